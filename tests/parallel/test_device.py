"""The device in the run (scalegnn/device.py and the engine on it): resolution and backends,
what the record says, a step that never makes the host wait for the device, and the CPU
path pinned to its numbers from before the engine moved onto devices.

GPU cases (the ``gpu`` marker, ``make test-gpu``) run the same checks on CUDA/ROCm: a
single-rank training run against the CPU one, multi-rank grids sharing one GPU through
gloo, an NCCL world of one rank. Code that runs on the device is held to its CPU self in
its own module's tests: Algorithm 2 (tests/unit/test_sampling_kernel.py), the prefetch
stream (tests/unit/test_perf.py), CUDA-event timing (tests/unit/test_timing.py),
torch.compile of the fused tail (tests/parallel/test_tail.py).
"""

from __future__ import annotations

import math

import pytest
import torch

from scalegnn import device as D
from scalegnn import records
from scalegnn.config import make_config
from scalegnn.launch import launch
from scalegnn.launch.job import spawn
from scalegnn.model import ModelConfig
from scalegnn.optim import OptimConfig
from scalegnn.parallel.engine import COMPONENTS, ParallelEngine
from scalegnn.parallel.grid import ProcessGrid
from scalegnn.perf import PerfConfig
from tests.devices import DEVICES, HAS_GPU, needs_gpu
from tests.graphs import parallel_graph
from tests.host_sync import HostSyncDetector
from tests.runs import SMALL


gpu = pytest.mark.gpu


# ----------------------------------------------------------------------------- resolution
def test_device_specs_and_backends_resolve_or_name_the_fix():
    assert D.resolve_device("cpu") == torch.device("cpu")
    assert D.resolve_backend("auto", torch.device("cpu")) == "gloo"
    assert D.resolve_backend("gloo", torch.device("cpu")) == "gloo"
    if not HAS_GPU:
        assert D.resolve_device("auto") == torch.device("cpu")  # no GPU visible: the CPU
        with pytest.raises(ValueError, match="asks for a GPU but .*use --device cpu"):
            D.resolve_device("cuda")
    with pytest.raises(ValueError, match="--device must be one of auto, cpu, cuda or cuda:N"):
        D.check_device_spec("gpu")
    with pytest.raises(ValueError, match="--backend nccl needs GPU tensors"):
        D.resolve_backend("nccl", torch.device("cpu"))
    with pytest.raises(ValueError, match="--backend must be one of"):
        D.resolve_backend("mpi", torch.device("cpu"))
    with pytest.raises(ValueError, match="--backend nccl needs GPU tensors but --device is cpu"):
        make_config(device="cpu", backend="nccl")
    with pytest.raises(ValueError, match="--device must be one of"):
        make_config(device="tpu")


def test_cli_device_flags_reach_the_config(tmp_path, capsys):
    from scalegnn.cli import main

    code = main(["train", "--dataset", SMALL, "--data-root", str(tmp_path / "d"), "--out", str(tmp_path / "r"),
                 "--epochs", "1", "--hidden", "8", "--layers", "1", "--device", "cpu", "--backend", "gloo",
                 "--quiet"])
    assert code == 0
    path = capsys.readouterr().out.strip().splitlines()[-1].split("record: ")[1]
    rec = records.read_record(path)
    assert (rec["config"]["parallel"]["device"], rec["config"]["parallel"]["backend"]) == ("cpu", "gloo")
    assert main(["train", "--dataset", SMALL, "--device", "tpu", "--quiet"]) == 2
    assert "--device must be one of" in capsys.readouterr().err


