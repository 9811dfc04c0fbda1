"""The device a run computes on, the collective backend that goes with it, and what
the run record says about both.

    --device auto   the local rank's GPU when CUDA or ROCm is visible, else the CPU
    --device cpu    the CPU (gloo)
    --device cuda   a GPU (``cuda:N`` picks one; plain ``cuda`` the local rank's),
                    NVIDIA through CUDA or AMD through ROCm/HIP: torch exposes both as
                    ``torch.cuda`` and NCCL's ROCm twin RCCL under the name "nccl"

The backend follows the device: NCCL (RCCL) for GPU tensors, gloo for CPU tensors.
``--backend gloo`` with a GPU is allowed on purpose: NCCL refuses two ranks on one
GPU, and the multi-rank GPU tests share one GPU between ranks through gloo (which
stages GPU tensors through host memory).

Everything here is a leaf: it imports torch and nothing of scalegnn, so every
floor above (sampling, parallel, the trainer, the baselines) may use it.
"""

from __future__ import annotations

import os
import platform
import resource

import torch

# --device and --backend's names, declared where no torch loads (scalegnn.sections)
from .sections.parallel import BACKENDS, DEVICES, check_device_spec

__all__ = ["DEVICES", "BACKENDS", "resolve_device", "resolve_backend", "indexed_device", "device_info",
           "synchronize", "peak_memory_bytes", "peak_rss_bytes", "peak_device_memory_bytes", "reset_peak_memory",
           "to_device", "check_device_spec"]


def resolve_device(spec: str = "auto", local_rank: int = 0) -> torch.device:
    """The ``torch.device`` of this rank for ``--device spec``.

    "auto" and "cuda" give GPU ``local_rank % device_count`` (one GPU per rank of a
    node, the layout srun/torchrun jobs use; ranks beyond the GPU count share them).
    """
    spec = check_device_spec(spec)
    if spec == "cpu":
        return torch.device("cpu")
    available = torch.cuda.is_available()
    if spec == "auto":
        if not available:
            return torch.device("cpu")
        spec = "cuda"
    if not available:
        build = "this torch build has no CUDA/ROCm support" if torch.version.cuda is None and \
            torch.version.hip is None else "no GPU is visible to this process (check CUDA_VISIBLE_DEVICES / " \
                                           "ROCR_VISIBLE_DEVICES and the job's GPU request)"
        raise ValueError(f"--device {spec} asks for a GPU but {build}; use --device cpu or --device auto")
    count = torch.cuda.device_count()
    if spec == "cuda":
        return torch.device("cuda", local_rank % count)
    index = int(spec.split(":")[1])
    if index >= count:
        raise ValueError(f"--device {spec}: this process sees {count} GPU(s) (cuda:0..cuda:{count - 1})")
    return torch.device("cuda", index)


def indexed_device(device: torch.device | str) -> torch.device:
    """``device`` with its index: a bare "cuda" is the current GPU, as torch reads it for
    a tensor; ``torch.cuda.set_device`` and the caching allocator's calls need the number."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def resolve_backend(spec: str, device: torch.device) -> str:
    """The torch.distributed backend for ``device``: "auto" follows the device."""
    spec = str(spec).strip().lower()
    if spec not in BACKENDS:
        raise ValueError(f"--backend must be one of {', '.join(BACKENDS)}, got {spec!r}")
    if spec == "auto":
        return "nccl" if device.type == "cuda" else "gloo"
    if spec == "nccl" and device.type != "cuda":
        raise ValueError("--backend nccl needs GPU tensors but the run's device is the CPU; use --backend gloo "
                         "or --device cuda")
    return spec


def to_device(obj, device: torch.device, non_blocking: bool = False):
    """``obj`` with every tensor moved to ``device``: tensors, and dicts, lists and
    tuples of them (other values pass through). CPU tensors bound for a GPU are
    pinned first when ``non_blocking``, so the copy does not wait for the host."""
    if isinstance(obj, torch.Tensor):
        if obj.device == device:
            return obj
        if non_blocking and device.type == "cuda" and obj.device.type == "cpu" and obj.layout == torch.strided:
            obj = obj.pin_memory()
        return obj.to(device, non_blocking=non_blocking)
    if isinstance(obj, dict):
        return {k: to_device(v, device, non_blocking) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_device(v, device, non_blocking) for v in obj)
    return obj


def synchronize(device: torch.device | str) -> None:
    """Wait for the kernels queued on ``device`` (GPU) so a host clock reading covers
    them; no-op on CPU, where every kernel is synchronous."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak_memory(device: torch.device | str) -> None:
    """Start the device allocator's peak count afresh (GPU; no-op on CPU)."""
    device = torch.device(device)
    if device.type == "cuda":
        # The caching allocator exists only once CUDA is initialized; a worker whose first
        # CUDA call this is (a gloo rank sharing the GPU) would get "Invalid device argument".
        torch.cuda.init()
        torch.cuda.reset_peak_memory_stats(device)


def peak_rss_bytes() -> int:
    """Peak resident set size of this process (Linux reports KiB)."""
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def peak_device_memory_bytes(device: torch.device | str) -> int | None:
    """Peak bytes held by the GPU caching allocator (``max_memory_allocated``); None on CPU."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    return int(torch.cuda.max_memory_allocated(device))


def peak_memory_bytes(device: torch.device | str = "cpu") -> int:
    """The memory that bounds a run on ``device``: the GPU allocator's peak on a GPU,
    the peak RSS on the CPU (the record's ``peak_memory_bytes``)."""
    peak = peak_device_memory_bytes(device)
    return peak_rss_bytes() if peak is None else peak


def device_info(device: torch.device | str) -> dict:
    """What the run record says about the device: kind, name, index, the CUDA or HIP
    version of the torch build and the NCCL (RCCL) version it bundles."""
    device = torch.device(device)
    info = {"type": device.type, "index": device.index, "name": None, "count": 0,
            "cuda_version": torch.version.cuda, "hip_version": getattr(torch.version, "hip", None),
            "nccl_version": None, "capability": None, "total_memory_bytes": None}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(name=props.name, count=torch.cuda.device_count(),
                    capability=f"{props.major}.{props.minor}", total_memory_bytes=int(props.total_memory))
        try:
            version = torch.cuda.nccl.version()
            info["nccl_version"] = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
        except (AttributeError, RuntimeError):  # a build without NCCL
            pass
    else:
        info.update(name=f"cpu ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)",
                    count=1)
    return info
