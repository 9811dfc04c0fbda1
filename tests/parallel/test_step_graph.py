"""``--cuda-graphs`` (scalegnn/parallel/step_graph.py): the training step captured once
per batch capacity and replayed.

No CUDA graph can be captured on a CPU, so the captured path is held to the eager one
through :class:`tests.graph_replay.RecordedGraph`: the capture records the step's ATen
operators and a replay runs exactly those on the same tensors, skipping every line of
Python, as a CUDA graph does. A replayed run that equals the eager run bit for bit
therefore reads its batch, its step index and its learning rate from the tensors the
graph reads, not from host values frozen at the capture; the planted controls show the
emulation catching both kinds of defect (a host int baked in, a host read). Both runs
take the torch path of the layer tail (the CPU's numba kernels are not ATen operators)
and the padded torch sampler, as a GPU run does. Bit for bit is the claim: the same
operators on the same values in the same order.
"""

from __future__ import annotations

import logging

import pytest
import torch

from scalegnn import _elementwise
from scalegnn.model import ModelConfig, dropout_key
from scalegnn.optim import OptimConfig
from scalegnn.parallel import engine as engine_module
from scalegnn.parallel import model as parallel_model
from scalegnn.parallel import step_graph
from scalegnn.parallel.engine import ParallelEngine
from scalegnn.parallel.step_graph import (StepGraphs, batch_signature, capture_obstacle, clone_batch,
                                          copy_batch_)
from scalegnn.perf import PerfConfig
from tests.devices import needs_gpu
from tests.graph_replay import RecordedGraph
from tests.graphs import parallel_graph

STEPS = 6


@pytest.fixture
def torch_path(monkeypatch):
    """The GPU's layer tail (torch operators) on the CPU."""
    monkeypatch.setattr(_elementwise, "_ENABLED", False)


@pytest.fixture
def emulated(monkeypatch, torch_path):
    """CUDA graphs emulated on the CPU by operator replay."""
    backend = lambda device: RecordedGraph  # noqa: E731
    monkeypatch.setattr(step_graph, "graph_backend", backend)
    monkeypatch.setattr(engine_module, "graph_backend", backend)


def _engine(cuda_graphs: bool, schedule: str = "cosine", dropout: float = 0.3):
    return ParallelEngine(parallel_graph(n=160, m=1200, seed=3), ModelConfig(hidden=12, layers=3, dropout=dropout),
                          OptimConfig(lr=1e-2, grad_clip=1.0, weight_decay=1e-2, schedule=schedule), 40, seed=7,
                          epochs=3, pad_samples=True, perf=PerfConfig(sampler="torch", cuda_graphs=cuda_graphs))


def _train(eng, steps=STEPS):
    stats = [eng.train_step(s).stats.tolist() for s in range(steps)]
    params = [p.detach().clone() for p in eng.model.parameters()]
    eng.close()
    return stats, params


def _same(a, b) -> bool:
    return a[0] == b[0] and all(torch.equal(x, y) for x, y in zip(a[1], b[1]))


def test_a_replayed_step_equals_the_eager_step_bit_for_bit(emulated):
    """Dropout keyed by the step, a cosine schedule, clipping and weight decay: every
    replay reads a new step index, a new learning rate and a new batch from the
    graph's tensors; losses, accuracy counts and weights equal the eager run's."""
    eager = _train(_engine(False))
    eng = _engine(True)
    assert eng.graphs is not None and isinstance(eng.optimizer.param_groups[0]["lr"], torch.Tensor)
    captured = _train(eng)
    assert _same(captured, eager)
    rec = eng.cuda_graphs_record()
    assert rec["fallback"] is None and rec["eager_steps"] == 1  # the warm-up step
    assert rec["replays"] == STEPS - 1
    assert rec["captures"] == 1  # the held capacity's room (1 % + 8 sd) covers the samples' variation


