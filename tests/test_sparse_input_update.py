"""The row-sparse input-weight gradient and the lazy AdamW update (scalegnn.optim,
``--sparse-input-update``).

What is held, and how strictly:
  * the row-sparse gradient of W_in is the dense gradient's rows of the features
    present in the batch, bit for bit, and the dense gradient is exactly zero elsewhere;
  * the lazy update (compiled kernel and torch path alike) equals a straightforward
    whole-tensor reference of the same rule bit for bit; it is AdamW on a row touched
    at every step and SparseAdam's moments on the others (close, not equal: those
    implementations round differently);
  * with the setting off the engine runs today's path: plain fused AdamW, dense dW;
  * the 8-rank 1x2x2x2 engine equals the single process with the setting on (float
    summation order only), with clipping, weight decay, a cosine schedule and the
    deferred gradient all-reduce; on 2 data-parallel groups it equals a serial
    reference of the union rule;
  * a checkpoint of the optimizer state round-trips: resumed == uninterrupted, bit for bit.
"""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
import torch

from scalegnn import optim as so
from scalegnn.csr import csr_matrix, csr_transpose
from scalegnn.model import ModelConfig, ScaleGNN, node_loss
from scalegnn.optim import OptimConfig, make_optimizer
from scalegnn.parallel.context import ParallelContext
from scalegnn.parallel.engine import ParallelEngine, _dropout_seed
from scalegnn.parallel.grid import ProcessGrid
from scalegnn.launch.job import spawn
from scalegnn.parallel.products import sharded_gemm
from scalegnn.perf import PerfConfig
from scalegnn.rowsparse import row_sparse_grad
from scalegnn.sampling import UniformVertexSampler, steps_per_epoch
from tests.graphs import parallel_graph

ATOL, RTOL = 2e-5, 1e-4  # as tests/test_parallel_engine.py: float summation order over a few steps


