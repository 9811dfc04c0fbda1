"""The ``sampling`` section: B, the vertices sampled per step (read by :mod:`scalegnn.sampling`)."""

from __future__ import annotations

from dataclasses import dataclass

from ..settings import fraction, setting

__all__ = ["SamplingConfig", "SAMPLER_BACKENDS", "resolve_batch_size"]

SAMPLER_BACKENDS = ("auto", "torch", "numba")  # Algorithm 2's kernels (scalegnn.sampling; --sampler, a perf switch)


# The one computation of B: the trainers, the distributed sampler and the cost model (scalegnn.perfmodel, no torch)
def resolve_batch_size(num_nodes: int, batch_size: int | None = None, batch_ratio: float | None = None) -> int:
    """B from either a count or a ratio of N; 2 <= B <= N (B = 1 makes p undefined)."""
    if (batch_size is None) == (batch_ratio is None):
        raise ValueError("give exactly one of batch_size (a vertex count) or batch_ratio (a fraction of N)")
    if batch_ratio is not None:
        if not 0.0 < batch_ratio <= 1.0:
            raise ValueError(f"batch_ratio must be in (0, 1], got {batch_ratio}")
        batch_size = max(2, int(round(batch_ratio * num_nodes)))
    if not 2 <= batch_size <= num_nodes:
        raise ValueError(
            f"batch size must be between 2 and N={num_nodes}, got {batch_size}; "
            "use --batch-ratio 1.0 for full-graph training"
        )
    return int(batch_size)


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
