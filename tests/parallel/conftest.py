"""The parallel code's tests spawn gloo process groups (``scalegnn.launch.job.spawn``): every
test in this folder is marked ``distributed``, as tests/benchmarks/conftest.py marks its
own ``bench``."""

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items):
    """Mark this folder's tests ``distributed`` (a conftest's hook sees every collected item)."""
    for item in items:
        if HERE in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.distributed)
