"""Flux-scheduled machines (LLNL Tuolumne): ``flux batch`` scripts and their tasks.

submitit has no Flux executor, so a Flux sweep writes its own batch scripts:

1. the staging jobs, one per graph its runs shard (``scalegnn data shard`` of each of its
   shard sets, skipped when their manifests exist; see ``staging.py``): one node for the
   profile's ``[staging]`` time, a single-task ``flux run``; the job fails when a set
   could not be written;
2. one script per group of runs with the same resources (nodes, tasks per node, CPUs per
   task, minutes): ``# flux:`` directives for the allocation (nodes, time limit, bank,
   queue, the profile's ``[flux] extra``, ``--dependency=afterok:<staging job>`` for each
   staging job its runs read from: Flux cancels it when staging fails), the profile's
   set-up lines and environment, the start-of-job check (``sweeps/preflight.py``), then
   one ``flux run -N <nodes> -n <ranks>`` per run, one after another inside the
   allocation, each task running ``python -m scalegnn.sweeps.flux <task file>``.

The task file (JSON, ``OUT/.flux/tasks/``) holds the run and its full
``scalegnn train`` arguments (data root, shard folder, checkpoint options). Each
task finds its rank, the world size and the rendezvous host in Flux's environment
(``FLUX_TASK_RANK``, ``FLUX_JOB_SIZE``, ``FLUX_TASK_LOCAL_ID``, the first host of
``flux getattr hostlist``: :func:`scalegnn.launch.environment.detect_env`), as a
SLURM task does from submitit's (:func:`scalegnn.sweeps.task.join_job`).

Time limits: every ``flux run`` asks for ``SIGUSR2`` 120 s before its expiration
(``--signal``); the training loop then saves a checkpoint at its next step and the
task stops (status ``running``, the record says where it saved). Flux does not
requeue: the next ``scalegnn sweep`` resubmits the run and ``--resume`` continues
it exactly. Not covered (no Flux here to try them on): ``flux cancel`` is not
recorded as ``cancelled``, and placement is one ``flux run`` per run, not packed.

Tested here against recorded scripts (``tests/expected/flux_tuolumne.sh``,
``tests/expected/flux_tuolumne_stage.sh``) and end to end under a simulated ``flux``
command (``tests/flux_sim/flux``, which honors ``afterok``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from .preflight import command as preflight_command

__all__ = ["render_flux_batch", "render_flux_stage", "submit_flux", "active_flux_jobs", "flux_run_args",
           "run_task_file", "main"]

FLUX_DIR = ".flux"
STAGE_PLACEHOLDER = "<staging job>"  # --dry-run: a staging job's id is known only once it is submitted
_JOB_ID = re.compile(r"[^\s'\"\\#$`;|&<>()]+")  # what `flux batch` prints: one word (ƒ2Lmf3a, or decimal)


def active_flux_jobs() -> set[str] | None:
    """Ids of this user's pending or running Flux jobs; None when ``flux`` cannot be asked."""
    try:
        out = subprocess.run(["flux", "jobs", "-n", "--filter=pending,running", "-o", "{id}"], capture_output=True,
                             text=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return {line.strip() for line in out.splitlines() if line.strip()}


def flux_run_args(profile, nodes: int, tasks: int, cpus: int) -> list[str]:
    """``flux run`` options of one run: its nodes, one task per rank, CPUs per task,
    the profile's binding options, USR2 ahead of the time limit (checkpoint, stop)."""
    from .jobs import SIGNAL_DELAY_S

    return ["-N", str(nodes), "-n", str(nodes * tasks), f"--cores-per-task={cpus}", *profile.flux.run_args,
            f"--signal=SIGUSR2@{SIGNAL_DELAY_S}s"]


def _directives(profile, nodes: int, time_min: int, job_name: str, log_dir: Path, *, bank: str | None = None,
                queue: str | None = None, extra: dict | None = None, dependencies=()) -> list[str]:
    f = profile.flux
    bank, queue = bank or f.bank, queue or f.queue
    lines = [f"--nodes={nodes}", f"--time-limit={int(time_min)}m", f"--job-name={job_name}",
             f"--output={log_dir}/{job_name}-{{{{id}}}}.out"]
    if bank:
        lines.append(f"--bank={bank}")
    if queue:
        lines.append(f"--queue={queue}")
    for key, value in (f.extra if extra is None else extra).items():
        flag = "--" + key.replace("_", "-")
        lines.append(flag if value is True else f"{flag}={value}")
    lines += [f"--dependency=afterok:{shlex.quote(job)}" for job in dependencies]
    return [f"# flux: {line}" for line in lines]


def _setup(profile) -> list[str]:
    return ["# setup", *profile.setup, *profile.env_lines()]


def render_flux_batch(profile, nodes: int, tasks_per_node: int, cpus: int, time_min: int, job_name: str,
                      out: str | os.PathLike, runs: list[tuple[str, str]], python: str, dependencies=()) -> str:
    """The ``flux batch`` script of one group of runs: ``runs`` are (name, task file)
    pairs, in the order they run; ``dependencies`` the staging jobs they read from."""
    out = Path(out)
    lines = ["#!/bin/bash", *_directives(profile, nodes, time_min, job_name, out / FLUX_DIR,
                                         dependencies=dependencies), "", *_setup(profile)]
    check = preflight_command(profile, python)
    lines += ["", *check, ""] if check else [""]
    task = f"{python} -u -m scalegnn.sweeps.flux"
    lines.append("# one `flux run` per run, one after another in this allocation")
    run_args = " ".join(shlex.quote(a) for a in flux_run_args(profile, nodes, tasks_per_node, cpus))
    for name, path in runs:
        lines.append(f"flux run {run_args} {task} {shlex.quote(path)} || echo \"run {name} failed: exit $?\"")
    return "\n".join(lines) + "\n"


def render_flux_stage(profile, job_name: str, out: str | os.PathLike, task_file: str, python: str) -> str:
    """The ``flux batch`` script of one staging task (the shard sets of one graph): one
    node for ``[staging] time_min``, the staging bank (``--staging-account``), queue and
    options where the profile gives them; its exit status is the task's, so the runs'
    ``afterok`` fails with it."""
    from .jobs import staging_threads

    st = profile.staging
    cpus = st.cpus_per_task or profile.cpus_per_task
    lines = ["#!/bin/bash", *_directives(profile, 1, st.time_min or profile.time_min, job_name, Path(out) / FLUX_DIR,
                                         bank=st.account or None, queue=st.queue or None, extra=st.extra), "",
             *_setup(profile), staging_threads(profile), "",
             "# data staged once: `scalegnn data shard` of each shard set of one graph, one task (a set whose "
             "shards exist is skipped)",
             f"flux run -N 1 -n 1 --cores-per-task={cpus} {python} -u -m scalegnn.sweeps.flux {shlex.quote(task_file)}"]
    return "\n".join(lines) + "\n"


def _write_task(path: Path, payload: dict) -> None:
    from scalegnn.records import atomic_write_json

    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, payload)


