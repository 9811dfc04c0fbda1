"""Per-component timers (scalegnn/timing.py): the host clock on the CPU, CUDA events on a
GPU (``gpu`` marker), nothing when off."""

from __future__ import annotations

import pytest
import torch

from scalegnn.timing import SpanTimer
from tests.devices import needs_gpu


def test_span_timer_cpu_and_off():
    t = SpanTimer("cpu")
    with t("a"):
        sum(range(1000))
    assert t.flush()["a"] > 0
    off = SpanTimer("cpu", enabled=False)
    with off("a"):
        pass
    assert dict(off.seconds) == {}


@pytest.mark.gpu
@needs_gpu
def test_span_timer_cuda_events():
    t = SpanTimer("cuda")
    x = torch.randn(1024, 1024, device="cuda")
    with t("mm"):
        x @ x
    assert t.flush()["mm"] > 0
