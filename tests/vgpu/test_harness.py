"""The virtual GPU catches what a real one refuses: planted bugs of each kind, in the
engine's step and in a whole run, each reported with its kind and the line that did
it; and it leaves torch as it found it."""

from __future__ import annotations

import pytest
import torch

from scalegnn.config import make_config
from scalegnn.launch import launch
from scalegnn.model import ModelConfig
from scalegnn.optim import OptimConfig
from scalegnn.parallel.engine import ParallelEngine
from scalegnn.perf import PerfConfig
from tests.graphs import parallel_graph
from tests.host_sync import HostSyncDetector
from tests.vgpu.virtual import VirtualGpu, device_of

import scalegnn.parallel.engine as E
import scalegnn.sampling as S


def _steps(steps=(0, 1), prefetch=False):
    eng = ParallelEngine(parallel_graph(n=60, m=300, seed=1), ModelConfig(hidden=12, layers=2, dropout=0.3),
                         OptimConfig(lr=1e-2), 17, seed=3, epochs=2, device=torch.device("cuda", 0),
                         perf=PerfConfig(prefetch=prefetch))
    try:
        for s in steps:
            eng.train_step(s)
    finally:
        eng.close()


def _caught(kind, run) -> list:
    gpu = VirtualGpu()
    with pytest.raises((RuntimeError, TypeError), match="virtual GPU"):
        with gpu:
            run()
    assert gpu.violations and {v.kind for v in gpu.violations} == {kind}, gpu.report()
    return gpu.violations


def test_a_clean_step_passes():
    with VirtualGpu() as gpu:
        _steps()
    assert gpu.violations == []


def test_a_host_tensor_in_a_device_operator_is_caught(monkeypatch):
    """Planted: a host tensor added to the device loss inside the step (on a GPU:
    "Expected all tensors to be on the same device")."""
    real = E.ParallelEngine._data_parallel

    def mixed(self, loss, count, counts):
        return real(self, loss + torch.zeros(1), count, counts)

    monkeypatch.setattr(E.ParallelEngine, "_data_parallel", mixed)
    (v,) = _caught("mixed devices", _steps)
    assert v.what.startswith("aten.add") and "[(1,)]" in v.what and v.where.startswith("parallel/engine.py")


def test_a_host_kernel_given_device_memory_is_caught(monkeypatch):
    """Planted: the compiled CPU sampler (numba, which reads tensors through ``.numpy()``)
    chosen for device blocks; on a GPU ``.numpy()`` of a device tensor raises."""
    monkeypatch.setattr(S, "_pick_backend", lambda backend, block: "numba")
    (v, *_) = _caught("host-only kernel", _steps)
    assert ".numpy() of a device tensor" in v.what


def test_a_host_generator_for_device_randoms_is_caught(monkeypatch):
    """Planted: dropout masks drawn on the device from a host ``torch.Generator``."""
    real = E.ParallelEngine._data_parallel

    def drawn(self, loss, count, counts):
        torch.rand(3, device=loss.device, generator=torch.Generator().manual_seed(0))
        return real(self, loss, count, counts)

    monkeypatch.setattr(E.ParallelEngine, "_data_parallel", drawn)
    (v,) = _caught("host-only kernel", _steps)
    assert "host torch.Generator" in v.what


def test_a_host_read_inside_a_step_is_caught_beside_it(monkeypatch):
    """Planted: ``float(loss)`` in the step: the host-sync detector, run on the virtual
    GPU, names it (the device rules alone would not: a read is legal, only slow)."""
    real = E.ParallelEngine._data_parallel

    def leaky(self, loss, count, counts):
        float(loss)
        return real(self, loss, count, counts)

    monkeypatch.setattr(E.ParallelEngine, "_data_parallel", leaky)
    with VirtualGpu() as gpu, HostSyncDetector() as det:
        _steps(steps=(0,), prefetch=True)
    assert gpu.violations == [] and "__float__()" in [what for what, _ in det.events]


