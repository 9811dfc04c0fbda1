"""The launcher's variables checked before anything starts (scalegnn/launch/environment.py,
``detect_env``): a rank outside its world, a local rank outside its node, a port that is
no port, an empty address, a value that is no integer. Each is one ``ValueError`` line
naming the variables, their values and the fix, raised before any rendezvous or data
(a rank 5 of 2 used to wait for a rendezvous that never completes)."""

from __future__ import annotations

import pytest

from scalegnn.launch.environment import detect_env
from tests.launchers import LAUNCHER_VARS

MORE = ("LOCAL_WORLD_SIZE", "SLURM_STEP_ID", "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE",
        "SLURM_NTASKS_PER_NODE", "SLURM_NODEID", "TORCHELASTIC_USE_AGENT_STORE")


@pytest.fixture
def launched(monkeypatch):
    """Set a launcher's variables (and no others): ``launched(RANK="1", ...)``."""
    for var in (*LAUNCHER_VARS, *MORE):
        monkeypatch.delenv(var, raising=False)

    def set_env(**variables):
        for key, value in variables.items():
            monkeypatch.setenv(key, value)
    return set_env


TORCHRUN = dict(MASTER_ADDR="127.0.0.1", MASTER_PORT="29500")


@pytest.mark.parametrize("variables, message", [
    (dict(RANK="5", WORLD_SIZE="2"), r"^RANK=5 is outside 0\.\.1 \(WORLD_SIZE=2\): .*; start the ranks with torchrun"),
    (dict(RANK="-1", WORLD_SIZE="2"), r"^RANK=-1 is outside 0\.\.1 \(WORLD_SIZE=2\)"),
    (dict(RANK="0", WORLD_SIZE="0"), r"^WORLD_SIZE=0 must be at least 1"),
    (dict(RANK="1", WORLD_SIZE="2", LOCAL_RANK="99", LOCAL_WORLD_SIZE="2"),
     r"^LOCAL_RANK=99 is outside 0\.\.1 \(LOCAL_WORLD_SIZE=2\)"),
    (dict(RANK="1", WORLD_SIZE="2", LOCAL_RANK="99"), r"^LOCAL_RANK=99 is outside 0\.\.1 \(WORLD_SIZE=2\)"),
    (dict(RANK="0", WORLD_SIZE="2", LOCAL_RANK="-1"), r"^LOCAL_RANK=-1 is outside"),
    (dict(RANK="0", WORLD_SIZE="2", LOCAL_WORLD_SIZE="4"), r"^LOCAL_WORLD_SIZE=4 is outside 1\.\.2 \(WORLD_SIZE=2\)"),
    (dict(RANK="0", WORLD_SIZE="2", LOCAL_RANK="zero"), r"^environment variable LOCAL_RANK='zero' must be an integer"),
    (dict(RANK="one", WORLD_SIZE="2"), r"^environment variable RANK='one' must be an integer; start the ranks"),
    (dict(RANK="0", WORLD_SIZE="2", MASTER_PORT="70000"), r"^MASTER_PORT=70000 is no TCP port \(1\.\.65535\); give"),
    (dict(RANK="0", WORLD_SIZE="2", MASTER_PORT="0"), r"^MASTER_PORT=0 is no TCP port"),
    (dict(RANK="0", WORLD_SIZE="2", MASTER_PORT="abc"), r"^environment variable MASTER_PORT='abc' must be an integer"),
    (dict(RANK="0", WORLD_SIZE="2", MASTER_PORT=""), r"^MASTER_PORT is empty"),
    (dict(RANK="0", WORLD_SIZE="2", MASTER_ADDR=""), r"^MASTER_ADDR is empty; set it to the host of rank 0"),
    (dict(RANK="0", WORLD_SIZE="2", MASTER_ADDR="  "), r"^MASTER_ADDR is empty"),
], ids=["rank-beyond-world", "negative-rank", "world-0", "local-rank-beyond-node", "local-rank-beyond-world",
        "negative-local-rank", "node-beyond-world", "local-rank-text", "rank-text", "port-70000", "port-0",
        "port-text", "port-empty", "addr-empty", "addr-blank"])
