"""The GPU surface that only a GPU can settle (``gpu`` marker: `make test-gpu`, `make
gpu-report`; skipped without a GPU): whole runs on the GPU with checkpoint, crash and
resume, inductor compiling the engine's tail, BF16 GEMMs and wire, permutations, the
row-sparse update, the full-graph mode, CAGNET, FastSample, multi-rank baselines sharing
the GPU, NCCL over two GPUs, and an out-of-memory error reported as one. Each compares
with the same run on the CPU where the arithmetic is the same up to float32 order.
The same paths run on every CI build on the virtual GPU (tests/vgpu/)."""

from __future__ import annotations

import pytest
import torch

from scalegnn.checkpoint import CheckpointConfig
from scalegnn.config import make_config
from scalegnn.launch import launch
from scalegnn.perf import PerfConfig
from tests.devices import needs_gpu

gpu = pytest.mark.gpu
TINY = "csbm:n=400,avg_degree=6,classes=3,feature_dim=12"


def cfg_for(tmp_path, device, system="scalegnn", name="r", **over):
    kw = dict(dataset=TINY, data_root=str(tmp_path / "data"), epochs=3, out_dir=str(tmp_path / f"{name}-{device}"),
              hidden=16, layers=2, dropout=0.0, device=device, progress=False)
    if system in ("scalegnn", "fullgraph-3d"):
        kw["batch_ratio"] = 0.2 if system == "scalegnn" else 1.0
    return make_config(system, **{**kw, **over})


def losses(rec):
    return [r["loss"] for r in rec["epochs"]]


def on_both(tmp_path, system="scalegnn", rel=1e-4, **over):
    cpu = launch(cfg_for(tmp_path, "cpu", system, **over), timeout_s=300)
    dev = launch(cfg_for(tmp_path, "cuda", system, **over), timeout_s=300)
    assert dev["status"] == "ok" and dev["env"]["device_type"] == "cuda", dev.get("error")
    assert losses(dev) == pytest.approx(losses(cpu), rel=rel)
    return dev


@gpu
@needs_gpu
def test_checkpoint_crash_and_resume_on_the_gpu(tmp_path, monkeypatch):
    from scalegnn.parallel.engine import ParallelEngine

    ref = launch(cfg_for(tmp_path, "cuda", name="ref"))
    real = ParallelEngine.train_step

    def crash(engine, step):
        if step == 7:
            raise RuntimeError("simulated crash at step 7")
        return real(engine, step)

    cfg = cfg_for(tmp_path, "cuda", checkpoint=CheckpointConfig(dir=str(tmp_path / "ck"), every="2", resume=True))
    monkeypatch.setattr(ParallelEngine, "train_step", crash)
    assert launch(cfg)["status"] == "failed"
    monkeypatch.setattr(ParallelEngine, "train_step", real)
    again = launch(cfg)
    assert again["status"] == "ok" and again["resumed"][0]["step"] == 6
    assert losses(again) == losses(ref)  # the GPU's own arithmetic, resumed: bit for bit


@gpu
@needs_gpu
def test_inductor_compiles_the_engine_tail_on_the_gpu(tmp_path):
    """The toolchain Triton needs is there (or the fallback says why, and the run still ends ok)."""
    rec = on_both(tmp_path, perf=PerfConfig(compile=True), rel=1e-3)
    assert rec["compile_fallback"] is None, rec["compile_fallback"]
    assert rec["compile_time_s"] > 0


@gpu
@needs_gpu
@pytest.mark.parametrize("over", [dict(comm_dtype="bf16", gemm_dtype="bf16", grid=(1, 2, 1, 1), nproc=2,
                                       backend="gloo"),
                                  dict(gemm_dtype="tf32"),
                                  dict(permute="single"), dict(permute="double", residual=False, layers=3)],
                         ids=["bf16", "tf32", "permute-single", "permute-double"])
