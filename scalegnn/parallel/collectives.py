"""Collectives over named grid axes, with byte accounting and optional low precision.

Every wrapper takes the :class:`~scalegnn.parallel.grid.ProcessGrid` and an axis
name (``"dp"``, ``"x"``, ``"y"``, ``"z"``), never a raw group, and records what it
sent in a :class:`CommStats` passed explicitly by the caller, under a *kind*:

    pmm_x, pmm_y, pmm_z   3D-PMM partial-sum all-reduces (SpMM, GEMM, their backward)
    norm                  RMSNorm sums of squares (Eq. 29) and their backward
    loss                  cross-entropy / BCE max, sum-exp, target and count reductions
    reshard               residual reshard all-gathers (forward and backward)
    dp                    data-parallel gradient all-reduce (paper IV-A)
    eval, clip, ...       anything else, named by the caller

Bytes are the payload this rank hands to the collective (``numel * itemsize`` of
the buffer actually communicated, so a BF16 all-reduce counts half of an FP32 one;
for an all-gather, the padded local piece). A collective over an axis of size 1 is
skipped and costs nothing; so is one over an empty tensor (every member of an
all-reduce holds the same shape, so they all skip together).

Only 3D-PMM partial sums may use a low-precision communication dtype (paper V-B):
cast to BF16, all-reduce, cast back. RMSNorm and cross-entropy reductions stay FP32.
"""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from .grid import ProcessGrid

__all__ = ["CommStats", "ComponentTimer", "all_reduce", "all_gather_uneven", "broadcast", "PMM_KINDS"]

PMM_KINDS = ("pmm_x", "pmm_y", "pmm_z")

_OPS = {"sum": "SUM", "max": "MAX", "min": "MIN"}


@dataclass
class CommStats:
    """Cumulative bytes, calls and wall seconds per collective kind (one per process)."""

    bytes: dict = field(default_factory=lambda: defaultdict(int))
    calls: dict = field(default_factory=lambda: defaultdict(int))
    seconds: dict = field(default_factory=lambda: defaultdict(float))

    def record(self, kind: str, nbytes: int, seconds: float = 0.0) -> None:
        self.bytes[kind] += int(nbytes)
        self.calls[kind] += 1
        self.seconds[kind] += float(seconds)

    def snapshot(self) -> dict:
        return {"bytes": dict(self.bytes), "calls": dict(self.calls), "seconds": dict(self.seconds)}

    def reset(self) -> None:
        self.bytes.clear()
        self.calls.clear()
        self.seconds.clear()


class ComponentTimer:
    """Cumulative wall seconds per named compute component (``with t("spmm"): ...``).

    CPU wall time; on GPU the caller must synchronize for meaningful numbers.
    A ``None`` timer anywhere in this package means "do not time".
    """

    def __init__(self):
        self.seconds: dict[str, float] = defaultdict(float)

    @contextmanager
    def __call__(self, name: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - t0

    def reset(self) -> None:
        self.seconds.clear()


@contextmanager
def _maybe_time(timer: ComponentTimer | None, name: str):
    if timer is None:
        yield
    else:
        with timer(name):
            yield


def _op(op: str):
    if op not in _OPS:
        raise ValueError(f"unknown reduction {op!r}; use one of {sorted(_OPS)}")
    return getattr(dist.ReduceOp, _OPS[op])


def _group(grid: ProcessGrid, axis: str):
    group = grid.group(axis)
    if group is None:
        raise RuntimeError(
            f"grid {grid.spec()} has no process groups (built with ProcessGrid.virtual/single) but a collective "
            f"over axis {axis} of size {grid.axis_size(axis)} was requested; build the grid on an initialized world"
        )
    return group


def all_reduce(
    t: torch.Tensor,
    grid: ProcessGrid,
    axis: str,
    stats: CommStats | None,
    kind: str,
    op: str = "sum",
    comm_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """In-place all-reduce of ``t`` over the grid ``axis``; returns ``t``.

    ``comm_dtype`` (e.g. ``torch.bfloat16``) casts the buffer for the wire and back:
    only for 3D-PMM partial sums (``kind`` in :data:`PMM_KINDS`).
    """
    if grid.axis_size(axis) == 1 or t.numel() == 0:
        return t
    if comm_dtype is not None and comm_dtype != t.dtype and kind not in PMM_KINDS:
        raise ValueError(f"low-precision communication is only for 3D-PMM partial sums, not for kind {kind!r}")
    group = _group(grid, axis)
    t0 = time.perf_counter()
    if comm_dtype is not None and comm_dtype != t.dtype:
        buf = t.to(comm_dtype)  # cast - all-reduce - cast (paper V-B)
        dist.all_reduce(buf, op=_op(op), group=group)
        t.copy_(buf)
        nbytes = buf.numel() * buf.element_size()
    else:
        if not t.is_contiguous():
            raise ValueError("all_reduce needs a contiguous tensor (it reduces in place)")
        dist.all_reduce(t, op=_op(op), group=group)
        nbytes = t.numel() * t.element_size()
    if stats is not None:
        stats.record(kind, nbytes, time.perf_counter() - t0)
    return t


def all_gather_uneven(
    t: torch.Tensor,
    sizes: list[int],
    grid: ProcessGrid,
    axis: str,
    stats: CommStats | None,
    kind: str,
    dim: int = 0,
) -> torch.Tensor:
    """Concatenate along ``dim`` the pieces held by the ranks of ``axis``, in axis order.

    ``sizes[i]`` is the length along ``dim`` of the piece of the rank with axis
    index i (known to every rank, so no size exchange is needed); ``t`` must have
    ``sizes[axis_index]``. Pieces are zero-padded to the largest size for the wire.
    """
    n = grid.axis_size(axis)
    me = grid.axis_index(axis)
    if t.shape[dim] != sizes[me]:
        raise ValueError(f"piece has {t.shape[dim]} along dim {dim}, expected sizes[{me}]={sizes[me]}")
    if n == 1:
        return t
    biggest = max(sizes)
    other = list(t.shape)
    other[dim] = biggest
    if 0 in other:
        # Nothing to send: the other dims are shared by all members, so they all skip.
        other[dim] = sum(sizes)
        return t.new_zeros(other)
    padded = t.new_zeros(other)
    padded.narrow(dim, 0, sizes[me]).copy_(t)
    outs = [torch.empty_like(padded) for _ in range(n)]
    t0 = time.perf_counter()
    dist.all_gather(outs, padded, group=_group(grid, axis))
    if stats is not None:
        stats.record(kind, padded.numel() * padded.element_size(), time.perf_counter() - t0)
    return torch.cat([o.narrow(dim, 0, s) for o, s in zip(outs, sizes)], dim=dim)


def broadcast(t: torch.Tensor, grid: ProcessGrid, axis: str, src_index: int, stats: CommStats | None,
              kind: str) -> torch.Tensor:
    """In-place broadcast of ``t`` from the rank with ``axis`` index ``src_index``."""
    if grid.axis_size(axis) == 1 or t.numel() == 0:
        return t
    t0 = time.perf_counter()
    dist.broadcast(t, src=grid.group_ranks(axis)[src_index], group=_group(grid, axis))
    if stats is not None:
        stats.record(kind, t.numel() * t.element_size(), time.perf_counter() - t0)
    return t
