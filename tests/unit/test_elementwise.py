"""The dropout mask's kernels (scalegnn/_elementwise.py) against the definition: the numba
kernel and the torch path equal, bit for bit, a frozen copy of the original formula
(``scalegnn.benchmarks.elementwise.mask_before_issue_l``), for random keys, ids, p, odd
and empty shapes, non-contiguous and int32 id tensors; without numba (monkeypatched
off) the torch path gives the same masks. The layer tail's kernels are held to the
unfused operators through ``layer_tail`` in tests/parallel/test_tail.py."""

from __future__ import annotations

import pytest
import torch

from scalegnn import _elementwise as ew
from scalegnn.benchmarks.elementwise import mask_before_issue_l
from scalegnn.functional import dropout_keep_mask
from tests.elementwise import backend, needs_numba  # noqa: F401 (backend: a fixture)


# ----------------------------------------------------------------------------- the mask
def _mask_cases():
    gen = torch.Generator().manual_seed(7)
    cases = []
    for i, (b, h) in enumerate([(1, 1), (7, 13), (257, 33), (0, 5), (5, 0), (64, 256), (3, 1000)]):
        for p in (0.0, 1e-9, 0.1, 0.5, 0.9, 0.999999):
            key = int(torch.randint(0, 1 << 62, (1,), generator=gen)) if i % 2 else i
            rows = torch.randint(0, 1 << 40, (b,), generator=gen)  # large ids: every bit of the product counts
            cols = torch.randperm(max(h, 1) * 3, generator=gen)[:h]
            cases.append((key, rows, cols, p))
    return cases


def test_mask_equals_the_definition_bit_for_bit(backend):
    for key, rows, cols, p in _mask_cases():
        want = mask_before_issue_l(key, rows, cols, p)
        got = ew.keep_mask(key, rows, cols, p)
        assert got.dtype == torch.bool and got.shape == want.shape
        assert torch.equal(got, want), (key, rows.shape, cols.shape, p)
        assert torch.equal(dropout_keep_mask(key, rows, cols, p), want)
        if p == 0.0:
            assert bool(got.all())
    # non-contiguous and int32 id tensors, and the keep rate
    ids = torch.arange(0, 4000, dtype=torch.int32)
    rows, cols = ids[::3], ids[1:600:7]
    assert not rows.is_contiguous()
    got = ew.keep_mask(123456789, rows, cols, 0.3)
    assert torch.equal(got, mask_before_issue_l(123456789, rows, cols, 0.3))
    assert abs(float(got.float().mean()) - 0.7) < 0.01


def test_mask_comparison_can_fail():
    """An arithmetic instead of a logical shift, or a neighbouring key, changes the mask."""
    rows, cols = torch.randint(0, 1 << 40, (50,)), torch.arange(64)
    want = ew.keep_mask(99, rows, cols, 0.5)
    assert not torch.equal(want, ew.keep_mask(100, rows, cols, 0.5))
    h = rows[:, None] * (ew.GOLD - (1 << 64)) + cols[None, :] * (ew.M2 - (1 << 64)) + 99
    h = (h ^ (h >> 30)) * (ew.M1 - (1 << 64))
    h = (h ^ (h >> 27)) * (ew.M2 - (1 << 64))
    h = h ^ (h >> 31)
    assert not torch.equal(want, (h >> 11) >= int(0.5 * float(1 << 53)))


@needs_numba
def test_the_numba_mask_does_not_call_the_torch_path(monkeypatch):
    def boom(*a):
        raise AssertionError("torch path taken")

    monkeypatch.setattr(ew, "keep_mask_torch", boom)
    ew.keep_mask(1, torch.arange(5), torch.arange(3), 0.5)
    with pytest.raises(ValueError, match="1-D"):
        ew.keep_mask(1, torch.arange(6).view(2, 3), torch.arange(3), 0.5)