# ----------------------------------------------------------------------------- the record
def test_record_names_the_device_and_both_memory_peaks(tmp_path):
    rec = launch(make_config(dataset=SMALL, data_root=str(tmp_path / "d"), out_dir=str(tmp_path / "r"),
                                 epochs=1, progress=False, device="cpu", hidden=8, layers=1))
    env = records.read_record(rec["path"])["env"]
    assert env["device_type"] == "cpu" and env["device"].startswith("cpu (")
    acc = env["accelerator"]
    assert acc["type"] == "cpu" and acc["cuda_version"] == torch.version.cuda and acc["nccl_version"] is None
    assert rec["peak_rss_bytes_per_rank"][0] == rec["peak_memory_bytes"] > 0  # CPU: the RSS bounds the run
    assert rec["peak_device_memory_bytes_per_rank"] is None


# ----------------------------------------------------------------------------- no host round trip
def _engine(device, perf=None, **over):
    graph = parallel_graph(n=60, m=300, seed=1)
    cfg = dict(model=ModelConfig(hidden=12, layers=3, dropout=0.3), optim=OptimConfig(lr=1e-2, grad_clip=1.0))
    cfg.update(over)
    return ParallelEngine(graph, cfg["model"], cfg["optim"], 17, seed=3, epochs=2, device=device,
                          perf=perf or PerfConfig(prefetch=True))


def _sync_events(engine, steps=range(1, 4)):
    engine.train_step(0)  # the first batch is sampled on this thread; later ones by the prefetch thread
    with HostSyncDetector() as det:
        for s in steps:
            engine.train_step(s)
    engine.close()
    return det.events


@pytest.mark.parametrize("device", DEVICES)
def test_a_training_step_never_makes_the_host_wait_for_the_device(device):
    """With prefetching, a step queues its work and returns: no value is read back,
    no data-dependent shape, no copy between host and device (clip, dropout, norm,
    residual and the no-labeled-vertex skip all stay on the device)."""
    assert _sync_events(_engine(D.resolve_device(device))) == []
    rare = _engine(D.resolve_device(device), perf=PerfConfig(prefetch=True, comm_overlap=True),
                   optim=OptimConfig(lr=1e-2, schedule="cosine"))
    assert _sync_events(rare) == []


def test_the_host_sync_detector_catches_what_it_looks_for(monkeypatch):
    """A planted ``float(loss)`` inside the step (the round trip this project had) and a
    boolean-mask gather are both reported with the line that did it."""
    import scalegnn.parallel.engine as E

    real = E.ParallelEngine._data_parallel

    def leaky(self, loss, count, counts):
        if float(loss) > 1e9:  # a host read of a device value
            pass
        counts[counts > 0].sum()  # a data-dependent shape
        return real(self, loss, count, counts)

    monkeypatch.setattr(E.ParallelEngine, "_data_parallel", leaky)
    events = [what for what, _ in _sync_events(_engine(torch.device("cpu")), steps=[1])]
    assert "__float__()" in events and "aten._local_scalar_dense" in events
    assert "aten.index with a boolean mask" in events


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
def test_drawing_a_batch_never_makes_the_host_wait_for_the_device(device, sparse):
    """A sampled batch's sizes are all counted on the host (row bounds, gathers, block
    capacities), so building it (``draw``: padded blocks, the torch kernel, the default
    on a GPU) reads nothing back; checking that every block fitted is one flag read.
    The unpadded kernel, which reads its sizes back, is the detector's control. The
    padded batch is the CPU's unpadded one plus zeros."""
    from scalegnn.parallel.dist_sampling import DistributedSampler
    from scalegnn.parallel.sharding import build_shard
    from tests.graphs import grid_coords

    dev = D.resolve_device(device)
    graph, shape, step = parallel_graph(n=300, m=3000, seed=2, sparse=sparse), (1, 2, 1, 2), 5
    for rank, coords in enumerate(grid_coords(shape)):
        grid, shard = ProcessGrid.virtual(*shape, rank), build_shard(graph, shape, coords)
        padded = DistributedSampler(shard.to(dev), grid, 40, seed=0, backend="torch",
                                    padded=True if dev.type == "cpu" else None)
        assert padded.padded
        host = padded.nodes(step)  # the vertex draw: host work on host tensors
        with HostSyncDetector() as det:
            batch = padded.draw(step, host)
        assert det.events == []
        with HostSyncDetector() as det:
            padded.sample(step)
        device_reads = [what for what, where in det.events if not where.endswith(" _first_distinct")]
        assert device_reads == ["__bool__()", "aten._local_scalar_dense"], det.events
        exact = DistributedSampler(shard, grid, 40, seed=0, backend="torch", padded=False)
        with HostSyncDetector() as det:
            reference = exact.draw(step, host)
        found = {what for what, _ in det.events}
        assert {"aten.nonzero", "aten._local_scalar_dense"} <= found, found
        for p, e in zip(batch.adj, reference.adj):
            assert torch.equal(p.adj.to_dense().cpu(), e.adj.to_dense()) and p.adj.values().numel() == p.capacity
        assert torch.equal(batch.x.to_dense().cpu(), reference.x.to_dense())


