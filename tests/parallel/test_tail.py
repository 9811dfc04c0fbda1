"""The layer tail (scalegnn/parallel/tail.py) and its kernels (scalegnn/_elementwise.py).

* The fused tail (``layer_tail``): given the same row statistics, the forward output and
  dx equal the unfused torch chain bit for bit (the kernels use its operations in its
  order); end to end it equals the unfused operators (parallel_rms_norm -> relu ->
  dropout -> add) within TOL32 (the row sums are added in another order), matches
  float64 autograd of the serial formula within 1e-12, and passes gradcheck; on 2 ranks
  with the column axis or the row axis split, every rank's block equals the serial
  reference. Without numba (monkeypatched off, or failing to compile) the torch path
  gives the same values.
* The RMSNorm gains' gradients left partial by the fused and the unfused tails and
  reduced in buckets equal the in-backward reduction, bit for bit, on 8 ranks.
* On a GPU (``gpu`` marker), torch.compile of the fused tail equals eager.

Tolerance TOL32: a float32 sum of H squares (or of H products) differs between two
summation orders by at most ~H * 2^-24 relative (pairwise in torch, float64 here:
~1e-7 observed for H <= 300); rinv = (s/H + eps)^-1/2 halves it and the following
multiplications add a few ulps, so out and the gradients differ by < 1e-6 relative
for O(1) values. rtol = 1e-5, atol = 1e-6 leaves a 10x margin, while a wrong mask bit,
a missing factor 1/(1-p) or a missing term of dx gives errors of order 1e-1.
"""

from __future__ import annotations

import pytest
import torch

from scalegnn import _elementwise as ew
from scalegnn._compiled import CompiledKernels
from scalegnn.benchmarks.elementwise import mask_before_issue_l
from scalegnn.functional import rms_norm
from scalegnn.launch.job import spawn
from scalegnn.model import ModelConfig
from scalegnn.parallel.collectives import CommStats
from scalegnn.parallel.context import ParallelContext
from scalegnn.parallel.grid import ProcessGrid
from scalegnn.parallel.tail import layer_tail, parallel_rms_norm
from tests.devices import needs_gpu
from tests.elementwise import backend, needs_numba  # noqa: F401 (backend: a fixture)
from tests.graphs import parallel_graph


TOL32 = dict(rtol=1e-5, atol=1e-6)
EPS = 1e-6


# ----------------------------------------------------------------------------- the tail
def _inputs(b, h, dtype, seed=0, norm=True, gain=True, residual=True, p=0.3):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(b, h, generator=gen, dtype=dtype)
    g = (torch.rand(h, generator=gen, dtype=dtype) + 0.5) if norm and gain else None
    res = torch.randn(b, h, generator=gen, dtype=dtype) if residual else None
    drop = ew.DropoutBlock(12345, torch.randint(0, 10_000, (b,), generator=gen), torch.arange(3, 3 + h), p) \
        if p > 0 else None
    return x, g, res, drop


def _unfused(x, g, res, drop, hidden, norm, pc=None, col_axis="x", row_axis="y"):
    """The unfused operators: parallel_rms_norm -> relu -> dropout -> residual add."""
    pc = pc if pc is not None else ParallelContext(ProcessGrid.single(), CommStats())
    z = parallel_rms_norm(x, g, pc, col_axis, row_axis, hidden, EPS) if norm else x
    z = torch.relu(z)
    if drop is not None:
        z = z * drop.keep() / (1.0 - drop.p)
    return z + res if res is not None else z


def _serial64(x, g, res, drop, norm):
    """The serial formula (scalegnn.functional.rms_norm) in float64 autograd."""
    z = rms_norm(x, g, EPS) if norm else x
    z = torch.relu(z)
    if drop is not None:
        z = z * drop.keep() / (1.0 - drop.p)
    return z + res if res is not None else z


def _dout(shape, dtype, seed=1):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _fwd_bwd(fn, x, g, res, dout=None):
    leaves = [t.detach().clone().requires_grad_() if t is not None else None for t in (x, g, res)]
    out = fn(*leaves)
    out.backward(_dout(out.shape, out.dtype) if dout is None else dout)
    return [out.detach()] + [t.grad if t is not None else None for t in leaves]


def _assert_all_close(a, b, **tol):
    for i, (u, v) in enumerate(zip(a, b)):
        assert (u is None) == (v is None), i
        if u is not None:
            torch.testing.assert_close(u, v, **tol, msg=lambda m: f"output {i}: {m}")


