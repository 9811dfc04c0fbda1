"""Where this process stands in a run (scalegnn/launch/environment.py): how it takes part
(in process, a local job, or a rank of a launched job: ``run_mode``), and the launcher's
variables it reads (torchrun, SLURM, Flux under a simulated ``flux`` command)."""

from __future__ import annotations

import os

import pytest

from scalegnn.launch.environment import _flux_port, detect_env, first_host, run_mode
from scalegnn.parallel.grid import ParallelConfig
from tests.launchers import FLUX_SIM, clean_env, flux_task_env  # noqa: F401 (clean_env: a fixture)


SLURM = ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_STEP_ID", "SLURM_JOB_ID", "SLURM_NODELIST", "SLURM_LOCALID",
         "SUBMITIT_EXECUTOR", "FLUX_TASK_RANK", "FLUX_JOB_SIZE", "TORCHELASTIC_RUN_ID")


@pytest.fixture
def no_launcher(monkeypatch):
    for var in SLURM:
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


# ----------------------------------------------------------------------------- how a process takes part
@pytest.mark.parametrize("env, parallel, mode", [
    ({}, dict(), "in process"),
    ({}, dict(nproc=1), "in process"),
    ({}, dict(nproc=4, grid=(1, 2, 2, 1)), "local"),
    ({}, dict(grid=(1, 2, 1, 1)), "joined"),  # no launcher: joining says how to start the ranks
    ({"RANK": "1", "WORLD_SIZE": "4", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, dict(grid=(1, 2, 2, 1)), "joined"),
    ({"RANK": "1", "WORLD_SIZE": "4", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, dict(nproc=4, grid=(4, 1, 1, 1)),
     "joined"),  # a data-parallel system's --nproc names the job's ranks
    # an srun task (its step's id) is a rank; the batch script of the allocation is not (checked on SLURM 22.05:
    # the batch script sees SLURM_PROCID=0 and SLURM_NTASKS, but no SLURM_STEP_ID)
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_STEP_ID": "0", "SLURM_NODELIST": "n1"},
     dict(grid=(1, 2, 2, 1)), "joined"),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_NODELIST": "n1"}, dict(nproc=4, grid=(1, 2, 2, 1)), "local"),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_NODELIST": "n1"}, dict(), "in process"),
], ids=["one", "nproc-1", "nproc-4", "grid-without-launcher", "torchrun", "torchrun-dp", "srun-task",
        "batch-script", "one-task"])
def test_a_process_takes_part_in_a_run_in_one_of_three_ways(no_launcher, env, parallel, mode):
    for key, value in env.items():
        no_launcher.setenv(key, value)
    assert run_mode(ParallelConfig(**parallel), detect_env()) == mode


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


# ----------------------------------------------------------------------------- Flux
def test_detect_env_reads_flux_task_variables_and_the_broker_hostlist(clean_env, tmp_path):
    """Task 5 of a 16-task job on 4 nodes: rank, world and local rank from Flux's variables,
    the rendezvous on the first host of `flux getattr hostlist` (simulated)."""
    clean_env.setenv("PATH", f"{FLUX_SIM}{os.pathsep}{os.environ['PATH']}")
    clean_env.setenv("FLUX_SIM_HOSTLIST", "tuolumne[1001-1004]")
    flux_task_env(clean_env, 5, 16, 1)
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
    flux_task_env(clean_env, 3, 4, 3)
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


