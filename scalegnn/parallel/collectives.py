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
all-reduce holds the same shape, so they all skip together). Calls are counted
beside bytes: on gloo and NCCL every call pays a fixed latency, so the number of
calls matters as much as their bytes.

Bucketing (:func:`bucketed_all_reduce`): tensors with no data dependency between them
that go over the same axis with the same op and the same wire dtype travel as one
flat buffer, one call, copied back (DDP's gradient buckets, on a grid axis). Each
member's bytes are counted under its own kind; the one call (and its seconds) under
the kind that carries most of the bucket's bytes. Element for element the sum is the
same; over an axis of 2 ranks it is bit for bit the separate calls' (a + b is
commutative), over more ranks the reduction order of a chunked ring may differ by
float rounding.

Only 3D-PMM partial sums may use a low-precision communication dtype (paper V-B):
cast to BF16, all-reduce, cast back. RMSNorm and cross-entropy reductions stay FP32.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from ..timing import SpanTimer
from .grid import ProcessGrid

__all__ = ["CommStats", "all_reduce", "all_reduce_world", "all_reduce_async", "bucketed_all_reduce", "PendingReduce",
           "all_gather_uneven", "broadcast", "PMM_KINDS"]

PMM_KINDS = ("pmm_x", "pmm_y", "pmm_z")

_OPS = {"sum": "SUM", "max": "MAX", "min": "MIN"}