def _flux_batch(script_path: Path) -> str:
    """Submit ``script_path`` with ``flux batch``; the job id it prints."""
    try:
        proc = subprocess.run(["flux", "batch", str(script_path)], capture_output=True, text=True, timeout=120)
    except OSError as exc:
        raise ValueError(f"cannot run `flux batch` ({exc}); submit from a Flux login node, or print the "
                         "scripts with --dry-run") from None
    if proc.returncode != 0:
        raise RuntimeError(f"flux batch {script_path} failed (exit {proc.returncode}): {proc.stderr.strip()}")
    lines = proc.stdout.strip().splitlines()
    job_id = lines[-1].strip() if lines else ""
    if not _JOB_ID.fullmatch(job_id):  # it goes into the next scripts' --dependency directives
        raise RuntimeError(f"flux batch {script_path} printed {proc.stdout.strip()!r}, not a job id")
    return job_id


def submit_flux(result, profile, out: Path, dry_run: bool, python, printer) -> None:
    """Write (or, with ``dry_run``, print) the staging scripts, then one batch script per
    group of ``result.todo`` depending on the staging jobs it reads from, and submit them
    with ``flux batch``; every run folder records its batch job's id."""
    from .folders import mark_submitted, run_dir
    from .jobs import group_runs, job_name, python_for, refuse_placeholders, stage_groups, task_payload

    if not dry_run:
        refuse_placeholders(profile)
    py = python_for(profile, python)
    tasks_dir = out.resolve() / FLUX_DIR / "tasks"
    stage_jobs: dict[str, str] = {}  # shard set folder -> its staging job
    groups = stage_groups(result)
    for i, group in enumerate(groups):
        name = f"scalegnn-{result.spec}-stage"
        path = tasks_dir / f"stage-{Path(group[0].folder).name}.json"
        script = render_flux_stage(profile, name, out.resolve(), str(path), py)
        if dry_run:
            result.stage_scripts.append(script)
            printer(f"\n# ---- flux batch {name} [{i}]: staging {len(group)} shard set(s) of one graph; the runs "
                    "that read them depend on it")
            for st in group:
                printer(f"#   scalegnn {shlex.join(st.argv())}")
            printer(script)
            job_id = STAGE_PLACEHOLDER
        else:
            _write_task(path, {"kind": "stage", "stages": [dataclasses.asdict(st) for st in group],
                               "offline": bool(profile.offline)})
            script_path = out.resolve() / FLUX_DIR / f"{name}-{i}.sh"
            script_path.write_text(script)
            job_id = _flux_batch(script_path)
            result.staged.append(job_id)
            printer(f"submitted flux batch {job_id} ({name}): staging {len(group)} shard set(s); script {script_path}")
        stage_jobs.update({st.folder: job_id for st in group})
    for n, ((nodes, tasks, cpus, minutes), group) in enumerate(group_runs(result.todo, profile).items()):
        name = job_name(result.spec, nodes, tasks)
        needs = sorted({stage_jobs[result.stages[r.key].folder] for r in group
                        if r.key in result.stages and result.stages[r.key].folder in stage_jobs})
        runs = []
        for run in group:
            payload = task_payload(run, out, result, profile)
            runs.append((run.key, str(tasks_dir / f"{run.key}.json"), run, payload))
        script = render_flux_batch(profile, nodes, tasks, cpus, minutes, name, out.resolve(),
                                   [(k, p) for k, p, _, _ in runs], py, needs)
        if dry_run:
            result.scripts.append(script)
            printer(f"\n# ---- flux batch {name}: {nodes} node(s) x {tasks} tasks, {minutes} min, {len(runs)} run(s)")
            for i, (key, _, _, payload) in enumerate(runs):
                printer(f"#   [{i}] {key}: scalegnn {shlex.join(payload['argv'])}")
            printer(script)
            continue
        for key, path, run, payload in runs:
            run_dir(out, run).mkdir(parents=True, exist_ok=True)
            _write_task(Path(path), {"kind": "run", "run": payload, "backend": profile.torch_backend})
        script_path = out.resolve() / FLUX_DIR / f"{name}-{n}.sh"
        script_path.write_text(script)
        job_id = _flux_batch(script_path)
        result.submitted.append(job_id)
        for _, _, run, _ in runs:
            mark_submitted(run_dir(out, run), job_id, profile.name)
        printer(f"submitted flux batch {job_id} ({name}): {len(runs)} run(s)"
                + (f", after staging job(s) {', '.join(needs)}" if needs else "") + f"; script {script_path}")


