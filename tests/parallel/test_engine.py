"""The engine (scalegnn/parallel/engine.py) against the serial reference (tests/reference.py):
whole training steps (loss, accuracy counts, updated weights), data-parallel averaging,
clipping, evaluation; its switches; the row-sparse input update; plane sharing.

Tolerances. One step differs from the serial one only by float32 summation order
(see tests/parallel/test_model.py: < 1e-6 on O(1) values). AdamW divides the first
moment by sqrt of the second, m / (sqrt(v) + 1e-8), which maps a relative gradient
error e to a relative update error e (no amplification unless |g| ~ 1e-8, where both
updates are ~lr anyway); over 6 steps with lr = 1e-2 the weight error stays ~1e-7 in
practice. ATOL = 2e-5, RTOL = 1e-4 on weights and losses keeps a safe margin while a
wrong gradient (wrong reduction, double-counted replica in the clip norm, missing dp
average) moves weights by ~lr = 1e-2.

The switches (paper V) leave the trained result unchanged. Bit-identical where the
arithmetic is identical: prefetching (background thread) and communication overlap
(asynchronous all-reduces of the same partial sums) give the same losses and weights;
BF16 + overlap + prefetch equals BF16 alone. Within a stated tolerance where it is
not: BF16 3D-PMM communication (relative rounding 2^-8 per partial sum, losses within
5e-2 over 4 steps; its PMM bytes halve exactly); fusion (``compile``): the fused RMSNorm
+ ReLU + dropout's backward is autograd's instead of the hand-written one, a float32
reordering: weights within 1e-5. Tests compile with the "aot_eager" backend (the same
graphs without inductor's code generation, seconds instead of a minute); ``scalegnn
bench ablation`` runs inductor. Timings are never asserted.

The row-sparse input update (``--sparse-input-update``): with the setting off the engine
runs today's path (plain fused AdamW, dense dW); the 8-rank 1x2x2x2 engine equals the
single process with the setting on (float summation order only), with clipping, weight
decay, a cosine schedule and the deferred gradient all-reduce; on 2 data-parallel
groups it equals a serial reference of the union rule; a checkpoint of the optimizer
state round-trips: resumed == uninterrupted, bit for bit.
"""

from __future__ import annotations

import io
import math
import threading

import pytest
import torch

from scalegnn import optim as so
from scalegnn.device import resolve_device
from scalegnn.launch.job import spawn
from scalegnn.model import ModelConfig, ScaleGNN, node_loss
from scalegnn.numerics import NumericsConfig
from scalegnn.optim import OptimConfig, make_optimizer
from scalegnn.parallel.engine import COMPONENTS, ParallelEngine, _dropout_seed
from scalegnn.parallel.grid import ProcessGrid
from scalegnn.parallel.sharding import build_shard
from scalegnn.perf import PerfConfig
from scalegnn.rowsparse import row_sparse_grad
from scalegnn.sampling import UniformVertexSampler, steps_per_epoch
from tests.devices import DEVICES
from tests.graphs import grid_id, nprocs, parallel_graph, unshared_shard
from tests.reference import SerialReference


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
    dict(name="pre-norm L4", graph=dict(seed=3), batch=19, seed=4,  # the norm on each layer's input layout
         model=ModelConfig(hidden=10, layers=4, dropout=0.3, norm_position="pre"),
         optim=OptimConfig(lr=1e-2, grad_clip=0.5)),
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


def test_reset_counters_restores_the_calls_of_a_partial_epoch():
    """A checkpoint's partial epoch gives its calls back with its bytes (one process: no
    collective adds to them)."""
    from scalegnn.parallel.engine import ParallelEngine

    eng = ParallelEngine(parallel_graph(), ModelConfig(hidden=4, layers=1), OptimConfig(), 8)
    eng.reset_counters({"spmm": 1.0}, {"pmm_x": 10}, {"pmm_x": 2})
    eng.train_step(0)
    _, nbytes, calls = eng.counters()
    assert nbytes == {"pmm_x": 10} and calls == {"pmm_x": 2}
    eng.reset_counters()
    assert eng.counters()[1:] == ({}, {})
    eng.close()