def test_a_step_index_frozen_on_the_host_is_caught(emulated, monkeypatch):
    """Control: a capture that reads the step as a host int (what the dropout key did
    before it took a device scalar) replays the captured step's dropout mask at every
    step, and the emulation shows it: the run no longer equals the eager one."""
    eager = _train(_engine(False))
    real = StepGraphs._capture

    def frozen(self, batch, signature, step):
        body = self.body
        self.body = lambda b, _: body(b, step)  # the host int, not self.step_index
        try:
            real(self, batch, signature, step)
        finally:
            self.body = body

    monkeypatch.setattr(StepGraphs, "_capture", frozen)
    assert not _same(_train(_engine(True)), eager)


def test_a_host_read_in_the_step_falls_back_to_eager_with_one_line(emulated, monkeypatch, caplog):
    """A host read inside the step (planted in the dropout key) makes the capture fail:
    one warning line says why, the record keeps it, and the run goes on eagerly with
    the eager run's results."""
    eager = _train(_engine(False))
    monkeypatch.setattr(parallel_model, "dropout_key",
                        lambda seed, step, layer: dropout_key(seed, int(step), layer))  # int(): a host read
    eng = _engine(True)
    with caplog.at_level(logging.WARNING):
        run = _train(eng)
    assert _same(run, eager)
    rec = eng.cuda_graphs_record()
    assert "the capture failed" in rec["fallback"] and "_local_scalar_dense" in rec["fallback"]
    assert rec["replays"] == 0 and rec["eager_steps"] == STEPS
    lines = [r.getMessage() for r in caplog.records if "--cuda-graphs" in r.getMessage()]
    assert len(lines) == 1 and "\n" not in lines[0]


def test_a_larger_capacity_is_captured_again_and_trains_the_same(emulated):
    """A block that overflows its capacity (planted: the room of a sample shrunk to a
    third) is drawn again with more room; the held capacity grows, the step is captured
    again at it, and training still equals the eager run."""
    eager = _train(_engine(False))
    eng = _engine(True)
    stats = [eng.train_step(0).stats.tolist()]  # the eager warm-up
    eng.sampler.slack = 1 / 3
    eng.sampler._held.clear()  # step 1 is captured at a third of the room
    stats.append(eng.train_step(1).stats.tolist())
    eng.sampler.slack = 1.0  # the next samples need more than the held capacity
    stats += [eng.train_step(s).stats.tolist() for s in range(2, STEPS)]
    assert eng.graphs.captures >= 2 and eng.graphs.fallback is None
    params = [p.detach().clone() for p in eng.model.parameters()]
    eng.close()
    assert _same((stats, params), eager)


def test_loading_a_state_drops_the_capture_and_keeps_a_device_learning_rate(emulated):
    """A state load replaces the optimizer's tensors: the capture is dropped and made
    again, the learning rate stays a tensor the schedule fills, and the resumed run
    equals the uninterrupted one."""
    whole = _train(_engine(True))
    first = _engine(True)
    for s in range(3):
        first.train_step(s)
    state = first.state_dict()
    first.close()
    resumed = _engine(True)
    resumed.load_state_dict(state)
    assert isinstance(resumed.optimizer.param_groups[0]["lr"], torch.Tensor)
    stats = [resumed.train_step(s).stats.tolist() for s in range(3, STEPS)]
    params = [p.detach().clone() for p in resumed.model.parameters()]
    assert resumed.graphs.captures == 1 and resumed.graphs.eager_steps == 1
    resumed.close()
    assert stats == whole[0][3:] and all(torch.equal(a, b) for a, b in zip(params, whole[1]))


def test_on_the_cpu_the_run_goes_on_uncaptured_and_says_why(caplog, torch_path):
    with caplog.at_level(logging.WARNING):
        eng = _engine(True)
    assert eng.graphs is None
    assert eng.cuda_graphs_record() == {"fallback": "CUDA graphs need a CUDA device, this run is on cpu"}
    assert any("--cuda-graphs: CUDA graphs need a CUDA device" in r.getMessage() for r in caplog.records)
    assert _same(_train(eng), _train(_engine(False)))
    assert _engine(False).cuda_graphs_record() is None


