"""The life of a run record: created once, given one status by what ended the run, written once.

:class:`RunSession` owns one rank's record from creation (:meth:`RunSession.open`,
from the trainer) to the atomic write (:meth:`RunSession.running` closes it: the
trainer's extra fields, the memory peaks and the trainer's own measurements of every
rank, the time to target, the summary). What ended the run maps to the record's status in one place,
:func:`status_of`:

    the loop returned                        ok
    DivergedError (a loss not finite)        diverged
    Preempted (saved, to be requeued)        running
    Interrupted (SIGINT / SIGTERM)           interrupted
    JobEnded (the job ended from outside)    cancelled / timeout
    anything else                            failed

A run whose own record could not be written by the rank that held it still leaves
one: :func:`stand_in_record` starts from rank 0's partial record, else the newest
checkpoint's, else the configuration alone, and :func:`conclude` gives it the status
of what ended it. The local job's starter (:func:`write_job_failure`), a surviving
rank of a launched job (:func:`write_survivor_failure`), the launcher after a stop
signal (:func:`write_interruption`) and a sweep task whose scheduler ended it
(``scalegnn.sweeps.task``) all come through here.
"""

from __future__ import annotations

import contextlib
import sys
import traceback

import torch
import torch.distributed as dist

from . import records
from .checkpoint import Preempted
from .config import RunConfig
from .device import peak_device_memory_bytes, peak_memory_bytes, peak_rss_bytes, reset_peak_memory
from .loop import DivergedError
from .parallel.grid import AXES
from .records import RunRecord
from .signals import Interrupted, JobEnded, held, signal_text, stop_under_way

__all__ = ["RunSession", "status_of", "JobFailed", "DiskFull", "disk_full", "FAILURES", "stand_in_record", "conclude", "new_run_id", "write_job_failure",
           "write_survivor_failure", "name_lost_ranks", "write_interruption", "OutOfMemory", "out_of_memory", "SETUP"]

# What a rank does with a failure (a status of FAILED_STATUSES):
#   "record"     one process: the failure is recorded and the record returned
#   "raise"      a rank of a launched job: rank 0 writes the record, every rank re-raises (the job fails as a whole)
#   "hand over"  a worker of a local job: re-raised with the record on the exception; the job's starter writes
#                it with the first error of whichever rank failed first
FAILURES = ("record", "raise", "hand over")
FAILED_STATUSES = ("failed", "cancelled", "timeout")
SETUP = "setup (loading the data or shards, building the model)"


class JobFailed(RuntimeError):
    """Processes this run started failed (DistDGL's servers or trainers): the message is
    their report, recorded without this process's traceback."""


class OutOfMemory(RuntimeError):
    """A rank ran out of memory; the message names the rank, the stage and a fix."""


class DiskFull(RuntimeError):
    """A write found no space left (ENOSPC, a quota); the message names what was being
    written, what is kept and how to go on."""


def disk_full(exc: BaseException, cfg: RunConfig, rank: int, stage: str) -> DiskFull | None:
    """``exc`` as a :class:`DiskFull` when it is a full disk, else None. A checkpoint
    save that fails leaves the previous checkpoints whole (each file is written to a
    temporary name and renamed), so the message names the newest one to resume from."""
    import errno

    if not isinstance(exc, OSError) or exc.errno not in (errno.ENOSPC, errno.EDQUOT):
        return None
    text = f"rank {rank}: no space left on device while {stage} ({exc.filename or exc.strerror})"
    if cfg.checkpoint.dir:
        from .checkpoint import latest

        newest = latest(cfg.checkpoint.dir)
        text += (f"; the newest whole checkpoint is {newest}: free space, then resume with --checkpoint-dir "
                 f"{cfg.checkpoint.dir} --resume" if newest is not None else "; no checkpoint was saved yet")
    return DiskFull(text)


def status_of(outcome: BaseException | None) -> str:
    """The record status of what ended a run (None: the loop finished)."""
    if outcome is None:
        return "ok"
    if isinstance(outcome, DivergedError):
        return "diverged"
    if isinstance(outcome, Preempted):
        return "running"
    if isinstance(outcome, Interrupted):
        return "interrupted"
    if isinstance(outcome, JobEnded):
        return outcome.status
    return "failed"