SWITCHES = [dict(), dict(p=0.0), dict(residual=False), dict(gain=False), dict(norm=False),
            dict(norm=False, p=0.0, residual=False)]


def _pc(fused=None):
    return ParallelContext(ProcessGrid.single(), CommStats(), fused=fused)


@pytest.mark.parametrize("switches", SWITCHES, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()) or "all")
def test_fused_tail_equals_the_unfused_operators(backend, switches):
    norm = switches.get("norm", True)
    b, h = 301, 77
    x, g, res, drop = _inputs(b, h, torch.float32, **switches)
    fused = _fwd_bwd(lambda x, g, r: layer_tail(x, g, r, drop, _pc(), "x", "y", h, EPS, norm), x, g, res)
    plain = _fwd_bwd(lambda x, g, r: _unfused(x, g, r, drop, h, norm), x, g, res)
    _assert_all_close(fused, plain, **TOL32)
    if not norm:  # no reduction at all: bit for bit
        _assert_all_close(fused, plain, rtol=0, atol=0)


@pytest.mark.parametrize("compile_backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("switches", SWITCHES, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()) or "all")
def test_compiled_tail_equals_the_eager_kernels(switches, compile_backend):
    """``--compile``'s phases (scalegnn._compiled: the mask hashed inside, nothing (B, H)
    saved but x) give the eager kernels' output and gradients within TOL32, for every
    combination of norm, gain, dropout and residual, in float64 within 1e-12; traced
    only (aot_eager) and as inductor's C++ kernels."""
    norm = switches.get("norm", True)
    b, h = 301, 77
    for dtype in (torch.float64, torch.float32):
        x, g, res, drop = _inputs(b, h, dtype, **switches)
        outs = [_fwd_bwd(lambda x, g, r: layer_tail(x, g, r, drop, _pc(fused), "x", "y", h, EPS, norm), x, g, res)
                for fused in (None, CompiledKernels(compile_backend))]
        if dtype == torch.float64:  # the formulas: equal up to float64 rounding
            _assert_all_close(outs[1], outs[0], rtol=1e-12, atol=1e-12)
            continue
        _assert_reordered_close(outs[1], outs[0])


def _assert_reordered_close(got, want):
    """float32 results of the tail whose reductions were summed in another order: out,
    dx and dres within TOL32; dg sums B terms of both signs (cancellation leaves entries
    near 0), so it is compared relative to its largest entry."""
    _assert_all_close(got[:2] + got[3:], want[:2] + want[3:], **TOL32)
    if want[2] is not None:
        torch.testing.assert_close(got[2], want[2], rtol=1e-5, atol=1e-5 * float(want[2].abs().max()))


def test_the_compiled_mask_is_the_definition_bit_for_bit():
    """The keep mask hashed inside inductor's kernels (int64 wrap-around, logical shifts
    written as arithmetic shifts and masks) is keep_mask's, bit for bit, forward (the
    entries it zeroes) and backward (the entries the gradient passes), on global row
    ids up to 2^40 and a 62-bit key."""
    gen = torch.Generator().manual_seed(9)
    b, h = 257, 77
    drop = ew.DropoutBlock((1 << 62) - 12345, torch.randint(0, 1 << 40, (b,), generator=gen),
                           torch.arange(5000, 5000 + h), 0.3)
    keep = ew.keep_mask_torch(drop.key, drop.rows, drop.cols, drop.p)
    if ew.available():
        assert torch.equal(keep, drop.keep())
    leaf = torch.ones(b, h, requires_grad=True)
    out = layer_tail(leaf * 1, None, None, drop, _pc(CompiledKernels("inductor")), "x", "y", h, EPS, False)
    out.backward(torch.ones_like(out))
    assert torch.equal(out.detach() != 0, keep)
    assert torch.equal(leaf.grad != 0, keep)
    assert 0.6 < keep.float().mean() < 0.8


def test_fused_tail_phases_equal_the_unfused_chain_bit_for_bit(backend):
    """Given the same row statistics (rinv, and c = rinv^3 dot / H), the forward output
    and dx are the unfused chain's to the last bit: the same operations in the same order."""
    x, g, res, drop = _inputs(513, 129, torch.float32, seed=3)
    rinv = torch.rsqrt(x.pow(2).sum(-1) / 129 + EPS)
    out, pas = ew.tail_forward(x, rinv, g, drop, res, save=True)
    keep = drop.keep()
    y = torch.relu(x * rinv[:, None] * g)
    assert torch.equal(out, y * keep / (1.0 - drop.p) + res)
    assert torch.equal(pas, keep & (y > 0))
    dout = torch.randn(x.shape, generator=torch.Generator().manual_seed(4))
    c = torch.rand(513, generator=torch.Generator().manual_seed(5)) * 1e-2
    dy = torch.where(pas, dout / (1.0 - drop.p), 0.0)
    assert torch.equal(ew.tail_backward_input(dout, x, rinv, c, g, pas, 1.0 - drop.p),
                       dy * g * rinv[:, None] - x * c[:, None])
    dot, dg = ew.tail_backward_stats(dout, x, rinv, g, pas, 1.0 - drop.p, want_dg=True)
    torch.testing.assert_close(dot, (dy * g * x).double().sum(-1).float(), **TOL32)
    torch.testing.assert_close(dg, (dy * x * rinv[:, None]).double().sum(0).float(), **TOL32)
    out2, pas2 = ew.tail_forward(x, None, None, None, None, save=True)  # relu alone
    assert torch.equal(out2, torch.relu(x)) and torch.equal(pas2, x > 0)


@pytest.mark.parametrize("switches", SWITCHES[:5], ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()) or "all")
def test_fused_tail_float64_equals_serial_autograd_and_passes_gradcheck(backend, switches):
    norm = switches.get("norm", True)
    b, h = 23, 17
    x, g, res, drop = _inputs(b, h, torch.float64, seed=2, **switches)
    fused = _fwd_bwd(lambda x, g, r: layer_tail(x, g, r, drop, _pc(), "x", "y", h, EPS, norm), x, g, res)
    ref = _fwd_bwd(lambda x, g, r: _serial64(x, g, r, drop, norm), x, g, res)
    _assert_all_close(fused, ref, rtol=1e-12, atol=1e-12)
    leaves = tuple(t.detach().clone().requires_grad_() for t in (x, g, res) if t is not None)

    def fn(*ts):
        it = iter(ts)
        return layer_tail(next(it), next(it) if g is not None else None, next(it) if res is not None else None,
                          drop, _pc(), "x", "y", h, EPS, norm)

    assert torch.autograd.gradcheck(fn, leaves, eps=1e-6, atol=1e-7)


