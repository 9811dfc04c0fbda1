"""The virtual-device tier (``make test-vgpu``): every test in this folder is marked
``vgpu``; `make test` deselects them (pyproject.toml's addopts), `make test-vgpu` runs
exactly them. The harness is tests/vgpu/virtual.py."""

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items):
    for item in items:
        if HERE in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.vgpu)
