"""One training step (sample + forward + backward + AdamW) in one process: the engine
on the 1x1x1x1 grid, plain and with every paper-V switch that applies to one
process. Multi-rank grids: ``scalegnn bench steps`` and ``scalegnn bench ablation``
(gloo processes; docs/benchmarks.md)."""

import itertools

import pytest

from scalegnn.model import ModelConfig
from scalegnn.optim import OptimConfig
from scalegnn.perf import PerfConfig

_steps = itertools.count()


@pytest.fixture(scope="module")
def graph():
    from scalegnn.config import make_config
    from scalegnn.trainer import prepare_graph

    return prepare_graph(make_config(dataset="csbm:n=50000,avg_degree=10,feature_dim=64", progress=False))


CFG = ModelConfig(hidden=128, layers=3)


@pytest.mark.benchmark(group="step")
@pytest.mark.parametrize("perf", [PerfConfig(), PerfConfig(prefetch=True), PerfConfig(compile=True)],
                         ids=["plain", "prefetch", "compile"])
def test_parallel_engine_single_grid_step(benchmark, graph, perf):
    from scalegnn.parallel.engine import ParallelEngine

    eng = ParallelEngine(graph, CFG, OptimConfig(), 5000, perf=perf)
    benchmark.extra_info["compile_time_s"] = eng.compile_time_s
    benchmark(lambda: eng.train_step(next(_steps)))
    eng.close()
