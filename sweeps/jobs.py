"""How a sweep's runs become scheduler jobs, whatever the scheduler (SLURM, Flux, local).

Which systems run here and which launch their own processes (the registry,
:mod:`scalegnn.systems`), each run's job shape and the grouping of runs into job
arrays, and each run's task payload: its :class:`~scalegnn.config.RunConfig` with
the data root, shard folder and checkpoints fixed at submission.
"""

from __future__ import annotations

import dataclasses
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from scalegnn import systems as registry
from scalegnn.config import RunConfig
from scalegnn.config import command_line, train_flags
from scalegnn.threads import AUTO

from .folders import run_dir
from .profiles import ClusterProfile
from .spec import RunSpec, SpecError
from .staging import StageSet, group_stages, with_data

__all__ = ["SIGNAL_DELAY_S", "supported_systems", "self_launching", "multi_node_refusal", "with_checkpoints",
           "with_threads", "job_shape", "group_runs", "job_name", "python_for", "SweepOutcome", "task_payload",
           "pending_stages", "stage_groups", "refuse_placeholders", "staging_threads", "check_runs"]

SIGNAL_DELAY_S = 120  # USR2 this long before the time limit: time to checkpoint and requeue


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


def with_checkpoints(cfg: RunConfig, folder: Path, every: str = ""):
    """``cfg`` checkpointing into ``<run folder>/checkpoint`` and resuming from it on
    every submission -- a resume without a checkpoint starts from scratch, so the first
    submission and every requeue run the same configuration -- every ``every`` (the
    profile's). A system without checkpoints (the compared systems) is returned as is."""
    if "--checkpoint-dir" not in train_flags(cfg.system):
        return cfg
    return dataclasses.replace(cfg, checkpoint=dataclasses.replace(
        cfg.checkpoint, dir=str(folder / "checkpoint"), resume=True, every=str(every) if every else cfg.checkpoint.every))


def with_threads(cfg: RunConfig, threads_per_task: int):
    """``cfg`` with the profile's ``threads_per_task`` (or ``--threads-per-task``) as its
    ``--threads`` when that gives a count and the run's own setting is ``auto``; 0 leaves
    the run's (``auto``: :mod:`scalegnn.threads` picks from the cores free on the node)."""
    if threads_per_task > 0 and cfg.parallel.threads == AUTO:
        return dataclasses.replace(cfg, parallel=dataclasses.replace(cfg.parallel, threads=threads_per_task))
    return cfg


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


def python_for(profile: ClusterProfile, python: str | None) -> str:
    """The jobs' interpreter command: ``--python``, else the profile's (the clusters':
    ``"${SCALEGNN_VENV}/bin/python"``, expanded in the job), else this one."""
    return python or profile.python or shlex.quote(sys.executable)


def refuse_placeholders(profile: ClusterProfile) -> None:
    """A submission with a ``<...>`` placeholder left in the profile stops here, before a
    manifest, a folder or a job exists, naming the flags that fill them."""
    if not profile.placeholders():
        return
    flags = ("--account (bank) / --partition (queue)" if profile.scheduler == "flux"
             else "--account/--qos/--partition") + \
        (" / --staging-account" if "staging.account" in profile.placeholders() else "")
    raise ValueError(f"profile {profile.name} still has placeholders {profile.placeholders()} ({profile.source}); "
                     f"pass {flags} or edit the profile")


def staging_threads(profile: ClusterProfile) -> str:
    """The staging job's thread count, after the profile's environment (whose
    ``OMP_NUM_THREADS`` is a rank's share of a node): every CPU of its one task."""
    cpus = profile.staging.cpus_per_task or profile.cpus_per_task
    return f"export OMP_NUM_THREADS={cpus}  # staging: its task's CPUs"


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


def job_name(spec: str, nodes: int, tasks: int) -> str:
    return f"scalegnn-{spec}-{nodes}x{tasks}"


def task_payload(run: RunSpec, out: Path, result: SweepOutcome, profile: ClusterProfile) -> dict:
    """What a run's tasks need: the run, its configuration (the spec's options with
    the data root, its shard folder, checkpoints and threads), the equivalent ``scalegnn``
    command line (for logs and dry runs), its folder, how it launches, the offline switch."""
    folder = run_dir(out, run)
    cfg = with_data(run.config(str(folder)), result.data_root, result.stages.get(run.key))
    cfg = with_checkpoints(cfg, folder, profile.checkpoint_every)
    cfg = with_threads(cfg, profile.threads_per_task)
    return {**run.to_dict(), "config": cfg.to_dict(), "argv": ["train", *command_line(cfg)], "folder": str(folder),
            "launch": "self" if self_launching(run.system) else "ranks", "offline": bool(profile.offline)}


def check_runs(runs: list[RunSpec], out: Path, data_root: str, *, read_files: bool = True) -> None:
    """Refuse a sweep before its first submission when one of ``runs`` would fail at its
    start: each run's configuration goes through the checks ``scalegnn train`` makes
    before it loads any data (its flags and settings, :meth:`RunSpec.config`; the dataset
    name, as the dataset registry reads it; with ``read_files``, the ``--tuned-from``
    file). The first bad run is one line (:class:`~scalegnn.sweeps.spec.SpecError`)
    naming it, the setting and the problem: a job would otherwise fail on its compute
    node, with the reason only in its scheduler log."""
    from scalegnn.datasets.registry import parse_name

    for i, run in enumerate(runs, 1):
        where = f"run {i} of {len(runs)}"
        try:
            cfg = run.config(str(run_dir(out, run)))
        except SpecError as exc:
            raise SpecError(f"{where}: {exc}; nothing was submitted") from None
        try:
            parse_name(cfg.data.dataset, Path(data_root or "."), cfg.seed)
            if read_files:
                cfg.check_tuned_from()
        except ValueError as exc:
            raise SpecError(f"{where} ({run.key}): {exc}; nothing was submitted") from None


def pending_stages(result: SweepOutcome, runs: list[RunSpec] | None = None) -> list[StageSet]:
    """The shard sets ``runs`` (default: every run to submit) read that are not written yet, once each."""
    sets = {}
    for r in runs if runs is not None else result.todo:
        st = result.stages.get(r.key)
        if st is not None and not st.done():
            sets.setdefault(st.folder, st)
    return list(sets.values())


def stage_groups(result: SweepOutcome, runs: list[RunSpec] | None = None) -> list[list[StageSet]]:
    """The pending shard sets of ``runs`` (default: every run to submit), one list per
    graph they shard: one staging task each (:func:`scalegnn.sweeps.staging.group_stages`)."""
    return group_stages(pending_stages(result, runs))
