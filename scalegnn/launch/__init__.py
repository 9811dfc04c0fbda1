"""Running a configuration: one launcher for every system, in every mode.

The path of one run, each hop going down (``docs/development.md`` walks it):

    scalegnn train | scalegnn.train(...) | a sweep's task
      launch(cfg, graph)          checks the output folders; stop signals and threads;
                                  then the mode (environment.run_mode):
        in process                  the whole run in this process
        local job                   --nproc workers on this host (job.LocalJob)
        joined                      a rank of a job torchrun / srun / submitit / Flux started
        a self-launching system     its own processes (DistDGL), recorded by a RunSession too
      train_rank(cfg, graph, env) every rank:
        make_trainer(cfg, graph, env)   the system's trainer (its registry entry's ``trainer``)
        RunSession                      opens the record, maps the outcome to a status, closes it
        train_epochs                    the epoch loop (scalegnn.loop)
      <- the record (rank 0), written once, atomically

Modules: ``environment`` (where this process stands: the launcher's variables,
``torch.distributed`` start-up, threads) and ``job`` (local worker processes). The
launcher itself is here; the package imports nothing at load time, so the lower
modules import without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # names for the annotations only: importing this package loads nothing
    from ..config import RunConfig
    from ..graph import Graph
    from ..records import RunRecord
    from .environment import DistEnv

__all__ = ["launch", "first_line", "train_rank", "local_rank"]


def launch(cfg: RunConfig, graph: Graph | None = None, *, timeout_s: float | None = None,
           rank_main=None) -> RunRecord | None:
    """Run ``cfg`` with its system and return the run record (None on ranks other
    than 0 of a job a launcher started). The command line, the Python API and the
    sweeps all come through here. ``graph``: a :class:`~scalegnn.graph.Graph` to train
    on instead of loading ``cfg``'s dataset (each system prepares it its own way).

    Before anything loads or starts, every folder the run writes to is checked (a
    file in the way, a place that cannot be written: a one-line ``ValueError``), so
    no finished run is lost to its output path.

    SIGINT (Ctrl-C) or SIGTERM stops a run that no launcher owns (one process, or a
    local job, whose workers get the signal forwarded): its record is written with
    status ``interrupted``, the epochs done and how to resume
    (:func:`scalegnn.session.write_interruption`), and
    :class:`scalegnn.signals.Interrupted` is raised carrying it as ``run_record``.

    For the fault-injection tests: ``timeout_s`` bounds a local job, ``rank_main``
    replaces its per-worker function (:func:`local_rank`'s signature).
    """
    from contextlib import nullcontext

    from .. import systems as registry
    from ..fileio import check_output_folder
    from ..progress import Phases
    from ..signals import Interrupted, raise_deferred, release_deferred, stop_on_signals, stop_under_way
    from .environment import detect_env, launched_rank, run_mode, run_threads

    for flag, folder in cfg.output_folders():
        check_output_folder(folder, flag)
    cfg.check_tuned_from()
    system = registry.get(cfg.system)
    if graph is not None:
        registry.check_graph(cfg.system, graph)
    env = detect_env()
    mode = run_mode(cfg.parallel, env)
    if system.self_launching and launched_rank(env):
        raise ValueError(f"--system {cfg.system} starts its own processes on this one host, but this process is "
                         f"rank {env.rank} of {env.world_size} that {env.source} started: run it as one task "
                         "(srun -N 1 -n 1, or no launcher) with --nproc for its trainers")
    if mode != "joined" or env.world_size == cfg.world_size:  # else _joined refuses it: nothing starts
        Phases(env.rank if mode == "joined" else 0, quiet=cfg.loop.progress is False).say(first_line(cfg, mode, env))
    from ..session import write_interruption  # the run's heavy imports (torch) begin here, after its first line

    if mode == "joined":
        release_deferred()  # a launched rank: its launcher's SIGTERM is a failure the rank records (terminate_raises)
    with nullcontext() if mode == "joined" else stop_on_signals(), run_threads(cfg.parallel):
        try:
            raise_deferred()  # a stop that came while the command started: recorded as this run's interruption
            if system.self_launching:
                return registry.resolve(system.job)(cfg, graph)
            if mode == "in process":
                return _in_process(cfg, graph)
            if mode == "local":
                return _local_job(cfg, graph, timeout_s, rank_main or local_rank)
            return _joined(cfg, graph)
        except Interrupted as stop:
            write_interruption(cfg, stop)
            raise
        except Exception as exc:
            if (signum := stop_under_way()) is None:
                raise
            stop = Interrupted(signum)  # a stop that a C++ call wrapped in its own error (stop_under_way)
            stop.run_record = getattr(exc, "run_record", None)
            write_interruption(cfg, stop)
            raise stop from exc


def first_line(cfg: RunConfig, mode: str, env: DistEnv) -> str:
    """What a run starts, in one line, logged before anything heavy loads (within a
    second of the command; rank 0 of a launched job alone)::

        scalegnn on cora: starting 2 local workers, grid 2x1x1x1 (what --nproc 2 alone gives: data
        parallel), 100 epochs

    ``mode``: :func:`~scalegnn.launch.environment.run_mode`'s. The grid's rule is named
    when ``--nproc N`` alone gives that grid (:func:`scalegnn.config.nproc_grid`)."""
    from ..config import nproc_grid
    from ..sections.parallel import format_grid

    p = cfg.parallel
    who = {"local": f"{p.nproc} local workers", "in process": "in this process"}.get(
        mode, f"rank {env.rank} of {env.world_size} ({env.source})")
    rule = ""
    if p.nproc and p.nproc > 1:
        grid, why = nproc_grid(cfg.system, p.nproc)
        rule = f" (what --nproc {p.nproc} alone gives: {why})" if tuple(p.grid) == grid else ""
    epochs = cfg.loop.epochs
    return f"{cfg.system} on {cfg.data.dataset}: starting {who}, grid {format_grid(p.grid)}{rule}, " \
        f"{epochs} epoch{'' if epochs == 1 else 's'}"


def train_rank(cfg: RunConfig, graph: Graph | None, env: DistEnv, *, run_id: str | None = None,
               failures: str = "record", write: bool = True, callbacks=(), placement: list[dict] | None = None,
               survey=None) -> RunRecord:
    """This rank's part of the run: the system's trainer, the session that owns the
    record, the epoch loop. Returns the record (this rank's view; rank 0 writes it).

    ``env``: where the rank stands (:class:`~scalegnn.launch.environment.DistEnv`: its
    rank, the run's world, its device and backend); ``failures``: what a failure does
    (:data:`scalegnn.session.FAILURES`); ``callbacks``: more
    :class:`~scalegnn.loop.Callback` objects for the loop (a benchmark's sampling);
    ``placement``: every rank's host, local rank and device, gathered here (a
    collective) when None; ``survey``: who a failed run lost
    (:class:`~scalegnn.launch.liveness.Liveness`), for the session.

    A configuration or data error raises before the record exists: it is the user's
    to fix, and a ``failed`` record for a typo would only be noise. So does a
    checkpoint of another run (``--resume``)."""
    import torch.distributed as dist

    from .. import systems as registry
    from ..loop import Progress, train_epochs
    from ..session import SETUP, RunSession, out_of_memory
    from .environment import gather_placement

    session = RunSession(cfg, rank=env.rank, world_size=env.world_size, device=env.device, run_id=run_id,
                         backend=env.backend if dist.is_available() and dist.is_initialized() else None,
                         failures=failures, write=write, placement=placement or gather_placement(env),
                         survey=survey)
    make_trainer = registry.resolve(registry.get(cfg.system).trainer)
    try:
        trainer = make_trainer(cfg, graph, env)
    except Exception as exc:
        oom = out_of_memory(exc, cfg, env.rank, SETUP)
        if oom is None:
            raise
        raise oom from exc
    record = session.open(trainer)
    try:
        start = trainer.begin(record)
    except BaseException:
        trainer.close()
        raise
    with session.running():
        if not start.finished:
            done = record["epochs"][-1]["train_time_s"] if record["epochs"] else 0.0
            progress = Progress(cfg.system, cfg.data.dataset, cfg.loop, env.rank, steps_per_epoch=trainer.steps_per_epoch,
                                batch_size=trainer.batch_size, done_epochs=start.first_epoch - 1, done_time_s=done)
            train_epochs(cfg.loop, trainer, record, start=start, callbacks=[*start.callbacks, progress, *callbacks])
        trainer.end(record)
    return record


def local_rank(rank: int, world: int, cfg: RunConfig, graph: Graph | None, run_id: str,
               backend: str) -> RunRecord | None:
    """Worker ``rank`` of a local job: :func:`train_rank` where the job's starter writes
    a failure's record; returns rank 0's record (None on the others)."""
    from .environment import local_rank_env

    record = train_rank(cfg, graph, local_rank_env(rank, world, cfg.parallel, backend), run_id=run_id,
                        failures="hand over")
    return record if rank == 0 else None


def _in_process(cfg: RunConfig, graph: Graph | None) -> RunRecord:
    from .environment import single_env

    return train_rank(cfg, graph, single_env(cfg.parallel))


def _local_job(cfg: RunConfig, graph: Graph | None, timeout_s: float | None, rank_main) -> RunRecord:
    """``--nproc`` workers on this host; rank 0's record. When a rank fails, is killed
    or stops answering, every worker is stopped within the collective timeout plus a
    few seconds and this process writes the ``failed`` record with the first error
    (rank 0 may be the one that died). A configuration or data error raised in the
    workers is a one-line ``ValueError`` with no record, as in one process."""
    from ..session import new_run_id, write_job_failure
    from ..signals import Interrupted
    from .environment import local_backend, threads_of_run
    from .job import LocalJob, WorkerError

    nproc = cfg.parallel.nproc  # the grid's world: RunConfig checks --nproc against --grid
    run_id = new_run_id(cfg)
    backend = local_backend(cfg.parallel, nproc)
    try:
        with LocalJob(rank_main, nproc, (cfg, graph, run_id, backend), backend=backend,
                      threads_per_worker=threads_of_run(cfg.parallel),
                      collective_timeout_s=cfg.parallel.collective_timeout_s) as job:
            return job.start().wait(timeout_s)[0]
    except (WorkerError, Interrupted) as exc:
        if isinstance(exc, WorkerError) and exc.user_error:
            raise ValueError(exc.message or str(exc)) from None
        done = (getattr(exc, "results", None) or [None])[0]
        if isinstance(done, dict) and done.get("path"):
            return done  # rank 0 finished and wrote its record; a rank failed (or was stopped) while exiting
        if isinstance(exc, Interrupted):
            raise  # launch() records it, on rank 0's partial record
        return write_job_failure(cfg, run_id, exc, nproc)


def _joined(cfg: RunConfig, graph: Graph | None) -> RunRecord | None:
    """This process as a rank of the job a launcher started: join it, agree on the run
    id, train; returns the record on rank 0, None on the others. Collectives time out
    after ``--collective-timeout``; SIGTERM (the launcher stopping the job) is a
    recorded failure; a failing rank exits non-zero (the launcher, torchrun or
    ``srun --kill-on-bad-exit=1``, stops the others), and a rank other than 0 leaves
    a ``failed`` record when rank 0 could not. A failed record names the ranks the
    job lost, with their hosts (:mod:`scalegnn.launch.liveness`)."""
    import datetime

    import torch.distributed as dist

    from ..checkpoint import Preempted
    from ..session import write_survivor_failure
    from ..signals import sigterm_ignored, terminate_raises
    from .environment import gather_placement, init_from_env
    from .liveness import Liveness

    world = cfg.world_size
    env = init_from_env(timeout=datetime.timedelta(seconds=cfg.parallel.collective_timeout_s),
                        backend=cfg.parallel.backend, device=cfg.parallel.device)
    if env.world_size != world:
        hint = (f"pass --nproc {world} to spawn local workers, or launch {world} processes with torchrun/srun"
                if env.source == "single" else f"launch {world} processes or change --grid")
        raise ValueError(f"the grid {'x'.join(map(str, cfg.parallel.grid))} needs {world} ranks but the job has "
                         f"{env.world_size} ({env.source}); {hint}")
    restore = terminate_raises(env.rank)
    liveness, ending = None, "failed"
    try:
        run_id = _agree_run_id(cfg)
        placement = gather_placement(env)
        if env.world_size > 1:
            liveness = Liveness(env.master_addr, env.master_port, env.rank, placement, run_id).start()
        try:
            record = train_rank(cfg, graph, env, run_id=run_id, failures="raise", placement=placement,
                                survey=liveness.survey if liveness else None)
            ending = record["status"]
        except Exception as exc:
            if env.rank != 0 and not isinstance(exc, Preempted):  # preempted: saved, rank 0 recorded it
                with sigterm_ignored():
                    lost = liveness.survey() if liveness else None
                    write_survivor_failure(cfg, run_id, env.rank, exc, lost=lost)
            raise
    finally:
        if liveness is not None:
            liveness.stop(ending)
        restore()
        if dist.is_initialized():
            dist.destroy_process_group()
    return record if env.rank == 0 else None


def _agree_run_id(cfg: RunConfig) -> str:
    """Rank 0's new run id, broadcast: every rank of a torchrun/srun job can name the record."""
    import torch.distributed as dist

    from ..session import new_run_id

    ids = [new_run_id(cfg) if not dist.is_initialized() or dist.get_rank() == 0 else None]
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list(ids, src=0)
    return ids[0]
