"""The engine against the serial reference (tests/reference.py): whole training steps (loss,
accuracy counts, updated weights), data-parallel averaging, clipping, evaluation.

Tolerances. One step differs from the serial one only by float32 summation order
(see test_parallel_pmm: < 1e-6 on O(1) values). AdamW divides the first moment by
sqrt of the second, m / (sqrt(v) + 1e-8), which maps a relative gradient error e to
a relative update error e (no amplification unless |g| ~ 1e-8, where both updates
are ~lr anyway); over 6 steps with lr = 1e-2 the weight error stays ~1e-7 in
practice. ATOL = 2e-5, RTOL = 1e-4 on weights and losses keeps a safe margin while a
wrong gradient (wrong reduction, double-counted replica in the clip norm, missing dp
average) moves weights by ~lr = 1e-2.
"""

from __future__ import annotations

import math

import pytest
import torch

from scalegnn.device import resolve_device
from scalegnn.model import ModelConfig, ScaleGNN, node_loss
from scalegnn.optim import OptimConfig, make_optimizer
from scalegnn.parallel.engine import ParallelEngine, _dropout_seed
from scalegnn.parallel.grid import ProcessGrid
from scalegnn.launch.job import spawn
from scalegnn.sampling import UniformVertexSampler, steps_per_epoch
from tests.devices import DEVICES
from tests.reference import SerialReference
from tests.graphs import nprocs, parallel_graph

pytestmark = pytest.mark.distributed

ATOL, RTOL = 2e-5, 1e-4
STEPS = 6


def _block(t, rows, cols):
    return t[cols[0]:cols[1]] if rows is None else t[rows[0]:rows[1], cols[0]:cols[1]]


def _engine_worker(rank, world, shape, runs, device="cpu"):
    """Each run: build an engine on ``device``, train STEPS steps, evaluate; return results."""
    grid = ProcessGrid(*shape)
    out = []
    for run in runs:
        graph = parallel_graph(**run["graph"])
        eng = ParallelEngine(graph, run["model"], run["optim"], run["batch"], seed=run["seed"], epochs=2, grid=grid,
                             device=resolve_device(device, rank), pmm_comm_dtype=run.get("comm_dtype"))
        steps = [eng.train_step(s) for s in range(run.get("steps", STEPS))]
        components, comm_bytes, _ = eng.counters()
        out.append({
            "steps": [(r.loss, r.correct, r.count) for r in steps],
            "params": eng.parameters_for_test(),
            "eval": eng.evaluate().as_dict(),
            "components": components,
            "comm_bytes": comm_bytes,
            "steps_per_epoch": eng.steps_per_epoch,
            "device": str(eng.device),
        })
        eng.close()
    return out


def _serial_run(run):
    graph = parallel_graph(**run["graph"])
    eng = SerialReference(graph, run["model"], run["optim"], run["batch"], seed=run["seed"], epochs=2)
    steps = [eng.train_step(s) for s in range(run.get("steps", STEPS))]
    return eng, [(r.loss, r.correct, r.count) for r in steps]


def _check_against(results, ref_steps, ref_params, ref_eval=None, name=""):
    for rank, res in enumerate(results):
        for (loss, correct, count), (rl, rc, rn) in zip(res["steps"], ref_steps):
            if rn == 0:
                assert count == 0 and math.isnan(loss), name
                continue
            assert loss == pytest.approx(rl, rel=RTOL, abs=ATOL), (name, rank)
            assert (correct, count) == (rc, rn), (name, rank)
        for pname, p in res["params"].items():
            torch.testing.assert_close(p["value"], _block(ref_params[pname], p["rows"], p["cols"]), atol=ATOL,
                                       rtol=RTOL, msg=lambda m: f"{name} rank {rank} {pname}: {m}")
        if ref_eval is not None:
            for split, acc in ref_eval.items():
                # argmax of logits equal to 1e-6 could flip only for a near tie; none occur
                # in these graphs, so accuracies are compared exactly.
                assert res["eval"][split] == pytest.approx(acc, abs=1e-12), (name, split)


