"""The epoch loop every system trains with: ScaleGNN and the compared systems.

A system supplies a :class:`Trainer`; the loop times its epochs, evaluates, builds
the epoch rows of the run record, reports and stops:

    trainer.train_epoch(epoch)  -> EpochStats   sums over the epoch's steps (and, when
                                                the trainer times itself, ``seconds``)
    trainer.evaluate()          -> (train, val, test) accuracies, the same on every rank
    trainer.reduce(stats)       -> EpochStats   the sums over the ranks (where a rank's are its own)
    trainer.slowest(seconds)    -> float        the slowest rank's time (where ranks time apart)

Per epoch: ``train_epoch``; the sums reduced over ranks; training time added
(evaluation excluded, paper VI-C); a loss that is not finite stops the run as
diverged; evaluation every ``eval_every`` epochs and after the last; the row
appended to ``record["epochs"]``; every callback's :meth:`Callback.on_epoch_end`;
the run stops at the target accuracy when asked, or when a callback says so.

Callbacks carry what differs between systems and callers: the progress log
(:class:`Progress`), ScaleGNN's epoch-end checkpoint and preemption, a benchmark's
per-epoch sampling. Where the epochs begin (a resumed run continues after its
checkpoint) is the trainer's :meth:`Trainer.begin`.

What an engine step and an evaluation round return sit here too, beside the sums
they become. ScaleGNN's trainer (:mod:`scalegnn.trainer`) drives the engine
(:class:`scalegnn.parallel.engine.ParallelEngine`, one for every grid, the single
process included) and never looks inside it:

    engine.steps_per_epoch            int
    engine.train_step(step)  -> StepResult     (Algorithm 1, one optimizer update)
    engine.evaluate()        -> EvalResult     (full-graph forward, no sampling)
    engine.counters()        ({component: seconds}, {collective kind: bytes}, {collective kind:
    engine.reset_counters()  calls}) since the last reset (the loop resets them per epoch)
    engine.synchronize()     wait for the device (before a host clock reading)

A step's numbers stay on the device: :class:`StepResult` holds tensors, and
:class:`EpochSums` adds them up without reading them, so a GPU is never made to
wait for the host inside an epoch; the trainer reads the sums once at the epoch's
end, into the :class:`EpochStats` the loop takes.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch

from .metrics import accuracy_counts
from .records import EpochRow, new_epoch_row
from .sections.loop import LoopConfig  # declared where no torch loads (scalegnn.sections)

__all__ = ["LoopConfig", "EpochStats", "StepResult", "EpochSums", "EvalResult", "Trainer", "LoopStart", "Callback",
           "BestValidation", "Progress", "DivergedError", "epoch_row", "train_epochs", "reached_target"]


class DivergedError(RuntimeError):
    """The training loss became NaN or infinite."""



@dataclass
class EpochStats:
    """One epoch's sums over its steps, on one rank (or already over all ranks)."""

    loss_sum: float = 0.0
    loss_n: int = 0
    correct: float = 0.0
    count: float = 0.0
    components: dict = field(default_factory=dict)  # seconds per step component
    comm_bytes: dict = field(default_factory=dict)  # bytes sent per collective kind
    comm_calls: dict | None = None  # collective calls per kind (None: the system does not count them)
    extra: dict = field(default_factory=dict)  # system-specific per-epoch fields (e.g. cache hits)
    seconds: float | None = None  # the epoch's training time, when the trainer measures it itself

    def add_batch(self, loss: float, logits, y) -> None:
        """One step's loss and the training accuracy of its (detached) logits."""
        correct, count = accuracy_counts(logits, y)
        self.loss_sum += loss
        self.loss_n += 1
        self.correct += correct
        self.count += count


@dataclass
class StepResult:
    """One step, as a float64 device tensor ``stats`` = [loss, learned, correct, count]:
    the loss (mean over the batch's labeled training vertices, averaged over the
    data-parallel groups that had one; 0 when none had), ``learned`` 1 if the step
    updated the weights (some group had a labeled vertex) else 0, and the batch's
    training-accuracy counts. The properties read it on the host (tests, tools);
    the trainer adds it up with :class:`EpochSums` instead."""

    stats: torch.Tensor

    @property
    def count(self) -> int:
        return int(self.stats[3])

    @property
    def correct(self) -> float:
        return float(self.stats[2])

    @property
    def loss(self) -> float:
        """The step's loss; NaN for a step without any labeled vertex."""
        loss, learned = self.stats[:2].tolist()
        return loss if learned else float("nan")