def test_numerics_settings_run_whole_on_the_gpu(tmp_path, over):
    """Each numerics setting on the GPU against the CPU (TF32 against the CPU's FP32: a
    CPU has no TF32; its products keep a 10-bit mantissa, as BF16's keep 7)."""
    over = dict(over)
    backend = over.pop("backend", None)
    rec = launch(cfg_for(tmp_path, "cuda", **over, **({"backend": backend} if backend else {})), timeout_s=300)
    cpu = launch(cfg_for(tmp_path, "cpu", **{k: v for k, v in over.items() if (k, v) != ("gemm_dtype", "tf32")}),
                 timeout_s=300)
    assert rec["status"] == "ok", rec.get("error")
    assert losses(rec) == pytest.approx(losses(cpu), rel=2e-2 if "gemm_dtype" in over else 1e-4)


@gpu
@needs_gpu
def test_the_row_sparse_update_on_the_gpu():
    """Sparse features with the row-sparse W_in gradient and update, on the GPU and the CPU."""
    from scalegnn.model import ModelConfig
    from scalegnn.optim import OptimConfig
    from scalegnn.parallel.engine import ParallelEngine
    from tests.graphs import parallel_graph

    def steps(device):
        eng = ParallelEngine(parallel_graph(n=60, m=300, seed=1, sparse=True), ModelConfig(hidden=12, layers=2),
                             OptimConfig(lr=1e-2, sparse_input_update="on"), 17, seed=3, epochs=2,
                             device=torch.device(device))
        assert eng.sparse_input_update
        out = [eng.train_step(s).stats.tolist() for s in range(4)]
        eng.close()
        return out

    for got, want in zip(steps("cuda"), steps("cpu")):
        assert got == pytest.approx(want, rel=1e-4)


@gpu
@needs_gpu
@pytest.mark.parametrize("system", ["fullgraph-3d", "cagnet-1d", "cagnet-2d", "fastsample"])
def test_more_systems_on_the_gpu(tmp_path, system):
    on_both(tmp_path, system, **({"batch_size": 64} if system == "fastsample" else {}))


@gpu
@needs_gpu
@pytest.mark.distributed
@pytest.mark.parametrize("system, over", [("bns-gcn", dict(boundary_rate=1.0, partition="random")),
                                          ("cagnet-1.5d", dict(c=2))], ids=["bns-gcn", "cagnet-1.5d"])
def test_multi_rank_baselines_share_the_gpu(tmp_path, system, over):
    cpu = launch(cfg_for(tmp_path, "cpu", system, nproc=2, **over), timeout_s=300)
    rec = launch(cfg_for(tmp_path, "cuda", system, nproc=2, backend="gloo", **over), timeout_s=300)
    assert rec["status"] == "ok" and len(rec["peak_device_memory_bytes_per_rank"]) == 2, rec.get("error")
    assert losses(rec) == pytest.approx(losses(cpu), rel=1e-4)


@gpu
@needs_gpu
@pytest.mark.distributed
@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.device_count() < 2, reason="needs two GPUs for NCCL")
def test_nccl_over_two_gpus(tmp_path):
    rec = launch(cfg_for(tmp_path, "cuda", grid=(1, 2, 1, 1), nproc=2), timeout_s=300)
    cpu = launch(cfg_for(tmp_path, "cpu", grid=(1, 2, 1, 1), nproc=2), timeout_s=300)
    assert rec["status"] == "ok" and rec["env"]["backend"] == "nccl", rec.get("error")
    assert losses(rec) == pytest.approx(losses(cpu), rel=1e-4)


@gpu
@needs_gpu
def test_running_out_of_gpu_memory_is_reported_as_such(tmp_path):
    """The GPU already nearly full (this process holds all but 256 MiB of it) and a model
    whose 16384 x 16384 float32 weight (1 GiB) cannot move there: the run fails with the
    out-of-memory message that names the rank, the stage and the fix, not a bare CUDA
    error. The weight fits the host, so the GPU's allocator is the one that refuses."""
    torch.cuda.init()
    free, _ = torch.cuda.mem_get_info()
    hog = torch.empty(max(free - (256 << 20), 0), dtype=torch.uint8, device="cuda")
    try:  # out of memory while setting up raises (no record); while training, the record says it
        message = launch(cfg_for(tmp_path, "cuda", hidden=16384, layers=2, epochs=1))["error"]
    except Exception as exc:
        message = str(exc)
    finally:
        del hog
        torch.cuda.empty_cache()
    assert "ran out of memory during" in message and "--hidden" in message, message
    assert "can't allocate memory" not in message, message  # the GPU's allocator, not the host's