# ---------------------------------------------------------------------------- the task
def run_task_file(path: str | os.PathLike) -> int:
    """Run one task of a Flux batch script: a staging step, or one rank of a run."""
    task = json.loads(Path(path).read_text())
    if task["kind"] == "stage":
        from .staging import StageSet, StageTask

        stages = [StageSet(**{**raw, "grid": tuple(raw["grid"])}) for raw in task["stages"]]
        StageTask(stages, task["offline"])()
        return 0
    return _run_rank(task["run"], task["backend"])


def _run_rank(run: dict, backend: str) -> int:
    import logging
    import signal

    from scalegnn.checkpoint import PREEMPTION, Preempted
    from scalegnn.config import RunConfig
    from scalegnn.launch.environment import detect_env
    from scalegnn.progress import configure_logging, default_log_level

    from .preflight import prepare_node
    from .task import join_job, save_on_signal, train
    from .staging import STAGED_SYSTEMS

    configure_logging(default_log_level())
    prepare_node()  # this node's MIOpen folders, before anything can compile a kernel
    info = detect_env()
    want = 1 if run.get("launch") == "self" else int(run["world_size"])
    if info.world_size != want:
        raise ValueError(f"run {run['key']} needs {want} task(s), this `flux run` has {info.world_size} "
                         f"({info.source}); launch it with -n {want}")
    if run.get("offline"):
        os.environ["SCALEGNN_OFFLINE"] = "1"
    if info.rank == 0:
        logging.getLogger("scalegnn.sweeps").info("run %s: %d task(s), Flux job %s", run["key"], info.world_size,
                                                  os.environ.get("FLUX_JOB_ID"))
    cfg = RunConfig.from_dict(run["config"])
    if info.world_size > 1:
        join_job(cfg, backend)

    def stop_now(sig, frame):  # the time limit is near and nothing is being trained: nothing to save
        raise SystemExit(f"rank {info.rank}: {signal.Signals(sig).name} before training started; resubmit the sweep")

    if cfg.system in STAGED_SYSTEMS:
        save_on_signal(signal.SIGUSR2, stop_now)
    try:
        return train(cfg)
    except Preempted as exc:  # saved at the same step on every rank: the next sweep resumes it
        print(f"rank {info.rank}: {exc}; resubmit the sweep to continue", file=sys.stderr)
        return 0
    finally:
        PREEMPTION.disarm()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m scalegnn.sweeps.flux TASK_FILE (written by `scalegnn sweep` for a Flux profile)",
              file=sys.stderr)
        return 2
    try:
        return run_task_file(argv[0])
    except ValueError as exc:
        print(f"scalegnn.sweeps.flux: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
