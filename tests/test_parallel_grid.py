"""Process grid, collectives over named axes, launch helpers and the spawn utility.

Collectives are checked with rank-valued inputs whose results have a closed form
(Megatron's test_mappings style); all values are small integers, exact in float32
and bfloat16, so equality is exact.
"""

from __future__ import annotations

import os
import time

import pytest
import torch

from scalegnn.launch.environment import detect_env, first_host
from scalegnn.launch.job import SpawnTimeout, WorkerError, spawn


pytestmark = pytest.mark.distributed


def _boom_worker(rank, world):
    if rank == 2:
        time.sleep(0.2)
        raise KeyError("rank two exploded")
    torch.distributed.barrier()  # would wait forever for rank 2
    return rank


def _exit_worker(rank, world):
    if rank == 1:
        os._exit(3)
    torch.distributed.barrier()
    return rank


def _sleep_worker(rank, world):
    time.sleep(60)


def _ok_worker(rank, world, payload):
    return rank, world, payload * (rank + 1)


def test_spawn_returns_results_in_rank_order():
    out = spawn(_ok_worker, 3, torch.arange(3.0), timeout_s=60)
    assert [r for r, _, _ in out] == [0, 1, 2] and all(w == 3 for _, w, _ in out)
    assert torch.equal(out[2][2], torch.tensor([0.0, 3.0, 6.0]))


def test_spawn_raises_worker_error_naming_the_failed_rank_promptly():
    t0 = time.monotonic()
    with pytest.raises(WorkerError) as info:
        spawn(_boom_worker, 4, timeout_s=60)
    assert info.value.rank == 2
    assert "KeyError" in info.value.traceback_text and "rank two exploded" in info.value.traceback_text
    assert time.monotonic() - t0 < 20  # not the 60 s deadline: the others were terminated


def test_spawn_reports_a_worker_that_dies_without_an_exception():
    with pytest.raises(WorkerError) as info:
        spawn(_exit_worker, 3, timeout_s=60)
    assert info.value.rank == 1 and "code 3" in str(info.value)


def test_spawn_times_out_instead_of_hanging():
    t0 = time.monotonic()
    with pytest.raises(SpawnTimeout, match="did not finish"):
        spawn(_sleep_worker, 2, timeout_s=3)
    assert time.monotonic() - t0 < 15


# ----------------------------------------------------------------------------- launch env
def test_first_host_of_slurm_nodelists():
    assert first_host("nid[001-004,007]") == "nid001"
    assert first_host("gpu12") == "gpu12"
    assert first_host("a[3-4],b[1-2]") == "a3"
    assert first_host("node-[09,11]-ib") == "node-09-ib"


def _clear_launch_env(monkeypatch):
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SUBMITIT_EXECUTOR",
              "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NODELIST", "SLURM_JOB_NODELIST",
              "SLURM_STEP_NODELIST", "SLURM_JOB_ID"):
        monkeypatch.delenv(k, raising=False)


def test_detect_env_torchrun_slurm_single(monkeypatch):
    _clear_launch_env(monkeypatch)
    assert detect_env().source == "single" and detect_env().world_size == 1
    monkeypatch.setenv("SLURM_PROCID", "5")
    monkeypatch.setenv("SLURM_NTASKS", "8")
    monkeypatch.setenv("SLURM_LOCALID", "1")
    monkeypatch.setenv("SLURM_NODELIST", "nid[010-011]")
    monkeypatch.setenv("SLURM_JOB_ID", "123456")
    env = detect_env()
    assert (env.source, env.rank, env.world_size, env.local_rank, env.master_addr) == ("slurm", 5, 8, 1, "nid010")
    assert 20000 <= env.master_port < 40000
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29501")
    env = detect_env()  # torchrun takes precedence over the SLURM variables
    assert (env.source, env.rank, env.world_size, env.master_addr, env.master_port) == \
        ("torchrun", 3, 4, "10.0.0.1", 29501)
    monkeypatch.delenv("MASTER_PORT")
    with pytest.raises(ValueError, match="MASTER_ADDR/MASTER_PORT"):
        detect_env()
