"""What an engine step and an evaluation round return, and the optimizer they share.

The training loop (:mod:`scalegnn.trainer`) drives the engine
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
wait for the host inside an epoch; the loop reads the sums once at its end.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .optim import SPARSE_INPUT_UPDATE, RowSparseAdamW
from .settings import setting

__all__ = ["OptimConfig", "StepResult", "EpochSums", "EvalResult", "make_optimizer"]


@dataclass(kw_only=True)
class OptimConfig:
    """AdamW with an optional cosine schedule and global-norm gradient clipping."""

    lr: float = setting(1e-3, help="learning rate (AdamW; the baselines' Adam)")
    # not rare: every system reads it, and a tuning sweep sets it beside --lr and --dropout
    weight_decay: float = setting(0.0, help="weight decay")
    # rare: no spec of sweeps/specs changes the schedule or clips; these are for a run that needs them
    schedule: str = setting("constant", scope="scalegnn", rare=True, choices=("constant", "cosine"),
                            help="learning-rate schedule: constant, or cosine decay to 0 over the run")
    grad_clip: float | None = setting(None, scope="scalegnn", rare=True,
                                      help="clip the global gradient L2 norm to this value")
    # Default off, from the evidence (Facebook, ratio 0.1, 100 epochs, seeds 0-2): test accuracy at the best
    # validation epoch 0.9406 +- 0.0053 on vs 0.9430 +- 0.0046 off (lower on every seed, by 0.1-0.3 points;
    # final test 0.9425 vs 0.9420), while the fused AdamW already makes the whole optimizer ~1.4 % of an epoch
    # and the row-sparse path saves ~0.3 ms of a ~70 ms step (epoch ratio on/off 0.98, within noise). It pays
    # where the input is much wider than what a batch touches; there, say auto or on. rare: for such inputs only.
    sparse_input_update: str = setting(
        "off", scope="scalegnn", rare=True, choices=SPARSE_INPUT_UPDATE,
        help="with sparse (CSR) features, compute the input weight's gradient and AdamW update only on the rows of "
             "the features present in the batch (lazy AdamW: an untouched row keeps its moments and skips the "
             "momentum step; weight decay stays exact on every row): on, off (dense AdamW on every row, the "
             "default), or auto (on with sparse features on the CPU with the compiled kernel)")

    def __post_init__(self):
        if self.lr <= 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay}")
        if self.schedule not in ("constant", "cosine"):
            raise ValueError(f"schedule must be 'constant' or 'cosine', got {self.schedule!r}")
        if self.grad_clip is not None and self.grad_clip <= 0:
            raise ValueError(f"grad_clip must be > 0 or None, got {self.grad_clip}")
        if self.sparse_input_update not in SPARSE_INPUT_UPDATE:
            raise ValueError(f"sparse_input_update must be one of {', '.join(SPARSE_INPUT_UPDATE)}, "
                             f"got {self.sparse_input_update!r}")


@dataclass
class StepResult:
    """One step, as a float64 device tensor ``stats`` = [loss, learned, correct, count]:
    the loss (mean over the batch's labeled training vertices, averaged over the
    data-parallel groups that had one; 0 when none had), ``learned`` 1 if the step
    updated the weights (some group had a labeled vertex) else 0, and the batch's
    training-accuracy counts. The properties read it on the host (tests, tools);
    the loop adds it up with :class:`EpochSums` instead."""

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
    train_acc: float
    val_acc: float
    test_acc: float

    def as_dict(self) -> dict:
        return {"train_acc": self.train_acc, "val_acc": self.val_acc, "test_acc": self.test_acc}


def make_optimizer(params, cfg: OptimConfig, total_steps: int, row_sparse: bool = False):
    """Fused AdamW (one kernel over all parameters, on CPU and GPU alike; it also takes
    the device-side ``found_inf`` skip the engine uses) and the LR schedule, a
    function of the step index. ``row_sparse``: some parameter receives row-sparse
    (sparse COO) gradients, which :class:`scalegnn.optim.RowSparseAdamW` updates
    lazily while the others keep the fused AdamW; without it, plain fused AdamW."""
    kind = RowSparseAdamW if row_sparse else torch.optim.AdamW
    opt = kind(params, lr=cfg.lr, weight_decay=cfg.weight_decay, fused=True)
    if cfg.schedule == "cosine":
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: 0.5 * (1 + math.cos(math.pi * min(s, total_steps) / max(total_steps, 1)))
        )
    else:
        sched = None
    return opt, sched