@dataclass
class CommStats:
    """Cumulative bytes, calls and seconds per collective kind (one per process).

    Seconds are the time a collective holds up its caller: around a blocking call
    on CPU (gloo is synchronous), the wait of an asynchronous one (the overlapped
    part is hidden, so it is not counted). On GPU (``device`` cuda) a collective
    only enqueues work, so :meth:`span` records CUDA events instead and
    :meth:`flush` resolves them (:class:`scalegnn.timing.SpanTimer` does both).
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

    def record(self, kind: str, nbytes: int, calls: int = 1) -> None:
        """Count ``nbytes`` under ``kind``, and ``calls`` calls (0 for a bucket member
        whose call is counted under another kind)."""
        self.bytes[kind] += int(nbytes)
        if calls:
            self.calls[kind] += calls

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


def _wire_dtype(t: torch.Tensor, kind: str, comm_dtype: torch.dtype | None) -> torch.dtype:
    """The dtype ``t`` travels in: ``comm_dtype`` only for 3D-PMM partial sums (paper V-B)."""
    if comm_dtype is None or comm_dtype == t.dtype:
        return t.dtype
    if kind not in PMM_KINDS:
        raise ValueError(f"low-precision communication is only for 3D-PMM partial sums, not for kind {kind!r}")
    return comm_dtype


def _launch(members: list[tuple[torch.Tensor, str]], grid: ProcessGrid, axis: str, stats: CommStats | None, op: str,
            comm_dtype: torch.dtype | None, async_op: bool, what: str):
    """One all-reduce over ``axis`` of every member (tensor, kind), in place; returns
    None (nothing to send), or (work or None when done, wire buffer or None, the
    kind the call is counted under, the members' tensors). The one place where tensors meet the wire:
    reduced as is when a single member needs no cast, else copied (cast) into one flat
    buffer in the wire dtype, reduced, and copied back by the caller (:func:`_unflatten`)."""
    members = [(t, kind) for t, kind in members if t.numel()]
    if grid.axis_size(axis) == 1 or not members:
        return None
    wires = {_wire_dtype(t, kind, comm_dtype) for t, kind in members}
    if len(wires) > 1:
        raise ValueError(f"a bucket travels in one dtype; its members need {sorted(map(str, wires))}: "
                         "bucket them apart")
    (wire,) = wires
    if len(members) == 1 and members[0][0].dtype == wire:
        (buf, _), flat = members[0], None
        if not buf.is_contiguous():
            raise ValueError(f"{what} needs a contiguous tensor (it reduces in place)")
    elif len(members) == 1:
        buf = flat = members[0][0].to(wire)  # cast - all-reduce - cast (paper V-B)
    else:
        if not all(t.is_contiguous() for t, _ in members):
            raise ValueError(f"{what} needs contiguous tensors (they are copied back in place)")
        buf = flat = torch.empty(sum(t.numel() for t, _ in members), dtype=wire, device=members[0][0].device)
        off = 0
        for t, _ in members:
            flat[off: off + t.numel()].copy_(t.view(-1))
            off += t.numel()
    per_kind: dict[str, int] = defaultdict(int)
    for t, kind in members:
        per_kind[kind] += t.numel() * buf.element_size()
    call_kind = max(per_kind, key=per_kind.get)  # the kind with most bytes (first such in member order)
    group = _group(grid, axis)
    with _span(stats, call_kind):
        work = dist.all_reduce(buf, op=_op(op), group=group, async_op=async_op)
        if not async_op and flat is not None:
            _unflatten(flat, [t for t, _ in members])
    if stats is not None:
        for kind, nbytes in per_kind.items():
            stats.record(kind, nbytes, calls=1 if kind == call_kind else 0)
    return (work if async_op else None), flat, call_kind, [t for t, _ in members]


def _unflatten(flat: torch.Tensor, targets: list[torch.Tensor]) -> None:
    """Copy (cast back) the reduced flat buffer into its members, in order."""
    if len(targets) == 1:
        targets[0].copy_(flat.view_as(targets[0]))
        return
    off = 0
    for t in targets:
        t.view(-1).copy_(flat[off: off + t.numel()])
        off += t.numel()


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
    _launch([(t, kind)], grid, axis, stats, op, comm_dtype, async_op=False, what="all_reduce")
    return t


def bucketed_all_reduce(
    members: list[tuple[torch.Tensor, str]],
    grid: ProcessGrid,
    axis: str,
    stats: CommStats | None,
    op: str = "sum",
    comm_dtype: torch.dtype | None = None,
    async_op: bool = False,
) -> "PendingReduce | None":
    """All-reduce every tensor of ``members`` ((tensor, kind) pairs; contiguous, no data
    dependency between them) over ``axis`` in ONE call, in place: flattened into one
    buffer in their common wire dtype (``comm_dtype`` for 3D-PMM kinds, else their own;
    members that differ raise), reduced, copied back. Bytes go to each member's kind,
    the call to the kind with most bytes. ``async_op``: returns the
    :class:`PendingReduce` whose ``wait()`` completes it (members untouchable until then);
    otherwise None, done."""
    launched = _launch(members, grid, axis, stats, op, comm_dtype, async_op, what="bucketed_all_reduce")
    if not async_op:
        return None
    if launched is None:
        return PendingReduce(None)
    work, flat, kind, targets = launched
    return PendingReduce(None, work, flat, stats, kind, targets)


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
    """An all-reduce in flight (:func:`all_reduce_async`, :func:`bucketed_all_reduce`);
    :meth:`wait` completes it.

    After ``wait()`` the tensor (every member of a bucket) holds the reduced value
    (cast back from the wire dtype if one was used). The wait is what the caller pays,
    so it is what :class:`CommStats` counts as seconds.
    """

    __slots__ = ("tensor", "_work", "_buf", "_targets", "_stats", "_kind")

    def __init__(self, tensor, work=None, buf=None, stats=None, kind="", targets=None):
        self.tensor, self._work, self._buf, self._stats, self._kind = tensor, work, buf, stats, kind
        self._targets = targets if targets is not None else [tensor]

    def wait(self) -> torch.Tensor | None:
        if self._work is not None:
            work, self._work = self._work, None
            with _span(self._stats, self._kind):
                work.wait()
                if self._buf is not None:
                    _unflatten(self._buf, self._targets)
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
    launched = _launch([(t, kind)], grid, axis, stats, "sum", comm_dtype, async_op=True, what="all_reduce_async")
    if launched is None:
        return PendingReduce(t)
    work, buf, kind, _ = launched
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
    """In-place broadcast of ``t`` from the rank with ``axis`` index ``src_index``; the
    source's ``t`` is left as it is (autograd may hold it for a backward)."""
    if grid.axis_size(axis) == 1 or t.numel() == 0:
        return t
    src, group = grid.group_ranks(axis)[src_index], _group(grid, axis)
    sent = t
    if t.is_cuda and dist.get_rank() == src and dist.get_backend(group) == "gloo":
        # gloo stages a GPU tensor through the host and copies the result back into every
        # rank's tensor, the source's too: an in-place write that bumps the version of a
        # tensor saved for backward (a layer's ReLU output), which the backward then
        # refuses. The source sends a copy and keeps its own tensor untouched.
        sent = t.clone()
    with _span(stats, kind):
        dist.broadcast(sent, src=src, group=group)
    if stats is not None:
        stats.record(kind, t.numel() * t.element_size())
    return t