# ---------------------------------------------------------------------------- transport interface
def test_a_transport_interface_this_host_lacks_is_refused_in_one_line():
    import socket

    from scalegnn.launch.environment import check_socket_ifnames

    have = sorted(name for _, name in socket.if_nameindex())
    lo = next(n for n in have if n.startswith("lo"))
    check_socket_ifnames({})  # nothing asked: nothing checked
    check_socket_ifnames({"GLOO_SOCKET_IFNAME": lo, "NCCL_SOCKET_IFNAME": lo})
    check_socket_ifnames({"GLOO_SOCKET_IFNAME": f"nosuch0,{lo}"})  # one present is enough
    check_socket_ifnames({"NCCL_SOCKET_IFNAME": "^docker,nosuch"})  # an exclusion list names no interface to use
    check_socket_ifnames({"NCCL_SOCKET_IFNAME": lo[:1]})  # NCCL matches a prefix ("hsn" for hsn0..hsn3)
    with pytest.raises(ValueError, match=rf"^GLOO_SOCKET_IFNAME=hsn0 names no network interface of "
                                         rf"{socket.gethostname()} \(it has .*{lo}.*\); set it to one of those"):
        check_socket_ifnames({"GLOO_SOCKET_IFNAME": "hsn0"})
    with pytest.raises(ValueError, match="^GLOO_SOCKET_IFNAME=l names no network interface"):
        check_socket_ifnames({"GLOO_SOCKET_IFNAME": "l"})  # gloo takes whole names only
    with pytest.raises(ValueError, match="^NCCL_SOCKET_IFNAME==l names no network interface"):
        check_socket_ifnames({"NCCL_SOCKET_IFNAME": "=l"})  # "=": NCCL's exact match