# ----------------------------------------------------------------------------- switches
def test_single_process_prefetch_gives_identical_training_and_leaves_no_thread(tmp_path):
    from scalegnn.config import make_config
    from scalegnn.launch import launch

    before = {t.ident for t in threading.enumerate()}
    base = dict(dataset="csbm:n=400,avg_degree=6,classes=3,feature_dim=8", batch_ratio=0.3, epochs=2,
                out_dir=str(tmp_path), progress=False, data_root=str(tmp_path / "data"),
                model=ModelConfig(hidden=8, layers=2, dropout=0.3))
    plain = launch(make_config(**base))
    pre = launch(make_config(**base, perf=PerfConfig(prefetch=True)))
    assert [r["loss"] for r in pre["epochs"]] == [r["loss"] for r in plain["epochs"]]  # across the epoch boundary
    assert pre["epochs"][-1]["test_acc"] == plain["epochs"][-1]["test_acc"]
    assert pre["config"]["perf"]["prefetch"] is True and pre["compile_time_s"] == 0.0
    assert set(pre["epochs"][0]["components"]) == set(COMPONENTS)
    assert {t.ident for t in threading.enumerate()} <= before  # no orphan prefetch thread


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
def test_a_padded_training_step_equals_the_unpadded_one(sparse, device):
    """Training on batches padded to their capacity (what a GPU run samples: explicit
    zeros after the kept entries) gives the losses and weights of the unpadded batches,
    bit for bit, step after step; the torch sampler both ways, on the same device."""
    runs = {}
    for padded in (False, True):
        eng = ParallelEngine(parallel_graph(n=200, m=1500, seed=4, sparse=sparse),
                             ModelConfig(hidden=12, layers=3, dropout=0.3), OptimConfig(lr=1e-2, grad_clip=1.0),
                             30, seed=5, pad_samples=padded, perf=PerfConfig(sampler="torch"),
                             device=resolve_device(device))
        assert eng.sampler.padded is padded
        losses = [eng.train_step(s).stats.tolist() for s in range(4)]
        runs[padded] = (losses, [p.detach().clone() for p in eng.model.parameters()], eng.sampler.overflows)
        eng.close()
    assert runs[True][0] == runs[False][0]
    assert all(torch.equal(a, b) for a, b in zip(runs[True][1], runs[False][1]))
    assert runs[True][2] == 0


# ------------------------------------------------------------------------------ parallel switches
SWITCH_STEPS = 4
_BASE = dict(model=ModelConfig(hidden=10, layers=3, dropout=0.3), optim=OptimConfig(lr=1e-2, grad_clip=0.5))
_NORES = dict(model=ModelConfig(hidden=10, layers=3, dropout=0.3, residual=False), optim=OptimConfig(lr=1e-2))
_PRE = dict(model=ModelConfig(hidden=10, layers=3, dropout=0.3, norm_position="pre"),
            optim=OptimConfig(lr=1e-2, grad_clip=0.5))
SWITCH_RUNS = {  # name: (model and optimizer, the engine's perf and numerics sections)
    "base": (_BASE, dict(perf=PerfConfig())),
    "prefetch": (_BASE, dict(perf=PerfConfig(prefetch=True))),
    "overlap": (_BASE, dict(perf=PerfConfig(comm_overlap=True))),
    "bf16": (_BASE, dict(numerics=NumericsConfig(comm_dtype="bf16"))),
    "bf16+overlap+prefetch": (_BASE, dict(numerics=NumericsConfig(comm_dtype="bf16"),
                                          perf=PerfConfig(comm_overlap=True, prefetch=True))),
    "gemm-bf16": (_BASE, dict(numerics=NumericsConfig(gemm_dtype="bf16"))),
    "compile": (_BASE, dict(perf=PerfConfig(compile=True, compile_backend="aot_eager"))),
    "uninstrumented": (_BASE, dict(perf=PerfConfig(instrument=False))),
    "double": (_NORES, dict(numerics=NumericsConfig(permute="double"))),
    "pre-norm": (_PRE, dict(perf=PerfConfig())),
    "pre-norm, overlap": (_PRE, dict(perf=PerfConfig(comm_overlap=True))),
    "pre-norm, compile": (_PRE, dict(perf=PerfConfig(compile=True, compile_backend="aot_eager"))),
}


