"""The communication context (scalegnn/parallel/context.py): the wire dtype of the 3D-PMM
partial sums, the dtype of the local GEMM operands, and the weight-gradient buckets.

Buckets, exactness. A bucket sums every element with the same operands as the separate
calls; over an axis of 2 ranks the sum is a + b, commutative, so bucketed training equals
unbucketed training bit for bit on grids whose axes have at most 2 ranks (the tests use
``torch.equal``). Over 3 ranks a chunked ring may add in another order: float32 rounding
(checked to 1e-6). The bucketed clip norm sums the same float64 squares in another order
(one world all-reduce): weights equal to 1e-9, where a wrong norm (a group counted
twice) moves them by ~lr. The calls a step saves are counted from the layout table and
recorded.

BF16. The wire keeps 8 mantissa bits (relative rounding 2^-8) per all-reduced partial
sum, its PMM bytes halve exactly and every other kind is unchanged; bf16 GEMM operands
are exactly the bf16 products, and on a 3D grid they move the same bytes.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from scalegnn.launch.job import spawn
from scalegnn.model import ModelConfig
from scalegnn.numerics import NumericsConfig
from scalegnn.optim import OptimConfig
from scalegnn.parallel.collectives import CommStats
from scalegnn.parallel.context import ParallelContext
from scalegnn.parallel.dist_sampling import DistributedSampler
from scalegnn.parallel.grid import ProcessGrid
from scalegnn.parallel.losses import parallel_cross_entropy
from scalegnn.parallel.model import ParallelScaleGNN
from scalegnn.parallel.sharding import build_rank_shard
from scalegnn.perf import PerfConfig
from tests.graphs import nprocs, parallel_graph


# ----------------------------------------------------------------------------- the engine, bucketed vs not
def expected_calls_saved(shape, layers: int, norm: bool, bf16: bool, clip: bool) -> int:
    """Calls a step saves with buckets, from the layout table (DESIGN section 3), not
    from the code: each weight gradient is summed over the axis along which its shard is
    replicated and H's rows differ, each RMSNorm gain over its layer output's row axis;
    gradients sharing (axis, wire dtype) go in one call. The clip norm: one call over
    the world instead of one per 3D axis with several ranks (when two or more have)."""
    size = dict(zip(("dp", "x", "y", "z"), shape))
    dw_axis = ("z", "y", "x")  # layer l mod 3: W on (y,x) / (x,z) / (z,y), H rows on z / y / x
    out_row = ("z", "y", "x")  # layer l mod 3: output on (z,x) / (y,z) / (x,y)
    members = defaultdict(int)

    def add(axis, pmm):
        if size[axis] > 1:
            members[(axis, "bf16" if pmm and bf16 else "fp32")] += 1

    add("x", True)  # W_in on (z, y), input rows on x (Eq. 18)
    for layer in range(layers):
        add(dw_axis[layer % 3], True)
        if norm:
            add(out_row[layer % 3], False)
    add(out_row[(layers - 1) % 3] if layers else "x", True)  # W_out: head rows = the last output's rows
    saved = sum(m - 1 for m in members.values())
    spread = sum(size[a] > 1 for a in ("x", "y", "z"))
    if clip and spread > 1:
        saved += spread - 1
    return saved


_HIDDEN, _BATCH, _STEPS = 10, 23, 3
_HIDDEN, _BATCH, _STEPS = 10, 23, 3
_HIDDEN, _BATCH, _STEPS = 10, 23, 3
VARIANTS = {  # name: (graph kwargs, model, optim, switches: perf and numerics settings)
    "plain": ({}, ModelConfig(hidden=_HIDDEN, layers=3, dropout=0.3), OptimConfig(lr=1e-2), {}),
    "overlap": ({}, ModelConfig(hidden=_HIDDEN, layers=3, dropout=0.3), OptimConfig(lr=1e-2),
                {"comm_overlap": True}),
    "sparse input grad": ({"sparse": True, "f": 40}, ModelConfig(hidden=_HIDDEN, layers=2, dropout=0.0),
                          OptimConfig(lr=1e-2, sparse_input_update="on"), {}),
    "sparse + overlap": ({"sparse": True, "f": 40}, ModelConfig(hidden=_HIDDEN, layers=3, dropout=0.0),
                         OptimConfig(lr=1e-2, sparse_input_update="on"), {"comm_overlap": True}),
    "bf16 L4": ({}, ModelConfig(hidden=_HIDDEN, layers=4, dropout=0.2), OptimConfig(lr=1e-2),
                {"comm_dtype": "bf16"}),
    "bf16 + overlap": ({}, ModelConfig(hidden=_HIDDEN, layers=3, dropout=0.2), OptimConfig(lr=1e-2),
                       {"comm_dtype": "bf16", "comm_overlap": True}),
    "no norm": ({}, ModelConfig(hidden=_HIDDEN, layers=2, dropout=0.0, norm=False), OptimConfig(lr=1e-2), {}),
    "clip + overlap": ({}, ModelConfig(hidden=_HIDDEN, layers=3, dropout=0.3),
                       OptimConfig(lr=1e-2, grad_clip=0.05), {"comm_overlap": True}),
}


def _engine_pair_worker(rank, world, shape, names):
    from scalegnn.parallel.engine import ParallelEngine

    grid = ProcessGrid(*shape)
    out = {}
    for name in names:
        gkw, model, optim, switches = VARIANTS[name]
        numeric = {f.name for f in dataclasses.fields(NumericsConfig)}
        perf = {k: v for k, v in switches.items() if k not in numeric}
        numerics = NumericsConfig(**{k: v for k, v in switches.items() if k in numeric})
        for bucket in (False, True):
            eng = ParallelEngine(parallel_graph(seed=1, **gkw), model, optim, _BATCH, seed=0, epochs=2, grid=grid,
                                 perf=PerfConfig(bucket_collectives=bucket, **perf), numerics=numerics)
            eng.train_step(0)
            eng.reset_counters()
            steps = [eng.train_step(s) for s in range(1, _STEPS + 1)]
            _, nbytes, calls = eng.counters()
            out[(name, bucket)] = {"steps": [r.stats.tolist() for r in steps],
                                   "params": {k: v["value"] for k, v in eng.parameters_for_test().items()},
                                   "bytes": nbytes, "calls": calls, "sparse": eng.sparse_input_update}
            eng.close()
    return out


def _check_pairs(results, shape, names, exact: bool):
    for res in results:
        for name in names:
            off, on = res[(name, False)], res[(name, True)]
            _, model, optim, switches = VARIANTS[name]
            clip = optim.grad_clip is not None
            if name.startswith("sparse"):
                assert on["sparse"] and off["sparse"]
            if exact and not clip:
                assert on["steps"] == off["steps"], name
                assert all(torch.equal(on["params"][k], v) for k, v in off["params"].items()), name
            else:
                tol = dict(rtol=0, atol=1e-9) if exact else dict(rtol=1e-5, atol=1e-6)
                torch.testing.assert_close(torch.tensor(on["steps"]), torch.tensor(off["steps"]), **tol)
                for k, v in off["params"].items():
                    torch.testing.assert_close(on["params"][k], v, **tol, msg=lambda m: f"{name} {k} {m}")
            # Same bytes per kind (the clip norm: 8 bytes in one call instead of 8 per axis).
            spread = sum(s > 1 for s in shape[1:])
            for kind, nbytes in off["bytes"].items():
                want = 8 * _STEPS if kind == "clip" and spread > 1 else nbytes
                assert on["bytes"][kind] == want, (name, kind)
            saved = expected_calls_saved(shape, model.layers, model.norm, switches.get("comm_dtype") == "bf16",
                                         clip)
            assert saved > 0, name
            assert sum(off["calls"].values()) - sum(on["calls"].values()) == saved * _STEPS, name
            # The loss and the batch accuracy: 3 calls a step where rows and classes are both split.
            assert on["calls"]["loss"] == off["calls"]["loss"] <= 3 * _STEPS


def test_bucketed_training_equals_unbucketed_bit_for_bit_1x2x2x2():
    """8 ranks, every axis of 2 ranks: bucketed steps (losses, accuracy counts) and
    weights equal the unbucketed ones bit for bit, with overlap on and off, row-sparse
    input gradients, BF16 partial sums (L = 4: two RMSNorm gains share a bucket) and no
    norm; with clipping to 1e-9. Bytes per kind are unchanged and the calls per step fall
    by what the layout table predicts."""
    shape = (1, 2, 2, 2)
    names = list(VARIANTS)
    results = spawn(_engine_pair_worker, nprocs(shape), shape, names, timeout_s=600)
    _check_pairs(results, shape, names, exact=True)


@pytest.mark.parametrize("shape", [(2, 2, 1, 2), (1, 3, 2, 1)], ids=["2x2x1x2", "1x3x2x1"])
def test_bucketed_training_with_data_parallel_and_a_three_rank_axis(shape):
    """Data parallel (the clip norm's world all-reduce counts group 0 alone): bit for bit
    but the clip; an axis of 3 ranks: float32 rounding."""
    names = ["overlap", "sparse + overlap", "clip + overlap"]
    results = spawn(_engine_pair_worker, nprocs(shape), shape, names, timeout_s=600)
    _check_pairs(results, shape, names, exact=max(shape[1:]) <= 2)


# ----------------------------------------------------------------------------- comm precision
def _precision_batch(shape):
    """The grid, graph and step-0 batch shard (B = 23) of the precision tests."""
    grid = ProcessGrid(*shape)
    graph = parallel_graph()
    batch = DistributedSampler(build_rank_shard(graph, grid), grid, 23, seed=2).sample(0)
    return grid, graph, batch


def _bf16_worker(rank, world, shape):
    grid, graph, batch = _precision_batch(shape)
    cfg = ModelConfig(hidden=10, layers=3, dropout=0.0)
    model = ParallelScaleGNN(graph.num_features, graph.num_classes, cfg, grid, seed=1)
    out = {}
    for name, dtype in (("fp32", None), ("bf16", torch.bfloat16)):
        pc = ParallelContext(grid, CommStats(), pmm_comm_dtype=dtype)
        out[name] = (model(batch, pc).detach(), dict(pc.stats.bytes))
    return out


def test_bf16_pmm_communication_halves_pmm_bytes_only():
    """BF16 keeps 8 mantissa bits (relative rounding 2^-8 = 0.4%) per all-reduced partial
    sum; over 5 rounds of O(1) values a 5e-2 absolute tolerance bounds the drift while
    the FP32 norm/loss reductions must be byte-for-byte unchanged."""
    for out in spawn(_bf16_worker, 8, (1, 2, 2, 2), timeout_s=60):
        (l32, b32), (l16, b16) = out["fp32"], out["bf16"]
        torch.testing.assert_close(l16, l32, atol=5e-2, rtol=5e-2)
        for kind in b32:
            if kind.startswith("pmm_"):
                assert b16[kind] * 2 == b32[kind], kind
            else:
                assert b16[kind] == b32[kind], kind


# ----------------------------------------------------------------------------- GEMM operand precision
def test_bf16_gemm_operands_are_exactly_the_bf16_products():
    """``gemm_dtype=bf16`` makes the three local products of a GEMM (Z = H W, dH = dZ W^T,
    dW = H^T dZ) bf16 products returned in FP32, bit for bit; the CSR input projection
    stays an FP32 sparse product. One process: no reduction reorders anything."""
    from scalegnn.parallel.products import sharded_gemm

    gen = torch.Generator().manual_seed(0)
    h = torch.randn(37, 16, generator=gen, requires_grad=True)
    w = torch.randn(16, 12, generator=gen, requires_grad=True)
    dz = torch.randn(37, 12, generator=gen)
    pc = ParallelContext(ProcessGrid.single(), CommStats(), gemm_dtype=torch.bfloat16)
    z = sharded_gemm(h, w, pc, reduce_axis="z", dh_axis="y", dw_axis="x")
    z.backward(dz)
    b = torch.bfloat16
    assert z.dtype == h.grad.dtype == w.grad.dtype == torch.float32
    assert torch.equal(z, (h.detach().to(b) @ w.detach().to(b)).float())
    assert torch.equal(h.grad, (dz.to(b) @ w.detach().to(b).t()).float())
    assert torch.equal(w.grad, (h.detach().to(b).t() @ dz.to(b)).float())
    assert not torch.equal(z, h.detach() @ w.detach())  # the switch changed the product
    # A CSR input keeps FP32 (its product is a sparse kernel with no bf16 path).
    x = (torch.rand(37, 16, generator=gen) < 0.2).float()
    zs = sharded_gemm(x.to_sparse_csr(), w.detach(), pc, reduce_axis="z", dh_axis="y", dw_axis="x")
    torch.testing.assert_close(zs, x @ w.detach(), atol=1e-6, rtol=1e-6)


def _bf16_gemm_worker(rank, world, shape):
    grid, graph, batch = _precision_batch(shape)
    cfg = ModelConfig(hidden=10, layers=3, dropout=0.3)
    out = {}
    for name, dtype in (("fp32", None), ("bf16", torch.bfloat16)):
        model = ParallelScaleGNN(graph.num_features, graph.num_classes, cfg, grid, seed=1).train()
        pc = ParallelContext(grid, CommStats(), gemm_dtype=dtype)
        logits = model(batch, pc, 5, 0)
        a, d = model.head.row_axis, model.head.class_axis
        loss, _ = parallel_cross_entropy(logits, batch.y[a], batch.train_mask[a], pc, a, d, model.class_range[0])
        loss.backward()
        out[name] = (logits.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters()},
                     dict(pc.stats.bytes))
    return out


def test_bf16_gemm_on_a_3d_grid_stays_close_and_moves_the_same_bytes():
    """On 8 ranks: bf16 GEMM operands round each product to 8 mantissa bits (2^-8
    relative) before the FP32 all-reduce; through 5 GEMMs of O(1) values logits and
    gradients stay within 5e-2 of FP32 (the bound of the bf16 wire test), differ from
    FP32 (the switch reached every rank), and every collective's bytes are unchanged."""
    for out in spawn(_bf16_gemm_worker, 8, (1, 2, 2, 2), timeout_s=60):
        (l32, g32, b32), (l16, g16, b16) = out["fp32"], out["bf16"]
        assert b16 == b32
        torch.testing.assert_close(l16, l32, atol=5e-2, rtol=5e-2)
        assert not torch.equal(l16, l32)
        for name, g in g32.items():
            torch.testing.assert_close(g16[name], g, atol=5e-2, rtol=5e-2, msg=lambda m: f"grad {name}: {m}")


# ----------------------------------------------------------------------------- TF32
def test_tf32_is_refused_on_the_cpu_in_one_line():
    """A CPU has no TF32: the configuration and the engine refuse it before any work,
    in one line that names the setting and the fix."""
    from scalegnn.config import make_config
    from scalegnn.parallel.engine import ParallelEngine
    from tests.graphs import parallel_graph

    with pytest.raises(ValueError) as err:
        make_config(dataset="cora", device="cpu", gemm_dtype="tf32")
    assert "--gemm-dtype tf32 needs a CUDA GPU" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ValueError, match="--gemm-dtype tf32 needs a CUDA GPU"):
        ParallelEngine(parallel_graph(), ModelConfig(hidden=8, layers=1), OptimConfig(), 9,
                       numerics=NumericsConfig(gemm_dtype="tf32"))
    make_config(dataset="cora", device="cpu", gemm_dtype="bf16")  # the others are fine there


