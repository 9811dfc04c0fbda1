"""Paper V switches and the sampler kernels: each leaves the trained result unchanged.

Bit-identical where the arithmetic is identical:
  * sampler kernels (numba / vectorized torch, tagged map / binary search, int32 /
    int64 ids) produce the same CSR pair, entry for entry, value for value;
  * the sample draw is the same with and without numba;
  * prefetching (background thread) and communication overlap (asynchronous
    all-reduces of the same partial sums) give the same losses and weights;
  * BF16 + overlap + prefetch equals BF16 alone.
Within a stated tolerance where it is not:
  * BF16 3D-PMM communication: relative rounding 2^-8 per partial sum, losses within
    5e-2 over 4 steps (as tests/test_parallel_engine.py); its PMM bytes halve exactly;
  * fusion (``compile``): the fused RMSNorm + ReLU + dropout's backward is autograd's
    instead of the hand-written one, a float32 reordering: weights within 1e-5.
    Tests compile with the "aot_eager" backend (the same graphs without inductor's
    code generation, seconds instead of a minute); ``scalegnn bench ablation`` runs inductor.
Timings are never asserted.
"""

from __future__ import annotations

import threading

import pytest
import torch

from scalegnn import _sampling_kernel
from scalegnn.model import ModelConfig
from scalegnn.numerics import NumericsConfig
from scalegnn.optim import OptimConfig
from scalegnn.parallel.engine import COMPONENTS
from scalegnn.perf import PerfConfig
from tests.graphs import parallel_graph
from tests.reference import SerialReference


needs_numba = pytest.mark.skipif(not _sampling_kernel.available(), reason="numba not installed")


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


# ------------------------------------------------------------------------------ parallel switches
STEPS = 4
_BASE = dict(model=ModelConfig(hidden=10, layers=3, dropout=0.3), optim=OptimConfig(lr=1e-2, grad_clip=0.5))
_NORES = dict(model=ModelConfig(hidden=10, layers=3, dropout=0.3, residual=False), optim=OptimConfig(lr=1e-2))
RUNS = {  # name: (model and optimizer, the engine's perf and numerics sections)
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
}


def _switch_worker(rank, world, shape):
    import time

    from scalegnn.parallel.engine import ParallelEngine
    from scalegnn.parallel.grid import ProcessGrid

    grid = ProcessGrid(*shape)
    out = {}
    for name, (cfg, sections) in RUNS.items():
        eng = ParallelEngine(parallel_graph(seed=0), cfg["model"], cfg["optim"], 23, seed=0, epochs=2, grid=grid,
                             **sections)
        t0 = time.perf_counter()
        steps = [eng.train_step(s) for s in range(STEPS)]
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
    # Double permutation (no residual): equal to the serial reference on the same (P_c-relabeled) graph.
    ser = SerialReference(parallel_graph(seed=0), _NORES["model"], _NORES["optim"], 23, seed=0, epochs=2)
    ref = [ser.train_step(s) for s in range(STEPS)]
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


# ------------------------------------------------------------------------------ loop, record, CLI
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
