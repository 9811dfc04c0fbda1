"""Accuracy as counts that add up across shards, ranks and steps before one division.

    accuracy_counts   (correct, total): argmax accuracy (single-label), or the
                      micro-F1 counts (multi-label), read on the host
    micro_f1_counts   [2TP, 2TP + FP + FN] at logit 0, an int64 device tensor

micro-F1 = 2TP / (2TP + FP + FN); accuracy = correct / total. The serial loop, the
baselines and the class-sharded loss and accuracy of :mod:`scalegnn.parallel.losses`
all count with these.
"""

from __future__ import annotations

import torch

__all__ = ["accuracy_counts", "micro_f1_counts"]


def micro_f1_counts(logits: torch.Tensor, y: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Multi-label: the micro-F1 numerator 2TP and denominator 2TP+FP+FN of ``logits``
    against the multi-hot ``y`` at a 0-logit threshold, over the rows of ``mask`` (all
    rows without one), as an int64 tensor on the logits' device. Counts, not the ratio:
    counts from several shards add up before dividing."""
    pred, truth = logits > 0, y > 0.5
    if mask is not None:
        pred, truth = pred & mask[:, None], truth & mask[:, None]
    tp = (pred & truth).sum()
    return torch.stack([2 * tp, 2 * tp + (pred & ~truth).sum() + (~pred & truth).sum()])


def accuracy_counts(logits: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """(correct, total) for single-label argmax accuracy; for multi-label,
    :func:`micro_f1_counts`."""
    if y.dim() == 2:
        two_tp, denom = micro_f1_counts(logits, y).tolist()
        return float(two_tp), float(denom)
    return float((logits.argmax(-1) == y).sum().item()), float(y.numel())