def _switch_worker(rank, world, shape):
    import time

    from scalegnn.parallel.engine import ParallelEngine
    from scalegnn.parallel.grid import ProcessGrid

    grid = ProcessGrid(*shape)
    out = {}
    for name, (cfg, sections) in SWITCH_RUNS.items():
        eng = ParallelEngine(parallel_graph(seed=0), cfg["model"], cfg["optim"], 23, seed=0, epochs=2, grid=grid,
                             **sections)
        t0 = time.perf_counter()
        steps = [eng.train_step(s) for s in range(SWITCH_STEPS)]
        wall = time.perf_counter() - t0
        eng.close()
        out[name] = {"steps": [(r.loss, r.correct, r.count) for r in steps], "wall": wall,
                     "params": {k: v["value"] for k, v in eng.parameters_for_test().items()},
                     "shards": {k: (v["rows"], v["cols"]) for k, v in eng.parameters_for_test().items()},
                     "bytes": dict(eng.comm_bytes), "components": dict(eng.components),
                     "compile_time_s": eng.compile_time_s, "eval": eng.evaluate().as_dict(),
                     "threads": threading.active_count()}
    return out


@pytest.mark.distributed
def test_parallel_switches_leave_training_unchanged():
    from scalegnn.launch.job import spawn

    results = spawn(_switch_worker, 4, (1, 2, 1, 2), timeout_s=240)
    for res in results:
        base = res["base"]

        def identical(name):
            other = res[name]
            assert other["steps"] == base["steps"], name
            assert all(torch.equal(other["params"][k], v) for k, v in base["params"].items()), name

        identical("prefetch")
        identical("overlap")
        identical("uninstrumented")
        # BF16: PMM bytes exactly half, every other kind unchanged; close losses; switches on top identical.
        bf = res["bf16"]
        for kind, nbytes in base["bytes"].items():
            assert bf["bytes"][kind] * (2 if kind.startswith("pmm_") else 1) == nbytes, kind
        assert [s[0] for s in bf["steps"]] == pytest.approx([s[0] for s in base["steps"]], abs=5e-2)
        # BF16 GEMM operands: the same collectives and bytes, close but different losses.
        gb = res["gemm-bf16"]
        assert gb["bytes"] == base["bytes"]
        assert [s[0] for s in gb["steps"]] == pytest.approx([s[0] for s in base["steps"]], abs=5e-2)
        assert gb["steps"] != base["steps"]
        combo = res["bf16+overlap+prefetch"]
        assert combo["steps"] == bf["steps"]
        assert all(torch.equal(combo["params"][k], v) for k, v in bf["params"].items())
        # Fusion: same math, autograd's backward: float32 reordering only.
        comp = res["compile"]
        assert comp["compile_time_s"] > 0
        for k, v in base["params"].items():
            torch.testing.assert_close(comp["params"][k], v, atol=1e-5, rtol=1e-5)
        # Instrumentation: the components partition the step time; off, no compute timer runs.
        c = base["components"]
        assert set(c) == {"sampling", "spmm", "gemm", "elementwise", "pmm_comm", "dp_comm", "optimizer", "other"}
        assert 0 < sum(c.values()) <= base["wall"] * 1.05 + 1e-3
        off = res["uninstrumented"]["components"]
        assert off["spmm"] == off["gemm"] == off["pmm_comm"] == 0.0
        assert res["uninstrumented"]["bytes"] == base["bytes"]  # bytes are always counted
        assert res["base"]["threads"] == res["prefetch"]["threads"]  # the prefetch thread was stopped
        # Pre-norm (another model): its gains' deferred, bucketed reductions change no bit; compiled
        # tails without a norm round as the eager ones up to float32 reordering.
        pre = res["pre-norm"]
        assert pre["steps"] != base["steps"]
        assert res["pre-norm, overlap"]["steps"] == pre["steps"]
        assert all(torch.equal(res["pre-norm, overlap"]["params"][k], v) for k, v in pre["params"].items())
        for k, v in pre["params"].items():
            torch.testing.assert_close(res["pre-norm, compile"]["params"][k], v, atol=1e-5, rtol=1e-5)
    # Double permutation (no residual): equal to the serial reference on the same (P_c-relabeled) graph.
    ser = SerialReference(parallel_graph(seed=0), _NORES["model"], _NORES["optim"], 23, seed=0, epochs=2)
    ref = [ser.train_step(s) for s in range(SWITCH_STEPS)]
    full = {n: p.detach() for n, p in ser.model.named_parameters()}
    for res in results:
        dbl = res["double"]
        assert [s[0] for s in dbl["steps"]] == pytest.approx([r.loss for r in ref], abs=2e-5, rel=1e-4)
        for k, v in dbl["params"].items():
            rows, cols = dbl["shards"][k]
            want = full[k][cols[0]:cols[1]] if rows is None else full[k][rows[0]:rows[1], cols[0]:cols[1]]
            torch.testing.assert_close(v, want, atol=2e-5, rtol=1e-4)
        assert dbl["eval"] == pytest.approx(ser.evaluate().as_dict(), abs=1e-12)


