"""The local job (scalegnn/launch/job.py): ``LocalJob`` (start / wait / stop) and
``spawn``, the ``--nproc`` workers, and how a run of them fails fast.

Fail fast. A rank that is SIGKILLed mid-epoch, a rank that stops answering (SIGSTOP) and
a launcher that is itself killed: in every case all processes exit, non-zero, within a
bounded time (a dead peer is seen at once; a silent one after ``--collective-timeout``),
the run record says ``failed`` with the first error, and no process is left behind
(found by an environment tag in /proc, which forked workers inherit). A local run's
ranks meet in a file of a private folder, and every TCP listener of the parent and its
workers is bound to the loopback address.
"""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from scalegnn.launch.job import LocalJob, SpawnTimeout, WorkerError, _is_main_guard, spawn
from tests.processes import CliRun, tagged_processes

pytestmark = pytest.mark.distributed


# ----------------------------------------------------------------------------- the local job
def _sleeper(rank, world, seconds):
    time.sleep(seconds if rank == 1 else 0.0)
    return rank * 10


def _raiser(rank, world):
    if rank == 1:
        raise RuntimeError("rank 1 broke")
    time.sleep(30)  # the job stops it within its grace, not after 30 s


def test_a_local_job_starts_waits_and_returns_every_result():
    with LocalJob(_sleeper, 3, (0.2,)) as job:
        assert job.start() is job and len(job.procs) == 3
        assert job.wait(60) == [0, 10, 20]


def test_a_local_job_fails_on_its_first_error_and_stops_the_rest():
    t0 = time.monotonic()
    with LocalJob(_raiser, 2, report_grace_s=1.0) as job:
        with pytest.raises(WorkerError, match="rank 1 broke") as caught:
            job.start().wait(60)
        procs = job.procs
    assert caught.value.rank == 1 and time.monotonic() - t0 < 25
    assert not any(p.is_alive() for p in procs)  # leaving the block stopped every worker


def test_a_stop_signal_reaches_every_worker_of_the_job():
    with LocalJob(_sleeper, 2, (60.0,), stop_grace_s=5.0) as job:
        job.start()
        time.sleep(1.0)
        t0 = time.monotonic()
        job.stop(signal.SIGTERM)  # forwarded: the workers report and exit
        assert time.monotonic() - t0 < 10 and not any(p.is_alive() for p in job.procs)


# ----------------------------------------------------------------------------- spawn
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


# ----------------------------------------------------------------------------- fail fast
@pytest.mark.distributed
def test_killing_one_rank_mid_epoch_fails_the_whole_run_within_60s(tmp_path):
    """SIGKILL rank 2 of a 4-process run mid-epoch: the launcher and every rank exit
    non-zero within 60 s, the record says failed with rank 2's death as the first
    error, and no process (workers, fork server) remains."""
    run = CliRun(tmp_path)
    try:
        run.wait_for_training()
        os.kill(run.rank_pid(2), signal.SIGKILL)
        killed = time.monotonic()
        out, err = run.proc.communicate(timeout=60)
        elapsed = time.monotonic() - killed
        run.wait_no_processes(timeout_s=max(1.0, 60 - elapsed))
    finally:
        run.kill_all()
    assert run.proc.returncode == 1, (out, err)
    assert elapsed < 60
    rec = run.record()
    assert rec["status"] == "failed"
    assert rec["error"].startswith("rank 2: was killed by SIGKILL"), rec["error"][:500]
    assert "2" in rec["rank_errors"] and set(rec["rank_errors"]) <= {"0", "1", "2", "3"}  # peers report if quick
    assert "status failed" in out and "rank 2: was killed by SIGKILL" in out


@pytest.mark.distributed
def test_a_rank_that_stops_answering_fails_the_run_after_the_collective_timeout(tmp_path):
    """SIGSTOP rank 1: its peers' collectives time out (--collective-timeout 8), the
    launcher stops everyone (SIGKILL reaches a stopped process) and records the
    silent rank."""
    run = CliRun(tmp_path, "--collective-timeout", "8")
    try:
        run.wait_for_training()
        os.kill(run.rank_pid(1), signal.SIGSTOP)
        stopped = time.monotonic()
        out, err = run.proc.communicate(timeout=60)
        elapsed = time.monotonic() - stopped
        print(f"startup {stopped - run.t0:.1f} s, stop -> exit {elapsed:.1f} s")
        run.wait_no_processes(timeout_s=10)
    finally:
        run.kill_all()
    assert run.proc.returncode == 1 and elapsed < 8 + 30, (elapsed, out, err)
    rec = run.record()
    assert rec["status"] == "failed"
    assert "ranks [1] reported nothing" in rec["error"], rec["error"][-800:]
    assert "1" not in rec["rank_errors"]