def test_torchrun_variables_outside_their_ranges_are_one_line(launched, variables, message):
    launched(**{**TORCHRUN, **variables})
    with pytest.raises(ValueError, match=message) as caught:
        detect_env()
    assert "\n" not in str(caught.value)


def test_torchrun_variables_within_their_ranges_pass(launched):
    launched(**{**TORCHRUN, "MASTER_PORT": "65535"}, RANK="3", WORLD_SIZE="4", LOCAL_RANK="1", LOCAL_WORLD_SIZE="2")
    env = detect_env()
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size, env.master_port) == (3, 4, 1, 2, 65535)
    launched(RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="", LOCAL_RANK="0")  # one rank: 0..0
    assert detect_env().world_size == 1


@pytest.mark.parametrize("variables, message", [
    (dict(SLURM_PROCID="4", SLURM_NTASKS="2"), r"^SLURM_PROCID=4 is outside 0\.\.1 \(SLURM_NTASKS=2\): .*srun"),
    (dict(SLURM_PROCID="0", SLURM_NTASKS="0"), r"^SLURM_NTASKS=0 must be at least 1"),
    (dict(SLURM_PROCID="1", SLURM_NTASKS="4", SLURM_STEP_ID="0", SLURM_LOCALID="3",
          SLURM_STEP_TASKS_PER_NODE="2(x2)"), r"^SLURM_LOCALID=3 is outside 0\.\.1 \(SLURM_STEP_TASKS_PER_NODE=2\)"),
    (dict(SLURM_PROCID="0", SLURM_NTASKS="2", SLURM_LOCALID="x"), r"^environment variable SLURM_LOCALID='x' must"),
    (dict(SLURM_PROCID="0", SLURM_NTASKS="2", MASTER_PORT="99999"), r"^MASTER_PORT=99999 is no TCP port"),
    (dict(FLUX_TASK_RANK="3", FLUX_JOB_SIZE="2"),
     r"^FLUX_TASK_RANK=3 is outside 0\.\.1 \(FLUX_JOB_SIZE=2\): .*flux run"),
    (dict(FLUX_TASK_RANK="0", FLUX_JOB_SIZE="2", FLUX_TASK_LOCAL_ID="2", MASTER_ADDR="h"),
     r"^FLUX_TASK_LOCAL_ID=2 is outside 0\.\.1 \(FLUX_JOB_SIZE=2\)"),
], ids=["slurm-rank", "slurm-world-0", "slurm-local-id", "slurm-local-text", "slurm-port", "flux-rank", "flux-local"])
def test_slurm_and_flux_variables_are_held_to_the_same_ranges(launched, variables, message):
    launched(SLURM_NODELIST="n[1-2]", **variables)
    with pytest.raises(ValueError, match=message):
        detect_env()


def test_a_slurm_batch_script_is_not_held_to_its_allocation_s_tasks_per_node(launched):
    """The batch script of an allocation sees its task counts but is no rank (no step id):
    its tasks per node bound nothing."""
    launched(SLURM_PROCID="0", SLURM_NTASKS="8", SLURM_LOCALID="0", SLURM_TASKS_PER_NODE="4(x2)", SLURM_NODELIST="n1")
    assert detect_env().source == "slurm"


def test_an_uneven_flux_placement_passes_and_stays_valid_once_exported(launched):
    """Flux may place 3 of a 4-task job's tasks on one of its 2 nodes: local id 2 is valid
    though tasks over nodes is 2; the ranks on the node count it, so that torchrun's
    variables a sweep task exports from them (sweeps/task.py, join_job) pass as well."""
    launched(FLUX_TASK_RANK="2", FLUX_JOB_SIZE="4", FLUX_TASK_LOCAL_ID="2", FLUX_JOB_NNODES="2", MASTER_ADDR="h",
             MASTER_PORT="29500")
    info = detect_env()
    assert (info.local_rank, info.local_world_size) == (2, 3)
    launched(RANK=str(info.rank), WORLD_SIZE=str(info.world_size), LOCAL_RANK=str(info.local_rank),
             LOCAL_WORLD_SIZE=str(info.local_world_size))
    assert detect_env().source == "torchrun"
