"""The two paths of the compiled elementwise kernels (scalegnn._elementwise), for the
tests of the dropout mask (tests/unit/test_elementwise.py) and of the layer tail that
runs on them (tests/parallel/test_tail.py): a test that takes the ``backend`` fixture
(imported into its module) runs once with numba's kernels and once with the torch path."""

from __future__ import annotations

import pytest

from scalegnn import _elementwise as ew

needs_numba = pytest.mark.skipif(not ew.available(), reason="numba is not installed")


@pytest.fixture(params=["numba", "torch"])
def backend(request, monkeypatch):
    """Each kernel path in turn: the compiled one (skipped without numba) and the torch
    one, forced by switching the compiled kernels off in this process."""
    if request.param == "numba" and not ew.available():
        pytest.skip("numba is not installed")
    if request.param == "torch":
        monkeypatch.setattr(ew, "_ENABLED", False)
    return request.param
