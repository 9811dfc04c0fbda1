"""Flux-scheduled machines (LLNL Tuolumne): ``flux batch`` scripts and their tasks.

submitit has no Flux executor, so a Flux sweep writes its own batch scripts: one
per group of runs with the same resources (nodes, tasks per node, CPUs per task,
minutes), ``# flux:`` directives for the allocation (nodes, time limit, bank, queue,
the profile's ``[flux] extra``), the profile's set-up lines and environment, then

1. the staging step: one single-task ``flux run`` per shard set the group's runs read
   (``scalegnn data shard``, skipped when its manifest exists, see ``staging.py``);
2. one ``flux run -N <nodes> -n <ranks>`` per run, one after another inside the
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

Tested here against a recorded script (``tests/expected/flux_tuolumne.sh``) and end
to end under a simulated ``flux`` command (``tests/flux_sim/flux``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

__all__ = ["render_flux_batch", "submit_flux", "active_flux_jobs", "flux_run_args", "run_task_file", "main"]

FLUX_DIR = ".flux"


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


def _directives(profile, nodes: int, time_min: int, job_name: str, log_dir: Path) -> list[str]:
    f = profile.flux
    lines = [f"--nodes={nodes}", f"--time-limit={int(time_min)}m", f"--job-name={job_name}",
             f"--output={log_dir}/{job_name}-{{{{id}}}}.out"]
    if f.bank:
        lines.append(f"--bank={f.bank}")
    if f.queue:
        lines.append(f"--queue={f.queue}")
    for key, value in f.extra.items():
        flag = "--" + key.replace("_", "-")
        lines.append(flag if value is True else f"{flag}={value}")
    return [f"# flux: {line}" for line in lines]


def render_flux_batch(profile, nodes: int, tasks_per_node: int, cpus: int, time_min: int, job_name: str,
                      out: str | os.PathLike, runs: list[tuple[str, str]], stages: list[tuple[str, str]],
                      python: str) -> str:
    """The ``flux batch`` script of one group: ``runs`` and ``stages`` are (name, task
    file) pairs, in the order they run."""
    out = Path(out)
    lines = ["#!/bin/bash", *_directives(profile, nodes, time_min, job_name, out / FLUX_DIR), "",
             "# setup", *profile.setup, *profile.env_lines(), ""]
    task = f"{python} -u -m scalegnn.sweeps.flux"
    if stages:
        lines.append("# data staged once: `scalegnn data shard`, one task (skipped when its shards exist)")
        for name, path in stages:
            lines.append(f"flux run -N 1 -n 1 --cores-per-task={cpus} {task} {shlex.quote(path)}"
                         f" || echo \"staging {name} failed: exit $?\"")
        lines.append("")
    lines.append("# one `flux run` per run, one after another in this allocation")
    run_args = " ".join(shlex.quote(a) for a in flux_run_args(profile, nodes, tasks_per_node, cpus))
    for name, path in runs:
        lines.append(f"flux run {run_args} {task} {shlex.quote(path)} || echo \"run {name} failed: exit $?\"")
    return "\n".join(lines) + "\n"


def _write_task(path: Path, payload: dict) -> None:
    from scalegnn.records import atomic_write_json

    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, payload)


def submit_flux(result, profile, out: Path, dry_run: bool, python, printer) -> None:
    """Write (or, with ``dry_run``, print) one batch script per group of ``result.todo``
    and submit it with ``flux batch``; every run folder records the batch job's id."""
    from .folders import mark_submitted, run_dir
    from .jobs import group_runs, job_name, pending_stages, python_for, task_payload

    if not dry_run and profile.placeholders():
        raise ValueError(f"profile {profile.name} still has placeholders {profile.placeholders()} "
                         f"({profile.source}); pass --account (bank) / --partition (queue) or edit the profile")
    py = python_for(profile, python)
    tasks_dir = out.resolve() / FLUX_DIR / "tasks"
    staged: set[str] = set()
    for n, ((nodes, tasks, cpus, minutes), group) in enumerate(group_runs(result.todo, profile).items()):
        name = job_name(result.spec, nodes, tasks)
        stages = []
        for st in pending_stages(result, group):
            if st.folder in staged:
                continue  # an earlier script of this sweep writes it (scripts may run in any order: it is re-checked)
            staged.add(st.folder)
            path = tasks_dir / f"stage-{Path(st.folder).name}.json"
            stages.append((Path(st.folder).name, str(path), st))
        runs = []
        for run in group:
            payload = task_payload(run, out, result, profile)
            runs.append((run.key, str(tasks_dir / f"{run.key}.json"), run, payload))
        script = render_flux_batch(profile, nodes, tasks, cpus, minutes, name, out.resolve(),
                                   [(k, p) for k, p, _, _ in runs], [(k, p) for k, p, _ in stages], py)
        if dry_run:
            result.scripts.append(script)
            printer(f"\n# ---- flux batch {name}: {nodes} node(s) x {tasks} tasks, {minutes} min, {len(runs)} run(s)")
            for i, (key, _, _, payload) in enumerate(runs):
                printer(f"#   [{i}] {key}: scalegnn {shlex.join(payload['argv'])}")
            printer(script)
            continue
        for _, path, st in stages:
            _write_task(Path(path), {"kind": "stage", "stage": dataclasses.asdict(st),
                                     "offline": bool(profile.offline)})
        for key, path, run, payload in runs:
            run_dir(out, run).mkdir(parents=True, exist_ok=True)
            _write_task(Path(path), {"kind": "run", "run": payload, "backend": profile.torch_backend})
        script_path = out.resolve() / FLUX_DIR / f"{name}-{n}.sh"
        script_path.write_text(script)
        try:
            proc = subprocess.run(["flux", "batch", str(script_path)], capture_output=True, text=True, timeout=120)
        except OSError as exc:
            raise ValueError(f"cannot run `flux batch` ({exc}); submit from a Flux login node, or print the "
                             "scripts with --dry-run") from None
        if proc.returncode != 0:
            raise RuntimeError(f"flux batch {script_path} failed (exit {proc.returncode}): {proc.stderr.strip()}")
        job_id = proc.stdout.strip().splitlines()[-1].strip()
        result.submitted.append(job_id)
        for _, _, run, _ in runs:
            mark_submitted(run_dir(out, run), job_id, profile.name)
        printer(f"submitted flux batch {job_id} ({name}): {len(runs)} run(s), {len(stages)} staging step(s); "
                f"script {script_path}")


# ---------------------------------------------------------------------------- the task
def run_task_file(path: str | os.PathLike) -> int:
    """Run one task of a Flux batch script: a staging step, or one rank of a run."""
    task = json.loads(Path(path).read_text())
    if task["kind"] == "stage":
        from .staging import StageSet, StageTask

        raw = dict(task["stage"])
        raw["grid"] = tuple(raw["grid"])
        StageTask(StageSet(**raw), task["offline"])()
        return 0
    return _run_rank(task["run"], task["backend"])


def _run_rank(run: dict, backend: str) -> int:
    import logging
    import signal

    from scalegnn.checkpoint import PREEMPTION, Preempted
    from scalegnn.config import RunConfig
    from scalegnn.launch.environment import detect_env
    from scalegnn.progress import configure_logging, default_log_level

    from .task import join_job, save_on_signal, train
    from .staging import STAGED_SYSTEMS

    configure_logging(default_log_level())
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