def test_a_rendezvous_port_in_use_is_one_line(tmp_path):
    """A torchrun-style launch (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) whose port
    another process already listens on: rank 0 cannot open the rendezvous store; one
    line naming the port and the fix, exit 2, no traceback (was 42 lines)."""
    import socket
    import subprocess
    import sys

    from tests.files import REPO

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0", "WORLD_SIZE": "2",
               "LOCAL_RANK": "0", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
        proc = subprocess.run([sys.executable, "-m", "scalegnn", "train", "--dataset",
                               "csbm:n=200,avg_degree=4,classes=2,feature_dim=4", "--epochs", "1", "--grid", "2x1x1x1",
                               "--out", str(tmp_path / "runs"), "--data-root", str(tmp_path / "data")],
                              env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr == (f"scalegnn: error: MASTER_PORT {port} on 127.0.0.1 is already in use (another job or "
                           "process listens there), so rank 0 cannot open the rendezvous: give the job a free port, "
                           "e.g. MASTER_PORT=$((20000 + RANDOM % 20000)), or torchrun --master-port\n")
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").glob("*.json"))


# ----------------------------------------------------------------------------- the torch it needs
def test_an_older_torch_is_refused_at_start_and_the_floor_is_pyproject_s():
    import re
    import tomllib

    from scalegnn.launch.environment import MIN_TORCH, check_torch
    from tests.files import REPO

    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    (spec,) = [d for d in deps if re.match(r"torch\b", d)]
    assert spec == "torch>=" + ".".join(map(str, MIN_TORCH))
    check_torch()  # this machine's
    check_torch("2.6.0+cu124")
    check_torch("2.10.0a0+git1234")
    with pytest.raises(RuntimeError, match=r"needs torch >= 2.6, this python has torch 2.5.1\+rocm6.2; load"):
        check_torch("2.5.1+rocm6.2")
    with pytest.raises(RuntimeError, match="torch 1.13.1"):
        check_torch("1.13.1")


# ----------------------------------------------------------------------------- a job's variables, its peers
TINY = "csbm:n=400,avg_degree=8,classes=3,feature_dim=8"


def _train_as_rank(tmp_path, variables: dict, *flags: str, timeout: float = 60):
    """``scalegnn train`` on a tiny graph as a process a launcher started with ``variables``
    (and no other launcher's): the finished process and its wall time."""
    import subprocess
    import sys
    import time

    from tests.files import REPO
    from tests.launchers import LAUNCHER_VARS

    env = {k: v for k, v in os.environ.items() if k not in (*LAUNCHER_VARS, "LOCAL_WORLD_SIZE", "SLURM_STEP_ID")}
    env.update({"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), **variables})
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "scalegnn", "train", "--dataset", TINY, "--epochs", "1", "--hidden",
                           "8", "--layers", "2", "--quiet", "--out", str(tmp_path / "runs"), "--data-root",
                           str(tmp_path / "data"), *flags], env=env, capture_output=True, text=True, timeout=timeout,
                          cwd=tmp_path)
    return proc, time.monotonic() - start


@pytest.mark.parametrize("variables, message", [
    (dict(RANK="5", WORLD_SIZE="2"), "RANK=5 is outside 0..1 (WORLD_SIZE=2)"),  # was: waited for ever
    (dict(RANK="-1", WORLD_SIZE="2"), "RANK=-1 is outside 0..1 (WORLD_SIZE=2)"),
    (dict(RANK="1", WORLD_SIZE="2", LOCAL_RANK="99", LOCAL_WORLD_SIZE="1"),
     "LOCAL_RANK=99 is outside 0..0 (LOCAL_WORLD_SIZE=1)"),  # was: trained, as if it were local rank 0
], ids=["rank-beyond-world", "negative-rank", "local-rank-beyond-node"])
def test_a_rank_outside_its_job_is_refused_at_once_in_one_line(tmp_path, variables, message):
    from scalegnn.launch.environment import free_port

    proc, _ = _train_as_rank(tmp_path, {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), **variables})
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.startswith(f"scalegnn: error: {message}: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert "start the ranks with torchrun" in proc.stderr
    assert not (tmp_path / "runs").exists()


def test_a_missing_peer_ends_the_rendezvous_in_one_line_naming_it(tmp_path):
    """Rank 0 of 2, whose rank 1 never starts: after --collective-timeout, one line naming
    the rendezvous, how many ranks joined and which one is missing (was a 39-line
    DistStoreError traceback saying "1/2 clients joined")."""
    from scalegnn.launch.environment import free_port

    port = free_port()
    proc, took = _train_as_rank(tmp_path, {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0",
                                           "WORLD_SIZE": "2"}, "--grid", "2x1x1x1", "--collective-timeout", "5")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(f"scalegnn: error: rendezvous at 127.0.0.1:{port} timed out after 5 s: 1 of 2 "
                                  "ranks joined; rank 1 missing; check that every rank was started, with the same "
                                  "MASTER_ADDR/MASTER_PORT"), proc.stderr
    assert "--collective-timeout" in proc.stderr
    assert took < 5 + 20, took
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").glob("*.json"))


def test_a_rank_whose_rank_0_never_opens_the_rendezvous_says_so_in_one_line(tmp_path):
    from scalegnn.launch.environment import free_port

    port = free_port()
    proc, took = _train_as_rank(tmp_path, {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "1",
                                           "WORLD_SIZE": "2"}, "--grid", "2x1x1x1", "--collective-timeout", "3")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr == (f"scalegnn: error: rendezvous at 127.0.0.1:{port} timed out after 3 s: rank 1 of 2 found "
                           "no store there (rank 0 opens it); check that rank 0 was started, with the same "
                           "MASTER_ADDR/MASTER_PORT as this rank, and that this host reaches it, or raise "
                           "--collective-timeout\n")
    assert took < 3 + 20, took


def test_every_rank_that_came_names_the_missing_ones():
    """Ranks 0 and 1 of 3 (threads of this process): both end with the same message, naming
    rank 2, within the timeout and a poll or two."""
    import datetime
    import threading
    import time

    from scalegnn.launch.environment import DistEnv, RendezvousTimeout, free_port, rendezvous

    port, errors = free_port(), {}

    def rank(r):
        try:
            rendezvous(DistEnv(r, 3, r, "gloo", "127.0.0.1", port, "torchrun"), datetime.timedelta(seconds=3))
        except RendezvousTimeout as exc:
            errors[r] = str(exc)

    start = time.monotonic()
    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert time.monotonic() - start < 3 + 5
    assert errors[0] == errors[1]
    assert errors[0].startswith(f"rendezvous at 127.0.0.1:{port} timed out after 3 s: 2 of 3 ranks joined; rank 2 "
                                "missing; ")
