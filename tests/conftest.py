"""Fixtures shared by the test modules. Plain helpers (graph builders, fake dataset
files, a minimal record) live in ``tests/graphs.py`` and ``tests/files.py``, so a test
module never imports another test module."""

from __future__ import annotations

import pytest

from tests.files import SHARED_DATA


LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture(autouse=True)
def _not_inside_a_launched_job(monkeypatch):
    """Every test starts outside any torchrun / srun job: with ``RANK`` and
    ``WORLD_SIZE`` set, a run joins that job and waits for its peers forever. Whatever a
    test exports is undone after it."""
    for var in LAUNCHER_VARIABLES:
        monkeypatch.setenv(var, "")
        monkeypatch.delenv(var)


@pytest.fixture(autouse=True)
def _default_log_level(monkeypatch):
    """Every test starts at the default log level: ``--log-level`` (configure_logging)
    exports the level for child processes (SCALEGNN_LOG_LEVEL) and sets the scalegnn
    logger's, and a CLI test's ``warning`` used to silence the INFO lines that a later
    test's subprocess is checked for. Both are put back after the test."""
    import logging

    logger = logging.getLogger("scalegnn")
    level = logger.level
    monkeypatch.delenv("SCALEGNN_LOG_LEVEL", raising=False)
    yield
    logger.setLevel(level)


@pytest.fixture
def isolated_data(tmp_path, monkeypatch):
    """Its own dataset cache, an empty default data root, and never any network:
    a test sees only the files it writes (or names explicitly)."""
    monkeypatch.setenv("SCALEGNN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("SCALEGNN_DATA_ROOT", str(tmp_path / "default-root"))
    monkeypatch.setenv("SCALEGNN_OFFLINE", "1")
    return tmp_path


@pytest.fixture
def shared_data():
    """``../shared/data`` (the real graphs next to the repository); the test is skipped
    when it is absent, as on a fresh machine."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data folder {SHARED_DATA} is absent")
    return SHARED_DATA
