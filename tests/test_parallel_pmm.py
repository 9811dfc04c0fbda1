"""3D-parallel operators and model: every rank's output block and every weight and
input gradient against the single-process ScaleGNN (same weights, inputs, sample).

Tolerances (float32, eps = 6e-8). The parallel model computes the same sums as the
serial one, split into partial sums over up to 3 blocks and added in another order
(all-reduce), so each reduction differs by a few ulps of its largest partial sum.
Through L <= 4 layers of SpMM (<= 23 terms per row), GEMM (<= 10 terms), RMSNorm and
the loss, values are O(1) and the observed error is below 1e-6; ATOL = 1e-5 with
RTOL = 1e-4 leaves a 10x margin while any wrong reduction axis, missing all-reduce
or misplaced block produces errors of order 1e-1 (the size of the values).
"""

from __future__ import annotations

import pytest
import torch

from scalegnn.device import resolve_device
from scalegnn.model import ModelConfig, ScaleGNN, node_loss
from scalegnn.parallel.collectives import CommStats
from scalegnn.parallel.context import ParallelContext
from scalegnn.parallel.dist_sampling import DistributedSampler
from scalegnn.parallel.grid import ProcessGrid
from scalegnn.launch.job import spawn
from scalegnn.parallel.layout import RowPartition, col_bounds, layer_layout
from scalegnn.parallel.losses import parallel_bce, parallel_cross_entropy
from scalegnn.parallel.model import ParallelScaleGNN
from scalegnn.parallel.products import reshard
from scalegnn.parallel.sharding import build_rank_shard
from scalegnn.sampling import UniformVertexSampler
from tests.devices import DEVICES
from tests.graphs import nprocs, parallel_graph

pytestmark = pytest.mark.distributed

ATOL, RTOL = 1e-5, 1e-4


# ----------------------------------------------------------------------------- helpers
def serial_reference(graph, cfg, batch_size, sample_seed, step, model_seed, dropout_seed, dp_index=0):
    """Serial forward/backward on the sample of data-parallel group ``dp_index``."""
    s = UniformVertexSampler(graph, batch_size, seed=sample_seed, dp_index=dp_index).sample(step)
    model = ScaleGNN(graph.num_features, graph.num_classes, cfg, seed=model_seed).train()
    x = s.x.clone().requires_grad_()
    logits = model(s.adj, s.adj_t, x, s.nodes, dropout_seed, step)
    loss = node_loss(logits, s.y, s.train_mask)
    loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    return {"nodes": s.nodes, "logits": logits.detach(), "loss": float(loss.detach()), "grads": grads,
            "x_grad": x.grad}


def _run_case(grid, case, device="cpu"):
    """One rank's forward/backward for ``case`` on ``device``; returns its blocks (host
    copies) with their global ids."""
    device = resolve_device(device, grid.rank)
    graph = parallel_graph(**case["graph"])
    shard = build_rank_shard(graph, grid).to(device)
    sampler = DistributedSampler(shard, grid, case["batch"], seed=case["sample_seed"])
    batch = sampler.sample(case["step"])
    batch.x = batch.x.clone().requires_grad_()
    cfg = case["cfg"]
    model = ParallelScaleGNN(graph.num_features, graph.num_classes, cfg, grid, seed=case["model_seed"])
    model = model.to(device).train()
    pc = ParallelContext(grid, CommStats())
    logits = model(batch, pc, case["dropout_seed"], case["step"])
    head = model.head
    a, d = head.row_axis, head.class_axis
    c0, c1 = model.class_range
    if graph.multilabel:
        loss, count = parallel_bce(logits, batch.y[a][:, c0:c1], batch.train_mask[a], pc, a, d, graph.num_classes)
    else:
        loss, count = parallel_cross_entropy(logits, batch.y[a], batch.train_mask[a], pc, a, d, c0)
    loss.backward()
    return {
        "dp": grid.axis_index("dp"), "loss": float(loss.detach()), "count": int(count),
        "logits": logits.detach().cpu(), "rows": batch.rows.global_ids(a).cpu(), "cols": (c0, c1),
        "grads": {n: (p.grad.detach().cpu(), model.shards[n].rows, model.shards[n].cols)
                  for n, p in model.named_parameters()},
        "x_grad": batch.x.grad.detach().cpu(), "x_rows": batch.rows.global_ids("x").cpu(),
        "x_cols": shard.feature_range, "bytes": dict(pc.stats.bytes), "device": str(logits.device),
    }


