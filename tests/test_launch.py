"""The one run path: how a process takes part in a run (run_mode), the local job
object (start / wait / stop), the one place outcomes become statuses (the session),
and the launcher that starts every system."""

from __future__ import annotations

import ast
import os
import signal
import time
from pathlib import Path

import pytest

from scalegnn import records
from scalegnn import systems as registry
from scalegnn.checkpoint import Preempted
from scalegnn.config import make_config
from scalegnn.launch import launch
from scalegnn.launch.environment import detect_env, run_mode
from scalegnn.launch.job import LocalJob, WorkerError
from scalegnn.loop import DivergedError, EpochStats, Trainer
from scalegnn.parallel.grid import ParallelConfig
from scalegnn.session import JobFailed, RunSession, conclude, status_of
from scalegnn.signals import Interrupted, JobEnded

ROOT = Path(__file__).resolve().parents[1]
TINY = "csbm:n=200,avg_degree=4,classes=2,feature_dim=4"

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


# ----------------------------------------------------------------------------- outcomes -> statuses
@pytest.mark.parametrize("outcome, status", [
    (None, "ok"), (DivergedError("loss became nan"), "diverged"), (Preempted(4, "ck", signal.SIGUSR2), "running"),
    (Interrupted(signal.SIGINT), "interrupted"), (JobEnded("cancelled", "scancel"), "cancelled"),
    (JobEnded("timeout", "time limit"), "timeout"), (JobFailed("trainer 1 exited 1"), "failed"),
    (RuntimeError("boom"), "failed"), (KeyboardInterrupt(), "failed"),
])
def test_every_outcome_has_one_status(outcome, status):
    assert status_of(outcome) == status
    assert status in records.STATUSES
    rec = conclude({"status": "running", "error": None}, outcome)
    assert rec["status"] == status and (rec["error"] is None) == (outcome is None or isinstance(outcome, Interrupted))


