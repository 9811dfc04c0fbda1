"""``scalegnn sweep SPEC --cluster NAME``: expand a spec, skip finished runs, submit the rest.

Layout of an output folder ``OUT`` (default ``results/sweeps/<spec>-<cluster>``)::

    OUT/<spec>-<cluster>.manifest   JSON: the spec, the profile and every expanded run
    OUT/runs/<run key>/*.json        the run's records (written by rank 0 of its job)
    OUT/shards/<set>/                data staged once: one shard file per rank (sweeps/staging.py)
    OUT/.submitit/                   submitit's pickles and per-task logs (SLURM, local)
    OUT/.flux/                       Flux batch scripts, task files and logs (sweeps/flux.py)

A run is *done* when its folder holds a record with status ``ok``; done runs are
never submitted again, so re-running a finished sweep submits nothing and a
partly failed one resubmits exactly what is missing (runs whose job is still
queued or running are left alone).

Data: every task gets the data root fixed at submission (``--data-root``) and the
profile's offline switch (``SCALEGNN_OFFLINE=1``); multi-rank ScaleGNN runs read
only their rank's shard (``--shard-dir``), written once per (dataset, grid,
permutation, seed) by a staging step that runs first (a dependent job on SLURM).

SLURM: runs are grouped by their resources (nodes, tasks per node, CPUs per task,
minutes) and each group is one submitit job array; every array task is one run,
with one task per rank (``tasks_per_node`` = GPUs per node) and each task setting
up ``torch.distributed`` from submitit's environment (:class:`SweepTask`). A system
that starts its own processes (``self_launching`` in :mod:`scalegnn.systems`: DistDGL) gets
one task on one node, and is refused on more than one node. ``--dry-run`` prints
the batch scripts submitit would submit (rendered by submitit's own sbatch writer)
and submits nothing. Local (``--cluster local``): the same tasks through submitit's
LocalExecutor, one job after another on this machine. Flux: :mod:`sweeps.flux`.

Checkpointing: :class:`SweepTask` is a ``submitit.helpers.Checkpointable``; on
timeout or preemption submitit calls :meth:`SweepTask.checkpoint`, which requeues
the same run; every submission passes ``--checkpoint-dir <run>/checkpoint --resume``
and the profile's ``--checkpoint-every`` (every profile checkpoints), so a requeued
job continues exactly from its newest checkpoint. When SLURM stops a job for good,
the run is recorded as such: ``scancel`` as ``cancelled``, a time limit with no
requeue left as ``timeout`` (:func:`slurm_job_verdict`).
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from scalegnn import systems as registry
from scalegnn.perfmodel import Machine

from .profiles import ClusterProfile, load_profile
from .spec import RunSpec, SweepSpec, expand, load_spec
from .staging import StageSet, StageTask, data_args, resolve_data_root, stage_for

__all__ = ["SweepTask", "SweepOutcome", "sweep", "run_dir", "run_state", "slurm_parameters", "render_sbatch",
           "group_runs", "job_shape", "supported_systems", "manifest_path", "default_out", "checkpoint_args",
           "collective_timeout_s", "active_slurm_jobs", "submitted_job", "slurm_job_verdict", "JobEnded",
           "self_launching", "multi_node_refusal", "join_job", "save_on_signal", "task_payload"]

SIGNAL_DELAY_S = 120  # USR2 this long before the time limit: time to checkpoint and requeue
log = logging.getLogger("scalegnn.sweeps")


# ---------------------------------------------------------------------------- run folders
def default_out(spec: str, cluster: str) -> Path:
    return Path("results") / "sweeps" / f"{spec}-{cluster}"


def run_dir(out: str | os.PathLike, run: RunSpec) -> Path:
    return Path(out) / "runs" / run.key


def manifest_path(out: str | os.PathLike, spec: str, cluster: str) -> Path:
    return Path(out) / f"{spec}-{cluster}.manifest"


def run_state(folder: str | os.PathLike) -> tuple[str, str | None, str | None]:
    """(state, record path, error) of a run folder: ``ok`` if any record there is ok;
    else the latest record's status; ``missing`` without records."""
    from scalegnn.records import RecordError, read_record

    folder = Path(folder)
    latest = None
    for path in sorted(folder.glob("*.json")):
        if path.name == SUBMITTED:  # the sweep's own note of the job id, not a record
            continue
        try:
            rec = read_record(path)
        except RecordError as exc:
            latest = ("unreadable", str(path), str(exc))
            continue
        if rec["status"] == "ok":
            return "ok", str(path), None
        latest = (rec["status"], str(path), rec.get("error"))
    return latest or ("missing", None, None)