def _parity_worker(rank, world, shape, cases, device="cpu"):
    grid = ProcessGrid(*shape)
    return [_run_case(grid, case, device) for case in cases]


def _block(t, rows, cols):
    return t[cols[0]:cols[1]] if rows is None else t[rows[0]:rows[1], cols[0]:cols[1]]


def check_parity(results_per_rank, cases):
    for ci, case in enumerate(cases):
        graph = parallel_graph(**case["graph"])
        refs = {}
        for res in (r[ci] for r in results_per_rank):
            g = res["dp"]
            if g not in refs:
                refs[g] = serial_reference(graph, case["cfg"], case["batch"], case["sample_seed"], case["step"],
                                           case["model_seed"], case["dropout_seed"], dp_index=g)
            ref = refs[g]
            pos = torch.full((graph.num_nodes,), -1, dtype=torch.long)
            pos[ref["nodes"]] = torch.arange(ref["nodes"].numel())
            where = f"case {ci} ({case['name']})"
            assert res["loss"] == pytest.approx(ref["loss"], rel=RTOL, abs=ATOL), where
            want = ref["logits"][pos[res["rows"]]][:, res["cols"][0]:res["cols"][1]]
            torch.testing.assert_close(res["logits"], want, atol=ATOL, rtol=RTOL, msg=lambda m: f"{where} logits {m}")
            for name, (grad, rows, cols) in res["grads"].items():
                torch.testing.assert_close(grad, _block(ref["grads"][name], rows, cols), atol=ATOL, rtol=RTOL,
                                           msg=lambda m: f"{where} grad {name} {m}")
            f0, f1 = res["x_cols"]
            torch.testing.assert_close(res["x_grad"], ref["x_grad"][pos[res["x_rows"]]][:, f0:f1], atol=ATOL,
                                       rtol=RTOL, msg=lambda m: f"{where} input grad {m}")


def make_cases(hidden=10, classes=5, layers=(1, 2, 3, 4), batch=23, extra=True):
    """L = 1..4 with everything on, then the switches off, dropout-only, and multi-label."""
    cases = []
    for L in layers:
        cases.append(dict(name=f"L{L} full", cfg=ModelConfig(hidden=hidden, layers=L, dropout=0.3)))
    if extra:
        cases += [
            dict(name="L3 bare", cfg=ModelConfig(hidden=hidden, layers=3, dropout=0.0, norm=False, residual=False)),
            dict(name="L2 norm only", cfg=ModelConfig(hidden=hidden, layers=2, dropout=0.0, residual=False)),
            dict(name="L4 residual+dropout", cfg=ModelConfig(hidden=hidden, layers=4, dropout=0.5, norm=False)),
            dict(name="L3 multilabel", cfg=ModelConfig(hidden=hidden, layers=3, dropout=0.2), multilabel=True),
        ]
    out = []
    for i, c in enumerate(cases):
        out.append(dict(name=c["name"], cfg=c["cfg"], batch=batch, sample_seed=3 + i, step=i, model_seed=10 + i,
                        dropout_seed=5, graph=dict(c=classes, multilabel=c.get("multilabel", False), seed=i % 3)))
    return out


# ----------------------------------------------------------------------------- parity
GRIDS = [(1, 1, 1, 1), (1, 2, 1, 1), (1, 1, 2, 1), (1, 1, 1, 2), (1, 2, 2, 1), (1, 2, 2, 2), (2, 1, 1, 1),
         (2, 2, 1, 1)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", GRIDS, ids=lambda s: "x".join(map(str, s)))
def test_model_forward_backward_parity(shape, device):
    """Logits, loss, all weight gradients and the input-feature gradient of every rank
    (replicas included: gradients are complete on every replica) for L = 1..4, with
    and without norm / residual / dropout, single- and multi-label; on the CPU and,
    where there is one, on a GPU shared by the ranks (against the same CPU reference)."""
    cases = make_cases()
    results = spawn(_parity_worker, nprocs(shape), shape, cases, device, timeout_s=300)
    assert all(res["device"].startswith(device) for rank in results for res in rank)
    check_parity(results, cases)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape,hidden,classes", [((1, 3, 2, 1), 10, 5), ((1, 1, 3, 2), 4, 2), ((1, 3, 1, 2), 2, 3)],
                         ids=["3x2-uneven", "h4-c2", "h2<Gx-empty-blocks"])
