"""A CUDA graph's semantics on the CPU: record a step's ATen operators once, replay them.

A CUDA graph replays the kernels its capture launched, on the same memory, and nothing
else: no Python runs, no host value is read, no allocation is made. :class:`RecordedGraph`
does the same with ATen operators, so that a CPU test can hold a captured training step
(:mod:`scalegnn.parallel.step_graph`) to the eager one. ``capture(fn)`` runs ``fn`` under
a dispatch mode that records every operator with its argument and output tensors;
``replay()`` calls the recorded operators again on those same tensor objects and writes
each fresh output into the tensor the capture produced, which the later operators read.
Whatever host code a real replay would skip is skipped here too: a Python int baked
into an argument (a step index, a learning rate) stays the captured step's value, and
the replayed step then differs from the eager one.

Like a capture, the recording refuses operators that read a device value on the host
(the detector's list, :mod:`tests.host_sync`) and random operators (a graph would replay
their Philox offsets, which this emulation does not model), with an error naming them.

Two differences from a real graph, both on the safe side for the tests: the capture
runs its operators (a CUDA capture only records them), so the first ``replay()`` after a
capture does nothing; and only ATen operators are replayed, so a step must not use
kernels outside ATen (numba, inductor's C++ kernels): the tests force the torch path.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from .host_sync import _OPS as HOST_READS
from .host_sync import _op_name

__all__ = ["RecordedGraph", "CaptureRefused"]


class CaptureRefused(RuntimeError):
    """An operator a CUDA graph capture would refuse."""


def _writes(func) -> bool:
    """The op writes into an argument (in-place ops, out= variants)."""
    return any(a.alias_info is not None and a.alias_info.is_write for a in func._schema.arguments)


def _is_view(func) -> bool:
    """The op's outputs alias its inputs without writing (views, detach): the recorded
    view already sees every later write into its base, so a replay skips it."""
    return not _writes(func) and any(r.alias_info is not None for r in func._schema.returns)


class _Recorder(TorchDispatchMode):
    def __init__(self, ops: list):
        super().__init__()
        self.ops = ops

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = _op_name(func)
        if name in HOST_READS:
            raise CaptureRefused(f"{name} reads a device value on the host during the capture")
        if torch.Tag.nondeterministic_seeded in func.tags:
            raise CaptureRefused(f"{name} draws random numbers during the capture")
        out = func(*args, **kwargs)
        factory = not any(isinstance(t, torch.Tensor) for t in tree_flatten((args, kwargs))[0])
        # A factory (zeros, arange, full) in a graph is a fill kernel on the device: its
        # replay rewrites the value it made, kept here before later ops change it.
        init = tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, out) if factory else None
        self.ops.append((func, args, kwargs, out, init))
        return out


class RecordedGraph:
    """The backend interface of :class:`scalegnn.parallel.step_graph.StepGraphs`."""

    def __init__(self, device=None):
        self.ops: list = []
        self._captured_now = False

    def capture(self, fn):
        self.ops.clear()
        with _Recorder(self.ops):
            out = fn()
        self._captured_now = True
        return out

    def replay(self) -> None:
        if self._captured_now:  # the capture ran the step already
            self._captured_now = False
            return
        with torch.no_grad():  # the recorded operators include backward's: replayed as plain kernels
            for func, args, kwargs, out, init in self.ops:
                self._replay_one(func, args, kwargs, out, init)

    @staticmethod
    def _replay_one(func, args, kwargs, out, init) -> None:
        if _is_view(func):
            return
        fresh = init if init is not None else func(*args, **kwargs)
        if not _writes(func):  # a new output: into the tensor the capture made, which later ops read
            news, _ = tree_flatten(fresh)
            olds, _ = tree_flatten(out)
            for old, new in zip(olds, news, strict=True):
                if isinstance(old, torch.Tensor):
                    old.copy_(new)

    def reset(self) -> None:
        self.ops.clear()
