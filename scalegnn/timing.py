"""Seconds per component of a step, measured without making the device wait.

    SpanTimer   ``with timer("spmm"): ...`` adds the span's seconds under its name:
                the host clock on CPU, a pair of CUDA events on GPU
    process_age_s  seconds since this process started (a run's time to its first step)

The collectives' accounting (:class:`scalegnn.parallel.collectives.CommStats`), the
sharded operators' compute spans and the engine's phases all time with it.
"""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager

import torch

__all__ = ["SpanTimer", "process_age_s"]

_IMPORTED = time.monotonic()  # the origin where the kernel does not say when the process started


def process_age_s() -> float:
    """Seconds since this process started: on Linux the kernel's start time of the process
    (``/proc/self/stat`` field 22, clock ticks since boot: 10 ms resolution) against
    ``CLOCK_BOOTTIME``, the same clock, so the interpreter's start and every import are
    counted; elsewhere since this module was imported (after the interpreter and torch)."""
    import os

    try:
        fields = open("/proc/self/stat").read().rsplit(")", 1)[1].split()  # the name may hold spaces
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22; fields[0] is field 3
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - started)
    except (OSError, ValueError, IndexError, AttributeError):
        return time.monotonic() - _IMPORTED


@contextmanager
def _recorded(span, name: str):
    with torch.profiler.record_function(name), span:
        yield


class SpanTimer:
    """Cumulative seconds per component name: ``with timer("spmm"): ...``.

    On CPU every kernel is synchronous, so the host clock around a span is its time.
    On GPU kernels are asynchronous: a span records a pair of CUDA events on the
    current stream and :meth:`flush` waits for the last event and adds up
    ``elapsed_time`` of every pair. No synchronization happens inside a span, and
    the engine flushes once per epoch, so timing never makes a step wait for the
    GPU. ``enabled=False`` makes spans free.
    """

    def __init__(self, device: torch.device | str = "cpu", enabled: bool = True):
        self.device = torch.device(device)
        self.enabled = enabled
        self.seconds: dict[str, float] = defaultdict(float)
        self._events: list[tuple[str, object, object]] = []
        self._cuda = self.device.type == "cuda"

    def __call__(self, name: str):
        """The span ``name``; while a torch profiler records, also a range of that name in
        its trace (the engine's phases are how :mod:`scalegnn.benchmarks.op_count`
        attributes a step's kernels to sampling, forward, backward and the optimizer)."""
        if torch.autograd._profiler_enabled():
            return _recorded(self._span(name), name)
        return self._span(name)

    @contextmanager
    def _span(self, name: str):
        if not self.enabled:
            yield
            return
        if self._cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(torch.cuda.current_stream(self.device))
            try:
                yield
            finally:
                end.record(torch.cuda.current_stream(self.device))
                self._events.append((name, start, end))
        else:
            t0 = time.perf_counter()
            try:
                yield
            finally:
                self.seconds[name] += time.perf_counter() - t0

    def add(self, name: str, seconds: float) -> None:
        if self.enabled:
            self.seconds[name] += seconds

    def flush(self) -> dict[str, float]:
        """Resolve pending GPU events, waiting for the last one (no-op on CPU); returns the totals."""
        if self._events:
            self._events[-1][2].synchronize()
            self.poll()
        return self.seconds

    def poll(self) -> None:
        """Resolve the GPU event pairs that have completed, without waiting (events of
        one stream complete in order), so a long epoch does not keep every pair alive."""
        done = 0
        for name, start, end in self._events:
            if not end.query():
                break
            self.seconds[name] += start.elapsed_time(end) / 1e3
            done += 1
        del self._events[:done]

    def reset(self) -> None:
        self.seconds.clear()
        self._events.clear()