def test_model_parity_uneven_and_empty_blocks(shape, hidden, classes, device):
    """Axis sizes 3 that divide none of N=37, B=23, F=7, H, C; H=2 < Gx=3 and C=2 < Gy=3
    leave some ranks with empty hidden / class blocks, which must still work."""
    cases = make_cases(hidden=hidden, classes=classes, layers=(1, 2, 3, 4), extra=False)
    results = spawn(_parity_worker, nprocs(shape), shape, cases, device, timeout_s=300)
    check_parity(results, cases)


def _full_batch_worker(rank, world, shape):
    """Full-graph batch (B = N, no rescaling) through the sampler's full_batch path."""
    grid = ProcessGrid(*shape)
    graph = parallel_graph()
    cfg = ModelConfig(hidden=8, layers=3, dropout=0.0)
    shard = build_rank_shard(graph, grid)
    batch = DistributedSampler(shard, grid, 5, seed=0).full_batch()
    model = ParallelScaleGNN(graph.num_features, graph.num_classes, cfg, grid, seed=1).eval()
    with torch.no_grad():
        logits = model(batch, ParallelContext(grid))
    return logits, batch.rows.global_ids(model.head.row_axis), model.class_range


def test_full_graph_forward_parity():
    shape = (1, 2, 2, 2)
    graph = parallel_graph()
    ref_model = ScaleGNN(graph.num_features, graph.num_classes, ModelConfig(hidden=8, layers=3, dropout=0.0),
                         seed=1).eval()
    adj = graph.to_torch_csr()
    with torch.no_grad():
        ref = ref_model(adj, adj.t().to_sparse_csr(), graph.x)
    for logits, rows, (c0, c1) in spawn(_full_batch_worker, 8, shape, timeout_s=60):
        torch.testing.assert_close(logits, ref[rows][:, c0:c1], atol=ATOL, rtol=RTOL)


# ----------------------------------------------------------------------------- reshard
def _reshard_worker(rank, world, shape, n, dim):
    """Reshard a known matrix M[i, j] = 1000 i + j between every pair of layouts used by
    the model (forward (r, c) -> (t, r) and its reverse), forward and backward."""
    grid = ProcessGrid(*shape)
    nodes = torch.sort(torch.randperm(n, generator=torch.Generator().manual_seed(1))[: n - 7]).values
    rows = RowPartition(nodes, n, grid)
    b = nodes.numel()
    full = torch.arange(b, dtype=torch.float32)[:, None] * 1000 + torch.arange(dim, dtype=torch.float32)[None, :]
    gfull = -3.0 * full + 1.0

    def block(m, lay):
        r0, r1 = rows.block(lay[0])
        cb = col_bounds(dim, grid, lay[1])
        j = grid.axis_index(lay[1])
        return m[r0:r1, cb[j]:cb[j + 1]].contiguous()

    pc = ParallelContext(grid, CommStats())
    bad = []
    for layer in range(3):
        lay = layer_layout(layer)
        for src, dst in ((lay.feat, lay.out), (lay.out, lay.feat)):
            x = block(full, src).requires_grad_()
            y = reshard(x, src, dst, rows, dim, pc)
            if not torch.equal(y, block(full, dst)):
                bad.append(("forward", src, dst))
            y.backward(block(gfull, dst))
            if not torch.equal(x.grad, block(gfull, src)):
                bad.append(("backward", src, dst))
    return bad, dict(pc.stats.bytes)


@pytest.mark.parametrize("shape", [(1, 2, 2, 2), (1, 2, 3, 1), (1, 1, 2, 3)], ids=lambda s: "x".join(map(str, s)))
def test_reshard_moves_blocks_exactly(shape):
    """Pure data movement: results are bit-exact (no arithmetic), so equality is exact."""
    for bad, nbytes in spawn(_reshard_worker, nprocs(shape), shape, 29, 11, timeout_s=60):
        assert bad == []
        assert set(nbytes) <= {"reshard"}


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
