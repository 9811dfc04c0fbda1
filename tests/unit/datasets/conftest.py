"""Every test of the dataset layer runs isolated (tests/conftest.py's ``isolated_data``):
its own cache folder, an empty default data root, and never the network."""

import pytest


@pytest.fixture(autouse=True)
def _isolated(isolated_data):
    return isolated_data