def _error_text(outcome: BaseException) -> str:
    """The record's ``error`` for ``outcome``: the message of a run that ended on a
    decision (diverged, preempted, a scheduler's verdict), the type, message and
    traceback of a failure (the traceback of the error being handled)."""
    if isinstance(outcome, (DivergedError, Preempted, JobEnded, JobFailed, DiskFull)):
        return str(outcome)
    return f"{type(outcome).__name__}: {outcome}\n{traceback.format_exc(limit=8)}"


def conclude(record: dict, outcome: BaseException | None) -> dict:
    """Give ``record`` the status (and error) of ``outcome``; returns it."""
    record["status"] = status_of(outcome)
    if outcome is not None and not isinstance(outcome, Interrupted):  # the launcher words a stop itself
        record["error"] = _error_text(outcome)
    return record


class RunSession:
    """One rank's side of a run's record.

    ``rank``, ``world_size``: this rank and the run's ranks; ``backend``: the world's
    collective backend (None in one process without ``torch.distributed``);
    ``device``: where the rank computes (its memory peak is reset now, so the
    record's peak covers loading and building); ``run_id``: the record's id (a new
    one when None); ``failures``: one of :data:`FAILURES`; ``write``: whether rank 0
    writes the record at all (a benchmark may keep it in memory); ``placement``:
    every rank's host, local rank and device (the record's ``env.placement``; this
    process alone when None); ``survey``: asked by rank 0 of a failed run which ranks
    were lost (:meth:`scalegnn.launch.liveness.Liveness.survey`), named in the
    record's ``lost_ranks`` and error (:func:`name_lost_ranks`).
    """

    def __init__(self, cfg: RunConfig, *, rank: int = 0, world_size: int = 1, backend: str | None = None,
                 device: torch.device | str = "cpu", run_id: str | None = None, failures: str = "record",
                 write: bool = True, placement: list[dict] | None = None, survey=None):
        if failures not in FAILURES:
            raise ValueError(f"failures must be one of {FAILURES}, got {failures!r}")
        self.cfg, self.rank, self.world_size, self.backend = cfg, rank, world_size, backend
        self.device = torch.device(device)
        self.run_id, self.failures, self.write = run_id, failures, write
        self.placement = placement or [records.placement_of(rank, 0, self.device)]
        self.survey = survey
        self.record: RunRecord | None = None
        self.trainer = None
        self.peaks: list[tuple] | None = None  # every rank's (memory, RSS, device memory) peaks, when known already
        reset_peak_memory(self.device)

    def open(self, trainer) -> RunRecord:
        """The record as it stands before the first epoch, from ``trainer`` (what it trains
        on, its batch size and steps per epoch, and its own skeleton fields)."""
        cfg = self.cfg
        self.trainer = trainer
        self.record = records.new_record(
            system=cfg.system, dataset=cfg.data.dataset, config=cfg.to_dict(),
            grid=dict(zip(AXES, cfg.parallel.grid)), world_size=self.world_size, seed=cfg.seed,
            env=records.environment_info(backend=self.backend, device=self.device, placement=self.placement),
            graph=trainer.graph_info,
            batch_size=trainer.batch_size, steps_per_epoch=trainer.steps_per_epoch, target_acc=cfg.loop.target_acc,
            run_id=self.run_id, **trainer.record_fields())
        if self.write and self.rank == 0:  # room for the record, whatever fills the disk meanwhile
            records.reserve_record_space(cfg.loop.out_dir, self.record["run_id"], cfg.loop.epochs)
        return self.record

    @contextlib.contextmanager
    def running(self):
        """The epochs run inside; whatever ends them gives the record its status
        (:func:`status_of`), and the record is closed and (by rank 0) written.

        Re-raised afterwards: a preemption (the launcher requeues), a stop signal (the
        launcher words and writes its record), and a failure unless this session
        records failures (``failures="record"``). Raised as an error of its own: a stop
        that a C++ call wrapped in its own error (:func:`scalegnn.signals.stop_under_way`),
        as :class:`Interrupted`, and an out-of-memory error, as :class:`OutOfMemory`."""
        record = self.record
        raise_after = None
        try:
            yield record
            conclude(record, None)
        except BaseException as exc:  # noqa: BLE001 - every outcome is recorded, then re-raised as it says
            outcome = self._outcome(exc)
            conclude(record, outcome)
            status = record["status"]
            if status in ("running", "interrupted") or (status in FAILED_STATUSES and self.failures != "record") \
                    or not isinstance(outcome, Exception):  # KeyboardInterrupt, SystemExit: recorded, never swallowed
                outcome.run_record = record  # the caller writes it if this rank cannot
                raise_after = (outcome, exc)
        finally:
            with held():  # a stop signal now would cut the record short, not the run
                self._close()
        if raise_after is not None:
            outcome, exc = raise_after
            if outcome is exc:
                raise exc
            raise outcome from exc

    def _outcome(self, exc: BaseException) -> BaseException:
        """``exc`` as the outcome it stands for (see :meth:`running`)."""
        if not isinstance(exc, Exception) or isinstance(exc, (DivergedError, Preempted, JobEnded)):
            return exc
        if (signum := stop_under_way()) is not None:
            return Interrupted(signum)
        stage = getattr(self.trainer, "stage", "training")
        return out_of_memory(exc, self.cfg, self.rank, stage, getattr(self.trainer, "batch_size", None)) \
            or disk_full(exc, self.cfg, self.rank, stage) or exc

    def _close(self) -> None:
        record, trainer = self.record, self.trainer
        if trainer is not None:
            trainer.close()  # no orphan threads (the prefetcher), the profiler trace written
            record.update(trainer.record_extra())
        if self.peaks is None:
            peaks = (peak_memory_bytes(self.device), peak_rss_bytes(), peak_device_memory_bytes(self.device))
            own = trainer.rank_fields() if trainer is not None else {}
            # After a failure or a stop the peers may be gone: no collective, this rank's own.
            stopped = record["status"] in ("interrupted",) + FAILED_STATUSES
            distributed = self.world_size > 1 and dist.is_available() and dist.is_initialized()
            every = _gather((peaks, own), self.world_size) if distributed and not stopped else [(peaks, own)]
            self.peaks = [p for p, _ in every]
            record.update(records.per_rank_fields([o for _, o in every]))
        record.update(records.memory_fields(self.peaks) if self.peaks else
                      {"peak_memory_bytes_per_rank": [], "peak_memory_bytes": None})
        record["time_to_target_s"] = records.time_to_target(record["epochs"], self.cfg.loop.target_acc)
        records.summarize(record)
        status = record["status"]
        if status in FAILED_STATUSES and self.rank == 0 and self.survey is not None:
            name_lost_ranks(record, self.survey())
        handed_over = self.failures == "hand over" and status in FAILED_STATUSES
        if self.write and self.rank == 0 and status != "interrupted" and not handed_over:
            record["path"] = str(records.write_record(record, self.cfg.loop.out_dir))