@pytest.mark.parametrize("facts, words", [
    (dict(pmm_ranks=2), "3D grid of 2 ranks"),
    (dict(dp_ranks=2, backend="gloo"), "over gloo cannot be captured"),
    (dict(padded=False), "reads its block sizes back"),
    (dict(sparse_features=True), "sparse (CSR) features"),
    (dict(row_sparse_update=True), "--sparse-input-update"),
])
def test_each_configuration_that_cannot_be_captured_is_named(facts, words):
    base = dict(device=torch.device("cuda"), pmm_ranks=1, dp_ranks=1, backend=None, padded=True,
                sparse_features=False, row_sparse_update=False)
    assert capture_obstacle(**base) is None
    assert words in capture_obstacle(**{**base, **facts})
    assert capture_obstacle(**{**base, "dp_ranks": 4, "backend": "nccl"}) is None


def test_a_batch_copies_into_its_static_buffers(emulated):
    """The static copy shares no tensor with the batch; copying another batch of the same
    signature makes them equal; a larger capacity changes the signature."""
    eng = _engine(True)
    a, b = eng.sampler.sample(0), eng.sampler.sample(1)
    static = clone_batch(a)
    assert batch_signature(static) == batch_signature(a) == batch_signature(b)
    ptrs = {t.data_ptr() for t in step_graph._tensors(a) if t.layout == torch.strided}
    assert not ptrs & {t.data_ptr() for t in step_graph._tensors(static) if t.layout == torch.strided}
    copy_batch_(step_graph._tensors(static), b)
    for s, t in zip(step_graph._tensors(static), step_graph._tensors(b)):
        assert torch.equal(s.to_dense(), t.to_dense()) if t.layout == torch.sparse_csr else torch.equal(s, t)
    eng.sampler.slack = 4.0
    assert batch_signature(eng.sampler.sample(2)) != batch_signature(a)
    eng.close()


@pytest.mark.gpu
@needs_gpu
def test_on_a_gpu_the_captured_step_trains_as_the_uncaptured_one():
    """A real CUDA graph: captured once, replayed for every later step, the same losses,
    counts and weights as the uncaptured run on the same GPU (bit for bit: the same
    kernels on the same values; a tolerance of float32 rounding only if a library picks
    another algorithm inside the capture)."""
    runs = {}
    for graphs in (False, True):
        eng = ParallelEngine(parallel_graph(n=160, m=1200, seed=3), ModelConfig(hidden=12, layers=3, dropout=0.3),
                             OptimConfig(lr=1e-2, grad_clip=1.0, weight_decay=1e-2, schedule="cosine"), 40, seed=7,
                             epochs=3, device="cuda", perf=PerfConfig(sampler="torch", cuda_graphs=graphs))
        runs[graphs] = _train(eng)
        if graphs:
            rec = eng.cuda_graphs_record()
            assert rec["fallback"] is None and rec["captures"] >= 1 and rec["replays"] == STEPS - 1, rec
    (s0, p0), (s1, p1) = runs[False], runs[True]
    torch.testing.assert_close(torch.tensor(s1), torch.tensor(s0), rtol=1e-6, atol=1e-6)
    for a, b in zip(p1, p0):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_batches_of_ever_new_shapes_end_in_one_line_and_eager_steps(caplog):
    """Each new shape is a new capture; past ``max_captures`` the run gives up with one
    line and goes on eagerly, every step's value right throughout."""
    graphs = StepGraphs(lambda b, s: (b * 2).sum() + s, torch.device("cpu"), RecordedGraph, max_captures=4)
    with caplog.at_level(logging.WARNING):
        got = [graphs.run(torch.ones(n), step=n).item() for n in range(1, 8)]
    assert got == [3.0 * n for n in range(1, 8)]  # 2n + n
    assert graphs.eager_steps == 1 + 2 and graphs.captures == 4 and graphs.replays == 4
    assert "the batches took 5 different shapes" in graphs.fallback
    assert sum("--cuda-graphs" in r.getMessage() for r in caplog.records) == 1
