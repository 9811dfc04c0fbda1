"""The task every rank of a sweep's job runs (:class:`SweepTask`), and what it does
when its scheduler signals it.

A task joins the job from its scheduler's environment (:func:`join_job`), runs the
run's configuration (:func:`train`), and turns the scheduler's signals into
records: USR2 (preemption, or ``SIGNAL_DELAY_S`` before the time limit) saves a
checkpoint at the next step and requeues; SIGTERM that ends the job for good
(``scancel``, the time limit with no requeue left) records the run as
``cancelled`` / ``timeout`` (:func:`slurm_job_verdict`).
"""

from __future__ import annotations

import datetime
import logging
import os
import shlex
import sys
import time
from pathlib import Path

from scalegnn.config import RunConfig
from scalegnn.signals import JobEnded

from .staging import STAGED_SYSTEMS

__all__ = ["train", "join_job", "slurm_job_verdict", "SweepTask", "save_on_signal"]

log = logging.getLogger("scalegnn.sweeps")


def train(cfg: RunConfig) -> int:
    """Run one configuration on this task (:func:`scalegnn.launch.launch`) as ``scalegnn
    train`` would: rank 0 prints the summary line and the record's path to the job's
    log; 0 when the run's record is ok (or this rank writes none), else 1."""
    from scalegnn.launch import launch
    from scalegnn.records import summary_line

    record = launch(cfg)
    if record is None:
        return 0
    print(summary_line(record))
    if record.get("path"):
        print(f"record: {record['path']}")
    return 0 if record["status"] == "ok" else 1


try:  # submitit is the [slurm] extra; only submitting and running tasks need it
    from submitit.helpers import Checkpointable as _TaskBase
except ImportError:  # pragma: no cover - exercised only without submitit
    _TaskBase = object


def join_job(cfg: RunConfig, backend: str):
    """Join the launched job from its scheduler's environment
    (:func:`scalegnn.launch.environment.detect_env`: submitit, Flux, SLURM): export the
    rank, world size and rendezvous in torchrun's variables, which every system's
    launcher reads, and initialize ``torch.distributed`` for ScaleGNN runs (the
    baselines initialize their own gloo groups). The world group's timeout is the
    run's ``--collective-timeout``: the axis groups inherit it. Returns the DistEnv."""
    from scalegnn.launch.environment import detect_env, init_from_env

    info = detect_env()
    os.environ.update(RANK=str(info.rank), WORLD_SIZE=str(info.world_size), LOCAL_RANK=str(info.local_rank),
                      LOCAL_WORLD_SIZE=str(info.local_world_size), MASTER_ADDR=info.master_addr,
                      MASTER_PORT=str(info.master_port))
    if cfg.system in STAGED_SYSTEMS:
        init_from_env(timeout=datetime.timedelta(seconds=cfg.parallel.collective_timeout_s), backend=backend)
    return info


def slurm_job_verdict(job_id: str | None = None) -> tuple[str, str] | None:
    """Why SLURM is stopping this job, asked when SIGTERM arrives (it looks the same
    for ``scancel``, a time limit and a requeue): ``("timeout", why)`` when the
    reason is the time limit, None when the job is being requeued (its restart count
    went up: submitit's or an admin's requeue, which resumes), ``("cancelled", why)``
    when it is ending otherwise (``scancel``, a preemption that cancels), and None
    outside SLURM or when ``scontrol`` cannot tell (the signal is then left alone)."""
    import subprocess

    job_id = job_id or os.environ.get("SLURM_JOB_ID")
    if not job_id:
        return None
    try:
        out = subprocess.run(["scontrol", "show", "job", str(job_id)], capture_output=True, text=True, timeout=20,
                             check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    fields = dict(tok.split("=", 1) for tok in out.split() if "=" in tok)
    try:
        restarts, before = int(fields.get("Restarts", 0)), int(os.environ.get("SLURM_RESTART_COUNT", 0))
    except ValueError:
        return None
    state, reason = fields.get("JobState", ""), fields.get("Reason", "")
    if restarts > before or state in ("PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"):
        return None
    if reason == "TimeLimit" or state == "TIMEOUT":
        return "timeout", (f"SLURM job {job_id} reached its time limit ({fields.get('TimeLimit', '?')}) with no "
                           "requeue left; resubmit the sweep to resume from the newest checkpoint")
    if state in ("COMPLETING", "CANCELLED", "PREEMPTED"):
        why = "" if reason in ("", "None") else f", reason {reason}"
        return "cancelled", (f"SLURM job {job_id} was cancelled (scancel or the scheduler{why}) after "
                             f"{fields.get('RunTime', '?')}; resubmit the sweep to resume from the newest checkpoint")
    return None


def _end_record(folder: Path, run: dict, since: float, status: str, reason: str, exc: BaseException | None) -> Path:
    """Record a run that its scheduler ended (``cancelled`` / ``timeout``), on rank 0.

    The run's own record when there is one: the trainer's partial record carried by
    the exception, else the newest record this attempt wrote in the folder (``failed``
    when the signal broke a collective, ``running`` after a preemption save, or already
    ended); it is rewritten under its run id with the new status (this attempt's own
    record only: an earlier attempt's, which a resume continued, stays as written).
    Without any, the run's stand-in record (:func:`scalegnn.session.stand_in_record`:
    its checkpoint's, else no epochs).
    """
    from scalegnn import records
    from scalegnn.session import conclude, new_run_id, stand_in_record

    rec = getattr(exc, "run_record", None) if exc is not None else None
    if rec is None:
        for path in sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True):
            if path.stat().st_mtime < since:
                break
            try:
                found = records.read_record(path)
            except records.RecordError:
                continue
            if found["status"] in ("failed", "running", "cancelled", "timeout"):
                rec = found
                break
    if rec is None:
        cfg = RunConfig.from_dict(run["config"])
        rec = stand_in_record(cfg, new_run_id(cfg), run["world_size"])
    rec = {k: v for k, v in rec.items() if k != "path"}
    seen = ((rec.get("error") or "").strip().splitlines() or [""])[0]
    conclude(rec, JobEnded(status, reason))
    # what the ranks saw when the signal broke their step (a collective cut short), unless it is the signal itself
    if seen and JobEnded.__name__ not in seen and reason not in seen:
        rec["error"] = f"{reason} (the interrupted attempt saw: {seen})"
    return records.write_record(rec, folder)