RUNS_1x2x2x2 = [
    dict(name="clip+wd+cosine", graph=dict(seed=0), batch=23, seed=0,
         model=ModelConfig(hidden=10, layers=3, dropout=0.3),
         optim=OptimConfig(lr=1e-2, weight_decay=0.01, schedule="cosine", grad_clip=0.5)),
    dict(name="L4 plain", graph=dict(seed=1), batch=15, seed=3,
         model=ModelConfig(hidden=8, layers=4, dropout=0.0, norm=False),
         optim=OptimConfig(lr=1e-2)),
    dict(name="multilabel", graph=dict(seed=2, multilabel=True), batch=20, seed=1,
         model=ModelConfig(hidden=10, layers=2, dropout=0.2), optim=OptimConfig(lr=1e-2, grad_clip=0.1)),
    dict(name="sparse features", graph=dict(seed=4, f=61, sparse=True), batch=21, seed=5,
         model=ModelConfig(hidden=9, layers=2, dropout=0.1), optim=OptimConfig(lr=1e-2)),
    dict(name="rare labels", graph=dict(seed=0, train=[0, 1]), batch=4, seed=2,  # most samples hold no train vertex
         model=ModelConfig(hidden=6, layers=1, dropout=0.0), optim=OptimConfig(lr=1e-2)),
]


@pytest.mark.parametrize("device", DEVICES)
def test_parallel_engine_steps_equal_serial_reference_1x2x2x2(device):
    """Six whole training steps on 8 ranks: the same loss sequence, accuracy counts,
    updated weights (every shard on every rank) and evaluation as the serial reference
    (on the CPU), whichever device the engine runs on."""
    results = spawn(_engine_worker, 8, (1, 2, 2, 2), RUNS_1x2x2x2, device, timeout_s=300)
    assert all(res["device"].startswith(device) for rank in results for res in rank)
    for i, run in enumerate(RUNS_1x2x2x2):
        eng, ref_steps = _serial_run(run)
        if run["name"] == "rare labels":
            assert any(n == 0 for _, _, n in ref_steps) and any(n > 0 for _, _, n in ref_steps)
        ref_params = {n: p.detach() for n, p in eng.model.named_parameters()}
        _check_against([r[i] for r in results], ref_steps, ref_params, eng.evaluate().as_dict(), run["name"])
    comp, nbytes = results[0][0]["components"], results[0][0]["comm_bytes"]
    assert {"sampling", "spmm", "gemm", "elementwise", "pmm_comm", "optimizer"} <= set(comp)
    assert {"pmm_x", "pmm_y", "pmm_z", "norm", "loss", "reshard", "clip"} <= set(nbytes)
    assert "dp" not in nbytes and "eval" not in nbytes  # Gd = 1; evaluation traffic is kept apart


def _manual_dp_reference(run, gd):
    """Serial reference of data parallelism: per step, each group's gradient on its own
    sample (dp_index = g, its own dropout stream), averaged over the groups whose sample
    has a labeled training vertex; global-norm clip; AdamW."""
    graph = parallel_graph(**run["graph"])
    model = ScaleGNN(graph.num_features, graph.num_classes, run["model"], seed=run["seed"])
    spe = steps_per_epoch(graph.num_nodes, run["batch"], gd)
    opt, sched = make_optimizer(model.parameters(), run["optim"], total_steps=2 * spe)
    samplers = [UniformVertexSampler(graph, run["batch"], seed=run["seed"], dp_index=g) for g in range(gd)]
    steps = []
    for step in range(run.get("steps", STEPS)):
        grads, losses, correct, count = [], [], 0.0, 0
        for g in range(gd):
            b = samplers[g].sample(step)
            model.train()
            model.zero_grad(set_to_none=True)
            logits = model(b.adj, b.adj_t, b.x, b.nodes, _dropout_seed(run["seed"], g), step)
            if not bool(b.train_mask.any()):
                continue
            loss = node_loss(logits, b.y, b.train_mask)
            loss.backward()
            grads.append([p.grad.clone() for p in model.parameters()])
            losses.append(float(loss.detach()))
            correct += float((logits.detach()[b.train_mask].argmax(-1) == b.y[b.train_mask]).sum())
            count += int(b.train_mask.sum())
        if not grads:
            steps.append((float("nan"), 0.0, 0))
            continue
        for i, p in enumerate(model.parameters()):
            p.grad = sum(gr[i] for gr in grads) / len(grads)
        if run["optim"].grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), run["optim"].grad_clip)
        opt.step()
        if sched is not None:
            sched.step()
        steps.append((sum(losses) / len(losses), correct, count))
    return model, steps, spe


