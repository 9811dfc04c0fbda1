"""The speed-only switches (scalegnn/perf.py): the prefetcher's order, errors and shutdown,
and on a GPU (``gpu`` marker) the ordering of its stream with the training stream.
Prefetching leaves training unchanged: tests/parallel/test_engine.py."""

from __future__ import annotations

import threading

import pytest
import torch

from scalegnn.perf import Prefetcher
from tests.devices import needs_gpu


# ------------------------------------------------------------------------------ prefetch
def test_prefetcher_order_errors_and_shutdown():
    seen = []

    def produce(step):
        seen.append((step, threading.current_thread().name))
        if step == 7:
            raise RuntimeError("boom at 7")
        return step * 10

    before = threading.active_count()
    pf = Prefetcher(produce)
    assert [pf.get(s) for s in range(4)] == [0, 10, 20, 30]
    assert pf.get(5) == 50  # a jump: the prefetched step 4 is dropped, 5 produced now
    assert any(name == "scalegnn-prefetch" for _, name in seen)
    pf.get(6)  # prefetches 7, which fails in the thread ...
    with pytest.raises(RuntimeError, match="boom at 7"):
        pf.get(7)  # ... and the consumer sees it
    pf.close()
    pf.close()  # idempotent
    assert not pf.alive and threading.active_count() == before
    with pytest.raises(RuntimeError, match="closed"):
        pf.get(8)


gpu = pytest.mark.gpu


@gpu
@needs_gpu
def test_prefetch_stream_waits_for_training_and_training_waits_for_it():
    """Both event waits of the prefetch stream, made observable with GPU sleeps: a job
    must see the training stream's writes queued before it was submitted (else it
    reads the stale buffer), and training must see a job's result only once the side
    stream has written it (else it reads uninitialized memory). Removing either wait
    from ``Prefetcher`` makes this fail."""
    from scalegnn.perf import Prefetcher

    dev = torch.device("cuda", 0)
    buf = torch.zeros(1 << 16, device=dev)
    cycles = int(2e8)  # ~0.1 s of GPU time

    def produce(step):
        seen = buf.clone()  # what the training stream wrote before this job was submitted
        torch.cuda._sleep(cycles)  # the producing stream is busy ...
        out = torch.empty(1 << 16, device=dev).fill_(float(step))  # ... before the result exists
        return seen, out

    pf = Prefetcher(produce, dev)
    try:
        torch.cuda._sleep(3 * cycles)  # the training stream is busy for longer than a job ...
        buf.fill_(1.0)  # ... before it writes what the jobs of steps 0 and 1 must see
        pf.get(0)  # step 1 is submitted after the fill; unordered, it would copy buf after job 0's sleep
        seen1, _ = pf.get(1)
        assert float(seen1.min()) == 1.0  # the job's stream waited for the training stream
        _, out2 = pf.get(2)  # the side stream still sleeps before it fills out2
        assert float(out2.min()) == 2.0 == float(out2.max())  # the training stream waited for the job
    finally:
        pf.close()
