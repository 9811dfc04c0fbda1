"""CAGNET's 1D, 1.5D and 2D algorithms (baselines/cagnet.py, cagnet_ops.py) against the
serial full-graph model (scalegnn.model.ScaleGNN with B = N): logits of every rank's
block rows and the all-reduced weight gradients of one training step (dropout on,
the same masks), on 1, 2, 4 and 6 processes, with n = 37 vertices (no grid divides it)
and hidden widths 10 and 7 (uneven over pc = 3 and 4), and n = 5, hidden 4 (empty blocks). The graph is *directed* (A is
not A^T), so a backward that used A where A^T belongs fails. The bytes each rank
records in the step equal :func:`scalegnn.baselines.cagnet_ops.analytic_comm_bytes` exactly.

Tolerance: float32 summation order only (< 1e-6 on O(1) values); 1e-5 absolute leaves
a margin while a missing or doubled partial sum moves values by O(0.1).
"""

from __future__ import annotations

import re

import pytest
import torch

from scalegnn.baselines import cagnet_ops as ops
from scalegnn.baselines.cagnet import CagnetGCN
from scalegnn import records
from scalegnn.cli import main
from scalegnn.device import resolve_device
from scalegnn.graph import Graph
from scalegnn.model import ModelConfig, ScaleGNN, node_loss
from tests.graphs import parallel_graph
from scalegnn.parallel.collectives import CommStats
from scalegnn.parallel.grid import ProcessGrid
from scalegnn.sampling import train_mask_of, training_features
from tests.devices import needs_gpu

ATOL, RTOL = 1e-5, 1e-4
SEED, DROPOUT_SEED, STEP = 1, 5, 2

MODELS = {
    "full": dict(graph=dict(seed=0), model=ModelConfig(hidden=10, layers=3, dropout=0.3)),
    "plain-multilabel-sparse": dict(graph=dict(seed=3, multilabel=True, sparse=True, f=40),
                                    model=ModelConfig(hidden=7, layers=2, dropout=0.0, norm=False, residual=False)),
    "fewer-vertices-than-processes": dict(graph=dict(n=5, m=8, f=3, c=2),  # empty block rows and hidden blocks
                                          model=ModelConfig(hidden=4, layers=2, dropout=0.2)),
}

# (algorithm, replication c, 2D grid) per world size: every 1.5D c dividing 6 up to 3, 2D in both orientations
GRIDS = {
    1: [("1d", 1, None), ("1.5d", 1, None), ("2d", 1, (1, 1))],
    2: [("1d", 1, None), ("1.5d", 2, None), ("2d", 1, (1, 2)), ("2d", 1, (2, 1))],
    4: [("1d", 1, None), ("1.5d", 2, None), ("1.5d", 4, None), ("2d", 1, (2, 2))],
    6: [("1d", 1, None), ("1.5d", 2, None), ("1.5d", 3, None), ("2d", 1, (2, 3)), ("2d", 1, (3, 2))],
}


def directed_graph(n=37, m=150, f=7, c=5, seed=0, multilabel=False, sparse=False) -> Graph:
    """tests.graphs.parallel_graph without the symmetrization: A != A^T."""
    return parallel_graph(n, m, f, c, seed, multilabel=multilabel, sparse=sparse, symmetric=False)


def _grid(shape):
    r, c = shape
    return ProcessGrid(1, r, c, 1) if r * c > 1 else ProcessGrid.single()


def _step(world, rank, alg, c, g2, device="cpu"):
    """One training step of every model case on this rank: logits, gradients, bytes."""
    device = resolve_device(device, rank)
    out = []
    shape = ops.process_grid_shape(alg, world, c, g2)
    grid = _grid(shape)
    for name, case in MODELS.items():
        graph = directed_graph(**case["graph"])
        stats = CommStats(timing=False)
        m = CagnetGCN(graph, alg, grid, case["model"], SEED, device, stats, features=training_features(graph.x))
        logits = m.forward(True, DROPOUT_SEED, STEP)
        m.loss(logits).backward()
        m.sync_grads()
        out.append(dict(model=name, key=(alg, c, g2), rows=m.plan.rows, logits=logits.detach().cpu(),
                        grads={n: p.grad.cpu() for n, p in m.module.named_parameters()}, device=str(logits.device),
                        bytes=dict(stats.bytes), analytic=m.analytic_bytes(rank)))
    return out


def _worker(rank, world, device="cpu"):
    return [r for alg, c, g2 in GRIDS[world] for r in _step(world, rank, alg, c, g2, device)]


def _serial(name):
    case = MODELS[name]
    graph = directed_graph(**case["graph"])
    adj = graph.to_torch_csr()
    adj_t = adj.t().to_sparse_csr()
    assert not torch.equal(adj.to_dense(), adj_t.to_dense())  # directed: the backward must use A^T
    model = ScaleGNN(graph.num_features, graph.num_classes, case["model"], seed=SEED).train()
    logits = model(adj, adj_t, training_features(graph.x), torch.arange(graph.num_nodes), DROPOUT_SEED, STEP)
    node_loss(logits, graph.y, train_mask_of(graph)).backward()
    return logits.detach(), {n: p.grad for n, p in model.named_parameters()}


