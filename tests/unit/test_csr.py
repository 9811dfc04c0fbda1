"""Sparse feature matrices (scalegnn/csr.py)."""

from __future__ import annotations

import torch


def test_csr_transpose_is_the_transpose_with_sorted_rows():
    """The CSR of x^T (the input projection's weight gradient on sparse features):
    equal to the dense transpose, rows sorted inside every column, empty rows and
    columns included."""
    from scalegnn.csr import csr_transpose

    gen = torch.Generator().manual_seed(3)
    dense = (torch.rand(9, 13, generator=gen) < 0.2) * torch.rand(9, 13, generator=gen)
    dense[4] = 0  # an empty row
    dense[:, 7] = 0  # an empty column
    t = csr_transpose(dense.to_sparse_csr())
    assert t.shape == (13, 9) and torch.equal(t.to_dense(), dense.t())
    crow, col = t.crow_indices(), t.col_indices()
    for r in range(13):
        cols = col[crow[r]:crow[r + 1]]
        assert torch.equal(cols, torch.sort(cols).values)
