"""The switches that change how fast a run goes, never what it computes (paper section V),
and the instrumentation that measures them.

    PerfConfig      the switches, the run configuration's ``perf`` section (``cfg.perf``)
    Prefetcher      prepare step t+1 while step t trains (V-A): a background thread on
                    CPU, plus a side CUDA stream and an event on GPU; across epochs
    StepProfiler    ``--profile DIR``: a torch.profiler trace of a few steps per rank

The per-component timers (``instrument``) are :class:`scalegnn.timing.SpanTimer`.

What this section guarantees. Every switch defaults to the behaviour without it, and
none changes what is computed: the same samples, dropout masks, formulas and
operand dtypes, so a run's losses, accuracies and weights equal those of the run
without the switch, bit for bit or up to float rounding where the same sums are
taken in another order (tests hold each to it):

    prefetch            bit-identical: the sample is a pure function of the step, so
                        producing it earlier reorders no arithmetic
    sampler             bit-identical: the numba kernel and the torch path build the
                        same CSR blocks, entry for entry
    comm_overlap        bit-identical: the asynchronous all-reduces sum the same
                        partial sums, only sooner
    instrument, profile nothing: timers and traces only read clocks
    bucket_collectives  the same reductions in fewer calls: bit-identical over axes of
                        2 ranks, float32 (the clip norm: float64) summation order over more
    compile, compile_backend
                        the same element-wise formula fused (RMSNorm + ReLU + dropout),
                        its backward derived by autograd instead of written by hand:
                        float32 rounding (weights within 1e-5)

A checkpoint resumes with ``prefetch``, ``profile``, ``sampler`` or ``instrument``
changed (:data:`scalegnn.checkpoint.RESUMABLE_DIFFERENCES`: its continuation stays
bit-exact). The settings that do change the numbers (BF16 communication, BF16 GEMM
operands, vertex permutations) are :class:`scalegnn.numerics.NumericsConfig`
(``cfg.numerics``).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import torch

from .sections.perf import PerfConfig  # declared where no torch loads (scalegnn.sections)

__all__ = ["PerfConfig", "Prefetcher", "StepProfiler"]


# --------------------------------------------------------------------------- prefetch
class _Job:
    __slots__ = ("step", "done", "result", "error", "event", "ready", "seconds")

    def __init__(self, step: int, ready=None):
        self.step, self.done = step, threading.Event()
        self.result = self.error = self.event = None
        self.ready = ready  # GPU: an event on the consumer's stream the job must wait for
        self.seconds = 0.0


class Prefetcher:
    """Runs ``produce(step)`` for the next step in a background thread (paper V-A).

    ``get(step)`` returns ``produce(step)``: the prefetched job when it is the one
    asked for (waiting for it to finish), else (the first step, or a jump such as a
    resume) a job submitted now and waited for; then it submits ``produce(step + 1)``.
    Every call of ``produce`` runs on the worker thread, one at a time, in order, so
    the producer's state (the sampler's compact column maps) is only ever touched
    there. Training steps count up across epochs, so the last step of an epoch
    prefetches the first of the next. The result never depends on prefetching:
    ``produce`` must be a pure function of the step (the samplers are).

    On GPU the worker thread runs on the device's side stream, ordered against the
    training stream by events in both directions, without the host ever waiting for
    the GPU:

    * before: a job's stream waits for an event recorded on the consumer's stream
      when the job was submitted, so the job sees everything training queued before
      it (without this wait a job would race, say, training's writes to a buffer
      the producer reads);
    * after: ``get`` makes the consumer's stream wait for the event the job recorded
      at its end (``wait_event``: the GPU waits, not the host), and marks every
      tensor of the batch (the arrays inside sparse ones included) as used by that
      stream (``record_stream``), so the caching allocator does not hand their memory
      to the side stream's next job while training still reads them.

    On CPU the thread overlaps with training because torch and the numba kernel
    release the GIL.

    The thread is a daemon and :meth:`close` stops it (waiting for a job in flight);
    an exception in ``produce`` is re-raised by the ``get`` that asks for that step.
    """

    def __init__(self, produce, device: torch.device | str = "cpu", name: str = "scalegnn-prefetch"):
        self.produce = produce
        self.device = torch.device(device)
        self._cuda = self.device.type == "cuda"
        self._stream = torch.cuda.Stream(self.device) if self._cuda else None
        self._cond = threading.Condition()
        self._queue: list[_Job] = []
        self._pending: _Job | None = None
        self._closed = False
        self.background_seconds = 0.0  # time the thread spent producing (hidden when overlapped)
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    # worker side
    def _loop(self) -> None:
        if self._cuda:  # a new thread starts on GPU 0 and the default stream: this one's are the job's
            torch.cuda.set_device(self.device)
            torch.cuda.set_stream(self._stream)
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                job = self._queue.pop(0)
            t0 = time.perf_counter()
            try:
                if self._cuda:
                    if job.ready is not None:
                        self._stream.wait_event(job.ready)
                    job.result = self.produce(job.step)
                    job.event = torch.cuda.Event()
                    job.event.record(self._stream)
                else:
                    job.result = self.produce(job.step)
            except BaseException as exc:  # noqa: BLE001 - handed to the consumer
                job.error = exc
            job.seconds = time.perf_counter() - t0
            job.done.set()

    # consumer side
    def _submit(self, step: int) -> _Job:
        ready = None
        if self._cuda:  # the job starts after the work queued so far on the consumer's stream
            ready = torch.cuda.Event()
            ready.record(torch.cuda.current_stream(self.device))
        job = _Job(step, ready)
        with self._cond:
            if self._closed:
                raise RuntimeError("Prefetcher is closed")
            self._queue.append(job)
            self._cond.notify()
        return job

    def get(self, step: int):
        """``produce(step)``; then starts ``produce(step + 1)`` in the background."""
        if self._closed:
            raise RuntimeError("Prefetcher is closed")
        job, self._pending = self._pending, None
        if job is None or job.step != step:  # first step, or a jump: after any job in flight, on the same stream
            job = self._submit(step)
        job.done.wait()
        self.background_seconds += job.seconds
        if job.error is not None:
            raise job.error
        result = job.result
        if self._cuda:
            current = torch.cuda.current_stream(self.device)
            current.wait_event(job.event)
            _record_stream(result, current)
        self._pending = self._submit(step + 1)
        return result

    def close(self, timeout: float = 30.0) -> None:
        """Stop the thread (after the job in flight, if any); idempotent."""
        with self._cond:
            self._closed = True
            self._queue.clear()
            self._cond.notify_all()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        self._pending = None

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def __del__(self):  # last resort; engines call close() explicitly
        try:
            self.close(timeout=1.0)
        except Exception:  # noqa: BLE001
            pass


_SPARSE_PARTS = {
    torch.sparse_csr: ("crow_indices", "col_indices", "values"),
    torch.sparse_csc: ("ccol_indices", "row_indices", "values"),
    torch.sparse_bsr: ("crow_indices", "col_indices", "values"),
    torch.sparse_bsc: ("ccol_indices", "row_indices", "values"),
    torch.sparse_coo: ("_indices", "_values"),
}


def _record_stream(obj, stream, _seen=None) -> None:
    """``tensor.record_stream(stream)`` for every CUDA tensor reachable in ``obj``. A
    sparse tensor has no ``record_stream`` of its own: its index and value arrays,
    which alias its storage, are recorded instead."""
    if isinstance(obj, torch.Tensor):
        if obj.is_cuda:
            if obj.layout == torch.strided:
                obj.record_stream(stream)
            else:
                for part in _SPARSE_PARTS[obj.layout]:
                    getattr(obj, part)().record_stream(stream)
        return
    _seen = set() if _seen is None else _seen
    if id(obj) in _seen:
        return
    _seen.add(id(obj))
    if isinstance(obj, dict):
        for v in obj.values():
            _record_stream(v, stream, _seen)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _record_stream(v, stream, _seen)
    elif hasattr(obj, "__dict__"):
        for v in vars(obj).values():
            _record_stream(v, stream, _seen)


# --------------------------------------------------------------------------- profiler
class StepProfiler:
    """``--profile DIR``: a torch.profiler trace of ``active`` training steps after
    ``wait + warmup`` steps, written as ``DIR/trace_rank{r}.json`` (Chrome trace
    format; open in Perfetto or chrome://tracing). Call :meth:`step` after every
    training step and :meth:`close` at the end; a run shorter than the schedule is
    still written at :meth:`close`.
    """

    def __init__(self, out_dir: str | None, rank: int = 0, wait: int = 1, warmup: int = 1, active: int = 3):
        self.enabled = out_dir is not None
        self.path = Path(out_dir) / f"trace_rank{rank}.json" if self.enabled else None
        self._prof = None
        self._written = False
        if self.enabled:
            from torch.profiler import ProfilerActivity, profile, schedule

            activities = [ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(ProfilerActivity.CUDA)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._prof = profile(activities=activities, schedule=schedule(wait=wait, warmup=warmup, active=active),
                                 on_trace_ready=self._write, record_shapes=False)
            self._prof.__enter__()

    def _write(self, prof) -> None:
        prof.export_chrome_trace(str(self.path))
        self._written = True

    def step(self) -> None:
        if self._prof is not None:
            self._prof.step()

    def close(self) -> None:
        if self._prof is not None:
            prof, self._prof = self._prof, None
            prof.__exit__(None, None, None)
            if not self._written:
                try:
                    prof.export_chrome_trace(str(self.path))
                    self._written = True
                except (RuntimeError, AssertionError):  # nothing was recorded (run shorter than wait+warmup)
                    pass