@pytest.fixture(scope="module")
def runs():
    """Every (world, algorithm, grid, model) step: [(world, per-rank results)]."""
    from scalegnn.launch.job import spawn

    out = {1: [_worker(0, 1)]}
    for world in (2, 4, 6):
        out[world] = spawn(_worker, world, timeout_s=240)
    return out


@pytest.fixture(scope="module")
def serial():
    return {name: _serial(name) for name in MODELS}


def _check_parity(world, per_rank, serial):
    checked = set()
    for rank, results in enumerate(per_rank):
        for res in results:
            ref_logits, ref_grads = serial[res["model"]]
            r0, r1 = res["rows"]
            where = f"P={world} rank {rank} {res['key']} {res['model']}"
            torch.testing.assert_close(res["logits"], ref_logits[r0:r1], atol=ATOL, rtol=RTOL,
                                       msg=lambda m: f"{where} logits: {m}")
            for name, g in res["grads"].items():
                torch.testing.assert_close(g, ref_grads[name], atol=ATOL, rtol=RTOL,
                                           msg=lambda m: f"{where} grad {name}: {m}")
            checked.add((res["key"], res["model"]))
    assert len(checked) == len(GRIDS[world]) * len(MODELS)


@pytest.mark.distributed
@pytest.mark.parametrize("world", [1, 2, 4, 6])
def test_logits_and_weight_gradients_equal_the_serial_model(world, runs, serial):
    _check_parity(world, runs[world], serial)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.distributed
def test_on_the_gpu_too(serial):
    """The same steps with the blocks, activations and collectives on a GPU (4 ranks
    sharing it through gloo), against the serial model on the CPU."""
    from scalegnn.launch.job import spawn

    per_rank = spawn(_worker, 4, "cuda", timeout_s=240)
    assert all(res["device"].startswith("cuda") for rank in per_rank for res in rank)
    _check_parity(4, per_rank, serial)


@pytest.mark.distributed
@pytest.mark.parametrize("world", [2, 4, 6])
def test_recorded_bytes_equal_the_analytic_volume(world, runs):
    kinds = set()
    for rank, results in enumerate(runs[world]):
        for res in results:
            assert res["bytes"] == res["analytic"], (world, rank, res["key"], res["model"])
            kinds |= set(res["bytes"])
    assert {"spmm_bcast_dense", "grad"} <= kinds
    if world >= 4:
        assert {"spmm_allreduce", "spmm_bcast_sparse", "gemm_bcast", "norm"} <= kinds


