"""The row-sparse gradient: a weight gradient that is zero outside some rows.

The input projection's weight gradient with sparse features, ``dW_in = X^T dZ`` (F, H),
is zero in the rows of the features absent from the batch. The sharded GEMM's backward
makes it (:func:`scalegnn.parallel.products.sharded_gemm`, only the R present rows) and
the optimizer consumes it (:class:`scalegnn.optim.RowSparseAdamW`, only those rows
updated). Between them it is a coalesced sparse COO tensor with one sparse dimension:

    indices (1, R)   the rows, sorted and unique
    values  (R, H)   those rows of the gradient
"""

from __future__ import annotations

import torch

__all__ = ["row_sparse_grad", "grad_values"]


def row_sparse_grad(rows: torch.Tensor, values: torch.Tensor, shape) -> torch.Tensor:
    """The gradient of a (F, H) weight that is zero outside ``rows`` (sorted, unique):
    a coalesced sparse COO tensor with one sparse dimension, values (R, H)."""
    return torch.sparse_coo_tensor(rows.reshape(1, -1), values, tuple(shape), is_coalesced=True)


def grad_values(grad: torch.Tensor) -> torch.Tensor:
    """The stored values of a gradient: itself if dense, its (R, H) rows if row-sparse
    (unique rows by construction, so norms and scalings apply to them as to a dense one;
    autograd's accumulation into ``.grad`` drops the coalesced flag, not the property)."""
    return grad._values() if grad.is_sparse else grad