def _sync_worker(rank, world, shape, device):
    grid = ProcessGrid(*shape)
    graph = parallel_graph(n=60, m=300, seed=2)
    eng = ParallelEngine(graph, ModelConfig(hidden=12, layers=2, dropout=0.2), OptimConfig(lr=1e-2, grad_clip=0.5),
                         17, seed=1, epochs=2, grid=grid, device=D.resolve_device(device, rank),
                         perf=PerfConfig(prefetch=True, comm_overlap=True))
    return _sync_events(eng)


@pytest.mark.distributed
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(2, 1, 1, 1), (1, 2, 1, 1)], ids=["dp2", "x2"])
def test_no_host_round_trip_with_data_parallel_or_3d_collectives(shape, device):
    assert spawn(_sync_worker, 2, shape, device, timeout_s=180) == [[], []]


# ----------------------------------------------------------------------------- pinned CPU numbers
# Epoch losses of `small_run` on main before the engine moved onto devices (commit
# 4460bc0: SerialEngine for one process, ParallelEngine for the grids; run then with
# /tmp/pin.py as this test does now). The engine now sums the loss counts in float64
# on the device and runs fused AdamW: the same arithmetic up to summation order and
# rounding, so losses agree to float32 precision (observed <= 5e-8 relative); 1e-6
# leaves room for platform differences while any change of what is computed (a
# different sample, mask or update) moves them by more than 1e-3. Test accuracies
# are counts over 150 vertices and must be equal.
PINNED = {
    (1, 1, 1, 1): ([1.53656063079834, 1.3719102144241333, 1.3842155694961549],
                   [0.3333333333333333, 0.36666666666666664, 0.47333333333333333]),
    (1, 2, 2, 1): ([1.5365607023239136, 1.3719101905822755, 1.3842155456542968],
                   [0.3333333333333333, 0.36666666666666664, 0.47333333333333333]),
    (2, 1, 1, 1): ([1.5677094062169392, 1.4502111673355103, 1.3503830830256145], [0.32, 0.36, 0.42]),
}


def small_run(tmp_path, grid, **over):
    """A small run on ``grid``: several ranks as local workers (--nproc)."""
    ranks = grid[0] * grid[1] * grid[2] * grid[3]
    return make_config(**{**dict(dataset=SMALL, batch_ratio=0.2, epochs=3, out_dir=str(tmp_path / "runs"),
                                 progress=False, hidden=16, layers=3, dropout=0.2, data_root=str(tmp_path / "data"),
                                 grid=grid, nproc=ranks if ranks > 1 else None, lr=1e-2, grad_clip=1.0,
                                 device="cpu"), **over})


@pytest.mark.parametrize("grid", list(PINNED), ids=lambda g: "x".join(map(str, g)))
def test_cpu_epoch_losses_equal_those_of_main_before_devices(tmp_path, grid):
    cfg = small_run(tmp_path, grid)
    rec = launch(cfg, timeout_s=180)
    losses, tests = PINNED[grid]
    assert [r["loss"] for r in rec["epochs"]] == pytest.approx(losses, rel=1e-6)
    assert [r["test_acc"] for r in rec["epochs"]] == tests


