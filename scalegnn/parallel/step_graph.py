"""A training step captured as a CUDA graph and replayed (``--cuda-graphs``, issue U).

Why. On a GPU one ScaleGNN step is a few hundred kernel launches, and with a small
batch the host's launch rate, not the device, sets the step time. Captured once, the
forward, backward, data-parallel all-reduce and AdamW of a step are one graph launch.

What makes a step capturable. A CUDA graph replays the kernels of its capture on the
same memory: every input must sit in the same tensors at every replay, every size must
be the same, and nothing may be read back on the host or decided by a host value that
changes from step to step. Here:

* the batch: the padded sampler (:mod:`scalegnn.parallel.dist_sampling`) gives every
  block exactly its capacity's entries, so with one rank per data-parallel group every
  shape of a batch is the same at every step (:func:`batch_signature`). The step reads
  its batch from static buffers (:func:`clone_batch`), into which each new batch is
  copied before the replay (:func:`copy_batch_`). A block that overflowed was drawn
  again with more room: a new capacity, a new signature, a new capture (``captures``
  counts them, the record keeps the count);
* the step index: the dropout key reads it from a 0-d device tensor
  (:func:`scalegnn.model.dropout_key`), the same bits as the host key;
* the optimizer: fused AdamW keeps its step count on the device and reads its learning
  rate from a device tensor, which the schedule fills between replays; the "nothing to
  learn" skip flag is computed inside the graph;
* the gradients: ``zero_grad(set_to_none=True)`` inside the capture, so backward's
  gradients are the graph's own static tensors (PyTorch's whole-network recipe).

The first ``warmup`` steps run eagerly, on a side stream on a GPU, as PyTorch asks
before a capture (library handles, optimizer state and compiled kernels are made
there). A configuration whose steps cannot be captured is named in one line by
:func:`capture_obstacle` and runs uncaptured; so does a run whose capture fails or
whose batches keep changing shape (more than ``max_captures`` signatures).

The backend is a small interface (``capture(fn)``, ``replay()``, ``reset()``) so that
a CPU test can hold the captured step to the eager one: ``tests/graph_replay.py``
records the aten operators of the capture and replays exactly those on the same
tensors, as a CUDA graph replays its kernels; host code that a replay would skip then
shows up as a difference (tests/parallel/test_step_graph.py).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from typing import Callable

import torch

from .dist_sampling import AltBatch, ShardedBatch
from .layout import RowPartition
from ..sampling import SampledBlock

_log = logging.getLogger(__name__)

__all__ = ["StepGraphs", "CudaGraph", "graph_backend", "capture_obstacle", "batch_signature", "clone_batch",
           "copy_batch_"]

# The containers a batch is made of; anything else that is not a tensor is a constant
# of the batch (ints, floats, the process grid) and is shared, never copied.
_CONTAINERS = (ShardedBatch, AltBatch, SampledBlock, RowPartition)
# Fields that change from step to step without entering the computation.
_SKIPPED_FIELDS = {"step"}


def _fields(obj) -> list[tuple[str, object]]:
    if dataclasses.is_dataclass(obj):
        return [(f.name, getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.name not in _SKIPPED_FIELDS]
    return [(k, v) for k, v in vars(obj).items() if k not in _SKIPPED_FIELDS]


def _leaves(obj):
    """Every leaf of a batch, in one fixed order (fields in declaration order, dicts by
    key): its tensors and its other values."""
    if isinstance(obj, _CONTAINERS):
        for _, value in _fields(obj):
            yield from _leaves(value)
    elif isinstance(obj, dict):
        for k in sorted(obj):
            yield from _leaves(obj[k])
    elif isinstance(obj, (tuple, list)):
        for v in obj:
            yield from _leaves(v)
    else:
        yield obj


def _tensors(batch) -> list[torch.Tensor]:
    return [x for x in _leaves(batch) if isinstance(x, torch.Tensor)]


def _describe(leaf) -> object:
    if isinstance(leaf, torch.Tensor):
        t = leaf
        if t.layout == torch.sparse_csr:
            return ("csr", tuple(t.shape), t.values().dtype, t.crow_indices().dtype, t.values().numel(),
                    str(t.device))
        return (str(t.layout), tuple(t.shape), t.dtype, str(t.device))
    if leaf is None or isinstance(leaf, (bool, int, float, str)):
        return leaf
    return type(leaf).__name__  # an object shared by every batch (the process grid): its type only


def batch_signature(batch) -> tuple:
    """What a captured step assumes of its batch: every tensor's layout, shape, dtype,
    entries (CSR) and device, and every other value (block offsets, capacities, row
    bounds, the rescaling), in one fixed order. Two batches with equal signatures can
    share one capture."""
    return tuple(_describe(leaf) for leaf in _leaves(batch))


def clone_batch(batch):
    """The batch's static buffers: the same structure with every tensor copied."""
    if isinstance(batch, torch.Tensor):
        return batch.clone()
    if isinstance(batch, _CONTAINERS):
        out = copy.copy(batch)
        for name, value in _fields(batch):
            object.__setattr__(out, name, clone_batch(value))
        return out
    if isinstance(batch, dict):
        return {k: clone_batch(v) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(clone_batch(v) for v in batch)
    return batch


def copy_batch_(dst: list[torch.Tensor], src) -> None:
    """Copy ``src``'s tensors into the static tensors ``dst`` (:func:`_tensors` of a
    batch of equal signature), in place."""
    for d, s in zip(dst, _tensors(src), strict=True):
        d.copy_(s)


# ------------------------------------------------------------------------------ backends
class CudaGraph:
    """``torch.cuda.CUDAGraph`` behind the backend interface."""

    def __init__(self, device: torch.device):
        self.graph = torch.cuda.CUDAGraph()  # on the current device, which the engine set

    def capture(self, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
        # thread_local: the prefetch thread goes on sampling on its own stream meanwhile
        with torch.cuda.graph(self.graph, capture_error_mode="thread_local"):
            return fn()

    def replay(self) -> None:
        self.graph.replay()

    def reset(self) -> None:
        self.graph.reset()

    @staticmethod
    def run_eager(device: torch.device, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
        """A warm-up step on a side stream (PyTorch's rule before a capture)."""
        main = torch.cuda.current_stream(device)
        side = torch.cuda.Stream(device)
        side.wait_stream(main)
        with torch.cuda.stream(side):
            out = fn()
        main.wait_stream(side)
        return out


def graph_backend(device: torch.device) -> Callable[[torch.device], object] | None:
    """The graph class for ``device``: CUDA graphs on CUDA (and ROCm's HIP graphs, which
    torch exposes under the same name), none elsewhere."""
    return CudaGraph if device.type == "cuda" else None


def capture_obstacle(*, device: torch.device, pmm_ranks: int, dp_ranks: int, backend: str | None,
                     padded: bool, sparse_features: bool, row_sparse_update: bool) -> str | None:
    """Why this configuration's steps cannot be captured, in one line (None: they can)."""
    if graph_backend(device) is None:
        return f"CUDA graphs need a CUDA device, this run is on {device.type}"
    if pmm_ranks > 1:
        return (f"on a 3D grid of {pmm_ranks} ranks the row blocks of a sample differ in size from step to step, "
                "so a step's shapes are not static (use one rank per data-parallel group, Gx = Gy = Gz = 1)")
    if dp_ranks > 1 and backend != "nccl":
        return f"the data-parallel all-reduce over {backend} cannot be captured (NCCL's can)"
    if not padded:
        return "the sampler reads its block sizes back on the host (padding off or --sampler numba)"
    if sparse_features:
        return "sparse (CSR) features: a batch's feature entries differ in number from step to step"
    if row_sparse_update:
        return "--sparse-input-update: the input weight's touched rows differ in number from step to step"
    return None


# ------------------------------------------------------------------------------ the captured step
class StepGraphs:
    """Runs ``body(batch, step)`` (a step's forward, backward, all-reduce and update,
    returning its stats tensor) eagerly for ``warmup`` steps, then captured: one
    capture per batch signature, replayed with the batch copied into its static buffers
    and the step index into a device scalar.

    ``on_capture(body_call)`` wraps each capture (the engine turns its timers off
    inside it: events cannot be recorded during a capture) and ``accounts`` is a
    :class:`~scalegnn.parallel.collectives.CommStats` whose counts the capture adds
    once and every replay adds again (a replay runs no Python)."""

    def __init__(self, body: Callable, device: torch.device, new_graph: Callable, *, warmup: int = 1,
                 max_captures: int = 4, on_capture: Callable | None = None, accounts=None):
        self.body, self.device, self.new_graph = body, device, new_graph
        self.warmup, self.max_captures = warmup, max_captures
        self.on_capture, self.accounts = on_capture, accounts
        self.step_index = torch.zeros((), dtype=torch.int64, device=device)
        self.captures = self.replays = self.eager_steps = 0
        self.fallback: str | None = None  # why the run went on uncaptured, once it did
        self._graph = self._signature = self._out = None
        self._static: list[torch.Tensor] | None = None  # the capture's batch tensors, in _tensors order
        self._counts: tuple[dict, dict] = ({}, {})

    @property
    def active(self) -> bool:
        return self.fallback is None

    def _give_up(self, reason: str) -> None:
        self.fallback = reason
        self.drop()
        _log.warning("--cuda-graphs: %s; the run goes on uncaptured (same results)", reason)

    def drop(self) -> None:
        """Forget the capture (its static tensors and the graph's memory): after a state
        load replaced the tensors the graph reads, or on a new signature."""
        if self._graph is not None:
            self._graph.reset()
        self._graph = self._signature = self._static = self._out = None

    def _eager(self, batch, step: int) -> torch.Tensor:
        self.eager_steps += 1
        fn = lambda: self.body(batch, step)  # noqa: E731
        if self.active and hasattr(self.new_graph, "run_eager"):  # a warm-up: on a side stream
            return self.new_graph.run_eager(self.device, fn)
        return fn()

    def _snapshot(self) -> tuple[dict, dict]:
        if self.accounts is None:
            return {}, {}
        return dict(self.accounts.bytes), dict(self.accounts.calls)

    def _capture(self, batch, signature: tuple, step: int) -> None:
        self.drop()
        static = clone_batch(batch)
        self.step_index.fill_(step)
        graph = self.new_graph(self.device)
        before = self._snapshot()
        call = lambda: graph.capture(lambda: self.body(static, self.step_index))  # noqa: E731
        out = self.on_capture(call) if self.on_capture is not None else call()
        after = self._snapshot()
        self._counts = tuple({k: v - b.get(k, 0) for k, v in a.items() if v != b.get(k, 0)}
                             for a, b in zip(after, before))
        self._graph, self._signature, self._static, self._out = graph, signature, _tensors(static), out
        self.captures += 1

    def run(self, batch, step: int) -> torch.Tensor:
        """The step's stats (a new tensor: the graph's output is overwritten by the next
        replay)."""
        if not self.active or self.eager_steps < self.warmup:
            return self._eager(batch, step)
        signature = batch_signature(batch)
        fresh = signature != self._signature
        if fresh:
            if self.captures >= self.max_captures:
                self._give_up(f"the batches took {self.captures + 1} different shapes (capacities); "
                              f"a run makes at most {self.max_captures} captures")
                return self._eager(batch, step)
            try:
                self._capture(batch, signature, step)
            except Exception as exc:  # a kernel or a host read that a capture refuses
                first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
                self._give_up(f"the capture failed: {type(exc).__name__}: {first}")
                return self._eager(batch, step)
        else:
            copy_batch_(self._static, batch)
            self.step_index.fill_(step)
        self._graph.replay()
        self.replays += 1
        if self.accounts is not None and not fresh:  # the capture counted its collectives once
            nbytes, calls = self._counts
            for kind in nbytes.keys() | calls.keys():
                self.accounts.record(kind, nbytes.get(kind, 0), calls=calls.get(kind, 0))
        return self._out.clone()

    def record(self) -> dict:
        """The record's ``cuda_graphs`` entry."""
        return {"captures": self.captures, "replays": self.replays, "eager_steps": self.eager_steps,
                "fallback": self.fallback}