def _gather(obj, world_size: int) -> list:
    out = [None] * world_size
    dist.all_gather_object(out, obj)
    return out


# --------------------------------------------------------------------------- records of runs that lost their rank 0
def new_run_id(cfg: RunConfig) -> str:
    """The id a run's record gets: a new one, on ``--resume`` too (a resume is a new run;
    its record's ``resumed_from`` names the run whose checkpoint it continues, whose
    record and model file stay as they were written)."""
    return records.new_run_id(cfg.system, cfg.data.dataset)


def stand_in_record(cfg: RunConfig, run_id: str, world_size: int, partial: dict | None = None) -> dict:
    """The record of a run whose own could not be written: rank 0's ``partial`` record
    when it sent one, else the newest checkpoint's record of this run (or, on
    ``--resume``, of the run it continues: its epochs so far, ``resumed_from`` that
    run's id), else one with the configuration and no epochs (status ``running`` until
    :func:`conclude`)."""
    from .checkpoint import CheckpointError, latest, read_meta

    base = dict(partial) if partial else None
    if base is None and cfg.checkpoint.dir:
        ckpt = latest(cfg.checkpoint.dir)
        try:
            saved = read_meta(ckpt)["record"] if ckpt is not None else None
        except CheckpointError:  # a damaged checkpoint: the record of what is known without it
            saved = None
        if saved is not None:
            if saved.get("run_id") == run_id:
                base = dict(saved)
            elif cfg.checkpoint.resume:
                base = {**saved, "resumed_from": saved.get("run_id")}
    if base is None:
        base = records.new_record(
            system=cfg.system, dataset=cfg.data.dataset, config=cfg.to_dict(),
            grid=dict(zip(AXES, cfg.parallel.grid)), world_size=world_size, seed=cfg.seed,
            env=records.environment_info(backend=cfg.parallel.backend, device=_device_or_cpu(cfg.parallel.device)),
            graph=None, batch_size=None, steps_per_epoch=None, target_acc=cfg.loop.target_acc, run_id=run_id)
    base.pop("path", None)
    base.update(run_id=run_id, world_size=world_size,
                time_to_target_s=records.time_to_target(base.get("epochs", []), cfg.loop.target_acc),
                peak_memory_bytes=base.get("peak_memory_bytes"))
    return base