@pytest.mark.distributed
def test_killing_the_launcher_leaves_no_orphan_workers(tmp_path):
    """SIGKILL the spawning process itself: its workers notice within ~1 s and exit."""
    run = CliRun(tmp_path)
    try:
        run.wait_for_training()
        assert len([n for n in tagged_processes(run.tag).values() if n.startswith("scalegnn-r")]) == 4
        run.proc.kill()
        run.proc.wait()
        run.wait_no_processes(timeout_s=15)
    finally:
        run.kill_all()


# ----------------------------------------------------------------------------- rendezvous
def _listening(pids: list[int]) -> list[tuple[int, str]]:
    """(pid, local address) of every listening TCP socket the processes hold, read from
    /proc (the socket inodes of their fds, matched in /proc/net/tcp and tcp6)."""
    inodes = {}
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes[target[8:-1]] = pid
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            cols = line.split()
            if cols[3] == "0A" and cols[9] in inodes:  # 0A: LISTEN
                found.append((inodes[cols[9]], cols[1].rsplit(":", 1)[0]))
    return found


LOOPBACK = {"0100007F", "00000000000000000000000001000000"}  # 127.0.0.1 and ::1 as /proc/net writes them


def _report_listeners(rank, world, parent):
    import torch.distributed as dist

    pids = [None] * world
    dist.all_gather_object(pids, os.getpid())  # every rank is connected: its listeners are open
    found = _listening([parent, *pids]) if rank == 0 else None
    dist.barrier()  # nobody leaves (closing its sockets) before rank 0 has looked
    return found


UNGUARDED = """\
import scalegnn

record = scalegnn.train(dataset="csbm:n=200,avg_degree=4,classes=2,feature_dim=4", nproc=2, grid="2x1x1x1",
                        epochs=1, hidden=8, out_dir={out!r}, data_root={data!r})
"""


def test_a_job_started_from_an_unguarded_script_is_refused_before_any_worker(tmp_path):
    """A script that calls scalegnn.train(nproc=2) at its top level: every worker would
    import it again and run the call once more. Refused in one line naming the line
    and the fix, before any worker starts or any record is written; the same call under
    ``if __name__ == "__main__":`` (either way round) is let through."""
    script = tmp_path / "train_it.py"
    script.write_text(UNGUARDED.format(out=str(tmp_path / "runs"), data=str(tmp_path / "data")))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last == ("ValueError: train_it.py, line 3, starts 2 worker processes from the top level of the script, "
                    "which every worker imports again before it runs (Python's spawn and forkserver start "
                    "methods): put the call under `if __name__ == \"__main__\":`"), proc.stderr[-2000:]
    assert "Traceback" in proc.stderr and proc.stderr.count("ValueError: train_it.py") == 1  # no worker ran it
    assert not (tmp_path / "runs").exists()
    for guard in ('__name__ == "__main__"', '"__main__" == __name__'):
        assert _is_main_guard(ast.parse(guard, mode="eval").body)
    for other in ('__name__ != "__main__"', '__name__ == "main"', 'name == "__main__"'):
        assert not _is_main_guard(ast.parse(other, mode="eval").body)


@pytest.mark.distributed
def test_a_local_run_listens_on_loopback_only():
    """The --nproc spawner's rendezvous store listened on every interface (anyone on
    the network could join or poison a local run): now the ranks meet in a file of a
    private folder, and every TCP listener of the parent and its workers (gloo's) is
    bound to the loopback address."""
    from scalegnn.launch.job import spawn

    found = spawn(_report_listeners, 2, os.getpid(), timeout_s=60)[0]
    assert found, "no listener seen: the check itself is broken"
    assert all(addr in LOOPBACK for _, addr in found), found
    assert os.getpid() not in {pid for pid, _ in found}  # the spawner itself opens no port
