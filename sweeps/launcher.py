"""``scalegnn sweep SPEC --cluster NAME``: expand a spec, skip finished runs, submit the rest.

Layout of an output folder ``OUT`` (default ``results/sweeps/<spec>-<cluster>``)::

    OUT/<spec>-<cluster>.manifest   JSON: the spec, the profile and every expanded run
    OUT/runs/<run key>/*.json        the run's records (written by rank 0 of its job)
    OUT/.submitit/                   submitit's pickles and per-task logs

A run is *done* when its folder holds a record with status ``ok``; done runs are
never submitted again, so re-running a finished sweep submits nothing and a
partly failed one resubmits exactly what is missing.

SLURM: runs are grouped by their resources (nodes, tasks per node) and each group
is one submitit job array; every array task is one run, with one task per rank
(``tasks_per_node`` = GPUs per node) and each task setting up ``torch.distributed``
from submitit's environment (:class:`SweepTask`). ``--dry-run`` prints the batch
scripts submitit would submit (rendered by submitit's own sbatch writer) and
submits nothing. Local (``--cluster local``): the same tasks through submitit's
LocalExecutor, one job after another on this machine.

Checkpointing: :class:`SweepTask` is a ``submitit.helpers.Checkpointable``; on
timeout or preemption submitit calls :meth:`SweepTask.checkpoint`, which requeues
the same run; every submission passes ``--checkpoint-dir <run>/checkpoint --resume``
(and the profile's ``--checkpoint-every``), so a requeued job continues from its
newest complete checkpoint (issue F makes that resume exact).
"""

from __future__ import annotations

import datetime
import json
import os
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from .profiles import ClusterProfile, load_profile
from .spec import RunSpec, SweepSpec, expand, load_spec

__all__ = ["SweepTask", "SweepOutcome", "sweep", "run_dir", "run_state", "slurm_parameters", "render_sbatch",
           "group_runs", "supported_systems", "manifest_path", "default_out", "checkpoint_args", "collective_timeout_s",
           "active_slurm_jobs", "submitted_job"]

SIGNAL_DELAY_S = 120  # USR2 this long before the time limit: time to checkpoint and requeue


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
                    unsupported: list[RunSpec]) -> Path:
    path = manifest_path(out, spec.name, profile.name)
    data = {
        "spec": spec.name, "title": spec.title, "figure": spec.figure, "paper": spec.paper,
        "spec_file": _relative(spec.source), "cluster": profile.name, "cluster_description": profile.description,
        "reference": spec.reference, "targets": spec.targets,
        "runs": [r.to_dict() for r in runs],
        "unsupported": [r.to_dict() for r in unsupported],
    }
    from scalegnn.records import atomic_write_json

    return atomic_write_json(path, data)


# ---------------------------------------------------------------------------- systems
def supported_systems() -> set[str] | None:
    """Systems the installed ``scalegnn train`` can run: ScaleGNN and its full-graph
    mode, plus the ``--system`` choices when the trainer has that option (None: a
    ``--system`` option without a fixed list, which accepts any name)."""
    from scalegnn.cli import build_parser

    train = _train_parser(build_parser())
    base = {"scalegnn", "fullgraph-3d"}
    for action in train._actions:
        if "--system" in action.option_strings:
            return base | set(action.choices) if action.choices else None
    return base


def _train_parser(parser):
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices["train"]
    raise RuntimeError("scalegnn's parser has no train subcommand")


