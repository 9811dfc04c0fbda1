"""Fixtures of the compared systems' tests: a data root per test module and the tiny graph
(:data:`tests.runs.BASELINE_TINY`) loaded the way the data-parallel baselines load it."""

import pytest

from scalegnn.config import make_config
from tests.runs import BASELINE_TINY as TINY


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    return str(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def tiny(data_root):
    from scalegnn.baselines.common import load_data  # PyG: imported by the modules that need it, after their skip

    return load_data(make_config("graphsage", dataset=TINY, data_root=data_root))