def _device_or_cpu(spec: str) -> torch.device:
    """The device ``spec`` names on this host, or the CPU where it cannot be had (the
    record of a job whose GPU request could not be met still gets written)."""
    from .device import resolve_device

    try:
        return resolve_device(spec)
    except ValueError:
        return torch.device("cpu")


def write_job_failure(cfg: RunConfig, run_id: str, error, world_size: int) -> dict:
    """Write the ``failed`` record of a local job that ``error`` (its
    :class:`~scalegnn.launch.job.WorkerError`) ended before rank 0 wrote one: on rank
    0's partial record when it sent one, with the first failing rank's traceback and
    every rank's last line (``rank_errors``)."""
    where = f"rank {error.rank}" if error.rank is not None else "the job"
    record = stand_in_record(cfg, run_id, world_size, error.run_record)
    record.update(status=status_of(error), error=f"{where}: {error.traceback_text}")
    if error.errors:
        record["rank_errors"] = {str(r): (t.strip().splitlines() or [""])[-1][:500]
                                 for r, t in sorted(error.errors.items())}
    record["path"] = str(records.write_record(record, cfg.loop.out_dir))
    return record


def name_lost_ranks(record: dict, lost: dict | None) -> None:
    """Put the ranks a failed run lost into ``record``: ``lost_ranks`` (``[{"rank",
    "host"}]``) and the start of its error, e.g. ``ranks 2, 3 on scn2 lost (no
    heartbeat for 5 s): ...``. ``lost``: ``{"ranks": [...], "how": text}``
    (:meth:`scalegnn.launch.liveness.Liveness.survey`), None when none was lost."""
    if not lost:
        return
    by_host: dict[str, list[int]] = {}
    for who in lost["ranks"]:
        by_host.setdefault(who["host"], []).append(who["rank"])
    where = "; ".join(f"rank{'s' if len(r) > 1 else ''} {', '.join(map(str, r))} on {host}"
                      for host, r in by_host.items())
    record["lost_ranks"] = lost["ranks"]
    record["error"] = f"{where} lost ({lost['how']}): {record.get('error') or ''}"


def write_survivor_failure(cfg: RunConfig, run_id: str, rank: int, exc: BaseException,
                           lost: dict | None = None) -> None:
    """Under torchrun / srun no parent process outlives the ranks: when rank 0 itself was
    killed, nobody else would record the run. Every other failing rank therefore
    writes a ``failed`` record under the agreed run id, but only if none exists yet
    (exclusive create: the first wins, and rank 0's own record, written whenever rank
    0 is alive to write it, replaces it)."""
    partial = getattr(exc, "run_record", None)
    text = f"rank {rank}: {type(exc).__name__}: {exc}\n{traceback.format_exc(limit=6)}"
    world = dist.get_world_size() if dist.is_initialized() else 1
    record = stand_in_record(cfg, run_id, world, partial)
    record.update(status=status_of(exc),
                  error=(f"rank {rank} saw the job fail (rank 0 wrote no record: it may have died first): "
                         f"{type(exc).__name__}: {exc}"),
                  rank_errors={str(rank): (text.strip().splitlines() or [""])[-1][:500]})
    name_lost_ranks(record, lost)
    try:
        records.write_record(record, cfg.loop.out_dir, exclusive=True)
    except FileExistsError:
        pass
    except OSError as write_error:  # never mask the training error with a reporting one
        print(f"rank {rank}: could not write the failed record: {write_error}", file=sys.stderr)


