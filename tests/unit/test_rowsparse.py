"""The row-sparse input-weight gradient (scalegnn/rowsparse.py): the dense gradient's
rows of the features present in the batch, bit for bit; the dense gradient is exactly
zero elsewhere. Its update (the lazy AdamW) is in tests/unit/test_optim.py, the engine
with the setting on in tests/parallel/test_engine.py."""

from __future__ import annotations

import pytest
import torch

from scalegnn.csr import csr_matrix, csr_transpose
from scalegnn.parallel.context import ParallelContext
from scalegnn.parallel.grid import ProcessGrid
from scalegnn.parallel.products import sharded_gemm


def _sparse_x(rows, cols, density, seed):
    gen = torch.Generator().manual_seed(seed)
    dense = (torch.rand(rows, cols, generator=gen) < density) * torch.randn(rows, cols, generator=gen)
    dense[:, cols // 2: cols // 2 + 3] = 0  # a few features no row has
    d = dense.to_sparse_csr()
    return csr_matrix(d.crow_indices(), d.col_indices(), d.values(), dense.shape), dense


# ----------------------------------------------------------------------------- gradient
@pytest.mark.parametrize("defer", [False, True])
def test_row_sparse_gradient_is_the_dense_gradients_touched_rows_exactly(defer):
    x, dense = _sparse_x(40, 57, 0.05, seed=0)
    x_t = csr_transpose(x)
    w0 = torch.randn(57, 9, generator=torch.Generator().manual_seed(1))
    dz = torch.randn(40, 9, generator=torch.Generator().manual_seed(2))
    grads, outs = {}, {}
    for sparse in (False, True):
        pc = ParallelContext(ProcessGrid.single(), sparse_input_grad=sparse)
        w = w0.clone().requires_grad_(True)
        out = sharded_gemm(x, w, pc, "z", "y", "x", defer_dw=defer, h_t=x_t)
        out.backward(dz)
        outs[sparse], grads[sparse] = out.detach(), w.grad
    assert torch.equal(outs[False], outs[True])  # the forward is untouched
    dense_grad, sparse_grad = grads[False], grads[True]
    assert dense_grad.layout == torch.strided and sparse_grad.is_sparse  # (accumulation drops the coalesced flag)
    present = (dense != 0).any(0).nonzero().squeeze(1)
    rows, values = sparse_grad._indices()[0], sparse_grad._values()
    assert 0 < rows.numel() < 57 and torch.equal(rows, present)
    assert values.shape == (rows.numel(), 9)  # only the touched rows were computed
    assert torch.equal(values, dense_grad[rows])  # bit for bit
    untouched = torch.ones(57, dtype=torch.bool)
    untouched[rows] = False
    assert torch.equal(dense_grad[untouched], torch.zeros_like(dense_grad[untouched]))
    assert torch.equal(sparse_grad.to_dense(), dense_grad)


def test_an_empty_batch_gives_an_empty_row_sparse_gradient():
    x = csr_matrix(torch.zeros(4, dtype=torch.long), torch.zeros(0, dtype=torch.long), torch.zeros(0), (3, 6))
    w = torch.randn(6, 2, requires_grad=True)
    pc = ParallelContext(ProcessGrid.single(), sparse_input_grad=True)
    sharded_gemm(x, w, pc, "z", "y", "x", h_t=csr_transpose(x)).sum().backward()
    assert w.grad.is_sparse and w.grad._nnz() == 0