def test_fused_tail_checks_its_inputs():
    x, g, res, drop = _inputs(4, 3, torch.float32)
    with pytest.raises(ValueError, match="norm=False"):
        layer_tail(x, g, res, None, _pc(), "x", "y", 3, EPS, norm=False)
    bad = ew.DropoutBlock(1, torch.arange(5), torch.arange(3), 0.5)
    with pytest.raises(ValueError, match="do not match"):
        layer_tail(x, g, res, bad, _pc(), "x", "y", 3, EPS, norm=True)
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        ew.DropoutBlock(1, torch.arange(5), torch.arange(3), 1.0)


def test_fused_tail_in_eval_saves_nothing_and_matches():
    x, g, res, drop = _inputs(40, 9, torch.float32)
    with torch.no_grad():
        out = layer_tail(x, g, res, None, _pc(), "x", "y", 9, EPS, True)
        want = _unfused(x, g, res, None, 9, True)
    torch.testing.assert_close(out, want, **TOL32)
    assert out.grad_fn is None


def test_fused_tail_on_empty_blocks():
    for b, h in [(0, 5), (5, 0)]:
        x, g, res, drop = _inputs(b, h, torch.float32)
        got = _fwd_bwd(lambda x, g, r: layer_tail(x, g, r, drop, _pc(), "x", "y", 8, EPS, True), x, g, res)
        assert got[0].shape == (b, h) and got[1].shape == (b, h) and got[2].shape == (h,)


