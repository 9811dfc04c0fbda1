"""Every system's whole run on the virtual GPU (tests/vgpu/virtual.py): the launcher,
the trainer, training, evaluation and the record, with ``--device cuda``; ScaleGNN
and its full-graph mode also checkpoint, crash and resume. A run passes when it
finishes ``ok`` on the device with no breach of a device rule, and its epoch losses
are those of the same run on the CPU (the virtual device computes with the CPU's
kernels, so only the GPU branches differ: fused AdamW, events, streams). Multi-rank
runs give each worker its own virtual GPU (gloo). DistDGL refuses a GPU before any
work (tests/baselines/test_device.py); the baselines have no checkpoints of their own."""

from __future__ import annotations

import pytest
import torch

from scalegnn.checkpoint import CheckpointConfig
from scalegnn.config import make_config
from scalegnn.launch import launch
from scalegnn.parallel.engine import ParallelEngine
from tests.runs import epoch_rows
from tests.vgpu.virtual import VirtualGpu, virtual_rank

TINY = "csbm:n=400,avg_degree=6,classes=3,feature_dim=12"
OPTIONS = {"scalegnn": dict(batch_ratio=0.2), "fullgraph-3d": dict(batch_ratio=1.0),
           "bns-gcn": dict(boundary_rate=1.0, partition="random"), "graphsage": dict(batch_size=64),
           "graphsaint": dict(node_budget=100), "salient": dict(batch_size=64, partition="random"),
           "fastsample": dict(batch_size=64), "cagnet-1d": {}, "cagnet-1.5d": dict(c=1),
           "cagnet-2d": {}, "pyg-gcn": {}}


# SALIENT++'s batches come from a pool of sampler threads in the order they finish: two
# CPU runs of it differ by about 1e-3 relative (measured), so its losses agree to that.
TOLERANCE = {"salient": 2e-2}


def config(system, tmp_path, device, **over):
    kw = dict(dataset=TINY, data_root=str(tmp_path / "data"), epochs=2, out_dir=str(tmp_path / f"r-{device}"),
              hidden=16, layers=2, dropout=0.0, device=device, **OPTIONS[system])
    return make_config(system, **{**kw, **over})


def on_virtual_gpu(cfg, flavor="cuda"):
    rank_main = virtual_rank if cfg.parallel.nproc else None
    with VirtualGpu(flavor) as gpu:
        record = launch(cfg, rank_main=rank_main, timeout_s=300) if rank_main else launch(cfg)
    assert gpu.report() == "" and record["status"] == "ok", (gpu.report(), record.get("error"))
    assert record["env"]["device_type"] == "cuda"
    return record


def losses(record):
    return [row["loss"] for row in record["epochs"]]


@pytest.mark.parametrize("system", list(OPTIONS))
def test_every_system_runs_whole_on_the_virtual_gpu(system, tmp_path):
    gpu = on_virtual_gpu(config(system, tmp_path, "cuda"))
    cpu = launch(config(system, tmp_path, "cpu"))
    assert losses(gpu) == pytest.approx(losses(cpu), rel=TOLERANCE.get(system, 1e-5))
    assert gpu["peak_device_memory_bytes_per_rank"][0] > 0 and gpu["env"]["accelerator"]["name"] == "Virtual GPU"


@pytest.mark.parametrize("system", ["graphsage", "graphsaint", "salient"])
def test_the_pure_torch_samplers_run_whole_on_the_virtual_gpu(system, tmp_path):
    """``--sampler-impl torch`` (what a GPU machine without torch-sparse runs): sampling on
    the host, batches and the CSR evaluation matrix moved to the device, the CPU run's
    losses (graphsage with exact layer-wise evaluation, the CSR matrix's SpMM on the device)."""
    over = dict(sampler_impl="torch", **(dict(eval_mode="layerwise") if system == "graphsage" else {}))
    gpu = on_virtual_gpu(config(system, tmp_path, "cuda", **over))
    cpu = launch(config(system, tmp_path, "cpu", **over))
    assert gpu["sampler_impl"] == cpu["sampler_impl"] == "torch"
    assert losses(gpu) == pytest.approx(losses(cpu), rel=TOLERANCE.get(system, 1e-5))


@pytest.mark.parametrize("system, nproc, over", [
    ("scalegnn", 2, dict(grid=(1, 2, 1, 1))),
    ("scalegnn", 2, dict(grid=(2, 1, 1, 1), prefetch=True, comm_overlap=True)),
    ("cagnet-1.5d", 2, dict(c=2)),
    ("cagnet-1d", 2, {}),  # H blocks broadcast along the process column
    ("bns-gcn", 2, {}),
    ("graphsage", 2, {}),
], ids=["scalegnn-x2", "scalegnn-dp2", "cagnet-1.5d", "cagnet-1d", "bns-gcn", "graphsage"])
def test_multi_rank_runs_on_virtual_gpus(system, nproc, over, tmp_path):
    cfg = config(system, tmp_path, "cuda", nproc=nproc, backend="gloo", **over)
    gpu = on_virtual_gpu(cfg)
    cpu = launch(config(system, tmp_path, "cpu", nproc=nproc, **over), timeout_s=300)
    assert losses(gpu) == pytest.approx(losses(cpu), rel=1e-5)
    assert len(gpu["peak_device_memory_bytes_per_rank"]) == nproc