def test_only_the_session_gives_a_run_record_its_status():
    """No module but scalegnn/session.py assigns a record's ``status`` (``x["status"] =``,
    ``x.update(status=...)``, ``x["status"], ... =``); ``records.new_record`` starts every
    record at ``running``. (The DGL side's ``dgl_run.py`` reports its own result, which the
    harness turns into an outcome.) The check catches a planted assignment."""
    def assignments(tree) -> list[int]:
        lines = []
        for node in ast.walk(tree):
            targets = node.targets if isinstance(node, ast.Assign) else []
            for t in targets:
                elts = t.elts if isinstance(t, ast.Tuple) else [t]
                lines += [node.lineno for e in elts if isinstance(e, ast.Subscript)
                          and isinstance(e.slice, ast.Constant) and e.slice.value == "status"]
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "update":
                lines += [node.lineno for k in node.keywords if k.arg == "status"]
        return lines

    found = []
    for folder in ("scalegnn", "baselines", "sweeps", "analysis", "benchmarks"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel in ("scalegnn/session.py", "baselines/distdgl/dgl_run.py"):
                continue
            found += [f"{rel}:{n}" for n in assignments(ast.parse(path.read_text()))]
    assert found == []
    assert sorted(assignments(ast.parse('rec["status"] = "failed"\nrec.update(status="ok")\nr["status"], e = 1, 2'))) == \
        [1, 2, 3]
    assert assignments(ast.parse((ROOT / "scalegnn/session.py").read_text()))  # where it does happen


class _Scripted(Trainer):
    """Two epochs; epoch 2 ends as ``outcome`` says."""

    steps_per_epoch, batch_size = 1, 4

    def __init__(self, outcome=None):
        self.outcome, self.closed = outcome, False

    def train_epoch(self, epoch):
        if epoch == 2 and self.outcome is not None:
            raise self.outcome
        return EpochStats(loss_sum=1.0, loss_n=1, correct=1, count=2)

    def evaluate(self):
        return 0.5, 0.5, 0.5

    def close(self):
        self.closed = True


def _session_run(tmp_path, outcome, failures="record"):
    from scalegnn.loop import train_epochs

    cfg = make_config(dataset=TINY, epochs=2, progress=False, out_dir=str(tmp_path))
    session = RunSession(cfg, failures=failures)
    trainer = _Scripted(outcome)
    record = session.open(trainer)
    raised = None
    try:
        with session.running():
            train_epochs(cfg.loop, trainer, record)
    except BaseException as exc:  # noqa: BLE001 - what the session re-raises is the point
        raised = exc
    assert trainer.closed  # closed however the run ended
    return record, raised, sorted(tmp_path.glob("*.json"))


@pytest.mark.parametrize("failures, written, reraised", [("record", True, False), ("raise", True, True),
                                                         ("hand over", False, True)])
def test_a_failure_is_recorded_once_by_whoever_owns_it(tmp_path, failures, written, reraised):
    record, raised, files = _session_run(tmp_path, RuntimeError("boom"), failures)
    assert record["status"] == "failed" and record["error"].startswith("RuntimeError: boom")
    assert len(record["epochs"]) == 1 and record["peak_memory_bytes"] > 0  # closed: the peaks gathered once
    assert bool(files) == written and (raised is not None) == reraised
    if reraised:
        assert raised.run_record is record  # the caller (the job's starter) writes it


def test_diverged_and_preempted_runs_are_written_and_a_stop_is_left_to_the_launcher(tmp_path):
    record, raised, files = _session_run(tmp_path / "d", DivergedError("loss became nan at epoch 2"))
    assert record["status"] == "diverged" and raised is None and len(files) == 1
    record, raised, files = _session_run(tmp_path / "p", Preempted(2, "ck", signal.SIGUSR2))
    assert record["status"] == "running" and isinstance(raised, Preempted) and len(files) == 1
    record, raised, files = _session_run(tmp_path / "i", Interrupted(signal.SIGTERM))
    assert record["status"] == "interrupted" and isinstance(raised, Interrupted) and files == []
    assert raised.run_record is record


def test_an_out_of_memory_error_names_the_stage(tmp_path):
    import torch

    record, raised, _ = _session_run(tmp_path, torch.OutOfMemoryError("CUDA out of memory"))
    assert record["status"] == "failed" and "OutOfMemory: rank 0 ran out of memory during training" in record["error"]


# ----------------------------------------------------------------------------- the one launcher
def test_every_runnable_system_is_started_by_the_one_launcher():
    """A system gives a trainer (the launcher runs it in every mode) or, starting its own
    processes, a job; nothing else in the registry says how it runs."""
    for entry in registry.systems(available=True):
        assert (entry.trainer is None) != (entry.job is None), entry.name
        assert (entry.job is not None) == entry.self_launching
        registry.resolve(entry.trainer or entry.job)  # importable
    with pytest.raises(ValueError, match="a trainer the launcher runs, or a job of its own, not both"):
        registry.System(name="x", display="x", trainer="a:b", job="c:d")


def test_a_self_launching_system_is_recorded_through_a_session(tmp_path, monkeypatch):
    """The launcher hands a self-launching system its run; the system's job records it
    through RunSession like every other (here a toy job that 'fails' in its processes)."""
    entry = registry.register(registry.System(name="selfjob", display="Self job", job="tests.test_launch:toy_job",
                                              self_launching=True, multi_node=False))
    try:
        cfg = make_config("selfjob", dataset=TINY, epochs=2, progress=False, out_dir=str(tmp_path),
                          data_root=str(tmp_path / "d"))
        rec = launch(cfg)
    finally:
        registry.unregister(entry.name)
    assert rec["status"] == "failed" and rec["error"] == "trainer 1 exited with code 3"
    assert records.read_record(rec["path"])["system"] == "selfjob"


def toy_job(cfg, graph=None):
    session = RunSession(cfg, world_size=2, backend="gloo")
    record = session.open(_Scripted())
    session.peaks = []
    with session.running():
        raise JobFailed("trainer 1 exited with code 3")
    return record


def test_the_launcher_checks_outputs_before_any_work(tmp_path):
    file = tmp_path / "FILE"
    file.write_text("x")
    cfg = make_config(dataset=TINY, epochs=1, progress=False, out_dir=str(file))
    with pytest.raises(ValueError, match="is an existing file, not a folder"):
        launch(cfg)
    assert os.listdir(tmp_path) == ["FILE"]