class EpochSums:
    """Sums of :class:`StepResult` over an epoch, kept on the device.

    ``add`` is a few element-wise device operations (no read-back); ``read`` waits
    for the device once and returns (loss_sum, loss_n, correct, count, first_bad):
    the sum of the losses of the steps that learned, their number, the accuracy
    counts and the first step whose loss was not finite (-1 if none)."""

    def __init__(self, device, start: tuple | None = None):
        self.sums = torch.tensor(list(start or (0.0, 0.0, 0.0, 0.0)), dtype=torch.float64, device=device)
        self.first_bad = torch.full((), -1, dtype=torch.int64, device=device)

    def add(self, res: StepResult, step: int) -> None:
        self.sums += res.stats
        bad = ~torch.isfinite(res.stats[0]) & (self.first_bad < 0)
        self.first_bad = torch.where(bad, step, self.first_bad)

    def read(self) -> tuple[float, int, float, float, int]:
        loss_sum, loss_n, correct, count = self.sums.tolist()
        return loss_sum, int(loss_n), correct, count, int(self.first_bad)


@dataclass
class EvalResult:
    """An evaluation round's accuracies (full graph, no sampling), the same on every rank."""

    train_acc: float
    val_acc: float
    test_acc: float

    def as_dict(self) -> dict:
        return {"train_acc": self.train_acc, "val_acc": self.val_acc, "test_acc": self.test_acc}


@dataclass
class LoopStart:
    """Where a run's epochs begin: epoch 1 with no training time for a fresh run; for a
    resumed one the epoch after its checkpoint, the training time it had, and
    ``finished`` when it had already stopped (its target reached): no epoch is left."""

    first_epoch: int = 1
    train_time_s: float = 0.0
    callbacks: tuple = ()
    finished: bool = False


class Trainer:
    """What the loop trains: every system supplies one (``make_trainer(cfg, graph, env)``,
    named by its registry entry, :mod:`scalegnn.systems`). The defaults are those of a
    trainer whose sums and times are already the run's (ScaleGNN's engine: every rank
    holds the global sums); a data-parallel trainer reduces them over its ranks.

    Attributes: ``batch_size`` and ``steps_per_epoch`` (this rank's, for the record),
    ``device`` (the ``torch.device`` it trains on), ``graph_info`` (the record's
    ``graph``: what it trains on, :meth:`scalegnn.graph.Graph.record_info`), ``stage``
    (what it is doing now: an out-of-memory error names it)."""

    batch_size: int
    steps_per_epoch: int
    device = None
    graph_info: dict | None = None
    stage: str = "training"

    def record_fields(self) -> dict:
        """Fields of the record's skeleton that only this system has (ScaleGNN's
        ``compile_time_s``)."""
        return {}

    def begin(self, record: dict) -> LoopStart:
        """Where the epochs begin; ``record`` is the new record (a resumed run fills it
        from its checkpoint here). A checkpoint of another run is refused here: a user
        error, before the run's outcome is recorded."""
        return LoopStart()

    def train_epoch(self, epoch: int) -> EpochStats:
        raise NotImplementedError

    def evaluate(self) -> tuple[float, float, float]:
        raise NotImplementedError

    def reduce(self, stats: EpochStats) -> EpochStats:
        """The epoch's sums over the run's ranks (default: they already are)."""
        return stats

    def slowest(self, seconds: float) -> float:
        """The slowest rank's ``seconds`` (default: this rank's)."""
        return seconds

    def record_extra(self) -> dict:
        """Fields added to the record when the run ends (``preprocess_s``, ScaleGNN's
        checkpoint summary)."""
        return {}

    def rank_fields(self) -> dict:
        """This rank's own measurements ``{name: value}``, gathered over the ranks when the
        run ends into the record's ``{name}_per_rank`` lists in rank order
        (:func:`scalegnn.records.per_rank_fields`; ScaleGNN's load time, RSS after
        loading and time to the first step)."""
        return {}

    def end(self, record: dict) -> None:
        """The epochs are done (the loop returned, on every rank): keep what the run made
        (ScaleGNN's consolidated model with ``--save-model``), before the record is closed."""

    def close(self) -> None:
        """The run is over, however it ended: stop threads, release what is held."""