def test_a_planted_bug_fails_a_whole_run_and_the_record_says_why(tmp_path, monkeypatch):
    real = E.ParallelEngine._data_parallel
    monkeypatch.setattr(E.ParallelEngine, "_data_parallel",
                        lambda self, loss, count, counts: real(self, loss + torch.zeros(1), count, counts))
    cfg = make_config(dataset="csbm:n=300,avg_degree=6,classes=3,feature_dim=8", data_root=str(tmp_path / "d"),
                      epochs=1, out_dir=str(tmp_path / "r"), hidden=8, layers=2, device="cuda", batch_ratio=0.3)
    with VirtualGpu() as gpu:
        rec = launch(cfg)
    assert rec["status"] == "failed" and "virtual GPU: aten.add" in rec["error"]
    assert [v.kind for v in gpu.violations] == ["mixed devices"]


def test_the_serial_sampler_of_a_device_graph_samples_on_the_device(monkeypatch):
    """The public UniformVertexSampler on a graph whose tensors live on the GPU: maps,
    masks and blocks on the device, clean; planted, the old host-side index map is caught."""
    import dataclasses

    def device_graph():
        g = parallel_graph(n=60, m=300, seed=1)
        moved = {f.name: getattr(g, f.name).to("cuda") for f in dataclasses.fields(g)
                 if isinstance(getattr(g, f.name), torch.Tensor)}
        return dataclasses.replace(g, **moved)

    with VirtualGpu() as gpu:
        batch = S.UniformVertexSampler(device_graph(), 17, seed=3).sample(2)
        assert {device_of(t) for t in (batch.nodes, batch.adj, batch.x, batch.y, batch.train_mask)} == {"cuda"}
    assert gpu.violations == []
    real_map = S.CompactIndexMap
    monkeypatch.setattr(S, "CompactIndexMap", lambda n, offset=0, device=None: real_map(n, offset))
    _caught("mixed devices", lambda: S.UniformVertexSampler(device_graph(), 17, seed=3).sample(2))


def test_torch_is_restored_when_the_device_closes():
    with VirtualGpu("rocm"):
        t = torch.ones(2, device="cuda")
        assert t.is_cuda and t.device == torch.device("cuda", 0) and torch.cuda.is_available()
        assert torch.version.hip and torch.version.cuda is None
        assert torch.ones(2).device.type == "cpu" and t.cpu().device.type == "cpu"
    assert not t.is_cuda and t.device.type == "cpu" and torch.cuda.is_available() is False
    assert torch.version.hip is None
    with pytest.raises(ValueError, match="flavor"):
        VirtualGpu("metal")


def test_the_runtime_rules_a_cpu_build_lacks():
    """As on a GPU: ``set_device`` refuses a device without an index, and the caching
    allocator's peak count cannot be reset before CUDA is initialized. The project's
    calls hold to both: :func:`indexed_device` numbers a bare "cuda", and
    :func:`reset_peak_memory` initializes CUDA first (a gloo rank's first CUDA call)."""
    from scalegnn.device import indexed_device, reset_peak_memory

    with VirtualGpu():
        with pytest.raises(ValueError, match="specified index"):
            torch.cuda.set_device(torch.device("cuda"))
        with pytest.raises(RuntimeError, match="Invalid device argument"):
            torch.cuda.reset_peak_memory_stats(torch.device("cuda", 0))
        assert torch.cuda.max_memory_allocated() == 0
        reset_peak_memory("cuda")
        assert torch.cuda.is_initialized() and torch.cuda.max_memory_allocated() > 0
        assert indexed_device("cuda") == torch.device("cuda", 0)
    with VirtualGpu():
        torch.ones(1, device="cuda")  # a first device tensor initializes CUDA
        torch.cuda.reset_peak_memory_stats(torch.device("cuda", 0))


def test_an_engine_given_a_bare_cuda_device_runs():
    """``ParallelEngine(device=torch.device("cuda"))``, as a public-API user writes it."""
    from scalegnn.model import ModelConfig
    from scalegnn.optim import OptimConfig
    from scalegnn.parallel.engine import ParallelEngine
    from tests.graphs import parallel_graph

    with VirtualGpu() as gpu:
        eng = ParallelEngine(parallel_graph(n=60, m=300, seed=1), ModelConfig(hidden=12, layers=2),
                             OptimConfig(lr=1e-2), 17, seed=3, epochs=1, device=torch.device("cuda"))
        assert eng.device == torch.device("cuda", 0)
        eng.train_step(0)
        eng.close()
    assert gpu.violations == []