def test_analytic_volume_is_the_papers_for_even_splits():
    """n divisible by everything: 1D moves n f per SpMM, 1.5D n f / c + (n c / P) f (c^2 | P),
    2D n f / pc of H plus n f / pr of partial SUMMA per layer and direction."""
    n, f, L, P, w = 120, 8, 2, 6, 4
    one = ops.analytic_comm_bytes("1d", 0, n=n, widths=[f] * L, num_params=0, P=P)
    assert one == {"spmm_bcast_dense": 2 * L * n * f * w}
    for p15, c in ((8, 2), (18, 3)):  # the paper's case: c^2 divides P (P/c^2 stages per process column)
        v = ops.analytic_comm_bytes("1.5d", 0, n=n, widths=[f] * L, num_params=0, P=p15, c=c)
        assert v == {"spmm_bcast_dense": 2 * L * (n // c) * f * w, "spmm_allreduce": 2 * L * (n * c // p15) * f * w}
    pr, pc = 3, 2
    nnz = [5, 7]
    v = ops.analytic_comm_bytes("2d", 0, n=n, widths=[f] * L, num_params=0, P=P, grid2d=(pr, pc), norm=False,
                                nnz_fwd=nnz, nnz_bwd=nnz)
    sparse = sum((n // pr + 1 + k) * 8 + k * 4 for k in nnz)
    assert v == {"spmm_bcast_dense": 2 * L * n * (f // pc) * w, "spmm_bcast_sparse": 2 * L * sparse,
                 "gemm_bcast": (2 * L + 1) * (n // pr) * f * w}


def test_bad_grids_are_refused_with_the_fix():
    with pytest.raises(ValueError, match="must divide the process count 6"):
        ops.process_grid_shape("1.5d", 6, 4)
    with pytest.raises(ValueError, match="PR\\*PC = 6"):
        ops.process_grid_shape("2d", 6, grid2d=(2, 2))
    with pytest.raises(ValueError, match="PRxPC"):
        ops.parse_process_grid("2by3")
    assert ops.process_grid_shape("2d", 6) == (3, 2) and ops.process_grid_shape("2d", 4) == (2, 2)


# ----------------------------------------------------------------------------- end to end
SMALL = "csbm:n=61,avg_degree=4,classes=3,feature_dim=6"


@pytest.mark.parametrize("system,extra,message", [
    ("cagnet-1.5d", ["--replication", "4"], "must divide the process count 6"),
    ("cagnet-2d", ["--process-grid", "2x2"], "PR\\*PC = 6"),
])
def test_a_grid_the_process_count_cannot_hold_is_refused_before_any_data_loads(system, extra, message, tmp_path,
                                                                                capsys):
    data_root = tmp_path / "data"  # the dataset would be generated here: nothing may appear
    rc = main(["train", "--system", system, "--dataset", SMALL, "--data-root", str(data_root), "--nproc", "6",
               "--epochs", "1", "--out", str(tmp_path / "runs"), *extra])
    err = capsys.readouterr().err
    assert rc == 2 and re.search(message, err), err
    assert len(err.strip().splitlines()) == 1, err
    assert not data_root.exists() and not (tmp_path / "runs").exists()


@pytest.mark.distributed
@pytest.mark.parametrize("system,extra", [
    ("cagnet-1d", []),
    ("cagnet-1.5d", ["--replication", "2"]),
    ("cagnet-2d", ["--process-grid", "1x2"]),
])
def test_cli_train_writes_an_ok_record_with_bytes_equal_to_the_analytic(system, extra, tmp_path, capsys):
    rc = main(["train", "--system", system, "--dataset", SMALL, "--data-root", str(tmp_path / "data"),
               "--nproc", "2", "--epochs", "2", "--hidden", "8", "--layers", "2", "--out", str(tmp_path / "runs"),
               "--quiet", "--device", "cpu", *extra])
    assert rc == 0, capsys.readouterr()
    [path] = list((tmp_path / "runs").glob("*.json"))
    rec = records.read_record(path)
    assert rec["system"] == system and rec["status"] == "ok" and rec["world_size"] == 2
    assert rec["batch_size"] == rec["graph"]["num_nodes"] and len(rec["epochs"]) == 2
    assert rec["epochs"][-1]["test_acc"] is not None
    cag = rec["cagnet"]
    assert cag["comm_bytes_per_step_per_rank"] == cag["analytic_comm_bytes_per_step_per_rank"]
    assert rec["epochs"][0]["comm_bytes"] == cag["comm_bytes_per_step_per_rank"][0]
    assert sum(sum(b.values()) for b in cag["comm_bytes_per_step_per_rank"]) > 0


# ----------------------------------------------------------------------------- performance model
def test_the_models_bytes_are_the_analytic_volume_of_every_rank():
    from scalegnn.baselines import cagnet_perf
    from scalegnn.perfmodel import Workload

    # n = 12 on a 2 x 2 grid: two 6 x 6 stages per block row, 48 / 4 = 12 nonzeros each
    w = Workload(num_nodes=12, nnz=48, num_features=5, num_classes=3, hidden=8, layers=2)
    params = 5 * 8 + 2 * (8 * 8 + 8) + 8 * 3
    for algorithm, P, kw in [("1d", 4, {}), ("1.5d", 4, {"c": 2}), ("1.5d", 6, {"c": 2}), ("1.5d", 8, {"c": 4}),
                             ("2d", 4, {"grid2d": (2, 2)})]:
        for rank in range(P):
            model = cagnet_perf.predicted_bytes_per_step(algorithm, w, P, rank=rank, **kw)
            extra = dict(nnz_fwd=[12, 12], nnz_bwd=[12, 12]) if algorithm == "2d" else {}
            analytic = ops.analytic_comm_bytes(algorithm, rank, n=12, widths=[8, 8], num_params=params, P=P,
                                               c=kw.get("c", 1), grid2d=kw.get("grid2d"), **extra)
            assert model == {k: float(v) for k, v in analytic.items()}, (algorithm, P, rank)


def test_plan_predicts_every_cagnet_configuration(capsys):
    rc = main(["plan", "--dataset", "ogbn-products", "--gpus", "8", "--cluster", "perlmutter", "--cagnet", "--top", "1"])
    out = capsys.readouterr().out
    assert rc == 0, out
    rows = {line.split()[0] + " " + line.split()[1] for line in out.splitlines()
            if line.startswith("cagnet-")}
    assert rows == {"cagnet-1d 8x1", "cagnet-1.5d 4x2", "cagnet-1.5d 2x4", "cagnet-1.5d 1x8", "cagnet-2d 8x1",
                    "cagnet-2d 4x2"}
    epoch_ms = {r: float(line.split()[2]) for line in out.splitlines() if line.startswith("cagnet-")
                for r in [line.split()[0] + " " + line.split()[1]]}
    assert all(v > 0 for v in epoch_ms.values())
