"""Contiguous pieces of ``range(n)``: how vertices, features, hidden dimensions and
classes are split over the ranks of a grid axis (and over the blocks of a load-
balance count). Every rank computes every piece locally, so no one has to be told.
"""

from __future__ import annotations

__all__ = ["split_range", "split_bounds"]


def split_range(n: int, parts: int, index: int) -> tuple[int, int]:
    """The ``index``-th of ``parts`` contiguous pieces of ``range(n)``: ``(start, end)``.

    Uneven split: the first ``n % parts`` pieces get one extra element, so sizes
    differ by at most one and every rank computes every piece locally. Pieces may be
    empty when ``n < parts``.
    """
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    if not 0 <= index < parts:
        raise ValueError(f"index {index} out of range for {parts} parts")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    base, extra = divmod(n, parts)
    start = index * base + min(index, extra)
    return start, start + base + (1 if index < extra else 0)


def split_bounds(n: int, parts: int) -> list[int]:
    """All ``parts + 1`` boundaries of :func:`split_range`: piece i is ``[b[i], b[i+1])``."""
    return [split_range(n, parts, i)[0] for i in range(parts)] + [n]
