"""Run ScaleGNN on every rank of its grid: one process, local workers (``--nproc``),
or a job a launcher started (torchrun, srun, submitit, Flux).

:func:`run_distributed_training` is the orchestration around
:func:`scalegnn.train.run_training` (one rank's training): it spawns or joins the
ranks (process mechanics live in :mod:`scalegnn.parallel.launch`), agrees on the run
id, turns SIGTERM into a recorded failure, and makes sure a failed job still leaves
its record, written by whichever process outlives the failure.
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

from .parallel.launch import WorkerError, init_from_env, local_backend, spawn

__all__ = ["run_distributed_training", "failed_record", "Terminated"]

_SETUP = "setup (loading the data or shards, building the model)"


def _training_worker(rank: int, world: int, cfg, run_id: str | None = None):
    from .device import resolve_backend, resolve_device
    from .train import out_of_memory, run_training
    from .parallel.grid import ProcessGrid

    device = resolve_device(cfg.device, local_rank=rank)
    grid = ProcessGrid(*cfg.grid, backend=resolve_backend(cfg.backend, device))
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
            system=cfg.system, dataset=cfg.dataset, config=cfg.to_dict(),
            grid=dict(zip(("dp", "x", "y", "z"), cfg.grid)), world_size=world_size, seed=cfg.seed,
            env=records.environment_info(backend=cfg.backend, device=_device_or_cpu(cfg.device)),
            graph=None, batch_size=None, steps_per_epoch=None, target_acc=cfg.target_acc, run_id=run_id, summary=None)
    base.pop("path", None)
    base.update(run_id=run_id, world_size=world_size, status="failed", error=error,
                time_to_target_s=records.time_to_target(base.get("epochs", []), cfg.target_acc),
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
    """Run :func:`scalegnn.train.run_training` on every rank of ``cfg.grid``.

    With ``nproc``: spawn that many local workers (must equal Gd*Gx*Gy*Gz; gloo, or
    NCCL with one GPU each) and return rank 0's record. If any rank raises, is killed or stops answering, every
    worker is stopped within ``cfg.collective_timeout_s`` plus a few seconds, and this
    process writes and returns a ``failed`` record carrying the first error (rank 0
    may be the one that died). A configuration or data error raises ``ValueError``
    and writes no record, as in a serial run.

    Without ``nproc``: join the job a launcher started (torchrun, srun, submitit);
    returns the record on rank 0 and None on the other ranks. Collectives time out
    after ``cfg.collective_timeout_s``; a failing rank exits non-zero, and the
    launcher (torchrun, ``srun --kill-on-bad-exit=1``) stops the others.

    ``worker`` replaces the per-rank function ``(rank, world, cfg, run_id) -> record``
    of a spawned run (the fault-injection tests use it).
    """
    from .parallel.grid import ProcessGrid

    world = cfg.world_size
    if nproc is not None:
        if nproc != world:
            raise ValueError(
                f"--nproc {nproc} does not match the grid {'x'.join(map(str, cfg.grid))} "
                f"(Gd*Gx*Gy*Gz = {world}); pass --nproc {world} or change --grid"
            )
        from . import records
        from .checkpoint import resume_run_id

        run_id = (resume_run_id(cfg.checkpoint.dir) if cfg.checkpoint.resume else None) \
            or records.new_run_id(cfg.system, cfg.dataset)
        threads = max(1, (os.cpu_count() or 1) // nproc)
        backend = local_backend(cfg, nproc)
        try:
            return spawn(worker or _training_worker, nproc, cfg, run_id, timeout_s=timeout_s,
                         threads_per_worker=threads, backend=backend,
                         collective_timeout_s=cfg.collective_timeout_s)[0]
        except WorkerError as exc:
            if exc.user_error:
                raise ValueError(exc.message or str(exc)) from None
            done = (getattr(exc, "results", None) or [None])[0]
            if isinstance(done, dict) and done.get("path"):
                return done  # rank 0 finished and wrote its record; a rank failed while exiting
            where = f"rank {exc.rank}" if exc.rank is not None else "the job"
            record = failed_record(cfg, run_id, f"{where}: {exc.traceback_text}", nproc, exc.run_record, exc.errors)
            record["path"] = str(records.write_record(record, cfg.out_dir))
            return record
    info = init_from_env(timeout=datetime.timedelta(seconds=cfg.collective_timeout_s), backend=cfg.backend,
                         device=cfg.device)
    if info.world_size != world:
        hint = (f"pass --nproc {world} to spawn local workers, or launch {world} processes with torchrun/srun"
                if info.source == "single" else f"launch {world} processes or change --grid")
        raise ValueError(f"the grid {'x'.join(map(str, cfg.grid))} needs {world} ranks but the job has "
                         f"{info.world_size} ({info.source}); {hint}")
    from .train import run_training

    grid = ProcessGrid(*cfg.grid, backend=info.backend) if world > 1 or dist.is_initialized() \
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

    ids = [records.new_run_id(cfg.system, cfg.dataset) if not dist.is_initialized() or dist.get_rank() == 0
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
        records.write_record(record, cfg.out_dir, exclusive=True)
    except FileExistsError:
        pass
    except OSError as write_error:  # never mask the training error with a reporting one
        print(f"rank {rank}: could not write the failed record: {write_error}", file=sys.stderr)
