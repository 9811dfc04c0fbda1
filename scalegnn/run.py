"""Run ScaleGNN on every rank of its grid: one process, local workers (``--nproc``),
or a job a launcher started (torchrun, srun, submitit, Flux).

:func:`run` is every system's way in: it checks the output folders, and makes SIGINT
(Ctrl-C) and SIGTERM end a run that no launcher owns as an ``interrupted`` record
(:mod:`scalegnn.signals`). :func:`run_distributed_training` is the orchestration
around :func:`scalegnn.trainer.run_training` (one rank's training): it spawns or joins
the ranks (process mechanics live in :mod:`scalegnn.parallel.launch`), agrees on the
run id, turns SIGTERM in a launched job into a recorded failure, and makes sure a
failed job still leaves its record, written by whichever process outlives the failure.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import signal
import sys
import traceback

import torch
import torch.distributed as dist

from .parallel.launch import WorkerError, init_from_env, local_backend, run_threads, spawn, threads_of_run
from .signals import Interrupted, held, signal_text, stop_on_signals, stop_under_way

__all__ = ["run", "run_scalegnn", "run_distributed_training", "failed_record", "Terminated"]


def run(cfg, graph=None) -> dict | None:
    """Run one configuration with its system (:mod:`scalegnn.systems`): ScaleGNN and
    its full-graph mode here, a compared system through its own run function. Returns
    the run record (None on ranks other than 0 of a job a launcher started). The
    command line, the sweeps and the Python API all come through here.

    Every folder the run will write to is checked first (a file in the way, a place
    that cannot be written: one-line ``ValueError``), before any data is loaded or
    any process spawned, so no finished run is lost to its output path.

    SIGINT (Ctrl-C) or SIGTERM stops the run (one process, or the ``--nproc``
    launcher, which forwards it to its workers): the record is written with status
    ``interrupted``, the epochs done and an ``error`` naming the signal and how to
    resume, and :class:`scalegnn.signals.Interrupted` is raised, carrying it as
    ``run_record``. The ranks of a launched job are left to their launcher (a SIGTERM
    there is recorded as a failure, :func:`run_distributed_training`)."""
    from . import systems as registry
    from .fileio import check_output_folder

    for flag, folder in cfg.output_folders():
        check_output_folder(folder, flag)
    with contextlib.nullcontext() if _launched() else stop_on_signals(), run_threads(cfg.parallel):
        try:
            return registry.resolve(registry.get(cfg.system).run)(cfg, graph)
        except Interrupted as stop:
            _record_interruption(cfg, stop)
            raise
        except Exception as exc:
            if (signum := stop_under_way()) is None:
                raise
            stop = Interrupted(signum)  # a stop that a C++ call wrapped in its own error (stop_under_way)
            stop.run_record = getattr(exc, "run_record", None)
            _record_interruption(cfg, stop)
            raise stop from exc


def _launched() -> bool:
    """This process is a rank of a multi-process job a launcher started."""
    return any(k in os.environ for k in ("TORCHELASTIC_RUN_ID", "SLURM_PROCID", "SUBMITIT_EXECUTOR")) and \
        int(os.environ.get("WORLD_SIZE", os.environ.get("SLURM_NTASKS", "1"))) > 1


def _record_interruption(cfg, stop: Interrupted) -> None:
    """Write the ``interrupted`` record of a run that ``stop`` ended: the trainer's
    partial record (rank 0's, for ``--nproc``) when the run had one, else the record
    of a run stopped while loading or spawning (no epochs, or its checkpoint's)."""
    from . import records
    from .checkpoint import resume_run_id

    record = stop.run_record
    if record is None:
        run_id = (resume_run_id(cfg.checkpoint.dir) if cfg.checkpoint.resume else None) \
            or records.new_run_id(cfg.system, cfg.data.dataset)
        record = failed_record(cfg, run_id, "", cfg.world_size)
    record = {k: v for k, v in record.items() if k != "path"}
    record.update(status="interrupted", error=_interruption_text(cfg, stop.signum, record))
    with held():
        record["path"] = str(records.write_record(record, cfg.loop.out_dir))
    stop.run_record = record


def _interruption_text(cfg, signum: int, record: dict) -> str:
    """What stopped the run, when, and how to go on: the newest checkpoint (none is
    saved at the interruption itself: the periodic ones are exact resume points, and
    a save while ranks are being stopped could not be agreed on)."""
    from . import systems as registry
    from .checkpoint import latest, read_meta

    done = record["epochs"][-1]["epoch"] if record.get("epochs") else 0
    text = f"interrupted by {signal_text(signum)} after epoch {done} of {cfg.loop.epochs}"
    if not cfg.checkpoint.dir:
        how = " (--checkpoint-dir D --checkpoint-every K make a run resumable)" \
            if cfg.system in registry.SCALEGNN_SYSTEMS else ""
        return f"{text}; no checkpoints, so a rerun starts over{how}"
    newest = latest(cfg.checkpoint.dir)
    if newest is None:
        return f"{text}; no checkpoint was saved yet in {cfg.checkpoint.dir}, so a rerun starts over"
    meta = read_meta(newest)
    return (f"{text}; nothing was saved at the interruption, the newest checkpoint is {newest} (step {meta['step']}, "
            f"{meta['epoch']} epochs done): resume with --checkpoint-dir {cfg.checkpoint.dir} --resume")


def run_scalegnn(cfg, graph=None) -> dict | None:
    """ScaleGNN on one process, on ``--nproc`` local workers, or as a rank of a job a
    launcher started (torchrun, srun, submitit, Flux)."""
    from .trainer import out_of_memory, run_training

    if cfg.parallel.nproc is not None or _launched() or cfg.world_size > 1:
        return run_distributed_training(cfg, nproc=cfg.parallel.nproc)
    try:
        return run_training(cfg, graph)
    except MemoryError as exc:  # while loading the data or building the model
        raise out_of_memory(exc, cfg, 0, "setup (loading the data, building the model)") from exc

_SETUP = "setup (loading the data or shards, building the model)"


def _training_worker(rank: int, world: int, cfg, run_id: str | None = None):
    from .device import resolve_backend, resolve_device
    from .trainer import out_of_memory, run_training
    from .parallel.grid import ProcessGrid

    device = resolve_device(cfg.parallel.device, local_rank=rank)
    grid = ProcessGrid(*cfg.parallel.grid, backend=resolve_backend(cfg.parallel.backend, device))
    try:
        # write_failed=False: the parent writes the failed record, with the first error of any rank
        record = run_training(cfg, grid=grid, run_id=run_id, write_failed=False, device=device)
    except Exception as exc:
        oom = None if hasattr(exc, "run_record") else out_of_memory(exc, cfg, rank, _SETUP)
        if oom is None:
            raise
        raise oom from exc
    return record if rank == 0 else None


def failed_record(cfg, run_id: str, error: str, world_size: int, partial: dict | None = None,
                  rank_errors: dict | None = None) -> dict:
    """A ``failed`` run record for a job whose rank 0 could not write one: built on
    rank 0's partial record when it sent one, else on the checkpoint's, else minimal."""
    from . import records
    from .checkpoint import latest, read_meta

    base = dict(partial) if partial else None
    if base is None and cfg.checkpoint.dir:
        ckpt = latest(cfg.checkpoint.dir)
        if ckpt is not None:
            saved = read_meta(ckpt)["record"]
            base = saved if saved.get("run_id") == run_id else None
    if base is None:
        base = records.new_record(
            system=cfg.system, dataset=cfg.data.dataset, config=cfg.to_dict(),
            grid=dict(zip(("dp", "x", "y", "z"), cfg.parallel.grid)), world_size=world_size, seed=cfg.seed,
            env=records.environment_info(backend=cfg.parallel.backend, device=_device_or_cpu(cfg.parallel.device)),
            graph=None, batch_size=None, steps_per_epoch=None, target_acc=cfg.loop.target_acc, run_id=run_id, summary=None)
    base.pop("path", None)
    base.update(run_id=run_id, world_size=world_size, status="failed", error=error,
                time_to_target_s=records.time_to_target(base.get("epochs", []), cfg.loop.target_acc),
                peak_memory_bytes=base.get("peak_memory_bytes"))
    if rank_errors:
        base["rank_errors"] = {str(r): (t.strip().splitlines() or [""])[-1][:500]
                               for r, t in sorted(rank_errors.items())}
    return base


def _device_or_cpu(spec: str) -> torch.device:
    """The device ``spec`` names on this host, or the CPU where it cannot be had (the
    failed record of a job whose GPU request could not be met still gets written)."""
    from .device import resolve_device

    try:
        return resolve_device(spec)
    except ValueError:
        return torch.device("cpu")


def run_distributed_training(cfg, nproc: int | None = None, timeout_s: float | None = None, *, worker=None):
    """Run :func:`scalegnn.trainer.run_training` on every rank of ``cfg.parallel.grid``.

    With ``nproc``: spawn that many local workers (must equal Gd*Gx*Gy*Gz; gloo, or
    NCCL with one GPU each) and return rank 0's record. If any rank raises, is killed or stops answering, every
    worker is stopped within ``cfg.parallel.collective_timeout_s`` plus a few seconds, and this
    process writes and returns a ``failed`` record carrying the first error (rank 0
    may be the one that died). A configuration or data error raises ``ValueError``
    and writes no record, as in a serial run.

    Without ``nproc``: join the job a launcher started (torchrun, srun, submitit);
    returns the record on rank 0 and None on the other ranks. Collectives time out
    after ``cfg.parallel.collective_timeout_s``; a failing rank exits non-zero, and the
    launcher (torchrun, ``srun --kill-on-bad-exit=1``) stops the others.

    ``worker`` replaces the per-rank function ``(rank, world, cfg, run_id) -> record``
    of a spawned run (the fault-injection tests use it).
    """
    from .parallel.grid import ProcessGrid

    world = cfg.world_size
    if nproc is not None:
        if nproc != world:
            raise ValueError(
                f"--nproc {nproc} does not match the grid {'x'.join(map(str, cfg.parallel.grid))} "
                f"(Gd*Gx*Gy*Gz = {world}); pass --nproc {world} or change --grid"
            )
        from . import records
        from .checkpoint import resume_run_id

        run_id = (resume_run_id(cfg.checkpoint.dir) if cfg.checkpoint.resume else None) \
            or records.new_run_id(cfg.system, cfg.data.dataset)
        threads = threads_of_run(cfg.parallel)
        backend = local_backend(cfg.parallel, nproc)
        try:
            return spawn(worker or _training_worker, nproc, cfg, run_id, timeout_s=timeout_s,
                         threads_per_worker=threads, backend=backend,
                         collective_timeout_s=cfg.parallel.collective_timeout_s)[0]
        except (WorkerError, Interrupted) as exc:
            if isinstance(exc, WorkerError) and exc.user_error:
                raise ValueError(exc.message or str(exc)) from None
            done = (getattr(exc, "results", None) or [None])[0]
            if isinstance(done, dict) and done.get("path"):
                return done  # rank 0 finished and wrote its record; a rank failed (or was stopped) while exiting
            if isinstance(exc, Interrupted):
                raise  # run() records it, on rank 0's partial record
            where = f"rank {exc.rank}" if exc.rank is not None else "the job"
            record = failed_record(cfg, run_id, f"{where}: {exc.traceback_text}", nproc, exc.run_record, exc.errors)
            record["path"] = str(records.write_record(record, cfg.loop.out_dir))
            return record
    info = init_from_env(timeout=datetime.timedelta(seconds=cfg.parallel.collective_timeout_s), backend=cfg.parallel.backend,
                         device=cfg.parallel.device)
    if info.world_size != world:
        hint = (f"pass --nproc {world} to spawn local workers, or launch {world} processes with torchrun/srun"
                if info.source == "single" else f"launch {world} processes or change --grid")
        raise ValueError(f"the grid {'x'.join(map(str, cfg.parallel.grid))} needs {world} ranks but the job has "
                         f"{info.world_size} ({info.source}); {hint}")
    from .trainer import run_training

    grid = ProcessGrid(*cfg.parallel.grid, backend=info.backend) if world > 1 or dist.is_initialized() \
        else ProcessGrid.single()
    restore = _terminate_raises(grid.rank)
    try:
        run_id = _agree_run_id(cfg)
        try:
            record = run_training(cfg, grid=grid, run_id=run_id, device=torch.device(info.device))
        except Exception as exc:
            from .checkpoint import Preempted

            if grid.rank != 0 and not isinstance(exc, Preempted):  # preempted: saved, rank 0 recorded it
                with _sigterm_ignored():
                    _record_failure_if_rank0_cannot(cfg, run_id, grid.rank, exc)
            raise
    finally:
        restore()
        if dist.is_initialized():
            dist.destroy_process_group()
    return record if grid.rank == 0 else None


class Terminated(RuntimeError):
    """SIGTERM reached a rank: the launcher stopping the job (torchrun does when a
    peer died), ``scancel`` or a time limit."""


def _terminate_raises(rank: int):
    """Make SIGTERM raise :class:`Terminated` in this rank, so the run ends as a
    recorded failure instead of vanishing (torchrun SIGTERMs the survivors when one
    rank dies). Left alone when someone already handles SIGTERM (submitit does: its
    preemption path must requeue, not fail) or off the main thread. Returns the undo."""
    import threading

    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None):
        return lambda: None

    def handler(signum, frame):
        raise Terminated(f"rank {rank} received SIGTERM (the launcher stopped the job: a peer rank failed, "
                         "scancel, or a time limit)")

    previous = signal.signal(signal.SIGTERM, handler)
    return lambda: signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def _sigterm_ignored():
    """A failing rank records the failure without being cut short: torchrun SIGTERMs the
    survivors as soon as it sees one rank dead, often while a survivor writes the
    failed record, and the Terminated raised mid-write left no record at all. The rank
    exits non-zero right afterwards anyway."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _agree_run_id(cfg) -> str:
    """Rank 0's new run id, broadcast: every rank of a torchrun/srun job can name the record."""
    from . import records

    ids = [records.new_run_id(cfg.system, cfg.data.dataset) if not dist.is_initialized() or dist.get_rank() == 0
           else None]
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list(ids, src=0)
    return ids[0]


def _record_failure_if_rank0_cannot(cfg, run_id: str, rank: int, exc: BaseException) -> None:
    """Under torchrun/srun no parent process outlives the ranks: when rank 0 itself was
    killed, nobody else would record the run. Every other failing rank therefore
    writes a ``failed`` record under the agreed run id, but only if none exists yet
    (exclusive create: the first wins, and rank 0's own record, written whenever rank
    0 is alive to write it, replaces it)."""
    from . import records

    partial = getattr(exc, "run_record", None)
    rid = (partial or {}).get("run_id") or run_id  # a resumed run keeps its checkpoint's id
    text = f"rank {rank}: {type(exc).__name__}: {exc}\n{traceback.format_exc(limit=6)}"
    record = failed_record(cfg, rid, text, dist.get_world_size() if dist.is_initialized() else 1, partial,
                           {rank: text})
    record["error"] = (f"rank {rank} saw the job fail (rank 0 wrote no record: it may have died first): "
                       f"{type(exc).__name__}: {exc}")
    try:
        records.write_record(record, cfg.loop.out_dir, exclusive=True)
    except FileExistsError:
        pass
    except OSError as write_error:  # never mask the training error with a reporting one
        print(f"rank {rank}: could not write the failed record: {write_error}", file=sys.stderr)