class _MatmulPrecision(TorchDispatchMode):
    """The CUDA matmul precision in force at each dense product (what cuBLAS would use)."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket is torch.ops.aten.mm:
            self.seen.append(torch.backends.cuda.matmul.fp32_precision)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("tf32", [True, False])
def test_tf32_gemms_run_their_products_and_only_them_in_tf32(tf32):
    """``tf32``: the three local products of a GEMM (Z = H W, dH, dW) are launched under
    the TF32 matmul precision, which is restored after each; without it none is."""
    from scalegnn.parallel.products import sharded_gemm

    before = torch.backends.cuda.matmul.fp32_precision
    gen = torch.Generator().manual_seed(0)
    h = torch.randn(37, 16, generator=gen, requires_grad=True)
    w = torch.randn(16, 12, generator=gen, requires_grad=True)
    pc = ParallelContext(ProcessGrid.single(), CommStats(), tf32=tf32)
    with _MatmulPrecision() as mode:
        z = sharded_gemm(h, w, pc, reduce_axis="z", dh_axis="y", dw_axis="x")
        z.backward(torch.ones_like(z))
        outside = torch.backends.cuda.matmul.fp32_precision
    assert len(mode.seen) == 3
    assert mode.seen == (["tf32"] * 3 if tf32 else [before] * 3) and "tf32" != before
    assert outside == before == torch.backends.cuda.matmul.fp32_precision
    torch.testing.assert_close(z, h.detach() @ w.detach())  # on a CPU the same FP32 product