# ----------------------------------------------------------------------------- GPU only
@gpu
@needs_gpu
def test_single_rank_training_on_the_gpu_matches_the_cpu_run(tmp_path):
    """The same run on cuda and on cpu: losses within float32 reordering (cuSPARSE and
    cuBLAS sum in other orders; 1e-4 relative over 3 epochs of 10 steps), the same
    test accuracy within one vertex, and a record that says where it ran."""
    cpu = launch(small_run(tmp_path, (1, 1, 1, 1)))
    cfg = small_run(tmp_path, (1, 1, 1, 1), device="cuda", prefetch=True)
    rec = launch(cfg)
    assert rec["status"] == "ok"
    assert [r["loss"] for r in rec["epochs"]] == pytest.approx([r["loss"] for r in cpu["epochs"]], rel=1e-4)
    assert abs(rec["epochs"][-1]["test_acc"] - cpu["epochs"][-1]["test_acc"]) <= 1 / 150 + 1e-12
    env = rec["env"]
    assert env["device_type"] == "cuda" and env["accelerator"]["name"] == torch.cuda.get_device_name(0)
    assert env["accelerator"]["cuda_version"] or env["accelerator"]["hip_version"]
    assert rec["peak_device_memory_bytes_per_rank"][0] > 0 and rec["peak_rss_bytes_per_rank"][0] > 0
    comp = rec["epochs"][0]["components"]
    assert set(comp) == set(COMPONENTS) and comp["spmm"] > 0 and comp["gemm"] > 0  # CUDA-event timing


@gpu
@needs_gpu
@pytest.mark.distributed
@pytest.mark.parametrize("grid", [(1, 2, 1, 1), (1, 2, 2, 1), (1, 2, 2, 2)], ids=lambda g: "x".join(map(str, g)))
def test_multi_rank_grids_share_one_gpu_through_gloo(tmp_path, grid):
    """The training loop on several ranks on one GPU (gloo stages the collectives):
    the epoch losses of the CPU run of the same grid, within float32 reordering."""
    cfg = small_run(tmp_path, grid)
    cpu = launch(cfg, timeout_s=300)
    cfg = small_run(tmp_path, grid, device="cuda", backend="gloo")
    rec = launch(cfg, timeout_s=300)
    assert rec["status"] == "ok" and rec["env"]["device_type"] == "cuda" and rec["env"]["backend"] == "gloo"
    assert [r["loss"] for r in rec["epochs"]] == pytest.approx([r["loss"] for r in cpu["epochs"]], rel=1e-4)
    assert len(rec["peak_device_memory_bytes_per_rank"]) == cfg.world_size


@gpu
@needs_gpu
def test_nccl_world_of_one_rank_trains():
    """An NCCL world (the cluster path: bound to the GPU, gloo beside it for CPU
    control traffic) on the one GPU there is: the engine's collectives and the
    checkpoint agreement's CPU all-reduce both work in it."""
    res = spawn(_nccl_worker, 1, timeout_s=180, backend="nccl")[0]
    assert res["backend"] == "nccl" and math.isfinite(res["loss"]) and res["agreed"] == 1.0


def _nccl_worker(rank, world):
    import torch.distributed as dist

    grid = ProcessGrid(1, 1, 1, 1, backend="nccl")
    eng = ParallelEngine(parallel_graph(seed=0), ModelConfig(hidden=8, layers=2), OptimConfig(), 11, grid=grid,
                         device=torch.device("cuda", 0))
    loss = eng.train_step(0).loss
    t = torch.ones(1)
    dist.all_reduce(t)  # a CPU tensor: gloo, beside NCCL
    g = torch.ones(1, device="cuda")
    dist.all_reduce(g)  # a GPU tensor: NCCL
    return {"backend": grid.backend, "loss": loss, "agreed": float(t) * float(g)}
