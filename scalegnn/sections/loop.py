"""The ``loop`` section: how long to train, when to evaluate and stop, where the record
goes (read by :mod:`scalegnn.loop`)."""

from __future__ import annotations

from dataclasses import dataclass

from ..settings import fraction, setting

__all__ = ["LoopConfig"]


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
    # The Python API turns it on (scalegnn.train's result.model); a sweep's hundreds of runs need no model each.
    # Every system's flag: DistDGL, whose model lives in its own DGL processes, writes none.
    save_model: bool = setting(False, action="store_true",
                               help="write the trained model (ScaleGNN's consolidated from the ranks) into one file "
                               "beside the record, the last epoch's and the best validation epoch's (<out>/<run "
                               "id>.model.pt, .best.model.pt; load them with scalegnn.load_model); DistDGL saves "
                               "none")
    progress: bool | None = setting(None, flag="--quiet", action="store_const", const=False,
                                    help="no progress at all (no bar, no epoch or phase lines; warnings and errors "
                                    "still show); default: a bar on a terminal, log lines elsewhere (a batch log)")
    # rare: a batch log's epoch lines and this heartbeat suit runs from seconds to hours per epoch as they are
    heartbeat_s: float = setting(60.0, flag="--heartbeat", scope="scalegnn", rare=True, metavar="S",
                                 help="in a batch log, a line inside a long epoch every S seconds (step, throughput, "
                                 "ETA); 0: none")

    def __post_init__(self):
        if self.epochs < 1:
            raise ValueError(f"epochs must be >= 1, got {self.epochs}")
        if self.eval_every < 1:
            raise ValueError(f"eval_every must be >= 1, got {self.eval_every}")
        if not self.heartbeat_s >= 0:  # also NaN
            raise ValueError(f"--heartbeat is seconds >= 0 (0: none), got {self.heartbeat_s}")
        if self.target_acc is not None and not 0.0 < self.target_acc <= 1.0:
            raise ValueError(f"target_acc is a fraction in (0, 1], got {self.target_acc}")
