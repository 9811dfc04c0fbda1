"""Flux (LLNL Tuolumne): the environment a `flux run` task sees, the batch scripts, and a
sweep end to end under a simulated `flux` (tests/flux_sim/flux: no Flux package is
reachable here, so the real scheduler is not exercised)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from scalegnn.launch.environment import _flux_port, detect_env


SIM = Path(__file__).parent / "flux_sim"
EXPECTED = Path(__file__).parent / "expected"
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SUBMITIT_EXECUTOR",
                 "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_JOB_ID", "SLURM_NODELIST",
                 "SLURM_JOB_NODELIST", "SLURM_STEP_NODELIST", "FLUX_TASK_RANK", "FLUX_JOB_SIZE",
                 "FLUX_TASK_LOCAL_ID", "FLUX_JOB_ID", "FLUX_JOB_NNODES")


@pytest.fixture
def clean_env(monkeypatch):
    for var in LAUNCHER_VARS:
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def _flux_task(monkeypatch, rank, size, local, job="ƒ2Mq8R4eZ"):
    monkeypatch.setenv("FLUX_TASK_RANK", str(rank))
    monkeypatch.setenv("FLUX_JOB_SIZE", str(size))
    monkeypatch.setenv("FLUX_TASK_LOCAL_ID", str(local))
    monkeypatch.setenv("FLUX_JOB_ID", job)


def test_detect_env_reads_flux_task_variables_and_the_broker_hostlist(clean_env, tmp_path):
    """Task 5 of a 16-task job on 4 nodes: rank, world and local rank from Flux's variables,
    the rendezvous on the first host of `flux getattr hostlist` (simulated)."""
    clean_env.setenv("PATH", f"{SIM}{os.pathsep}{os.environ['PATH']}")
    clean_env.setenv("FLUX_SIM_HOSTLIST", "tuolumne[1001-1004]")
    _flux_task(clean_env, 5, 16, 1)
    info = detect_env()
    assert (info.rank, info.world_size, info.local_rank, info.source) == (5, 16, 1, "flux")
    assert info.master_addr == "tuolumne1001"
    assert info.master_port == _flux_port("ƒ2Mq8R4eZ") and 20000 <= info.master_port < 40000
    # every task of the job computes the same port; another job id gives another one
    assert _flux_port("ƒ2Mq8R4eZ") == _flux_port("ƒ2Mq8R4eZ") != _flux_port("ƒ3ETxsR9H")
    assert _flux_port("1234567") == 20000 + 1234567 % 20000  # decimal ids as SLURM's
    # MASTER_ADDR / MASTER_PORT, when the script exports them, win
    clean_env.setenv("MASTER_ADDR", "10.0.0.7")
    clean_env.setenv("MASTER_PORT", "29999")
    info = detect_env()
    assert (info.master_addr, info.master_port) == ("10.0.0.7", 29999)


def test_flux_comes_before_slurm_variables_inherited_from_the_broker(clean_env):
    """A Flux instance started by srun passes the broker's SLURM_* variables to its jobs'
    tasks: they must not be read as this task's rank (every task would be rank 0)."""
    clean_env.setenv("SLURM_PROCID", "0")
    clean_env.setenv("SLURM_NTASKS", "1")
    clean_env.setenv("MASTER_ADDR", "127.0.0.1")
    _flux_task(clean_env, 3, 4, 3)
    info = detect_env()
    assert (info.rank, info.world_size, info.source) == (3, 4, "flux")


def test_flux_errors_name_the_fix(clean_env):
    clean_env.setenv("FLUX_TASK_RANK", "0")
    with pytest.raises(ValueError, match="FLUX_JOB_SIZE is not.*flux run"):
        detect_env()
    clean_env.setenv("FLUX_JOB_SIZE", "2")
    clean_env.setenv("PATH", "/nonexistent")  # no flux command: no host list
    with pytest.raises(ValueError, match="flux getattr hostlist.*MASTER_ADDR"):
        detect_env()
    clean_env.setenv("FLUX_JOB_SIZE", "two")
    with pytest.raises(ValueError, match="FLUX_JOB_SIZE='two' must be an integer"):
        detect_env()
