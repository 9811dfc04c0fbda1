"""SpMM forward + backward on a sampled block (B = 2e4 rows, ~2e5 entries), hidden 64
and 256: the aggregation of one layer (Eq. 5) and its backward through the prebuilt
transpose (Eq. 17)."""

import pytest
import torch

from scalegnn.model import spmm
from scalegnn.sampling import extract_block, inclusion_probability, sample_vertices
from tests.benchmarks.conftest import B, N


@pytest.fixture(scope="module")
def sampled(block):
    return extract_block(block, sample_vertices(N, B, 0, 0), inclusion_probability(N, B))


@pytest.mark.benchmark(group="spmm")
@pytest.mark.parametrize("hidden", [64, 256])
def test_spmm_forward_backward(benchmark, sampled, hidden):
    x = torch.randn(B, hidden, requires_grad=True)
    grad = torch.randn(B, hidden)

    def step():
        x.grad = None
        spmm(sampled.adj, sampled.adj_t, x).backward(grad)

    benchmark(step)