def _sparse_x(rows, cols, density, seed):
    gen = torch.Generator().manual_seed(seed)
    dense = (torch.rand(rows, cols, generator=gen) < density) * torch.randn(rows, cols, generator=gen)
    dense[:, cols // 2: cols // 2 + 3] = 0  # a few features no row has
    d = dense.to_sparse_csr()
    return csr_matrix(d.crow_indices(), d.col_indices(), d.values(), dense.shape), dense


# ----------------------------------------------------------------------------- gradient
@pytest.mark.parametrize("defer", [False, True])
def test_row_sparse_gradient_is_the_dense_gradients_touched_rows_exactly(defer):
    x, dense = _sparse_x(40, 57, 0.05, seed=0)
    x_t = csr_transpose(x)
    w0 = torch.randn(57, 9, generator=torch.Generator().manual_seed(1))
    dz = torch.randn(40, 9, generator=torch.Generator().manual_seed(2))
    grads, outs = {}, {}
    for sparse in (False, True):
        pc = ParallelContext(ProcessGrid.single(), sparse_input_grad=sparse)
        w = w0.clone().requires_grad_(True)
        out = sharded_gemm(x, w, pc, "z", "y", "x", defer_dw=defer, h_t=x_t)
        out.backward(dz)
        outs[sparse], grads[sparse] = out.detach(), w.grad
    assert torch.equal(outs[False], outs[True])  # the forward is untouched
    dense_grad, sparse_grad = grads[False], grads[True]
    assert dense_grad.layout == torch.strided and sparse_grad.is_sparse  # (accumulation drops the coalesced flag)
    present = (dense != 0).any(0).nonzero().squeeze(1)
    rows, values = sparse_grad._indices()[0], sparse_grad._values()
    assert 0 < rows.numel() < 57 and torch.equal(rows, present)
    assert values.shape == (rows.numel(), 9)  # only the touched rows were computed
    assert torch.equal(values, dense_grad[rows])  # bit for bit
    untouched = torch.ones(57, dtype=torch.bool)
    untouched[rows] = False
    assert torch.equal(dense_grad[untouched], torch.zeros_like(dense_grad[untouched]))
    assert torch.equal(sparse_grad.to_dense(), dense_grad)


def test_an_empty_batch_gives_an_empty_row_sparse_gradient():
    x = csr_matrix(torch.zeros(4, dtype=torch.long), torch.zeros(0, dtype=torch.long), torch.zeros(0), (3, 6))
    w = torch.randn(6, 2, requires_grad=True)
    pc = ParallelContext(ProcessGrid.single(), sparse_input_grad=True)
    sharded_gemm(x, w, pc, "z", "y", "x", h_t=csr_transpose(x)).sum().backward()
    assert w.grad.is_sparse and w.grad._nnz() == 0


# ----------------------------------------------------------------------------- the update rule
def _reference_rule(p, m, v, t, touched, g_dense, lr, b1, b2, eps, wd):
    """The rule of scalegnn.optim written over whole tensors with a row mask, for
    clarity: every row computed, the untouched ones put back."""
    f = torch.float32
    bc1, bc2 = 1 - b1 ** t, 1 - b2 ** t
    if wd:
        p = p * torch.tensor(1 - lr * wd, dtype=f)
    m_new = m * torch.tensor(b1, dtype=f) + g_dense * torch.tensor(1 - b1, dtype=f)
    v_new = v * torch.tensor(b2, dtype=f) + (g_dense * g_dense) * torch.tensor(1 - b2, dtype=f)
    root = torch.from_numpy(np.sqrt(v_new.numpy()))  # IEEE float32 sqrt (torch's CPU one may be an ulp off)
    denom = root / torch.tensor(math.sqrt(bc2), dtype=f) + torch.tensor(eps, dtype=f)
    p_new = p - (m_new / denom) * torch.tensor(lr / bc1, dtype=f)
    keep = touched[:, None]
    return torch.where(keep, p_new, p), torch.where(keep, m_new, m), torch.where(keep, v_new, v)


def _touch_pattern(steps, rows, seed):
    gen = torch.Generator().manual_seed(seed)
    return [torch.rand(rows, generator=gen) < 0.4 for _ in range(steps)]


@pytest.mark.parametrize("wd", [0.0, 0.05])
@pytest.mark.parametrize("kernel", [False, True], ids=["torch", "compiled"])
def test_lazy_update_equals_the_reference_rule_bit_for_bit(kernel, wd):
    if kernel and not so._HAVE_NUMBA:
        pytest.skip("numba is not installed")
    F, H, steps, lr, b1, b2, eps = 23, 7, 25, 3e-2, 0.9, 0.999, 1e-8
    gen = torch.Generator().manual_seed(0)
    p = torch.randn(F, H, generator=gen)
    state = {"step": torch.zeros(()), "exp_avg": torch.zeros(F, H), "exp_avg_sq": torch.zeros(F, H)}
    rp, rm, rv, t = p.clone(), torch.zeros(F, H), torch.zeros(F, H), 0
    skips = {7, 8}
    for s, touched in enumerate(_touch_pattern(steps, F, 1)):
        rows = touched.nonzero().squeeze(1)
        vals = torch.randn(rows.numel(), H, generator=gen) * 10.0 ** float(torch.randint(-4, 1, (), generator=gen))
        found_inf = torch.tensor(1.0 if s in skips else 0.0)
        so.lazy_adamw_rows_(p, row_sparse_grad(rows, vals, (F, H)), state, lr=lr, betas=(b1, b2), eps=eps,
                            weight_decay=wd, found_inf=found_inf, kernel=kernel)
        if s not in skips:
            t += 1
            g_dense = torch.zeros(F, H).index_copy_(0, rows, vals)
            rp, rm, rv = _reference_rule(rp, rm, rv, t, touched, g_dense, lr, b1, b2, eps, wd)
        assert float(state["step"]) == t
        assert torch.equal(p, rp) and torch.equal(state["exp_avg"], rm) and torch.equal(state["exp_avg_sq"], rv), s


def test_the_torch_path_without_host_reads_equals_the_host_path():
    """The branch a GPU takes (step count, constants and skip flag stay tensors, no host
    read) computes the CPU branch's numbers."""
    F, H = 11, 4
    gen = torch.Generator().manual_seed(3)
    p0 = torch.randn(F, H, generator=gen)
    results = []
    for host in (True, False):
        p = p0.clone()
        state = {"step": torch.zeros(()), "exp_avg": torch.zeros(F, H), "exp_avg_sq": torch.zeros(F, H)}
        g2 = torch.Generator().manual_seed(4)
        for s in range(6):
            rows = torch.tensor([1, 4, 5, 9]) if s % 2 else torch.tensor([0, 4])
            grad = row_sparse_grad(rows, torch.randn(rows.numel(), H, generator=g2), (F, H))
            so.lazy_adamw_rows_(p, grad, state, lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1,
                                found_inf=torch.tensor(1.0 if s == 3 else 0.0), kernel=False, host=host)
        results.append((p, state))
    (p1, s1), (p2, s2) = results
    # pow of a tensor vs the host's pow: the float32 constants may differ in the last bit
    torch.testing.assert_close(p1, p2, rtol=1e-6, atol=1e-7)
    assert torch.equal(s1["exp_avg_sq"], s2["exp_avg_sq"])  # the moments do not use the constants
    assert torch.equal(s1["exp_avg"], s2["exp_avg"])
    assert float(s1["step"]) == float(s2["step"]) == 5


def test_a_row_touched_every_step_follows_adamw_and_the_others_sparse_adams_moments():
    F, H = 9, 5
    gen = torch.Generator().manual_seed(5)
    w0 = torch.randn(F, H, generator=gen)
    # every row touched: AdamW itself (torch's reference implementation, fused=False)
    lazy = torch.nn.Parameter(w0.clone())
    ref = torch.nn.Parameter(w0.clone())
    opt_l = so.RowSparseAdamW([lazy], lr=1e-2, weight_decay=0.02)
    opt_r = torch.optim.AdamW([ref], lr=1e-2, weight_decay=0.02, fused=False)
    for _ in range(20):
        g = torch.randn(F, H, generator=gen)
        lazy.grad = row_sparse_grad(torch.arange(F), g.clone(), (F, H))
        ref.grad = g.clone()
        opt_l.step()
        opt_r.step()
    torch.testing.assert_close(lazy.detach(), ref.detach(), rtol=1e-5, atol=1e-6)
    # some rows: torch.optim.SparseAdam (no weight decay; eps placed differently, hence close)
    lazy = torch.nn.Parameter(w0.clone())
    ref = torch.nn.Parameter(w0.clone())
    opt_l = so.RowSparseAdamW([lazy], lr=1e-2, weight_decay=0.0)
    opt_r = torch.optim.SparseAdam([ref], lr=1e-2)
    for touched in _touch_pattern(20, F, 6):
        rows = touched.nonzero().squeeze(1)
        vals = torch.randn(rows.numel(), H, generator=gen)
        lazy.grad = row_sparse_grad(rows, vals.clone(), (F, H))
        ref.grad = row_sparse_grad(rows, vals.clone(), (F, H))
        opt_l.step()
        opt_r.step()
    torch.testing.assert_close(lazy.detach(), ref.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(opt_l.state[lazy]["exp_avg"], opt_r.state[ref]["exp_avg"])


def test_dense_gradients_take_the_fused_adamw_bit_for_bit_and_the_state_round_trips():
    gen = torch.Generator().manual_seed(7)
    w0, b0 = torch.randn(8, 3, generator=gen), torch.randn(3, generator=gen)
    grads = [(torch.randn(8, 3, generator=gen), torch.randn(3, generator=gen), torch.rand(8, generator=gen) < 0.5)
             for _ in range(10)]

    def run(kind, steps, state=None):
        w, b = torch.nn.Parameter(w0.clone()), torch.nn.Parameter(b0.clone())
        opt = kind([w, b], lr=1e-2, weight_decay=0.01, fused=True)
        if state is not None:
            w.data.copy_(state["w"])
            b.data.copy_(state["b"])
            buf = io.BytesIO()
            torch.save(state["opt"], buf)
            buf.seek(0)
            opt.load_state_dict(torch.load(buf, weights_only=True))
        for gw, gb, touched in steps:
            rows = touched.nonzero().squeeze(1)
            w.grad = row_sparse_grad(rows, gw[rows], w.shape) if kind is so.RowSparseAdamW else gw.clone()
            b.grad = gb.clone()
            opt.step()
        return w.detach(), b.detach(), opt

    # bias's dense gradient: the fused AdamW itself, bit for bit
    _, b_lazy, _ = run(so.RowSparseAdamW, grads)
    _, b_fused, _ = run(torch.optim.AdamW, grads)
    assert torch.equal(b_lazy, b_fused)
    # state_dict round trip: 4 steps, save, load into a fresh optimizer, 6 more == 10 steps
    w_all, b_all, _ = run(so.RowSparseAdamW, grads)
    w4, b4, opt4 = run(so.RowSparseAdamW, grads[:4])
    w_res, b_res, _ = run(so.RowSparseAdamW, grads[4:], {"w": w4, "b": b4, "opt": opt4.state_dict()})
    assert torch.equal(w_res, w_all) and torch.equal(b_res, b_all)


def test_the_setting_is_validated_and_resolved():
    with pytest.raises(ValueError, match="sparse_input_update must be one of auto, on, off"):
        OptimConfig(sparse_input_update="lazy")
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    assert so.use_sparse_input_update("auto", True, cpu) == so._HAVE_NUMBA
    assert not so.use_sparse_input_update("auto", True, gpu)
    assert so.use_sparse_input_update("on", True, gpu) and not so.use_sparse_input_update("on", False, cpu)
    assert not so.use_sparse_input_update("off", True, cpu)
    assert OptimConfig().sparse_input_update == "off"  # the default: dense AdamW, as before
    opt, _ = make_optimizer([torch.nn.Parameter(torch.ones(2))], OptimConfig(), 10)
    assert type(opt) is torch.optim.AdamW and opt.defaults["fused"]


# ----------------------------------------------------------------------------- the engine
GRAPH = dict(n=41, f=67, sparse=True, seed=4)


def _run_engine(grid, mode, steps, optim=None, perf=None, state=None, model=None):
    graph = parallel_graph(**GRAPH)
    optim = optim or OptimConfig(lr=1e-2, weight_decay=0.01, schedule="cosine", grad_clip=0.5)
    eng = ParallelEngine(graph, model or ModelConfig(hidden=9, layers=2, dropout=0.2),
                         OptimConfig(**{**optim.__dict__, "sparse_input_update": mode}), 17, seed=5, epochs=3,
                         grid=grid, perf=perf)
    if state is not None:
        eng.load_state_dict(state)
    losses = [eng.train_step(s).loss for s in steps]
    return eng, losses


def test_with_the_setting_off_the_engine_runs_todays_path():
    eng, _ = _run_engine(ProcessGrid.single(), "off", range(2))
    assert type(eng.optimizer) is torch.optim.AdamW and not eng.pc.sparse_input_grad
    assert eng.model.w_in.grad.layout == torch.strided
    eng_on, _ = _run_engine(ProcessGrid.single(), "on", range(2))
    assert type(eng_on.optimizer) is so.RowSparseAdamW and eng_on.model.w_in.grad.is_sparse
    assert all(not p.grad.is_sparse for n, p in eng_on.params if n != "w_in")


def test_lazy_engine_differs_from_dense_only_on_untouched_rows_after_one_step():
    """After the first step (moments zero before it), lazy and dense AdamW agree on the
    touched rows bit for bit... up to the fused kernel's own rounding; untouched rows
    of W_in move under dense AdamW only by weight decay at step 1, and stay under lazy."""
    opt = OptimConfig(lr=1e-2, weight_decay=0.0)
    on, _ = _run_engine(ProcessGrid.single(), "on", range(1), optim=opt)
    off, _ = _run_engine(ProcessGrid.single(), "off", range(1), optim=opt)
    rows = on.model.w_in.grad._indices()[0]
    torch.testing.assert_close(on.model.w_in.detach()[rows], off.model.w_in.detach()[rows], rtol=1e-6, atol=1e-7)
    for (name, a), (_, b) in zip(on.params, off.params):
        if name != "w_in":
            assert torch.equal(a.detach(), b.detach()), name


def test_resume_from_a_checkpoint_is_exact_with_the_setting_on():
    _, full = _run_engine(ProcessGrid.single(), "on", range(8))
    first, part = _run_engine(ProcessGrid.single(), "on", range(3))
    buf = io.BytesIO()
    torch.save(first.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    resumed, rest = _run_engine(ProcessGrid.single(), "on", range(3, 8), state=state)
    assert part + rest == full
    final, _ = _run_engine(ProcessGrid.single(), "on", range(8))
    for (name, a), (_, b) in zip(resumed.params, final.params):
        assert torch.equal(a.detach(), b.detach()), name


def _grid_worker(rank, world, shape, runs):
    out = []
    for run in runs:
        eng, losses = _run_engine(ProcessGrid(*shape), "on", range(run["steps"]), perf=run.get("perf"))
        out.append({"losses": losses, "params": eng.parameters_for_test()})
        eng.close()
    return out


def _block(t, rows, cols):
    return t[cols[0]:cols[1]] if rows is None else t[rows[0]:rows[1], cols[0]:cols[1]]


@pytest.mark.distributed
@pytest.mark.parametrize("shape", [(1, 2, 2, 2), (1, 2, 1, 2)], ids=lambda s: "x".join(map(str, s)))
def test_the_parallel_engine_equals_the_single_process_with_the_setting_on(shape):
    steps = 6
    runs = [dict(steps=steps), dict(steps=steps, perf=PerfConfig(comm_overlap=True))]
    results = spawn(_grid_worker, math.prod(shape), shape, runs, timeout_s=300)
    ref, ref_losses = _run_engine(ProcessGrid.single(), "on", range(steps))
    ref_params = {n: p.detach() for n, p in ref.params}
    for i in range(len(runs)):
        for rank, res in enumerate(r[i] for r in results):
            assert res["losses"] == pytest.approx(ref_losses, rel=RTOL, abs=ATOL), (i, rank)
            for name, p in res["params"].items():
                torch.testing.assert_close(p["value"], _block(ref_params[name], p["rows"], p["cols"]), atol=ATOL,
                                           rtol=RTOL, msg=lambda m: f"run {i} rank {rank} {name}: {m}")
                if name == "w_in":
                    assert p["grad"].is_sparse


def _dp_worker(rank, world, steps):
    eng, losses = _run_engine(ProcessGrid(2, 2, 1, 1), "on", range(steps), optim=OptimConfig(lr=1e-2, grad_clip=0.3,
                                                                                               weight_decay=0.01))
    return {"losses": losses, "params": eng.parameters_for_test()}


def _serial_dp_union_reference(steps, gd=2):
    """Data parallelism with the union rule, serially: each group's dense gradient on
    its own sample, averaged over the groups that had a labeled vertex; W_in updated on
    the union of the features present in the groups' samples."""
    graph = parallel_graph(**GRAPH)
    cfg = OptimConfig(lr=1e-2, grad_clip=0.3, weight_decay=0.01)
    model = ScaleGNN(graph.num_features, graph.num_classes, ModelConfig(hidden=9, layers=2, dropout=0.2), seed=5)
    spe = steps_per_epoch(graph.num_nodes, 17, gd)
    opt, sched = make_optimizer(model.parameters(), cfg, total_steps=3 * spe, row_sparse=True)
    samplers = [UniformVertexSampler(graph, 17, seed=5, dp_index=g) for g in range(gd)]
    for step in range(steps):
        grads, present = [], torch.zeros(graph.num_features, dtype=torch.bool)
        for g in range(gd):
            b = samplers[g].sample(step)
            present |= (b.x.to_dense() != 0).any(0)
            model.train()
            model.zero_grad(set_to_none=True)
            logits = model(b.adj, b.adj_t, b.x, b.nodes, _dropout_seed(5, g), step)
            if bool(b.train_mask.any()):
                node_loss(logits, b.y, b.train_mask).backward()
                grads.append([p.grad.clone() for p in model.parameters()])
        assert grads  # this graph and batch give every step a labeled vertex
        for i, p in enumerate(model.parameters()):
            p.grad = sum(gr[i] for gr in grads) / len(grads)
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        rows = present.nonzero().squeeze(1)
        model.w_in.grad = row_sparse_grad(rows, model.w_in.grad[rows], model.w_in.shape)
        opt.step()
    return {n: p.detach() for n, p in model.named_parameters()}


@pytest.mark.distributed
def test_data_parallel_groups_update_the_union_of_their_rows():
    steps = 5
    results = spawn(_dp_worker, 4, steps, timeout_s=300)
    ref = _serial_dp_union_reference(steps)
    for rank, res in enumerate(results):
        for name, p in res["params"].items():
            torch.testing.assert_close(p["value"], _block(ref[name], p["rows"], p["cols"]), atol=ATOL, rtol=RTOL,
                                       msg=lambda m: f"rank {rank} {name}: {m}")