@pytest.mark.parametrize("system, every, crash_at, resumed", [("scalegnn", "2", 5, 4), ("fullgraph-3d", "1", 2, 2)])
def test_a_run_checkpointed_on_the_device_crashes_and_resumes_exactly(system, every, crash_at, resumed, tmp_path,
                                                                       monkeypatch):
    """Checkpoints written from device tensors, a crash, the resumed run loads them onto
    the device: its epochs equal the uninterrupted run's (ScaleGNN: 5 steps an epoch,
    the full graph: 1)."""
    ref = on_virtual_gpu(config(system, tmp_path, "cuda", epochs=3, out_dir=str(tmp_path / "ref")))
    real = ParallelEngine.train_step

    def crash(engine, step):
        if step == crash_at:
            raise RuntimeError(f"simulated crash at step {step}")
        return real(engine, step)

    ckpt = CheckpointConfig(dir=str(tmp_path / "ck"), every=every, resume=True)
    cfg = config(system, tmp_path, "cuda", epochs=3, checkpoint=ckpt)
    monkeypatch.setattr(ParallelEngine, "train_step", crash)
    with VirtualGpu() as gpu:
        first = launch(cfg)
    assert first["status"] == "failed" and "simulated crash" in first["error"] and gpu.report() == ""
    monkeypatch.setattr(ParallelEngine, "train_step", real)
    second = on_virtual_gpu(cfg)
    assert second["resumed"][0]["step"] == resumed
    assert epoch_rows(second) == epoch_rows(ref)


def test_a_rocm_build_runs_and_its_record_says_hip_and_rccl(tmp_path):
    """ROCm's differences as torch shows them: ``torch.version.hip`` set and
    ``torch.version.cuda`` None, the device still ``cuda``, RCCL behind the "nccl" name."""
    rec = on_virtual_gpu(config("scalegnn", tmp_path, "cuda"), flavor="rocm")
    acc = rec["env"]["accelerator"]
    assert acc["hip_version"] and acc["cuda_version"] is None and acc["nccl_version"] == "2.18.3"
    from scalegnn.device import resolve_backend

    with VirtualGpu("rocm"):
        assert torch.version.hip and resolve_backend("auto", torch.device("cuda", 0)) == "nccl"



def _broadcast_a_saved_activation(rank, world, raw):
    """One rank: y = relu(x W) on its virtual GPU, broadcast from rank 0 along the grid's x
    axis (the project's collective, or ``raw``: torch's own call), then a backward that
    needs y as the ReLU saved it."""
    import torch.distributed as dist

    from scalegnn.parallel.collectives import broadcast
    from scalegnn.parallel.grid import ProcessGrid

    grid = ProcessGrid(1, world, 1, 1)
    with VirtualGpu() as gpu:
        w = torch.full((3, 4), 0.5, device="cuda", requires_grad=True)
        y = torch.relu(torch.ones(2, 3, device="cuda") @ w)
        buf = y if rank == 0 else torch.empty_like(y)  # the source sends its own, the others receive
        if raw:
            dist.broadcast(buf, src=0)
        else:
            broadcast(buf, grid, "x", 0, None, "test")
        (y * buf).sum().backward()
    assert gpu.report() == "", gpu.report()
    assert torch.equal(buf, y)
    return w.grad.sum().item()


@pytest.mark.parametrize("raw", [False, True], ids=["scalegnn-broadcast", "planted-raw-broadcast"])
def test_a_broadcast_leaves_the_sources_saved_tensor_alone(raw):
    """gloo writes a GPU broadcast's result back into the source's tensor too (the
    virtual GPU does as well): the project's broadcast sends a copy from the source, so
    the backward through the ReLU that saved it runs (CAGNET broadcasts activations);
    torch's own call, planted, makes the backward fail as on a real GPU."""
    from scalegnn.launch.job import WorkerError, spawn

    if raw:
        with pytest.raises(WorkerError, match="modified by an inplace operation"):
            spawn(_broadcast_a_saved_activation, 2, raw, timeout_s=120)
    else:
        # y = 1.5 everywhere; d/dW of sum(y * y) is 2 * 2 * 1.5 per entry (12 entries), of sum(y * y_0) 2 * 1.5
        assert spawn(_broadcast_a_saved_activation, 2, raw, timeout_s=120) == [72.0, 36.0]