def epoch_row(epoch: int, train_time_s: float, stats: EpochStats) -> EpochRow:
    """The record's row of an epoch (:func:`scalegnn.records.new_epoch_row`), before evaluation."""
    return new_epoch_row(epoch, train_time_s, stats.loss_sum / max(stats.loss_n, 1),
                         stats.correct / stats.count if stats.count else None, stats.components, stats.comm_bytes,
                         comm_calls=stats.comm_calls, **stats.extra)


def reached_target(row: dict, target: float | None) -> bool:
    return target is not None and (row.get("test_acc") or 0.0) >= target


class Callback:
    """Told when the epochs start and about every finished epoch; :meth:`on_epoch_end`
    returns True to stop the run."""

    def on_start(self, epochs: int) -> None:
        """Before the first step (of this attempt: a resumed run starts at its next
        epoch); ``epochs``: the run's last epoch."""

    def on_epoch_end(self, row: dict) -> bool | None:
        return None

    def close(self) -> None:
        """The loop ended (normally or not)."""


class BestValidation(Callback):
    """The weights of the best validation epoch so far (the record summary's model
    selection: the highest ``val_acc``, the earliest on ties), taken by ``snapshot()``
    when an evaluation beats the best: ``kept`` is (epoch, what it returned). A resumed
    run starts from the best of the epochs it continues (``record``'s), whose weights it
    does not have: it keeps weights only when it does better."""

    def __init__(self, snapshot, record: dict):
        self.snapshot = snapshot
        self.best_val = max((r["val_acc"] for r in record["epochs"] if r.get("val_acc") is not None),
                            default=float("-inf"))
        self.kept: tuple[int, dict] | None = None

    def on_epoch_end(self, row: dict) -> None:
        if row.get("val_acc") is not None and row["val_acc"] > self.best_val:
            self.best_val = row["val_acc"]
            self.kept = (row["epoch"], self.snapshot())


class Progress(Callback):
    """The per-epoch report of rank 0 (:class:`scalegnn.progress.EpochLogger`: a bar on
    a terminal, one log line per epoch in a batch job)."""

    def __init__(self, system: str, dataset: str, cfg: LoopConfig, rank: int, **logger_kw):
        from .progress import EpochLogger, mode_from_progress

        self.logger = EpochLogger(system, dataset, cfg.epochs, rank, mode_from_progress(cfg.progress), **logger_kw)

    def on_epoch_end(self, row: dict) -> None:
        self.logger.epoch(row)

    def close(self) -> None:
        self.logger.close()


def train_epochs(cfg: LoopConfig, trainer: Trainer, record: dict, *, start: LoopStart | None = None,
                 callbacks=()) -> None:
    """Epochs ``start.first_epoch..cfg.epochs`` of ``trainer`` into ``record`` (see the
    module doc); the training time continues from ``start.train_time_s``. Callbacks are
    closed when the loop ends, however it ends."""
    start = start or LoopStart()
    train_time_s = start.train_time_s
    try:
        for cb in callbacks:
            cb.on_start(cfg.epochs)
        for epoch in range(start.first_epoch, cfg.epochs + 1):
            t0 = time.perf_counter()
            stats = trainer.train_epoch(epoch)
            seconds = stats.seconds if stats.seconds is not None else time.perf_counter() - t0
            stats = trainer.reduce(stats)
            train_time_s += trainer.slowest(seconds)
            row = epoch_row(epoch, train_time_s, stats)
            if not math.isfinite(row["loss"]):
                raise DivergedError(f"loss became {row['loss']} at epoch {epoch}")
            if epoch % cfg.eval_every == 0 or epoch == cfg.epochs:
                t1 = time.perf_counter()
                row.update(zip(("train_acc", "val_acc", "test_acc"), trainer.evaluate()))
                row["eval_time_s"] = trainer.slowest(time.perf_counter() - t1)
            record["epochs"].append(row)
            stop = [cb.on_epoch_end(row) for cb in callbacks]  # every callback sees the epoch
            if any(stop) or (cfg.stop_at_target and reached_target(row, cfg.target_acc)):
                break
    finally:
        for cb in callbacks:
            cb.close()
