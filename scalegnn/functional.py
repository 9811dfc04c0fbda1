"""The element-wise functions of a layer's tail, shared by the serial model and the
sharded one (:mod:`scalegnn.parallel.tail`) and by the CAGNET baseline.

Shape legend: B rows (vertices), H hidden columns; a caller holding a column slice
passes what it needs of the full row (the all-reduced sum of squares, the global
column ids).

    rms_norm           y = x / sqrt(sum_j x_j^2 / H + eps) * g               (Eq. 7)
    dropout_keep_mask  keep_ij ~ Bernoulli(1 - p), a hash of (key, row i, col j) (Eq. 9)
"""

from __future__ import annotations

import torch

__all__ = ["rms_norm", "dropout_keep_mask"]


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float, sum_sq: torch.Tensor | None = None,
             dim: int | None = None) -> torch.Tensor:
    """RMSNorm (Eq. 7): x / sqrt(mean_j x_j^2 + eps) * g.

    ``sum_sq`` and ``dim`` let the parallel model pass the all-reduced FP32 sum of
    squares over the full hidden dimension (Eq. 29) while holding a column slice.
    """
    if sum_sq is None:
        acc = x if x.dtype == torch.float64 else x.float()  # FP32 at least, as the parallel all-reduce
        sum_sq, dim = acc.pow(2).sum(-1, keepdim=True), x.shape[-1]
    y = x * torch.rsqrt(sum_sq / dim + eps).to(x.dtype)
    return y * weight if weight is not None else y


def dropout_keep_mask(key: int, row_ids: torch.Tensor, col_ids: torch.Tensor, p: float) -> torch.Tensor:
    """Bernoulli(1-p) keep mask (len(row_ids), len(col_ids)) from a splitmix64 hash.

    Entry (i, j) depends only on (key, row_ids[i], col_ids[j]): any block of the
    global mask can be computed alone, which is what makes dropout in the 3D
    parallel model identical to the serial one under a shared seed. The hash is
    defined in :mod:`scalegnn._elementwise` (a one-pass numba kernel on the CPU, torch
    int64 ops elsewhere; the same bits).
    """
    from ._elementwise import keep_mask  # lazy: importing the model does not pay numba's import

    return keep_mask(key, row_ids, col_ids, p)