# ----------------------------------------------------------------------------- 2 ranks
def _two_rank_worker(rank, world, shape, col_axis, row_axis, backend, planted=False):
    """Each rank takes its block of a (B, H) problem on (row_axis, col_axis) and returns
    the fused tail's output and gradients of that block and the block's ranges.
    ``planted``: the norm's all-reduces are skipped (a bug the check must catch)."""
    from scalegnn.ranges import split_range

    if backend == "torch":
        ew._ENABLED = False
    if planted:
        ParallelContext.reduce = lambda self, t, axis, kind, op="sum": t
    grid = ProcessGrid(*shape)
    b, h = 37, 11
    x, g, res, drop = _inputs(b, h, torch.float32, seed=9)
    r0, r1 = split_range(b, grid.axis_size(row_axis), grid.axis_index(row_axis))
    c0, c1 = split_range(h, grid.axis_size(col_axis), grid.axis_index(col_axis))
    blk = ew.DropoutBlock(drop.key, drop.rows[r0:r1], drop.cols[c0:c1], drop.p)
    pc = ParallelContext(grid, CommStats())
    got = _fwd_bwd(lambda x_, g_, r_: layer_tail(x_, g_, r_, blk, pc, col_axis, row_axis, h, EPS, True),
                   x[r0:r1, c0:c1], g[c0:c1], res[r0:r1, c0:c1], dout=_dout((b, h), torch.float32)[r0:r1, c0:c1])
    return (r0, r1, c0, c1), got, dict(pc.stats.bytes)


@pytest.mark.distributed
@pytest.mark.parametrize("shape,col_axis,row_axis", [((1, 2, 1, 1), "x", "y"), ((1, 2, 1, 1), "y", "x")],
                         ids=["columns-split", "rows-split"])
def test_fused_tail_on_two_ranks_equals_the_serial_block(shape, col_axis, row_axis, backend):
    """Columns split: the sum of squares and the backward dot are all-reduced over the
    column axis; rows split: the gain's gradient over the row axis."""
    results = spawn(_two_rank_worker, 2, shape, col_axis, row_axis, backend, timeout_s=120)
    for (r0, r1, c0, c1), got, nbytes in results:
        _assert_all_close(got, _serial_block(r0, r1, c0, c1), **TOL32)
        assert set(nbytes) == {"norm"}  # FP32 statistics only: (B,) twice, and (H,) with rows split
        n_rows, n_cols = r1 - r0, c1 - c0
        assert nbytes["norm"] == 4 * (2 * n_rows if col_axis == "x" else n_cols)


def _serial_block(r0, r1, c0, c1):
    x, g, res, drop = _inputs(37, 11, torch.float32, seed=9)
    ref = _fwd_bwd(lambda x, g, r: _unfused(x, g, r, drop, 11, True), x, g, res)
    return [ref[0][r0:r1, c0:c1], ref[1][r0:r1, c0:c1], ref[2][c0:c1], ref[3][r0:r1, c0:c1]]


@pytest.mark.distributed
@pytest.mark.parametrize("col_axis,row_axis", [("x", "y"), ("y", "x")], ids=["columns-split", "rows-split"])
def test_the_two_rank_check_catches_a_missing_all_reduce(col_axis, row_axis):
    results = spawn(_two_rank_worker, 2, (1, 2, 1, 1), col_axis, row_axis, "torch", True, timeout_s=120)
    for (r0, r1, c0, c1), got, _ in results:
        with pytest.raises(AssertionError):
            _assert_all_close(got, _serial_block(r0, r1, c0, c1), **TOL32)