class SweepTask(_TaskBase):
    """One run, executed by every task (rank) of its submitit job.

    Each task sets up ``torch.distributed`` from submitit's environment
    (:func:`scalegnn.launch.environment.init_from_env`: rank = submitit's global rank,
    world = its task count, rendezvous on the first host), then runs
    ``scalegnn train`` with the run's arguments; rank 0 writes the record. A
    self-launching system (DistDGL) runs in one task, which starts the run's ranks.

    Signals (SLURM): USR2 (preemption, or ``signal_delay_s`` before the time limit)
    saves a checkpoint at the next step and requeues; SIGTERM that ends the job for
    good (``scancel``, the time limit with no requeue left) records the run as
    ``cancelled`` / ``timeout`` instead of leaving it silently unfinished.
    """

    def __init__(self, run: dict, folder: str, backend: str, requeued: int = 0):
        self.run, self.folder, self.backend, self.requeued = run, folder, backend, requeued

    @property
    def tasks(self) -> int:
        """Tasks of this run's job: one per rank, or one for a self-launching system."""
        return 1 if self.run.get("launch") == "self" else int(self.run["world_size"])

    def __call__(self) -> dict:
        import submitit

        env = submitit.JobEnvironment()  # threads: the run's --threads (jobs.with_threads), applied by run()
        ntasks = env.num_tasks
        if ntasks != self.tasks:
            raise RuntimeError(f"run {self.run['key']} needs {self.tasks} tasks, the job has {ntasks}")
        if self.run.get("offline"):
            os.environ["SCALEGNN_OFFLINE"] = "1"  # staged data only: a missing file fails fast, nothing downloads
        from scalegnn.progress import configure_logging, default_log_level

        from .preflight import prepare_node

        configure_logging(default_log_level())
        prepare_node()  # this node's MIOpen folders (node-local /tmp), before anything can compile a kernel
        if env.global_rank == 0:
            import importlib.util

            log.info("run %s: %d task(s) on %s, job %s (restart %s), scalegnn from %s", self.run["key"], ntasks,
                     ",".join(env.hostnames), env.job_id, os.environ.get("SLURM_RESTART_COUNT", 0),
                     Path(importlib.util.find_spec("scalegnn").origin).parent)
        cfg = RunConfig.from_dict(self.run["config"])
        if ntasks > 1:
            join_job(cfg, self.backend)
        from submitit.core.utils import UncompletedJobError

        from scalegnn.checkpoint import PREEMPTION, Preempted

        started = time.time()
        ended = _record_end_on_sigterm()
        # Baselines have no checkpoints: submitit's handler requeues them directly.
        requeue = _save_on_preemption_signal() if cfg.system in STAGED_SYSTEMS else None
        try:
            rc = train(cfg)
        except Preempted as exc:
            # Every rank saved at the same step; now submitit's own handler requeues
            # the job (rank 0; the others return and are stopped by the requeue).
            print(f"rank {env.global_rank}: {exc}", file=sys.stderr)
            if requeue is not None:
                try:
                    requeue()
                except UncompletedJobError as no_requeue:  # timed out max_timeouts times
                    if env.global_rank == 0:
                        path = _end_record(Path(self.folder), self.run, started, "timeout",
                                           f"{no_requeue}; the checkpoint is kept: resubmit the sweep to resume", None)
                        log.warning("run %s: recorded as timeout (%s)", self.run["key"], path)
                    raise
            return {"key": self.run["key"], "rank": env.global_rank, "status": "preempted"}
        except Exception as exc:
            if ended.verdict is None:
                raise
            return self._ended(env.global_rank, started, exc, ended.verdict)
        finally:
            PREEMPTION.disarm()
            ended.restore()
        if ended.verdict is not None and rc != 0:  # a one-rank run records its failure and returns
            return self._ended(env.global_rank, started, None, ended.verdict)
        if rc != 0:
            raise RuntimeError(f"scalegnn {shlex.join(self.run['argv'])} ended with a {rc} exit status on rank "
                               f"{env.global_rank}")
        return {"key": self.run["key"], "rank": env.global_rank, "status": "ok"}

    def _ended(self, rank: int, started: float, exc: BaseException | None, verdict: tuple[str, str]) -> dict:
        status, reason = verdict
        if rank == 0:
            path = _end_record(Path(self.folder), self.run, started, status, reason, exc)
            log.warning("run %s: recorded as %s (%s)", self.run["key"], status, path)
        return {"key": self.run["key"], "rank": rank, "status": status}

    def checkpoint(self, *args, **kwargs):
        """Requeue the same run, resuming (submitit calls this on timeout/preemption)."""
        from submitit.helpers import DelayedSubmission

        return DelayedSubmission(SweepTask(self.run, self.folder, self.backend, requeued=self.requeued + 1))


