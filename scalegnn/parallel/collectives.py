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

from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from ..perf import SpanTimer
from .grid import ProcessGrid

__all__ = ["CommStats", "all_reduce", "all_reduce_world", "all_reduce_async", "PendingReduce", "all_gather_uneven",
           "broadcast", "PMM_KINDS"]

PMM_KINDS = ("pmm_x", "pmm_y", "pmm_z")

_OPS = {"sum": "SUM", "max": "MAX", "min": "MIN"}


@dataclass
class CommStats:
    """Cumulative bytes, calls and seconds per collective kind (one per process).

    Seconds are the time a collective holds up its caller: around a blocking call
    on CPU (gloo is synchronous), the wait of an asynchronous one (the overlapped
    part is hidden, so it is not counted). On GPU (``device`` cuda) a collective
    only enqueues work, so :meth:`span` records CUDA events instead and
    :meth:`flush` resolves them (:class:`scalegnn.perf.SpanTimer` does both).
    ``timing=False`` keeps the byte counts and skips every clock.
    """

    bytes: dict = field(default_factory=lambda: defaultdict(int))
    calls: dict = field(default_factory=lambda: defaultdict(int))
    timing: bool = True
    device: torch.device | str = "cpu"

    def __post_init__(self):
        self._timer = SpanTimer(self.device, enabled=self.timing)

    @property
    def seconds(self) -> dict:
        return self._timer.seconds

    def record(self, kind: str, nbytes: int) -> None:
        self.bytes[kind] += int(nbytes)
        self.calls[kind] += 1

    def span(self, kind: str):
        """Time the enclosed collective under ``kind``."""
        return self._timer(kind)

    def flush(self) -> None:
        """Add the elapsed time of pending GPU event pairs (waits for the last one)."""
        self._timer.flush()

    def poll(self) -> None:
        """Add the elapsed time of the GPU event pairs already completed (never waits)."""
        self._timer.poll()

    def snapshot(self) -> dict:
        self.flush()
        return {"bytes": dict(self.bytes), "calls": dict(self.calls), "seconds": dict(self.seconds)}

    def reset(self) -> None:
        self.bytes.clear()
        self.calls.clear()
        self._timer.reset()


@contextmanager
def _maybe_time(timer: SpanTimer | None, name: str):
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
    with _span(stats, kind):
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
        stats.record(kind, nbytes)
    return t


def all_reduce_world(t: torch.Tensor, grid: ProcessGrid, stats: CommStats | None, kind: str) -> torch.Tensor:
    """In-place sum of ``t`` over every rank of ``grid`` (one collective, not one per axis);
    returns ``t``."""
    if grid.world_size == 1 or t.numel() == 0:
        return t
    if not t.is_contiguous():
        raise ValueError("all_reduce_world needs a contiguous tensor (it reduces in place)")
    with _span(stats, kind):
        dist.all_reduce(t, group=dist.group.WORLD)
    if stats is not None:
        stats.record(kind, t.numel() * t.element_size())
    return t


def _span(stats: CommStats | None, kind: str):
    return stats.span(kind) if stats is not None else _NULL_SPAN


class _NullSpan:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


_NULL_SPAN = _NullSpan()


class PendingReduce:
    """An all-reduce in flight (:func:`all_reduce_async`); :meth:`wait` completes it.

    After ``wait()`` the tensor holds the reduced value (cast back from the wire
    dtype if one was used). The wait is what the caller pays, so it is what
    :class:`CommStats` counts as seconds.
    """

    __slots__ = ("tensor", "_work", "_buf", "_stats", "_kind")

    def __init__(self, tensor, work=None, buf=None, stats=None, kind=""):
        self.tensor, self._work, self._buf, self._stats, self._kind = tensor, work, buf, stats, kind

    def wait(self) -> torch.Tensor:
        if self._work is not None:
            work, self._work = self._work, None
            with _span(self._stats, self._kind):
                work.wait()
                if self._buf is not None:
                    self.tensor.copy_(self._buf)
                    self._buf = None
        return self.tensor


def all_reduce_async(
    t: torch.Tensor,
    grid: ProcessGrid,
    axis: str,
    stats: CommStats | None,
    kind: str,
    comm_dtype: torch.dtype | None = None,
) -> PendingReduce:
    """Start an in-place sum all-reduce of ``t`` over ``axis``; ``.wait()`` finishes it.

    Same accounting and precision rules as :func:`all_reduce` (bytes are counted at
    launch). Collectives on different axes use different process groups, so an
    all-reduce over x can be in flight while one over y runs (paper V-D). ``t`` must
    not be read or written until the wait.
    """
    if grid.axis_size(axis) == 1 or t.numel() == 0:
        return PendingReduce(t)
    if comm_dtype is not None and comm_dtype != t.dtype and kind not in PMM_KINDS:
        raise ValueError(f"low-precision communication is only for 3D-PMM partial sums, not for kind {kind!r}")
    if not t.is_contiguous():
        raise ValueError("all_reduce_async needs a contiguous tensor (it reduces in place)")
    group = _group(grid, axis)
    buf = t.to(comm_dtype) if comm_dtype is not None and comm_dtype != t.dtype else None
    wire = t if buf is None else buf
    with _span(stats, kind):
        work = dist.all_reduce(wire, op=dist.ReduceOp.SUM, group=group, async_op=True)
    if stats is not None:
        stats.record(kind, wire.numel() * wire.element_size())
    return PendingReduce(t, work, buf, stats, kind)


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
    with _span(stats, kind):
        dist.all_gather(outs, padded, group=_group(grid, axis))
    if stats is not None:
        stats.record(kind, padded.numel() * padded.element_size())
    return torch.cat([o.narrow(dim, 0, s) for o, s in zip(outs, sizes)], dim=dim)


def broadcast(t: torch.Tensor, grid: ProcessGrid, axis: str, src_index: int, stats: CommStats | None,
              kind: str) -> torch.Tensor:
    """In-place broadcast of ``t`` from the rank with ``axis`` index ``src_index``."""
    if grid.axis_size(axis) == 1 or t.numel() == 0:
        return t
    with _span(stats, kind):
        dist.broadcast(t, src=grid.group_ranks(axis)[src_index], group=_group(grid, axis))
    if stats is not None:
        stats.record(kind, t.numel() * t.element_size())
    return t
