"""Shared fixtures of the micro-benchmarks (``make bench``: pytest tests/benchmarks -m bench
--benchmark-only).

Every test in this folder is marked ``bench`` and runs only where ``-m`` names ``bench``:
``make test`` (pytest's addopts in pyproject.toml: ``-m 'not slurm and not bench'``), or
any other ``-m`` that does not name it, deselects them: timings are never a pass/fail test. Sizes are moderate so one run takes a few minutes on a 2-core box; the
end-to-end comparisons at full size are ``scalegnn bench ...`` (docs/benchmarks.md).
"""

import re
import warnings
from pathlib import Path

import pytest
import torch

warnings.filterwarnings("ignore", message=".*Sparse CSR tensor support is in beta.*")

N, NNZ, B = 200_000, 4_000_000, 20_000

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items):
    """Mark this folder's tests ``bench`` (a conftest's hook runs ahead of pytest's own
    ``-m`` selection), and deselect them unless the ``-m`` expression names ``bench`` (a
    later ``-m`` replaces the one of addopts)."""
    mine = {item for item in items if HERE in Path(item.path).resolve().parents}
    for item in mine:
        item.add_marker(pytest.mark.bench)
    if mine and "bench" not in re.findall(r"\w+", config.option.markexpr or ""):
        config.hook.pytest_deselected(items=sorted(mine, key=lambda item: item.nodeid))
        items[:] = [item for item in items if item not in mine]


@pytest.fixture(scope="session")
def csr():
    from scalegnn.benchmarks.bench_command import random_csr

    return random_csr(N, NNZ, seed=0)


@pytest.fixture(scope="session")
def block(csr):
    from scalegnn.sampling import CSRBlock

    indptr, indices, values = csr
    return CSRBlock(indptr, indices.to(torch.int32), values, 0, N, 0, N)
