"""The ``--compile`` training step (scalegnn/_compiled.py; paper V-C) as a whole:

* no frame compiles once the engine's warm-up is done: training steps and the full-graph
  evaluation run only graphs the warm-up built (Dynamo's counters), on one process with
  inductor and on grids whose layers see different column slices of H (the RMSNorm gains
  of several sizes); a planted recompile (the gain handed to the graph as the
  ``nn.Parameter`` it is, whose sizes Dynamo guards as static) is caught;
* the kernels one step launches (scalegnn.benchmarks.op_count: torch.profiler, each
  compiled kernel counted as one) stay within the budget a GPU step needs at L = 3:
  forward <= 40, backward <= 30, and no operator on a 2-D int64 tensor (the dropout
  hash) outside a compiled kernel; the eager torch path (what a GPU ran before, without
  numba) is over both budgets and hashes in 2-D int64 operators, so the budgets tell the
  two apart.
"""

from __future__ import annotations

import pytest
import torch

from scalegnn import _compiled
from scalegnn import _elementwise as ew
from scalegnn.benchmarks import op_count
from scalegnn.launch.job import spawn
from scalegnn.model import ModelConfig
from scalegnn.optim import OptimConfig
from scalegnn.parallel.engine import ParallelEngine
from scalegnn.parallel.grid import ProcessGrid
from scalegnn.perf import PerfConfig
from tests.devices import DEVICES
from tests.graphs import parallel_graph


def _compiles() -> tuple[int, int]:
    """(frames Dynamo converted, graphs it built) so far in this process."""
    from torch._dynamo.utils import counters

    return counters["frames"]["total"], counters["stats"]["unique_graphs"]


def _run_after_warm_up(shape=(1, 1, 1, 1), backend="inductor", multilabel=False, dropout=0.5,
                       device="cpu", norm_position="post") -> dict:
    """Build a compiled engine (its warm-up compiles), then train 3 steps, evaluate and
    train once more; the compiles before and after the warm-up."""
    torch._dynamo.reset()
    before = _compiles()
    eng = ParallelEngine(parallel_graph(n=90, m=500, seed=2, multilabel=multilabel),
                         ModelConfig(hidden=12, layers=3, dropout=dropout, norm_position=norm_position),
                         OptimConfig(lr=1e-2), 31, seed=1,
                         epochs=2, grid=ProcessGrid(*shape) if shape != (1, 1, 1, 1) else ProcessGrid.single(),
                         perf=PerfConfig(compile=True, compile_backend=backend, prefetch=True), device=device)
    try:
        warmed = _compiles()
        for step in range(3):
            eng.train_step(step)
        eng.evaluate()
        eng.train_step(3)
        after = _compiles()
    finally:
        eng.close()
    return {"warm_up": (warmed[0] - before[0], warmed[1] - before[1]),
            "after": (after[0] - warmed[0], after[1] - warmed[1]), "fallback": eng.compile_fallback}


def _grid_worker(rank, world, shape, backend):
    return _run_after_warm_up(shape, backend)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("multilabel,dropout,norm_position", [(False, 0.5, "post"), (True, 0.0, "post"),
                                                                (False, 0.5, "pre")],
                         ids=["single-label", "multi-label, p=0", "pre-norm"])
def test_no_frame_compiles_after_the_warm_up(multilabel, dropout, norm_position, device):
    """Inductor's kernels: C++ on the CPU, Triton on a GPU (a prefetching side stream);
    with the pre-norm the tail runs without its norm, and the warm-up compiles that."""
    res = _run_after_warm_up(backend="inductor", multilabel=multilabel, dropout=dropout, device=device,
                             norm_position=norm_position)
    assert res["fallback"] is None
    assert res["warm_up"][1] > 0  # the warm-up compiled the phases
    assert res["after"] == (0, 0)


@pytest.mark.parametrize("shape", [(1, 2, 1, 1), (1, 1, 2, 2)], ids=["1x2x1x1", "1x1x2x2"])
def test_no_frame_compiles_after_the_warm_up_on_a_grid(shape):
    """Layers whose column axis is split see H_col = H / 2, the others H: gains (and
    blocks) of several sizes, each a compile if a graph took sizes as static."""
    for res in spawn(_grid_worker, shape[1] * shape[2] * shape[3], shape, "aot_eager", timeout_s=300):
        assert res["warm_up"][1] > 0 and res["after"] == (0, 0), res


def test_the_check_catches_a_recompile_in_training(monkeypatch):
    """Planted: the phases see the RMSNorm gain as the nn.Parameter it is (no detach);
    Dynamo guards a parameter's sizes as static, so the warm-up's gain (7 columns) does
    not serve training's (12): training compiles again, and the check sees it."""
    monkeypatch.setattr(_compiled, "_detaching", lambda fn: fn)
    monkeypatch.setattr(_compiled.CompiledKernels, "_compiled", {})
    res = _run_after_warm_up(backend="aot_eager")
    assert res["after"][0] > 0


# ----------------------------------------------------------------------------- kernels per step
def _step_counts(compile_backend, monkeypatch) -> dict:
    if compile_backend is None:  # the torch kernels: a GPU's eager path
        monkeypatch.setattr(ew, "_ENABLED", False)
    return op_count.step_counts(layers=3, compile_backend=compile_backend, nodes=1500, hidden=32, sampler="torch")


def test_a_compiled_step_launches_within_the_gpu_budget(monkeypatch):
    counts = _step_counts("inductor", monkeypatch)
    fwd, bwd = counts["forward"], counts["backward"]
    assert fwd.total <= 40, fwd.ops
    assert bwd.total <= 30, bwd.ops
    assert not fwd.int64_2d and not bwd.int64_2d, (fwd.int64_2d, bwd.int64_2d)
    # per layer (3): sum of squares and the tail forward; backward's two phases
    assert fwd.fused_kernels >= 6 and bwd.fused_kernels >= 6


def test_the_eager_torch_step_is_over_the_budget(monkeypatch):
    """The budgets discriminate: the eager torch kernels (the path a GPU ran before
    --compile hashed the mask in its kernel) exceed both and hash in 2-D int64 ops."""
    counts = _step_counts(None, monkeypatch)
    fwd, bwd = counts["forward"], counts["backward"]
    assert fwd.total > 40 and bwd.total > 30
    assert sum(fwd.int64_2d.values()) >= 3 * 10  # each layer's hash: about a dozen int64 (B, H) passes
    assert fwd.fused_kernels == 0
