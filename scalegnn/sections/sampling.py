"""The ``sampling`` section: B, the vertices sampled per step (read by :mod:`scalegnn.sampling`)."""

from __future__ import annotations

from dataclasses import dataclass

from ..settings import fraction, setting

__all__ = ["SamplingConfig", "SAMPLER_BACKENDS"]

SAMPLER_BACKENDS = ("auto", "torch", "numba")  # Algorithm 2's kernels (scalegnn.sampling; --sampler, a perf switch)


@dataclass(kw_only=True)
class SamplingConfig:
    """B, the vertices sampled per step: a count, or a ratio of N (one of the two)."""

    batch_size: int | None = setting(None, scope="scalegnn", help="sampled vertices per step B (a count)")
    batch_ratio: float | None = setting(0.1, scope="scalegnn", type=fraction,
                                        help="B as a fraction of N; 1.0 is full-graph training (fullgraph-3d)")

    def __post_init__(self):
        if self.batch_size is not None:
            self.batch_ratio = None  # a count given: the ratio's default does not apply
        elif self.batch_ratio is None:
            raise ValueError("give the batch as --batch-size (a vertex count) or --batch-ratio (a fraction of N)")
        if self.batch_ratio is not None:
            fraction(self.batch_ratio)