@needs_numba
def test_the_numba_tail_runs_its_kernels_without_falling_back(monkeypatch):
    """A kernel that failed to compile would warn and leave the torch path on: here every
    phase must run compiled, silently, and leave the kernels enabled."""
    import warnings

    calls = []
    real = ew._run
    monkeypatch.setattr(ew, "_run", lambda kernel, *a: calls.append(kernel.__name__) or real(kernel, *a))
    x, g, res, drop = _inputs(50, 20, torch.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _fwd_bwd(lambda x, g, r: layer_tail(x, g, r, drop, _pc(), "x", "y", 20, EPS, True), x, g, res)
    assert calls == ["_sum_squares_kernel", "_tail_fwd_kernel", "_tail_bwd_stats_kernel", "_tail_bwd_input_kernel"]
    assert ew.available()
    calls.clear()
    assert ew.warm_up() > 0
    assert sorted(calls) == sorted(["_mask_kernel", "_sum_squares_kernel", "_tail_fwd_kernel",
                                    "_tail_bwd_stats_kernel", "_tail_bwd_input_kernel"])


def test_a_kernel_that_cannot_compile_falls_back_to_the_same_values(monkeypatch):
    """numba present but unusable (an odd LLVM build): _run raises Unavailable, the torch
    path answers, with the same mask bits and the same tail values."""
    def unavailable(kernel, *a):
        raise ew.Unavailable("no compiler here")

    x, g, res, drop = _inputs(50, 20, torch.float32)
    want = _fwd_bwd(lambda x, g, r: layer_tail(x, g, r, drop, _pc(), "x", "y", 20, EPS, True), x, g, res)
    monkeypatch.setattr(ew, "_run", unavailable)
    assert torch.equal(drop.keep(), mask_before_issue_l(drop.key, drop.rows, drop.cols, drop.p))
    got = _fwd_bwd(lambda x, g, r: layer_tail(x, g, r, drop, _pc(), "x", "y", 20, EPS, True), x, g, res)
    _assert_all_close(got, want, **TOL32)


# ----------------------------------------------------------------------------- deferred gain gradients
_HIDDEN, _BATCH, _STEPS = 10, 23, 3
_HIDDEN, _BATCH, _STEPS = 10, 23, 3


def _fused_worker(rank, world, shape):
    from scalegnn.parallel.dist_sampling import DistributedSampler
    from scalegnn.parallel.context import ParallelContext
    from scalegnn.parallel.losses import parallel_cross_entropy
    from scalegnn.parallel.model import ParallelScaleGNN
    from scalegnn.parallel.sharding import build_rank_shard
    from scalegnn._compiled import CompiledKernels

    grid = ProcessGrid(*shape)
    graph = parallel_graph(seed=2)
    cfg = ModelConfig(hidden=_HIDDEN, layers=4, dropout=0.3)
    batch = DistributedSampler(build_rank_shard(graph, grid), grid, _BATCH, seed=1).sample(0)
    out = {}
    for fused in (None, CompiledKernels("aot_eager")):
        for overlap, bucket in ((False, False), (False, True), (True, True)):
            model = ParallelScaleGNN(graph.num_features, graph.num_classes, cfg, grid, seed=3).train()
            pc = ParallelContext(grid, CommStats(timing=False), fused=fused, overlap=overlap, bucket=bucket)
            if pc.defers_weight_grads:
                model.defer_weight_grad_sync(pc)
            logits = model(batch, pc, 5, 0)
            head = model.head
            loss, _ = parallel_cross_entropy(logits, batch.y[head.row_axis], batch.train_mask[head.row_axis], pc,
                                             head.row_axis, head.class_axis, model.class_range[0])
            loss.backward()
            pc.wait_pending()
            out[(fused is not None, overlap, bucket)] = {n: p.grad.clone() for n, p in model.named_parameters()}
    return out


def test_deferred_norm_gradients_in_the_fused_and_unfused_tails():
    """RMSNorm gains' gradients left partial by the compiled phases and by the numba
    kernels and reduced in buckets equal the in-backward reduction, bit for bit, on 8
    ranks; with asynchronous buckets too."""
    for res in spawn(_fused_worker, 8, (1, 2, 2, 2), timeout_s=180):
        for fused in (False, True):
            base = res[(fused, False, False)]
            for key in ((fused, False, True), (fused, True, True)):
                assert all(torch.equal(res[key][n], g) for n, g in base.items()), key


# ----------------------------------------------------------------------------- on a GPU
gpu = pytest.mark.gpu


@gpu
@needs_gpu
@pytest.mark.parametrize("switches", SWITCHES, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()) or "all")
def test_compiled_tail_on_the_gpu_equals_eager(switches):
    """The compiled phases (inductor, Triton: the mask hashed in the kernel) on a GPU:
    the eager torch kernels' values and gradients within float32 reordering, and the
    same dropout mask bit for bit (the entries that the forward zeroes)."""
    dev = torch.device("cuda", 0)
    norm = switches.get("norm", True)
    b, h = 257, 64
    x, g, res, drop = _inputs(b, h, torch.float32, **switches)
    x, g, res = (t.to(dev) if t is not None else None for t in (x, g, res))
    if drop is not None:
        drop = ew.DropoutBlock(drop.key, drop.rows.to(dev), drop.cols.to(dev), drop.p)
    outs = [_fwd_bwd(lambda x, g, r: layer_tail(x, g, r, drop, _pc(fused), "x", "y", h, EPS, norm), x, g, res)
            for fused in (None, CompiledKernels("inductor"))]
    _assert_reordered_close(outs[1], outs[0])
    if drop is not None:
        ones = torch.ones(b, h, device=dev)
        out = layer_tail(ones, None, None, drop, _pc(CompiledKernels("inductor")), "x", "y", h, EPS, False)
        assert torch.equal(out != 0, drop.keep())