SUBMITTED = "submitted.json"  # in a run folder: the SLURM job that runs it (written at submission)


def _mark_submitted(folder: Path, job_id: str, cluster: str) -> None:
    from scalegnn.records import atomic_write_json

    atomic_write_json(folder / SUBMITTED, {"job_id": job_id, "cluster": cluster, "time": time.time()})


def submitted_job(folder: str | os.PathLike) -> str | None:
    """The SLURM job id a run folder was last submitted as (None if never, or unreadable)."""
    try:
        return str(json.loads((Path(folder) / SUBMITTED).read_text())["job_id"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def active_slurm_jobs() -> set[str] | None:
    """The ids of this user's pending or running SLURM jobs, one per array task
    (``123_4``); None when ``squeue`` cannot be asked (not on a SLURM login node)."""
    import getpass
    import subprocess

    try:
        out = subprocess.run(["squeue", "-h", "-r", "-u", getpass.getuser(), "-o", "%i"],
                             capture_output=True, text=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return {line.strip() for line in out.splitlines() if line.strip()}


def _relative(path: str) -> str:
    """``sweeps/specs/x.toml`` for the shipped files (manifests are committed and moved)."""
    root = Path(__file__).resolve().parent.parent
    try:
        return str(Path(path).resolve().relative_to(root))
    except ValueError:
        return str(path)


def _write_manifest(out: Path, spec: SweepSpec, profile: ClusterProfile, runs: list[RunSpec],
                    unsupported: list[RunSpec], refused: list[tuple[RunSpec, str]] = (), data_root: str = "") -> Path:
    path = manifest_path(out, spec.name, profile.name)
    data = {
        "spec": spec.name, "title": spec.title, "figure": spec.figure, "paper": spec.paper,
        "spec_file": _relative(spec.source), "cluster": profile.name, "cluster_description": profile.description,
        "reference": spec.reference, "targets": spec.targets,
        "runs": [r.to_dict() for r in runs],
        "unsupported": [r.to_dict() for r in unsupported],
        "refused": [{**r.to_dict(), "reason": why} for r, why in refused],
        "data_root": data_root,
        "machine": Machine.from_profile(profile).to_dict(),  # what the performance model knows of the cluster
    }
    from scalegnn.records import atomic_write_json

    return atomic_write_json(path, data)


# ---------------------------------------------------------------------------- systems
def supported_systems() -> set[str]:
    """Systems this scalegnn can run (the registry's available ones; a paper-only
    system such as MassiveGNN is reported and skipped by a sweep)."""
    return set(registry.names(available=True))


def self_launching(system: str) -> bool:
    """Whether a system starts its own processes from one task (its registry entry):
    its job gets one task, which spawns the run's ranks on one node."""
    return registry.get(system).self_launching


def multi_node_refusal(run: RunSpec, profile: ClusterProfile) -> str | None:
    """Why ``run`` cannot be scheduled on ``profile`` (None if it can): a self-launching
    system (DistDGL) starts its servers and trainers on one host (127.0.0.1, one
    simulated machine per partition), so a run that needs more than one node would
    train every rank's share on the first node while the other nodes idle."""
    if not self_launching(run.system):
        return None
    nodes = -(-run.world_size // profile.gpus_per_node)
    if nodes <= 1:
        return None
    return (f"{run.system} starts its servers and trainers on one host (127.0.0.1), so it runs on one node only: "
            f"{run.world_size} trainers need {nodes} nodes of {profile.gpus_per_node} on {profile.name}")



def _train_parser(parser):
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices["train"]
    raise RuntimeError("scalegnn's parser has no train subcommand")


def checkpoint_args(folder: Path, every: str = "") -> list[str]:
    """Checkpoint options for the trainer, as far as it offers them:
    ``--checkpoint-dir <run folder>/checkpoint --resume`` on every submission -- a
    resume without a checkpoint starts from scratch, so the first submission and
    every requeue use the same command -- and ``--checkpoint-every`` from the profile."""
    from scalegnn.cli import build_parser

    train = _train_parser(build_parser())
    options = {s: a for a in train._actions for s in a.option_strings}
    if "--checkpoint-dir" not in options:
        return []
    ckpt = str(folder / "checkpoint")
    args = ["--checkpoint-dir", ckpt]
    if "--resume" in options:
        args += ["--resume"] if options["--resume"].nargs == 0 else ["--resume", ckpt]
    if every and "--checkpoint-every" in options:
        args += ["--checkpoint-every", str(every)]
    return args


# ---------------------------------------------------------------------------- the task
def collective_timeout_s(argv: list[str]) -> float:
    """The ``--collective-timeout`` a run's arguments ask for (``scalegnn train``'s default otherwise)."""
    from scalegnn.train import DEFAULT_COLLECTIVE_TIMEOUT_S

    for i, arg in enumerate(argv):
        if arg == "--collective-timeout" and i + 1 < len(argv):
            return float(argv[i + 1])
        if arg.startswith("--collective-timeout="):
            return float(arg.split("=", 1)[1])
    return DEFAULT_COLLECTIVE_TIMEOUT_S


try:  # submitit is the [slurm] extra; only submitting and running tasks need it
    from submitit.helpers import Checkpointable as _TaskBase
except ImportError:  # pragma: no cover - exercised only without submitit
    _TaskBase = object


def join_job(system: str, argv: list[str], backend: str):
    """Join the launched job from its scheduler's environment
    (:func:`scalegnn.parallel.launch.detect_env`: submitit, Flux, SLURM): export the
    rank, world size and rendezvous in torchrun's variables, which every system's
    launcher reads, and initialize ``torch.distributed`` for ScaleGNN runs (the
    baselines initialize their own gloo groups). The world group's timeout is the
    run's ``--collective-timeout``: the axis groups inherit it. Returns the DistEnv."""
    from scalegnn.parallel.launch import detect_env, init_from_env

    info = detect_env()
    os.environ.update(RANK=str(info.rank), WORLD_SIZE=str(info.world_size), LOCAL_RANK=str(info.local_rank),
                      MASTER_ADDR=info.master_addr, MASTER_PORT=str(info.master_port))
    if system in ("scalegnn", "fullgraph-3d"):
        init_from_env(timeout=datetime.timedelta(seconds=collective_timeout_s(argv)), backend=backend)
    return info


class JobEnded(RuntimeError):
    """Raised in a rank when the scheduler stops its job for good (SIGTERM after
    ``scancel``, or at the time limit with no requeue): ``status`` is the run record's
    ``cancelled`` or ``timeout``, ``reason`` says why."""

    def __init__(self, status: str, reason: str):
        super().__init__(reason)
        self.status, self.reason = status, reason


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
    when the signal broke a collective, ``running`` after a preemption save); it is
    rewritten under its run id with the new status (the replacement rule of resumed
    runs). Without any, a minimal record of the run (no epochs) is written.
    """
    from scalegnn import records

    rec = getattr(exc, "run_record", None) if exc is not None else None
    if rec is None:
        for path in sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True):
            if path.stat().st_mtime < since:
                break
            try:
                found = records.read_record(path)
            except records.RecordError:
                continue
            if found["status"] in ("failed", "running"):
                rec = found
                break
    if rec is None:
        grid = [int(g) for g in run["grid"].split("x")]
        rec = records.new_record(
            system=run["system"], dataset=run["dataset"], config={"argv": list(run["argv"])},
            grid=dict(zip(("dp", "x", "y", "z"), grid)), world_size=run["world_size"], seed=run["seed"],
            env=records.environment_info(), graph=None, batch_size=None, steps_per_epoch=None,
            target_acc=run.get("target_acc"))
    rec = {k: v for k, v in rec.items() if k != "path"}
    seen = ((rec.get("error") or "").strip().splitlines() or [""])[0]
    rec["status"] = status
    # what the ranks saw when the signal broke their step (a collective cut short), unless it is the signal itself
    rec["error"] = reason if not seen or JobEnded.__name__ in seen or reason in seen else \
        f"{reason} (the interrupted attempt saw: {seen})"
    return records.write_record(rec, folder)


class SweepTask(_TaskBase):
    """One run, executed by every task (rank) of its submitit job.

    Each task sets up ``torch.distributed`` from submitit's environment
    (:func:`scalegnn.parallel.launch.init_from_env`: rank = submitit's global rank,
    world = its task count, rendezvous on the first host), then runs
    ``scalegnn train`` with the run's arguments; rank 0 writes the record. A
    self-launching system (DistDGL) runs in one task, which starts the run's ranks.

    Signals (SLURM): USR2 (preemption, or ``signal_delay_s`` before the time limit)
    saves a checkpoint at the next step and requeues; SIGTERM that ends the job for
    good (``scancel``, the time limit with no requeue left) records the run as
    ``cancelled`` / ``timeout`` instead of leaving it silently unfinished.
    """

    def __init__(self, run: dict, folder: str, backend: str, threads: int = 0, checkpoint_every: str = "",
                 requeued: int = 0):
        self.run, self.folder, self.backend, self.threads = run, folder, backend, threads
        self.checkpoint_every, self.requeued = checkpoint_every, requeued

    def argv(self) -> list[str]:
        return list(self.run["argv"]) + checkpoint_args(Path(self.folder), self.checkpoint_every)

    @property
    def tasks(self) -> int:
        """Tasks of this run's job: one per rank, or one for a self-launching system."""
        return 1 if self.run.get("launch") == "self" else int(self.run["world_size"])

    def __call__(self) -> dict:
        import submitit
        import torch

        env = submitit.JobEnvironment()
        ntasks = env.num_tasks
        threads = self.threads or max(1, (os.cpu_count() or 1) // max(1, ntasks // max(1, env.num_nodes)))
        torch.set_num_threads(threads)
        if ntasks != self.tasks:
            raise RuntimeError(f"run {self.run['key']} needs {self.tasks} tasks, the job has {ntasks}")
        if self.run.get("offline"):
            os.environ["SCALEGNN_OFFLINE"] = "1"  # staged data only: a missing file fails fast, nothing downloads
        from scalegnn.progress import configure_logging, default_log_level

        configure_logging(default_log_level())
        if env.global_rank == 0:
            import scalegnn

            log.info("run %s: %d task(s) on %s, job %s (restart %s), scalegnn from %s", self.run["key"], ntasks,
                     ",".join(env.hostnames), env.job_id, os.environ.get("SLURM_RESTART_COUNT", 0),
                     Path(scalegnn.__file__).parent)
        if ntasks > 1:
            join_job(self.run["system"], self.argv(), self.backend)
        from submitit.core.utils import UncompletedJobError

        from scalegnn.checkpoint import PREEMPTION, Preempted
        from scalegnn.cli import main

        started = time.time()
        ended = _record_end_on_sigterm()
        # Baselines have no checkpoints: submitit's handler requeues them directly.
        requeue = _save_on_preemption_signal() if self.run["system"] in ("scalegnn", "fullgraph-3d") else None
        try:
            rc = main(self.argv())
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
            raise RuntimeError(f"scalegnn {' '.join(self.argv())} exited with status {rc} on rank {env.global_rank}")
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

        return DelayedSubmission(SweepTask(self.run, self.folder, self.backend, self.threads, self.checkpoint_every,
                                           requeued=self.requeued + 1))


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


# ---------------------------------------------------------------------------- SLURM scripts
def job_shape(run: RunSpec, profile: ClusterProfile) -> tuple[int, int, int]:
    """(nodes, tasks per node, CPUs per task) of the job that runs ``run``: one task per
    rank; a self-launching system gets one task with the CPUs of all its ranks."""
    nodes, tasks = profile.placement(run.world_size)
    if self_launching(run.system):
        return 1, 1, profile.cpus_per_task * run.world_size
    return nodes, tasks, profile.cpus_per_task


def group_runs(runs: list[RunSpec], profile: ClusterProfile) -> dict[tuple[int, int, int, int], list[RunSpec]]:
    """Runs grouped by (nodes, tasks per node, CPUs per task, minutes): one job array each."""
    groups: dict[tuple[int, int, int, int], list[RunSpec]] = {}
    for run in runs:
        groups.setdefault((*job_shape(run, profile), run.time_min or profile.time_min), []).append(run)
    return dict(sorted(groups.items()))


def slurm_parameters(profile: ClusterProfile, nodes: int, tasks_per_node: int, time_min: int, job_name: str,
                     cpus_per_task: int | None = None, dependency: str | None = None) -> dict:
    """Parameters for ``submitit.SlurmExecutor.update_parameters`` (its own names).
    ``dependency``: ``afterok:<job>[:<job>...]`` (the staging jobs); a job whose
    dependency can never be met is cancelled by SLURM instead of pending forever."""
    s = profile.slurm
    params = {
        "job_name": job_name, "time": int(time_min), "nodes": nodes, "ntasks_per_node": tasks_per_node,
        "cpus_per_task": cpus_per_task or profile.cpus_per_task, "signal_delay_s": SIGNAL_DELAY_S,
        "setup": list(profile.setup) + profile.env_lines(),
        "srun_args": list(s.srun_args),
    }
    for key in ("account", "qos", "partition", "constraint"):
        if getattr(s, key):
            params[key] = getattr(s, key)
    if s.gpus_per_node:
        params["gpus_per_node"] = min(s.gpus_per_node, tasks_per_node) if nodes == 1 else s.gpus_per_node
    extra = dict(s.extra)
    if dependency:
        extra.update(dependency=dependency, kill_on_invalid_dep="yes")
    if extra:
        params["additional_parameters"] = extra
    return params


def stage_parameters(profile: ClusterProfile, job_name: str) -> dict:
    """The staging job: one task on one node, the profile's account and set-up, no
    GPU binding (``scalegnn data shard`` is CPU work)."""
    params = slurm_parameters(profile, 1, 1, profile.time_min, job_name)
    params["srun_args"] = []
    params.pop("gpus_per_node", None)
    return params


def _python(profile: ClusterProfile, python: str | None) -> str:
    return python or profile.python or shlex.quote(sys.executable)


def render_sbatch(profile: ClusterProfile, nodes: int, tasks_per_node: int, time_min: int, array_size: int,
                  folder: str | os.PathLike, job_name: str, python: str | None = None, cpus_per_task: int | None = None,
                  dependency: str | None = None, params: dict | None = None) -> str:
    """The batch script submitit writes for one job array of ``array_size`` runs."""
    from submitit.slurm.slurm import _make_sbatch_string

    if params is None:
        params = slurm_parameters(profile, nodes, tasks_per_node, time_min, job_name, cpus_per_task, dependency)
    command = " ".join([_python(profile, python), "-u -m submitit.core._submit", shlex.quote(str(folder))])
    return _make_sbatch_string(command=command, folder=str(folder), map_count=array_size if array_size > 1 else None,
                               **params)


# ---------------------------------------------------------------------------- the sweep
@dataclass
class SweepOutcome:
    spec: str
    cluster: str
    out: Path
    runs: list[RunSpec]
    done: list[RunSpec] = field(default_factory=list)
    todo: list[RunSpec] = field(default_factory=list)
    unsupported: list[RunSpec] = field(default_factory=list)
    refused: list[tuple[RunSpec, str]] = field(default_factory=list)  # cannot be scheduled here, and why
    queued: list[RunSpec] = field(default_factory=list)  # submitted earlier, job still pending/running
    submitted: list[str] = field(default_factory=list)  # job ids of the runs
    failed: list[tuple[RunSpec, str]] = field(default_factory=list)
    scripts: list[str] = field(default_factory=list)  # dry run: the batch scripts / commands of the runs
    data_root: str = ""
    stages: dict = field(default_factory=dict)  # run key -> StageSet (runs that read staged shards)
    staged: list[str] = field(default_factory=list)  # job ids (or local job ids) of the staging step
    stage_scripts: list[str] = field(default_factory=list)  # dry run: the staging job's script


def _job_name(spec: str, nodes: int, tasks: int) -> str:
    return f"scalegnn-{spec}-{nodes}x{tasks}"


def sweep(spec_name, cluster: str, out: str | os.PathLike | None = None, *, dry_run: bool = False,
          gpus=None, datasets=None, epochs: int | None = None, seeds=None, systems=None,
          overrides: dict | None = None, python: str | None = None, data_root: str | None = None,
          stage: bool = True, printer=print) -> SweepOutcome:
    """Expand ``spec_name`` for ``cluster``, skip done runs, stage their data, submit (or print) the rest.

    ``data_root`` (default ``$SCALEGNN_DATA_ROOT``, else scalegnn's default) is fixed
    here and passed to every task; ``stage=False`` lets every rank load the whole
    graph (no ``--shard-dir``), as before staging existed.
    """
    spec = load_spec(spec_name)
    profile = load_profile(cluster).with_overrides(**(overrides or {}))
    out = Path(out) if out is not None else default_out(spec.name, profile.name)
    runs = expand(spec, profile.name, gpus=gpus, datasets=datasets, epochs=epochs, seeds=seeds, systems=systems,
                  local=profile.uses_stand_ins)
    known = supported_systems()
    unsupported = [r for r in runs if known is not None and r.system not in known]
    runs = [r for r in runs if r not in unsupported]
    refused = [(r, why) for r in runs if (why := multi_node_refusal(r, profile)) is not None]
    runs = [r for r in runs if r.key not in {x.key for x, _ in refused}]
    for r in runs:
        profile.placement(r.world_size)  # fail now for a run that cannot be placed
    result = SweepOutcome(spec.name, profile.name, out, runs, unsupported=unsupported, refused=refused,
                          data_root=resolve_data_root(data_root))
    active = _active_jobs(profile) if profile.scheduler != "local" and not dry_run else None
    for r in runs:
        if run_state(run_dir(out, r))[0] == "ok":
            result.done.append(r)
        elif active is not None and submitted_job(run_dir(out, r)) in active:
            result.queued.append(r)  # its job is still pending or running: submitting again would duplicate it
        else:
            result.todo.append(r)
    printer(f"sweep {spec.name} on {profile.name}: {len(runs)} runs, {len(result.done)} done, "
            + (f"{len(result.queued)} still queued or running, " if result.queued else "")
            + f"{len(result.todo)} to submit" + (f", {len(unsupported)} skipped (system not available here)"
                                                 if unsupported else "")
            + (f", {len(refused)} refused" if refused else ""))
    if profile.scheduler != "local" and not dry_run and active is None:
        printer(f"  note: the {profile.scheduler} queue cannot be asked here, so runs still queued from an earlier "
                "submission cannot be told apart and are submitted again")
    for sys_name in sorted({r.system for r in unsupported}):
        printer(f"  skipped: `scalegnn train` has no --system {sys_name} here "
                f"({sum(r.system == sys_name for r in unsupported)} runs)")
    for why in sorted({why for _, why in refused}):
        printer(f"  refused ({sum(w == why for _, w in refused)} run(s)): {why}")
    if not dry_run:
        _write_manifest(out, spec, profile, runs, unsupported, refused, result.data_root)
    if not result.todo:
        return result
    if stage:
        from scalegnn.cli import build_parser

        parser = _train_parser(build_parser())
        for r in result.todo:
            st = stage_for(r.train_argv(str(run_dir(out, r))), out, result.data_root, parser)
            if st is not None:
                result.stages[r.key] = st
    if profile.scheduler == "slurm":
        _slurm(result, profile, out, dry_run, python, printer)
    elif profile.scheduler == "flux":
        from .flux import submit_flux

        submit_flux(result, profile, out, dry_run, python, printer)
    else:
        _local(result, profile, out, dry_run, printer)
    return result


def _active_jobs(profile: ClusterProfile) -> set[str] | None:
    if profile.scheduler == "flux":
        from .flux import active_flux_jobs

        return active_flux_jobs()
    return active_slurm_jobs()


def task_payload(run: RunSpec, out: Path, result: SweepOutcome, profile: ClusterProfile) -> dict:
    """What a run's tasks need: the run, its ``scalegnn train`` arguments with the data
    root and shard folder, its folder, how it launches, the offline switch."""
    folder = run_dir(out, run)
    argv = run.train_argv(str(folder))
    argv += data_args(argv, result.data_root, result.stages.get(run.key))
    return {**run.to_dict(), "argv": argv, "folder": str(folder),
            "launch": "self" if self_launching(run.system) else "ranks", "offline": bool(profile.offline)}


def pending_stages(result: SweepOutcome, runs: list[RunSpec] | None = None) -> list[StageSet]:
    """The shard sets ``runs`` (default: every run to submit) read that are not written yet, once each."""
    sets = {}
    for r in runs if runs is not None else result.todo:
        st = result.stages.get(r.key)
        if st is not None and not st.done():
            sets.setdefault(st.folder, st)
    return list(sets.values())


def _slurm(result: SweepOutcome, profile: ClusterProfile, out: Path, dry_run: bool, python, printer) -> None:
    folder = out / ".submitit" / "%j"
    if not dry_run and profile.placeholders():
        raise ValueError(f"profile {profile.name} still has placeholders {profile.placeholders()} "
                         f"({profile.source}); pass --account/--qos/--partition or edit the profile")
    stage_jobs = _slurm_stage(result, profile, folder, dry_run, python, printer)  # set folder -> job id
    for (nodes, tasks, cpus, minutes), group in group_runs(result.todo, profile).items():
        name = _job_name(result.spec, nodes, tasks)
        needs = sorted({stage_jobs[result.stages[r.key].folder] for r in group
                        if r.key in result.stages and result.stages[r.key].folder in stage_jobs})
        dependency = "afterok:" + ":".join(needs) if needs else None
        if dry_run:
            script = render_sbatch(profile, nodes, tasks, minutes, len(group), folder, name, python, cpus, dependency)
            result.scripts.append(script)
            kind = f"job array of {len(group)} runs" if len(group) > 1 else "job (1 run)"
            printer(f"\n# ---- {kind} {name}: {nodes} node(s) x {tasks} tasks, {minutes} min")
            for i, run in enumerate(group):
                argv = task_payload(run, out, result, profile)["argv"] + checkpoint_args(run_dir(out, run),
                                                                                         profile.checkpoint_every)
                printer(f"#   [{i}] {run.key}: scalegnn {shlex.join(argv)}")
            printer(script)
            continue
        import submitit

        ex = submitit.SlurmExecutor(folder=folder, max_num_timeout=profile.max_timeouts,
                                    python=_python(profile, python))
        ex.update_parameters(**slurm_parameters(profile, nodes, tasks, minutes, name, cpus, dependency))
        tasks_ = [SweepTask(task_payload(r, out, result, profile), str(run_dir(out, r)), profile.torch_backend,
                            profile.threads_per_task, profile.checkpoint_every) for r in group]
        for r in group:
            run_dir(out, r).mkdir(parents=True, exist_ok=True)
        jobs = ex.submit_array(tasks_)
        result.submitted.extend(j.job_id for j in jobs)
        for r, job in zip(group, jobs):
            _mark_submitted(run_dir(out, r), job.job_id, profile.name)
        printer(f"submitted job array {jobs[0].job_id.split('_')[0]} ({name}): {len(jobs)} runs"
                + (f", after staging job(s) {', '.join(needs)}" if needs else ""))


STAGE_PLACEHOLDER = "<staging job>"  # --dry-run: the staging job's id is known only once it is submitted


def _slurm_stage(result: SweepOutcome, profile: ClusterProfile, folder: Path, dry_run: bool, python,
                 printer) -> dict[str, str]:
    """Submit the staging step (one job array, one ``scalegnn data shard`` task per
    shard set); returns each set folder's job id, on which the runs that read it depend."""
    sets = pending_stages(result)
    if not sets:
        return {}
    name = f"scalegnn-{result.spec}-stage"
    params = stage_parameters(profile, name)
    if dry_run:
        script = render_sbatch(profile, 1, 1, profile.time_min, len(sets), folder, name, python, params=params)
        result.stage_scripts.append(script)
        printer(f"\n# ---- staging: {len(sets)} shard set(s), one task each; the runs that read them depend on it")
        for i, st in enumerate(sets):
            printer(f"#   [{i}] scalegnn {shlex.join(st.argv())}")
        printer(script)
        return {st.folder: STAGE_PLACEHOLDER for st in sets}
    import submitit

    ex = submitit.SlurmExecutor(folder=folder, max_num_timeout=0, python=_python(profile, python))
    ex.update_parameters(**params)
    jobs = ex.submit_array([StageTask(st, profile.offline) for st in sets])
    result.staged.extend(j.job_id for j in jobs)
    printer(f"submitted staging job array {jobs[0].job_id.split('_')[0]} ({name}): {len(sets)} shard set(s)")
    return {st.folder: job.job_id for st, job in zip(sets, jobs)}


def _local(result: SweepOutcome, profile: ClusterProfile, out: Path, dry_run: bool, printer) -> None:
    """Staging first (one local job per shard set), then each run as one LocalExecutor
    job with one task per rank; at most ``profile.max_parallel_jobs`` jobs at a time (0: all at once)."""
    setup = list(profile.setup) + profile.env_lines()
    if dry_run:
        for st in pending_stages(result):
            line = f"# local staging job: 1 task\nscalegnn {shlex.join(st.argv())}"
            result.stage_scripts.append(line)
            printer(line)
        for run in result.todo:
            nodes, tasks, _ = job_shape(run, profile)
            line = (f"# local job: {tasks} task(s), setup {setup}\n"
                    f"scalegnn {shlex.join(task_payload(run, out, result, profile)['argv'])}")
            result.scripts.append(line)
            printer(line)
        return
    import submitit

    broken = _local_stage(result, profile, out, setup, printer)  # set folder -> error
    limit = profile.max_parallel_jobs or len(result.todo)
    pending: list = []  # (index, run, job, start time)

    def finish(i, run, job, t0):
        try:
            job.results()  # every task's result: raises with the failing task's traceback
        except Exception as exc:  # noqa: BLE001 - one failed run must not stop the sweep
            text = str(exc).strip().splitlines()
            result.failed.append((run, text[-1] if text else repr(exc)))
            printer(f"    [{i}] {run.key} failed after {time.perf_counter() - t0:.0f} s: "
                    f"{text[-1] if text else exc}")
            return
        state, _, _ = run_state(run_dir(out, run))
        printer(f"    [{i}] {state} in {time.perf_counter() - t0:.0f} s")
        if state != "ok":
            result.failed.append((run, f"finished without an ok record ({state})"))

    for i, run in enumerate(result.todo, 1):
        st = result.stages.get(run.key)
        if st is not None and st.folder in broken:
            result.failed.append((run, f"staging failed: {broken[st.folder]}"))
            printer(f"[{i}/{len(result.todo)}] {run.key}: not run, its staging failed")
            continue
        nodes, tasks, _ = job_shape(run, profile)
        ex = submitit.LocalExecutor(folder=out / ".submitit" / "%j", max_num_timeout=profile.max_timeouts)
        ex.update_parameters(tasks_per_node=tasks, nodes=1, timeout_min=run.time_min or profile.time_min,
                             signal_delay_s=min(SIGNAL_DELAY_S, 30), setup=setup)
        folder = run_dir(out, run)
        folder.mkdir(parents=True, exist_ok=True)
        task = SweepTask(task_payload(run, out, result, profile), str(folder), profile.torch_backend,
                         profile.threads_per_task, profile.checkpoint_every)
        job = ex.submit(task)
        result.submitted.append(job.job_id)
        printer(f"[{i}/{len(result.todo)}] {run.key}: {tasks} task(s), local job {job.job_id}")
        pending.append((i, run, job, time.perf_counter()))
        if len(pending) >= limit:
            finish(*pending.pop(0))
    while pending:
        finish(*pending.pop(0))


def _local_stage(result: SweepOutcome, profile: ClusterProfile, out: Path, setup: list[str],
                 printer) -> dict[str, str]:
    """Write the pending shard sets, one local job each, before any run; returns the
    folders whose staging failed, with the error."""
    import submitit

    broken = {}
    for st in pending_stages(result):
        ex = submitit.LocalExecutor(folder=out / ".submitit" / "%j", max_num_timeout=0)
        ex.update_parameters(tasks_per_node=1, nodes=1, timeout_min=profile.time_min, setup=setup)
        t0 = time.perf_counter()
        job = ex.submit(StageTask(st, profile.offline))
        result.staged.append(job.job_id)
        try:
            job.result()
            printer(f"staged {st.dataset} for grid {st.grid_str} (permute {st.permute}, seed {st.seed}) in "
                    f"{time.perf_counter() - t0:.0f} s: {st.folder}")
        except Exception as exc:  # noqa: BLE001 - its runs are reported, the others go on
            text = str(exc).strip().splitlines()
            broken[st.folder] = text[-1] if text else repr(exc)
            printer(f"staging {st.dataset} for grid {st.grid_str} failed: {broken[st.folder]}")
    return broken
