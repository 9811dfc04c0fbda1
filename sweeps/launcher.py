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

Data: every task gets the data root fixed at submission (``--data-root``, else
``$SCALEGNN_DATA_ROOT``, else the profile's ``data_root``: scratch on the clusters) and
the profile's offline switch (``SCALEGNN_OFFLINE=1``); multi-rank ScaleGNN runs read
only their rank's shard (``--shard-dir``), written once per (dataset, 3D grid,
permutation, seed) by a staging job the runs depend on: CPU work on the profile's
``[staging]`` resources, one array task per graph (:mod:`scalegnn.sweeps.staging`).
``OUT`` defaults to ``<out_root>/<spec>-<cluster>`` (the profile's ``out_root``).

Each run job starts with the profile's set-up lines, its environment, and the
start-of-job check (:mod:`scalegnn.sweeps.preflight`, GPU profiles): the python is the
profile's (``"${SCALEGNN_VENV}/bin/python"`` on the clusters), not the submitting one.

SLURM: runs are grouped by their resources (nodes, tasks per node, CPUs per task,
minutes) and each group is one submitit job array; every array task is one run,
with one task per rank (``tasks_per_node`` = GPUs per node) and each task setting
up ``torch.distributed`` from submitit's environment (:class:`SweepTask`). A system
that starts its own processes (``self_launching`` in :mod:`scalegnn.systems`: DistDGL) gets
one task on one node, and is refused on more than one node. ``--dry-run`` prints
the batch scripts submitit would submit (rendered by submitit's own sbatch writer)
and submits nothing. Local (``--cluster local``): the same tasks through submitit's
LocalExecutor, one job after another on this machine. Flux: :mod:`scalegnn.sweeps.flux`.

Checkpointing: :class:`SweepTask` is a ``submitit.helpers.Checkpointable``; on
timeout or preemption submitit calls :meth:`SweepTask.checkpoint`, which requeues
the same run; every submission passes ``--checkpoint-dir <run>/checkpoint --resume``
and the profile's ``--checkpoint-every`` (every profile checkpoints), so a requeued
job continues exactly from its newest checkpoint. When SLURM stops a job for good,
the run is recorded as such: ``scancel`` as ``cancelled``, a time limit with no
requeue left as ``timeout`` (:func:`slurm_job_verdict`).
"""

from __future__ import annotations

import logging
import os
import shlex
import time
from pathlib import Path

from scalegnn.perfmodel import Machine

from .folders import default_out, manifest_path, mark_submitted, run_dir, run_state, submitted_job
from .jobs import (SIGNAL_DELAY_S, SweepOutcome, check_runs, group_runs, job_name, job_shape, multi_node_refusal,
                   python_for, refuse_placeholders, stage_groups, staging_threads, supported_systems, task_payload)
from .preflight import command as preflight_command
from .profiles import (ONE_LINE, ClusterProfile, check_script_command, check_script_value, load_profile,
                       show_site_variables)
from .spec import RunSpec, SweepSpec, expand, load_spec
from .staging import StageTask, resolve_data_root, stage_for
from .task import SweepTask

__all__ = ["sweep", "slurm_parameters", "stage_parameters", "render_sbatch", "active_slurm_jobs"]

log = logging.getLogger("scalegnn.sweeps")


# ---------------------------------------------------------------------------- the queue and the manifest
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


# ---------------------------------------------------------------------------- SLURM scripts
def slurm_parameters(profile: ClusterProfile, nodes: int, tasks_per_node: int, time_min: int, job_name: str,
                     cpus_per_task: int | None = None, dependency: str | None = None,
                     python: str | None = None) -> dict:
    """Parameters for ``submitit.SlurmExecutor.update_parameters`` (its own names).
    ``dependency``: ``afterok:<job>[:<job>...]`` (the staging jobs); a job whose
    dependency can never be met is cancelled by SLURM instead of pending forever. The
    set-up: the profile's lines, its environment, then the start-of-job check run by
    the job's ``python`` (:func:`scalegnn.sweeps.preflight.command`; GPU profiles)."""
    s = profile.slurm
    params = {
        "job_name": job_name, "time": int(time_min), "nodes": nodes, "ntasks_per_node": tasks_per_node,
        "cpus_per_task": cpus_per_task or profile.cpus_per_task, "signal_delay_s": SIGNAL_DELAY_S,
        "setup": list(profile.setup) + profile.env_lines() + preflight_command(profile, python_for(profile, python)),
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
    """The staging job (``scalegnn data shard`` is CPU work): one task on one node, the
    profile's set-up and environment, no GPU request or binding, no start-of-job check,
    and the ``[staging]`` settings where they are given (Perlmutter: a shared CPU node,
    ``--constraint=cpu --qos=shared``, charged to ``[staging] account`` /
    ``--staging-account`` where CPU hours have an account of their own), else the runs'."""
    st = profile.staging
    params = slurm_parameters(profile, 1, 1, st.time_min or profile.time_min, job_name, st.cpus_per_task or None)
    params["setup"] = list(profile.setup) + profile.env_lines() + [staging_threads(profile)]
    params["srun_args"] = []
    params.pop("gpus_per_node", None)
    for key in ("account", "qos", "constraint", "partition"):
        if getattr(st, key):
            params[key] = getattr(st, key)
    if st.extra is not None:
        params.pop("additional_parameters", None)
        if st.extra:
            params["additional_parameters"] = dict(st.extra)
    return params


def render_sbatch(profile: ClusterProfile, nodes: int, tasks_per_node: int, time_min: int, array_size: int,
                  folder: str | os.PathLike, job_name: str, python: str | None = None, cpus_per_task: int | None = None,
                  dependency: str | None = None, params: dict | None = None) -> str:
    """The batch script submitit writes for one job array of ``array_size`` runs."""
    from submitit.slurm.slurm import _make_sbatch_string

    if params is None:
        params = slurm_parameters(profile, nodes, tasks_per_node, time_min, job_name, cpus_per_task, dependency, python)
    command = " ".join([python_for(profile, python), "-u -m submitit.core._submit", shlex.quote(str(folder))])
    return _make_sbatch_string(command=command, folder=str(folder), map_count=array_size if array_size > 1 else None,
                               **params)


# ---------------------------------------------------------------------------- the sweep
def sweep(spec_name, cluster: str, out: str | os.PathLike | None = None, *, dry_run: bool = False,
          gpus=None, datasets=None, epochs: int | None = None, seeds=None, systems=None,
          overrides: dict | None = None, python: str | None = None, data_root: str | None = None,
          stage: bool = True, printer=print) -> SweepOutcome:
    """Expand ``spec_name`` for ``cluster``, skip done runs, stage their data, submit (or print) the rest.

    ``data_root`` (default ``$SCALEGNN_DATA_ROOT``, else the profile's ``data_root``,
    else scalegnn's default) is fixed here and passed to every task; ``out`` defaults to
    the profile's ``out_root``; ``stage=False`` lets every rank load the whole graph (no
    ``--shard-dir``), as before staging existed. With runs to submit, nothing is written
    while the profile holds a placeholder (``dry_run`` prints it).
    """
    spec = load_spec(spec_name)
    profile = load_profile(cluster).with_overrides(**(overrides or {}))
    # A dry run is what one runs before logging in: a site variable it cannot expand here ($PSCRATCH, $USER) is
    # shown as itself; a submission needs it (site_path's one-line error).
    unset: list[str] | None = [] if dry_run else None
    out = Path(out) if out is not None else default_out(spec.name, profile.name,
                                                        profile.site_path("out_root", unset=unset))
    site_data = profile.site_path("data_root", unset=unset) if not data_root else None
    if unset:
        shown, printer = printer, lambda text="": shown(show_site_variables(text))
    # the folder lands in #SBATCH --output / # flux: --output lines: one line, or it injects one
    check_script_value("--out", out.resolve(), ONE_LINE, "pass a folder whose path has no newline or control "
                       "character")
    if python is not None:  # written into the script as a command: a path, and ${NAME} references the job expands
        check_script_command("--python", python,
                             'pass the path of the jobs\' python, e.g. "${SCALEGNN_VENV}/bin/python"')
    if not dry_run:  # a dry run writes nothing, and its folder may be a cluster's, not this machine's
        from scalegnn.fileio import check_output_folder

        check_output_folder(out, "--out")
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
                          data_root=resolve_data_root(data_root, site_data))
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
    if unset:
        it, names = (("it", f"${unset[0]} is") if len(unset) == 1 else
                     ("them", ", ".join("$" + v for v in unset) + " are"))
        printer(f"  note: {names} not set here, so the paths show {', '.join('${' + v + '}' for v in unset)} as "
                f"written; a {profile.name} login node sets {it}, and a submission needs {it}")
    for sys_name in sorted({r.system for r in unsupported}):
        printer(f"  skipped: `scalegnn train` has no --system {sys_name} here "
                f"({sum(r.system == sys_name for r in unsupported)} runs)")
    for why in sorted({why for _, why in refused}):
        printer(f"  refused ({sum(w == why for _, w in refused)} run(s)): {why}")
    if not dry_run and result.todo:
        refuse_placeholders(profile)  # before the manifest: nothing is written for a submission that cannot be
    # every run to submit as its `scalegnn train` would check it before loading data: a bad one is refused here,
    # before any job exists, not on a compute node with the reason only in its scheduler log
    check_runs(result.todo, out, result.data_root, read_files=not dry_run)
    if not dry_run:
        _write_manifest(out, spec, profile, runs, unsupported, refused, result.data_root)
    if not result.todo:
        return result
    if stage:
        for r in result.todo:
            st = stage_for(r.config(str(run_dir(out, r))), out, result.data_root, profile.staging.memory_budget)
            if st is not None:
                result.stages[r.key] = st
    if profile.scheduler == "slurm":
        _slurm(result, profile, out, dry_run, python, printer)
    elif profile.scheduler == "flux":
        from .flux import submit_flux

        submit_flux(result, profile, out, dry_run, python, printer)
    else:
        _local(result, profile, out, dry_run, printer)
    if unset:  # the scripts as they were printed
        result.scripts[:] = map(show_site_variables, result.scripts)
        result.stage_scripts[:] = map(show_site_variables, result.stage_scripts)
    return result


def _active_jobs(profile: ClusterProfile) -> set[str] | None:
    if profile.scheduler == "flux":
        from .flux import active_flux_jobs

        return active_flux_jobs()
    return active_slurm_jobs()


def _slurm(result: SweepOutcome, profile: ClusterProfile, out: Path, dry_run: bool, python, printer) -> None:
    folder = out / ".submitit" / "%j"
    stage_jobs = _slurm_stage(result, profile, folder, dry_run, python, printer)  # set folder -> job id
    for (nodes, tasks, cpus, minutes), group in group_runs(result.todo, profile).items():
        name = job_name(result.spec, nodes, tasks)
        needs = sorted({stage_jobs[result.stages[r.key].folder] for r in group
                        if r.key in result.stages and result.stages[r.key].folder in stage_jobs})
        dependency = "afterok:" + ":".join(needs) if needs else None
        if dry_run:
            script = render_sbatch(profile, nodes, tasks, minutes, len(group), folder, name, python, cpus, dependency)
            result.scripts.append(script)
            kind = f"job array of {len(group)} runs" if len(group) > 1 else "job (1 run)"
            printer(f"\n# ---- {kind} {name}: {nodes} node(s) x {tasks} tasks, {minutes} min")
            for i, run in enumerate(group):
                argv = task_payload(run, out, result, profile)["argv"]
                printer(f"#   [{i}] {run.key}: scalegnn {shlex.join(argv)}")
            printer(script)
            continue
        import submitit

        ex = submitit.SlurmExecutor(folder=folder, max_num_timeout=profile.max_timeouts,
                                    python=python_for(profile, python))
        ex.update_parameters(**slurm_parameters(profile, nodes, tasks, minutes, name, cpus, dependency, python))
        tasks_ = [SweepTask(task_payload(r, out, result, profile), str(run_dir(out, r)), profile.torch_backend)
                  for r in group]
        for r in group:
            run_dir(out, r).mkdir(parents=True, exist_ok=True)
        jobs = ex.submit_array(tasks_)
        result.submitted.extend(j.job_id for j in jobs)
        for r, job in zip(group, jobs):
            mark_submitted(run_dir(out, r), job.job_id, profile.name)
        printer(f"submitted job array {jobs[0].job_id.split('_')[0]} ({name}): {len(jobs)} runs"
                + (f", after staging job(s) {', '.join(needs)}" if needs else ""))


STAGE_PLACEHOLDER = "<staging job>"  # --dry-run: the staging job's id is known only once it is submitted


def _slurm_stage(result: SweepOutcome, profile: ClusterProfile, folder: Path, dry_run: bool, python,
                 printer) -> dict[str, str]:
    """Submit the staging step: one job array, one task per graph (the shard sets that
    read it, :func:`scalegnn.sweeps.jobs.stage_groups`); returns each set folder's job id
    (its group's array task), on which the runs that read it depend."""
    groups = stage_groups(result)
    if not groups:
        return {}
    name = f"scalegnn-{result.spec}-stage"
    params = stage_parameters(profile, name)
    if dry_run:
        script = render_sbatch(profile, 1, 1, params["time"], len(groups), folder, name, python, params=params)
        result.stage_scripts.append(script)
        printer(f"\n# ---- staging: {sum(map(len, groups))} shard set(s) of {len(groups)} graph(s), one task per "
                "graph; the runs that read them depend on it")
        for i, group in enumerate(groups):
            for st in group:
                printer(f"#   [{i}] scalegnn {shlex.join(st.argv())}")
        printer(script)
        return {st.folder: STAGE_PLACEHOLDER for group in groups for st in group}
    import submitit

    ex = submitit.SlurmExecutor(folder=folder, max_num_timeout=0, python=python_for(profile, python))
    ex.update_parameters(**params)
    jobs = ex.submit_array([StageTask(group, profile.offline) for group in groups])
    result.staged.extend(j.job_id for j in jobs)
    printer(f"submitted staging job array {jobs[0].job_id.split('_')[0]} ({name}): {len(groups)} task(s), "
            f"{sum(map(len, groups))} shard set(s)")
    return {st.folder: job.job_id for group, job in zip(groups, jobs) for st in group}


def _local(result: SweepOutcome, profile: ClusterProfile, out: Path, dry_run: bool, printer) -> None:
    """Staging first (one local job per shard set), then each run as one LocalExecutor
    job with one task per rank; at most ``profile.max_parallel_jobs`` jobs at a time (0: all at once)."""
    setup = list(profile.setup) + profile.env_lines()
    if dry_run:
        for group in stage_groups(result):
            line = "# local staging job: 1 task\n" + "\n".join(f"scalegnn {shlex.join(st.argv())}" for st in group)
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
        task = SweepTask(task_payload(run, out, result, profile), str(folder), profile.torch_backend)
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
    """Write the pending shard sets, one local job per graph, before any run; returns the
    folders whose staging failed, with the error."""
    import submitit

    broken = {}
    for group in stage_groups(result):
        ex = submitit.LocalExecutor(folder=out / ".submitit" / "%j", max_num_timeout=0)
        ex.update_parameters(tasks_per_node=1, nodes=1, timeout_min=profile.staging.time_min or profile.time_min,
                             setup=setup)
        t0 = time.perf_counter()
        job = ex.submit(StageTask(group, profile.offline))
        result.staged.append(job.job_id)
        grids = ", ".join(st.grid_str for st in group)
        try:
            job.result()
            printer(f"staged {group[0].dataset} for grid(s) {grids} (seed {group[0].seed}) in "
                    f"{time.perf_counter() - t0:.0f} s: {', '.join(st.folder for st in group)}")
        except Exception as exc:  # noqa: BLE001 - its runs are reported, the others go on
            text = str(exc).strip().splitlines()
            for st in group:
                if not st.done():
                    broken[st.folder] = text[-1] if text else repr(exc)
            printer(f"staging {group[0].dataset} for grid(s) {grids} failed: {text[-1] if text else exc}")
    return broken