def test_double_permutation_needs_no_residual():
    from scalegnn.parallel.engine import ParallelEngine
    from scalegnn.parallel.grid import ProcessGrid

    with pytest.raises(ValueError, match="--no-residual"):
        ParallelEngine(parallel_graph(), ModelConfig(hidden=8), OptimConfig(), 10, grid=ProcessGrid.single(),
                       numerics=NumericsConfig(permute="double"))


def test_compile_time_is_recorded_apart_and_profile_writes_a_trace(tmp_path):
    import json

    from scalegnn.config import make_config
    from scalegnn.launch import launch

    base = dict(dataset="csbm:n=300,avg_degree=6,classes=3,feature_dim=8", batch_ratio=0.1, epochs=1,
                out_dir=str(tmp_path), progress=False, data_root=str(tmp_path / "data"),
                model=ModelConfig(hidden=8, layers=2, dropout=0.2))
    plain = launch(make_config(**base))
    fused = launch(make_config(**base, perf=PerfConfig(compile=True, compile_backend="aot_eager",
                                                           profile=str(tmp_path / "prof"))))
    assert fused["compile_time_s"] > 0 and plain["compile_time_s"] == 0.0
    assert fused["epochs"][0]["loss"] == pytest.approx(plain["epochs"][0]["loss"], rel=1e-5)
    assert fused["epochs"][0]["test_acc"] == plain["epochs"][0]["test_acc"]
    trace = json.loads((tmp_path / "prof" / "trace_rank0.json").read_text())
    assert trace["traceEvents"]


# ----------------------------------------------------------------------------- the row-sparse input update
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


# ----------------------------------------------------------------------------- planes that share storage
RUN = dict(model=ModelConfig(hidden=10, layers=3, dropout=0.2), optim=OptimConfig(lr=1e-2, grad_clip=0.5), batch=17)


def _shared_vs_unshared_worker(rank, world, shape, steps):
    grid = ProcessGrid(*shape)
    graph = parallel_graph(n=41, m=170)
    shard = build_shard(graph, shape, grid.coords)
    out = []
    for s in (shard, unshared_shard(shard)):
        eng = ParallelEngine(None, RUN["model"], RUN["optim"], RUN["batch"], seed=3, epochs=2, grid=grid, shard=s)
        results = [eng.train_step(step) for step in range(steps)]
        out.append({"steps": [(r.loss, r.correct, r.count) for r in results], "eval": eng.evaluate().as_dict(),
                    "params": {k: v["value"] for k, v in eng.parameters_for_test().items()},
                    "storage": s.adjacency_storage()})
        eng.close()
    return out


@pytest.mark.distributed
@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (1, 2, 1, 1), (1, 2, 2, 1), (1, 2, 2, 2)], ids=grid_id)
def test_training_on_shared_planes_equals_training_on_separate_copies(shape):
    """Steps, evaluation and every parameter shard after the steps: bit for bit."""
    for shared, unshared in spawn(_shared_vs_unshared_worker, nprocs(shape), shape, 4, timeout_s=180):
        assert shared["steps"] == unshared["steps"] and shared["eval"] == unshared["eval"]
        assert shared["params"].keys() == unshared["params"].keys()
        assert all(torch.equal(shared["params"][k], unshared["params"][k]) for k in shared["params"])
        assert shared["storage"]["bytes"] <= unshared["storage"]["bytes"]
        if shape == (1, 1, 1, 1):
            assert shared["storage"]["blocks"] == 1 and 3 * shared["storage"]["bytes"] == unshared["storage"]["bytes"]
