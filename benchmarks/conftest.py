"""Shared fixtures of the micro-benchmarks (``make bench``: pytest benchmarks --benchmark-only).

Sizes are moderate so one run takes a few minutes on a 2-core box; the end-to-end
comparisons at full size are ``scalegnn bench ...`` (docs/benchmarks.md).
"""

import warnings

import pytest
import torch

warnings.filterwarnings("ignore", message=".*Sparse CSR tensor support is in beta.*")

N, NNZ, B = 200_000, 4_000_000, 20_000


@pytest.fixture(scope="session")
def csr():
    from scalegnn.benchmarks.peers import random_csr

    return random_csr(N, NNZ, seed=0)


@pytest.fixture(scope="session")
def block(csr):
    from scalegnn.sampling import CSRBlock

    indptr, indices, values = csr
    return CSRBlock(indptr, indices.to(torch.int32), values, 0, N, 0, N)