def write_interruption(cfg: RunConfig, stop: Interrupted) -> None:
    """Write the ``interrupted`` record of a run that ``stop`` ended: the rank's partial
    record (rank 0's, for a local job) when the run had one, else the record of a run
    stopped while loading or starting (no epochs, or its checkpoint's); the error names
    the signal, the epochs done and how to go on. ``stop.run_record`` is the record
    written."""
    record = stop.run_record
    if record is None:
        record = stand_in_record(cfg, new_run_id(cfg), cfg.world_size)
    record = {k: v for k, v in record.items() if k != "path"}
    conclude(record, stop)
    record["error"] = _interruption_text(cfg, stop.signum, record)
    with held():
        record["path"] = str(records.write_record(record, cfg.loop.out_dir))
    stop.run_record = record


def _interruption_text(cfg: RunConfig, signum: int, record: dict) -> str:
    """What stopped the run, when, and how to go on: the newest checkpoint (none is
    saved at the interruption itself: the periodic ones are exact resume points, and
    a save while ranks are being stopped could not be agreed on)."""
    from . import systems as registry
    from .checkpoint import CheckpointError, latest, read_meta

    done = record["epochs"][-1]["epoch"] if record.get("epochs") else 0
    text = f"interrupted by {signal_text(signum)} after epoch {done} of {cfg.loop.epochs}"
    if not cfg.checkpoint.dir:
        how = " (--checkpoint-dir D --checkpoint-every K make a run resumable)" \
            if cfg.system in registry.SCALEGNN_SYSTEMS else ""
        return f"{text}; no checkpoints, so a rerun starts over{how}"
    newest = latest(cfg.checkpoint.dir)
    if newest is None:
        return f"{text}; no checkpoint was saved yet in {cfg.checkpoint.dir}, so a rerun starts over"
    try:
        meta = read_meta(newest)
    except CheckpointError as exc:  # the interruption is what this text reports: the checkpoint's damage beside it
        return f"{text}; nothing was saved at the interruption, and the newest checkpoint cannot be resumed: {exc}"
    return (f"{text}; nothing was saved at the interruption, the newest checkpoint is {newest} (step {meta['step']}, "
            f"{meta['epoch']} epochs done): resume with --checkpoint-dir {cfg.checkpoint.dir} --resume")


# --------------------------------------------------------------------------- out of memory
def out_of_memory(exc: BaseException, cfg: RunConfig, rank: int, stage: str,
                  batch_size: int | None = None) -> OutOfMemory | None:
    """An :class:`OutOfMemory` naming the rank, the stage and a fix when ``exc`` is an
    out-of-memory error (CUDA/ROCm allocator, ``MemoryError``, torch's CPU
    allocator); None otherwise. (On Linux the kernel's OOM killer may SIGKILL a rank
    instead: the launcher then reports that rank as killed by signal 9.)"""
    oom_types = tuple(t for t in (getattr(torch, "OutOfMemoryError", None),
                                  getattr(torch.cuda, "OutOfMemoryError", None)) if t is not None)
    text = str(exc).lower()
    if not (isinstance(exc, MemoryError) or (oom_types and isinstance(exc, oom_types))
            or (isinstance(exc, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text))):
        return None
    if isinstance(exc, OutOfMemory):
        return exc
    grid = cfg.parallel.grid
    gd, gx, gy, gz = grid
    bigger = list(grid)
    axis = min((1, 2, 3), key=lambda i: (grid[i], -i))  # double the smallest 3D axis
    bigger[axis] *= 2
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
    b = f"B={batch_size}" if batch_size else "the batch"
    return OutOfMemory(
        f"rank {rank} ran out of memory during {stage} (grid {gd}x{gx}x{gy}x{gz}, {b}, hidden "
        f"{cfg.model.hidden}): {first}. Use a larger grid, whose Gx*Gy*Gz ranks split the graph, features and "
        f"weights (e.g. --grid {'x'.join(map(str, bigger))}), a smaller batch (--batch-size / --batch-ratio), "
        f"or a smaller --hidden"
    )