RUNS_DP = [
    dict(name="dp clip", graph=dict(seed=0), batch=12, seed=0, model=ModelConfig(hidden=10, layers=2, dropout=0.3),
         optim=OptimConfig(lr=1e-2, weight_decay=0.01, grad_clip=0.3)),
    dict(name="dp rare labels", graph=dict(seed=1, train=[0, 1, 2]), batch=5, seed=4,
         model=ModelConfig(hidden=6, layers=3, dropout=0.0), optim=OptimConfig(lr=1e-2)),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(2, 2, 1, 1), (2, 1, 1, 2)], ids=lambda s: "x".join(map(str, s)))
def test_data_parallel_engine_averages_group_gradients(shape, device):
    results = spawn(_engine_worker, nprocs(shape), shape, RUNS_DP, device, timeout_s=300)
    for i, run in enumerate(RUNS_DP):
        model, ref_steps, spe = _manual_dp_reference(run, shape[0])
        ref_params = {n: p.detach() for n, p in model.named_parameters()}
        _check_against([r[i] for r in results], ref_steps, ref_params, name=run["name"])
        assert all(r[i]["steps_per_epoch"] == spe for r in results)  # ceil(ceil(N/B)/Gd)
    assert "dp" in results[0][0]["comm_bytes"]


def test_bf16_communication_trains_close_to_fp32():
    """BF16 partial sums (relative rounding 2^-8) perturb each step by ~1e-2 relative;
    the loss sequence must stay within 5e-2 of the FP32 one over 6 steps."""
    base = dict(graph=dict(seed=0), batch=23, seed=0, model=ModelConfig(hidden=10, layers=3, dropout=0.0),
                optim=OptimConfig(lr=1e-2))
    runs = [dict(base, name="fp32"), dict(base, name="bf16", comm_dtype=torch.bfloat16)]
    res = spawn(_engine_worker, 4, (1, 2, 1, 2), runs, timeout_s=120)[0]
    fp32, bf16 = [l for l, _, _ in res[0]["steps"]], [l for l, _, _ in res[1]["steps"]]
    assert fp32 != bf16
    assert bf16 == pytest.approx(fp32, abs=5e-2)
    assert res[1]["comm_bytes"]["pmm_x"] * 2 == res[0]["comm_bytes"]["pmm_x"]


def test_a_local_job_writes_one_record_that_matches_the_serial_run(tmp_path):
    """The training loop on 4 spawned gloo ranks (--nproc 4) writes one record whose
    per-epoch losses equal the serial run's (tolerance as above), with 3D-PMM byte counts."""
    from scalegnn.config import make_config
    from scalegnn.launch import launch

    base = dict(dataset="csbm:n=300,avg_degree=6,classes=3,feature_dim=8", batch_ratio=0.3, epochs=2,
                out_dir=str(tmp_path / "runs"), progress=False, data_root=str(tmp_path / "data"),
                model=ModelConfig(hidden=8, layers=2, dropout=0.2))
    serial = launch(make_config(**base))
    par = launch(make_config(grid=(1, 2, 1, 2), nproc=4, **base), timeout_s=180)
    assert par["status"] == "ok" and par["world_size"] == 4 and par["env"]["backend"] == "gloo"
    assert [r["loss"] for r in par["epochs"]] == pytest.approx([r["loss"] for r in serial["epochs"]], rel=RTOL)
    assert par["epochs"][-1]["test_acc"] == pytest.approx(serial["epochs"][-1]["test_acc"], abs=1e-12)
    assert par["epochs"][0]["comm_bytes"]["pmm_x"] > 0 and len(par["peak_memory_bytes_per_rank"]) == 4
    calls = par["epochs"][-1]["comm_calls"]  # calls per kind beside the bytes; none in one process
    assert set(calls) == set(par["epochs"][-1]["comm_bytes"]) and serial["epochs"][-1]["comm_calls"] == {}
    assert par["summary"]["comm_calls_per_step"] == {k: v / par["steps_per_epoch"] for k, v in sorted(calls.items())}
    with pytest.raises(ValueError, match="--nproc 3 does not match the grid 1x2x1x2"):
        launch(make_config(grid=(1, 2, 1, 2), nproc=3, **base))
