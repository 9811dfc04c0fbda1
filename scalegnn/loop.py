"""The epoch loop every system trains with in this process: ScaleGNN and the baselines.

A *trainer* supplies the epochs; the loop times them, evaluates, builds the epoch
rows of the run record, reports and stops:

    trainer.train_epoch(epoch)  -> EpochStats   sums over the epoch's steps (and, when
                                                the trainer times itself, ``seconds``)
    trainer.evaluate()          -> (train, val, test) accuracies, the same on every rank

Per epoch: ``train_epoch``; the sums reduced over ranks where the trainer's are
local (``reduce``); training time added (the slowest rank's with ``slowest``;
evaluation excluded, paper VI-C); a loss that is not finite stops the run as
diverged; evaluation every ``eval_every`` epochs and after the last; the row
appended to ``record["epochs"]``; every callback's :meth:`Callback.on_epoch_end`;
the run stops at the target accuracy when asked, or when a callback says so.

Callbacks carry what differs between systems and callers: the progress log
(:class:`Progress`), ScaleGNN's epoch-end checkpoint and preemption, a benchmark's
per-epoch sampling.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from .metrics import accuracy_counts
from .records import EpochRow, new_epoch_row
from .settings import fraction, setting

__all__ = ["LoopConfig", "EpochStats", "Callback", "Progress", "DivergedError", "epoch_row", "train_epochs",
           "reached_target"]


class DivergedError(RuntimeError):
    """The training loss became NaN or infinite."""



@dataclass(kw_only=True)
class LoopConfig:
    """How long to train, when to evaluate and stop, where the record goes."""

    epochs: int = setting(100, help="training epochs (ScaleGNN: ceil(N/B)/Gd steps each; a baseline: one pass "
                          "over its training vertices)")
    eval_every: int = setting(1, help="full evaluation every K epochs (and after the last)")
    target_acc: float | None = setting(None, type=fraction,
                                       help="target test accuracy for time-to-accuracy (fraction, e.g. 0.92)")
    stop_at_target: bool = setting(False, action="store_true", help="stop once --target-acc is reached")
    out_dir: str = setting("results/runs", flag="--out", output=True, help="folder for the run record")
    progress: bool | None = setting(None, flag="--quiet", action="store_const", const=False,
                                    help="no progress bar (a batch log keeps its one line per epoch); "
                                    "default: a bar only on a terminal")

    def __post_init__(self):
        if self.epochs < 1:
            raise ValueError(f"epochs must be >= 1, got {self.epochs}")
        if self.eval_every < 1:
            raise ValueError(f"eval_every must be >= 1, got {self.eval_every}")
        if self.target_acc is not None and not 0.0 < self.target_acc <= 1.0:
            raise ValueError(f"target_acc is a fraction in (0, 1], got {self.target_acc}")


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


def train_epochs(cfg: LoopConfig, trainer, record: dict, *, first_epoch: int = 1, train_time_s: float = 0.0,
                 callbacks=(), reduce=None, slowest=None) -> None:
    """Epochs ``first_epoch..cfg.epochs`` of ``trainer`` into ``record`` (see the module doc).

    ``reduce(stats) -> stats`` sums a rank's epoch over the ranks (baselines: local
    sums); ``slowest(seconds) -> seconds`` the slowest rank's time (training and
    evaluation). Both default to this rank's own (ScaleGNN's engine: every rank
    holds the global sums). Callbacks are closed when the loop ends, however it ends."""
    try:
        for cb in callbacks:
            cb.on_start(cfg.epochs)
        for epoch in range(first_epoch, cfg.epochs + 1):
            t0 = time.perf_counter()
            stats = trainer.train_epoch(epoch)
            seconds = stats.seconds if stats.seconds is not None else time.perf_counter() - t0
            if reduce is not None:
                stats = reduce(stats)
            train_time_s += slowest(seconds) if slowest is not None else seconds
            row = epoch_row(epoch, train_time_s, stats)
            if not math.isfinite(row["loss"]):
                raise DivergedError(f"loss became {row['loss']} at epoch {epoch}")
            if epoch % cfg.eval_every == 0 or epoch == cfg.epochs:
                t1 = time.perf_counter()
                row.update(zip(("train_acc", "val_acc", "test_acc"), trainer.evaluate()))
                eval_s = time.perf_counter() - t1
                row["eval_time_s"] = slowest(eval_s) if slowest is not None else eval_s
            record["epochs"].append(row)
            stop = [cb.on_epoch_end(row) for cb in callbacks]  # every callback sees the epoch
            if any(stop) or (cfg.stop_at_target and reached_target(row, cfg.target_acc)):
                break
    finally:
        for cb in callbacks:
            cb.close()
