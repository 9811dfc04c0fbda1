"""Contiguous, balanced splits of a range (scalegnn/ranges.py)."""

from __future__ import annotations

import pytest

from scalegnn.ranges import split_bounds, split_range


# ----------------------------------------------------------------------------- pure helpers
@pytest.mark.parametrize("n,parts", [(10, 3), (3, 5), (0, 2), (37, 2), (8, 8), (1, 1)])
def test_split_range_is_contiguous_and_balanced(n, parts):
    pieces = [split_range(n, parts, i) for i in range(parts)]
    assert pieces[0][0] == 0 and pieces[-1][1] == n
    assert all(pieces[i][1] == pieces[i + 1][0] for i in range(parts - 1))
    sizes = [b - a for a, b in pieces]
    assert sizes == sorted(sizes, reverse=True) and max(sizes) - min(sizes) <= 1
    assert sizes[: n % parts] == [n // parts + 1] * (n % parts)  # the first n % parts get one extra
    assert split_bounds(n, parts) == [a for a, _ in pieces] + [n]


def test_split_range_rejects_bad_arguments():
    with pytest.raises(ValueError, match="index 3 out of range"):
        split_range(10, 3, 3)
    with pytest.raises(ValueError, match="parts must be >= 1"):
        split_range(10, 0, 0)
