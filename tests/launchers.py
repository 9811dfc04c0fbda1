"""The environment of a process started by a launcher, for the tests of how a process
finds its place in a run (tests/integration/test_launch_environment.py) and of the Flux
task of a sweep (tests/harness/test_flux.py): no launcher's variables (``clean_env``,
imported into a test module as a fixture), a Flux task's own, and the simulated ``flux``
command of ``tests/flux_sim``."""

from __future__ import annotations

from pathlib import Path

import pytest

FLUX_SIM = Path(__file__).resolve().parent / "flux_sim"
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SUBMITIT_EXECUTOR",
                 "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_JOB_ID", "SLURM_NODELIST",
                 "SLURM_JOB_NODELIST", "SLURM_STEP_NODELIST", "FLUX_TASK_RANK", "FLUX_JOB_SIZE",
                 "FLUX_TASK_LOCAL_ID", "FLUX_JOB_ID", "FLUX_JOB_NNODES")


@pytest.fixture
def clean_env(monkeypatch):
    for var in LAUNCHER_VARS:
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def flux_task_env(monkeypatch, rank, size, local, job="ƒ2Mq8R4eZ"):
    """The variables Flux gives task ``rank`` of a ``size``-task job (``local``: its index on the node)."""
    monkeypatch.setenv("FLUX_TASK_RANK", str(rank))
    monkeypatch.setenv("FLUX_JOB_SIZE", str(size))
    monkeypatch.setenv("FLUX_TASK_LOCAL_ID", str(local))
    monkeypatch.setenv("FLUX_JOB_ID", job)