class _EndWatch:
    """What :func:`_record_end_on_sigterm` saw: the verdict, and how to undo the handler."""

    def __init__(self, restore):
        self.verdict: tuple[str, str] | None = None
        self.restore = restore


def _record_end_on_sigterm() -> _EndWatch:
    """On SIGTERM, ask SLURM why (:func:`slurm_job_verdict`). When the job is ending
    for good, remember the verdict and raise :class:`JobEnded` in this rank, so the
    trainer stops and the task records the run; otherwise (a requeue, not SLURM) the
    previous handler runs (submitit's: it ignores SIGTERM). The verdict is kept
    apart from the exception because a peer's exit may break this rank's collective
    first: whatever the rank then raises, the task still knows the job was ended."""
    import signal as signal_module
    import threading

    if threading.current_thread() is not threading.main_thread():
        return _EndWatch(lambda: None)
    previous = signal_module.getsignal(signal_module.SIGTERM)

    def handler(sig, frame):
        verdict = slurm_job_verdict()
        if verdict is None:
            if callable(previous):
                previous(sig, frame)
            return
        if watch.verdict is None:
            watch.verdict = verdict
            raise JobEnded(*verdict)

    watch = _EndWatch(lambda: signal_module.signal(signal_module.SIGTERM, previous))
    signal_module.signal(signal_module.SIGTERM, handler)
    return watch


def save_on_signal(signum: int, when_idle) -> None:
    """Arm the training loop's preemption request on ``signum``: while the loop runs,
    the signal makes it save a checkpoint at its next step boundary (all ranks at the
    same step) and raise ``Preempted``; while no loop listens (data loading, setup,
    after training: nothing to save) ``when_idle(sig, frame)`` runs instead."""
    import signal as signal_module

    from scalegnn.checkpoint import PREEMPTION

    PREEMPTION.arm()

    def handler(sig, frame):
        if PREEMPTION.listening:
            PREEMPTION.request(sig)
        else:
            when_idle(sig, frame)

    signal_module.signal(signum, handler)


def _save_on_preemption_signal():
    """Submitit's signal (USR2, sent ``signal_delay_s`` before a time limit, or on
    preemption) saves a checkpoint first (:func:`save_on_signal`) instead of letting
    submitit requeue at once; the returned function then runs submitit's own
    handler, which requeues. Without this, a requeued run would lose everything since
    its last periodic checkpoint. A signal while no loop listens requeues at once, as
    submitit would. Returns None when submitit installed no handler (not inside a
    submitit job)."""
    import signal as signal_module

    try:
        import submitit

        signum = submitit.JobEnvironment._usr_sig()
    except Exception:  # noqa: BLE001 - not a submitit job, or an older submitit
        return None
    original = signal_module.getsignal(signum)
    if not callable(original):
        return None
    save_on_signal(signum, original)
    return lambda: original(signum, None)