def checkpoint_args(folder: Path, every: str = "") -> list[str]:
    """Checkpoint options for the trainer (issue F), as far as it offers them:
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


class SweepTask(_TaskBase):
    """One run, executed by every task (rank) of its submitit job.

    Each task sets up ``torch.distributed`` from submitit's environment
    (:func:`scalegnn.parallel.launch.init_from_env`: rank = submitit's global rank,
    world = its task count, rendezvous on the first host), then runs
    ``scalegnn train`` with the run's arguments; rank 0 writes the record.
    """

    def __init__(self, run: dict, folder: str, backend: str, threads: int = 0, checkpoint_every: str = "",
                 requeued: int = 0):
        self.run, self.folder, self.backend, self.threads = run, folder, backend, threads
        self.checkpoint_every, self.requeued = checkpoint_every, requeued

    def argv(self) -> list[str]:
        return list(self.run["argv"]) + checkpoint_args(Path(self.folder), self.checkpoint_every)

    def __call__(self) -> dict:
        import submitit
        import torch

        env = submitit.JobEnvironment()
        ntasks = env.num_tasks
        threads = self.threads or max(1, (os.cpu_count() or 1) // max(1, ntasks // max(1, env.num_nodes)))
        torch.set_num_threads(threads)
        if ntasks != self.run["world_size"]:
            raise RuntimeError(f"run {self.run['key']} needs {self.run['world_size']} ranks, the job has {ntasks}")
        if ntasks > 1:
            from scalegnn.parallel.launch import detect_env, init_from_env

            # submitit's rank, world size and rendezvous (first host, port from the job
            # id), exported in torchrun's variables: every system's launcher reads them.
            info = detect_env()
            os.environ.update(RANK=str(info.rank), WORLD_SIZE=str(info.world_size),
                              LOCAL_RANK=str(info.local_rank), MASTER_ADDR=info.master_addr,
                              MASTER_PORT=str(info.master_port))
            if self.run["system"] in ("scalegnn", "fullgraph-3d"):
                # baselines initialize their own (gloo) groups. The world group's timeout
                # is the run's --collective-timeout: the axis groups inherit it.
                init_from_env(timeout=datetime.timedelta(seconds=collective_timeout_s(self.argv())),
                              backend=self.backend)
        from scalegnn.checkpoint import PREEMPTION, Preempted
        from scalegnn.cli import main

        # Baselines have no checkpoints: submitit's handler requeues them directly.
        requeue = _save_on_preemption_signal() if self.run["system"] in ("scalegnn", "fullgraph-3d") else None
        try:
            rc = main(self.argv())
        except Preempted as exc:
            # Every rank saved at the same step; now submitit's own handler requeues
            # the job (rank 0; the others return and are stopped by the requeue).
            print(f"rank {env.global_rank}: {exc}", file=sys.stderr)
            if requeue is not None:
                requeue()
            return {"key": self.run["key"], "rank": env.global_rank, "status": "preempted"}
        finally:
            PREEMPTION.disarm()
        if rc != 0:
            raise RuntimeError(f"scalegnn {' '.join(self.argv())} exited with status {rc} on rank {env.global_rank}")
        return {"key": self.run["key"], "rank": env.global_rank, "status": "ok"}

    def checkpoint(self, *args, **kwargs):
        """Requeue the same run, resuming (submitit calls this on timeout/preemption)."""
        from submitit.helpers import DelayedSubmission

        return DelayedSubmission(SweepTask(self.run, self.folder, self.backend, self.threads, self.checkpoint_every,
                                           requeued=self.requeued + 1))


def _save_on_preemption_signal():
    """Arm the training loop's preemption request on submitit's signal (USR2, sent
    ``signal_delay_s`` before a time limit, or on preemption) instead of letting
    submitit requeue at once: the loop saves a checkpoint at its next step boundary
    (all ranks at the same step) and raises ``Preempted``; then the returned function
    runs submitit's own handler, which requeues. Without this, a requeued run would
    lose everything since its last periodic checkpoint. A signal that arrives while
    no training loop listens (data loading, setup) requeues at once, as submitit
    would. Returns None when submitit installed no handler (not inside a submitit job)."""
    import signal as signal_module

    from scalegnn.checkpoint import PREEMPTION

    try:
        import submitit

        signum = submitit.JobEnvironment._usr_sig()
    except Exception:  # noqa: BLE001 - not a submitit job, or an older submitit
        return None
    original = signal_module.getsignal(signum)
    if not callable(original):
        return None
    PREEMPTION.arm()

    def handler(sig, frame):
        if PREEMPTION.listening:
            PREEMPTION.request(sig)
        else:  # loading data, building the model, or after training: nothing to save, requeue now
            original(sig, frame)

    signal_module.signal(signum, handler)
    return lambda: original(signum, None)


# ---------------------------------------------------------------------------- SLURM scripts
def group_runs(runs: list[RunSpec], profile: ClusterProfile) -> dict[tuple[int, int, int], list[RunSpec]]:
    """Runs grouped by (nodes, tasks per node, minutes): one job array each."""
    groups: dict[tuple[int, int, int], list[RunSpec]] = {}
    for run in runs:
        nodes, tasks = profile.placement(run.world_size)
        groups.setdefault((nodes, tasks, run.time_min or profile.time_min), []).append(run)
    return dict(sorted(groups.items()))


def slurm_parameters(profile: ClusterProfile, nodes: int, tasks_per_node: int, time_min: int, job_name: str) -> dict:
    """Parameters for ``submitit.SlurmExecutor.update_parameters`` (its own names)."""
    s = profile.slurm
    params = {
        "job_name": job_name, "time": int(time_min), "nodes": nodes, "ntasks_per_node": tasks_per_node,
        "cpus_per_task": profile.cpus_per_task, "signal_delay_s": SIGNAL_DELAY_S,
        "setup": list(profile.setup) + profile.env_lines(),
        "srun_args": list(s.srun_args),
    }
    for key in ("account", "qos", "partition", "constraint"):
        if getattr(s, key):
            params[key] = getattr(s, key)
    if s.gpus_per_node:
        params["gpus_per_node"] = min(s.gpus_per_node, tasks_per_node) if nodes == 1 else s.gpus_per_node
    if s.extra:
        params["additional_parameters"] = dict(s.extra)
    return params


def _python(profile: ClusterProfile, python: str | None) -> str:
    return python or profile.python or shlex.quote(sys.executable)


def render_sbatch(profile: ClusterProfile, nodes: int, tasks_per_node: int, time_min: int, array_size: int,
                  folder: str | os.PathLike, job_name: str, python: str | None = None) -> str:
    """The batch script submitit writes for one job array of ``array_size`` runs."""
    from submitit.slurm.slurm import _make_sbatch_string

    params = slurm_parameters(profile, nodes, tasks_per_node, time_min, job_name)
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
    queued: list[RunSpec] = field(default_factory=list)  # SLURM: submitted earlier, job still pending/running
    submitted: list[str] = field(default_factory=list)  # job ids
    failed: list[tuple[RunSpec, str]] = field(default_factory=list)
    scripts: list[str] = field(default_factory=list)  # dry run: the batch scripts / commands


def _job_name(spec: str, nodes: int, tasks: int) -> str:
    return f"scalegnn-{spec}-{nodes}x{tasks}"


def sweep(spec_name, cluster: str, out: str | os.PathLike | None = None, *, dry_run: bool = False,
          gpus=None, datasets=None, epochs: int | None = None, seeds=None, systems=None,
          overrides: dict | None = None, python: str | None = None, printer=print) -> SweepOutcome:
    """Expand ``spec_name`` for ``cluster``, skip done runs, submit (or print) the rest."""
    spec = load_spec(spec_name)
    profile = load_profile(cluster).with_overrides(**(overrides or {}))
    out = Path(out) if out is not None else default_out(spec.name, profile.name)
    runs = expand(spec, profile.name, gpus=gpus, datasets=datasets, epochs=epochs, seeds=seeds, systems=systems,
                  local=profile.scheduler == "local")
    known = supported_systems()
    unsupported = [r for r in runs if known is not None and r.system not in known]
    runs = [r for r in runs if r not in unsupported]
    for r in runs:
        profile.placement(r.world_size)  # fail now for a run that cannot be placed
    result = SweepOutcome(spec.name, profile.name, out, runs, unsupported=unsupported)
    active = active_slurm_jobs() if profile.scheduler == "slurm" and not dry_run else None
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
                                                 if unsupported else ""))
    if profile.scheduler == "slurm" and not dry_run and active is None:
        printer("  note: squeue is not available, so runs still queued from an earlier submission "
                "cannot be told apart and are submitted again")
    for sys_name in sorted({r.system for r in unsupported}):
        printer(f"  skipped: `scalegnn train` has no --system {sys_name} here "
                f"({sum(r.system == sys_name for r in unsupported)} runs)")
    if not dry_run:
        _write_manifest(out, spec, profile, runs, unsupported)
    if not result.todo:
        return result
    if profile.scheduler == "slurm":
        _slurm(result, profile, out, dry_run, python, printer)
    else:
        _local(result, profile, out, dry_run, printer)
    return result


def _task_payload(run: RunSpec, out: Path) -> dict:
    folder = run_dir(out, run)
    return {**run.to_dict(), "argv": run.train_argv(str(folder)), "folder": str(folder)}


def _slurm(result: SweepOutcome, profile: ClusterProfile, out: Path, dry_run: bool, python, printer) -> None:
    folder = out / ".submitit" / "%j"
    if not dry_run and profile.placeholders():
        raise ValueError(f"profile {profile.name} still has placeholders {profile.placeholders()} "
                         f"({profile.source}); pass --account/--qos/--partition or edit the profile")
    for (nodes, tasks, minutes), group in group_runs(result.todo, profile).items():
        name = _job_name(result.spec, nodes, tasks)
        if dry_run:
            script = render_sbatch(profile, nodes, tasks, minutes, len(group), folder, name, python)
            result.scripts.append(script)
            kind = f"job array of {len(group)} runs" if len(group) > 1 else "job (1 run)"
            printer(f"\n# ---- {kind} {name}: {nodes} node(s) x {tasks} tasks, {minutes} min")
            for i, run in enumerate(group):
                argv = run.train_argv(str(run_dir(out, run))) + checkpoint_args(run_dir(out, run),
                                                                                 profile.checkpoint_every)
                printer(f"#   [{i}] {run.key}: scalegnn {shlex.join(argv)}")
            printer(script)
            continue
        import submitit

        ex = submitit.SlurmExecutor(folder=folder, max_num_timeout=profile.max_timeouts,
                                    python=_python(profile, python))
        ex.update_parameters(**slurm_parameters(profile, nodes, tasks, minutes, name))
        tasks_ = [SweepTask(_task_payload(r, out), str(run_dir(out, r)), profile.torch_backend,
                            profile.threads_per_task, profile.checkpoint_every) for r in group]
        for r in group:
            run_dir(out, r).mkdir(parents=True, exist_ok=True)
        jobs = ex.submit_array(tasks_)
        result.submitted.extend(j.job_id for j in jobs)
        for r, job in zip(group, jobs):
            _mark_submitted(run_dir(out, r), job.job_id, profile.name)
        printer(f"submitted job array {jobs[0].job_id.split('_')[0]} ({name}): {len(jobs)} runs")


def _local(result: SweepOutcome, profile: ClusterProfile, out: Path, dry_run: bool, printer) -> None:
    """Each run is one LocalExecutor job with one task per rank; at most
    ``profile.max_parallel_jobs`` jobs at a time (0: all at once)."""
    setup = list(profile.setup) + profile.env_lines()
    if dry_run:
        for run in result.todo:
            nodes, tasks = profile.placement(run.world_size)
            line = (f"# local job: {tasks} task(s), setup {setup}\n"
                    f"scalegnn {shlex.join(run.train_argv(str(run_dir(out, run))))}")
            result.scripts.append(line)
            printer(line)
        return
    import submitit

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
        nodes, tasks = profile.placement(run.world_size)
        ex = submitit.LocalExecutor(folder=out / ".submitit" / "%j", max_num_timeout=profile.max_timeouts)
        ex.update_parameters(tasks_per_node=tasks, nodes=1, timeout_min=run.time_min or profile.time_min,
                             signal_delay_s=min(SIGNAL_DELAY_S, 30), setup=setup)
        folder = run_dir(out, run)
        folder.mkdir(parents=True, exist_ok=True)
        task = SweepTask(_task_payload(run, out), str(folder), profile.torch_backend, profile.threads_per_task,
                         profile.checkpoint_every)
        job = ex.submit(task)
        result.submitted.append(job.job_id)
        printer(f"[{i}/{len(result.todo)}] {run.key}: {tasks} task(s), local job {job.job_id}")
        pending.append((i, run, job, time.perf_counter()))
        if len(pending) >= limit:
            finish(*pending.pop(0))
    while pending:
        finish(*pending.pop(0))
