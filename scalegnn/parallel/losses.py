"""Losses and accuracy over class-sharded logits (paper Eq. 12).

Shape legend (per rank): Br_a rows of the logits' row block along the row axis a,
C_d classes along the class axis d, C all classes; ``y`` (Br_a,) global class ids
(single-label) or (Br_a, C_d) the multi-hot block (multi-label); ``mask`` (Br_a,) the
rows whose loss counts; o the logits in FP32.

    parallel_cross_entropy    L = sum_{i in mask} (m_i + log S_i - o_i,y_i) / count
    parallel_bce              L = sum_{i in mask, j} bce(o_ij, y_ij) / (count C)
    parallel_argmax           the global argmax class of each row
    parallel_accuracy_counts  (correct, total) per row mask, for the evaluation

Each loss reduces over the class axis what its rows need, then both end alike
(:func:`_row_totals`): one FP64 all-reduce over the row axis of [loss sum, count,
accuracy counts], L divided by the count clamped to 1 (L = 0 with zero gradient when
no row counts, without the host reading the count), the count and the batch's
accuracy counts (:mod:`scalegnn.metrics`) returned beside L without a gradient.

Gradients, under the package's convention (:mod:`scalegnn.parallel`): every class
replica computes the same row losses from the reduced values (they are consumed
identically), so each local gradient block is complete without an all-reduce.
"""

from __future__ import annotations

import torch

from .._compiled import EAGER
from ..metrics import micro_f1_counts
from .context import ParallelContext
from .grid import ProcessGrid

__all__ = ["parallel_cross_entropy", "parallel_bce", "parallel_argmax", "parallel_accuracy_counts", "warm_up_compiled"]


def _row_totals(ctx, loss_sum: torch.Tensor, mask: torch.Tensor, acc: torch.Tensor, pc: ParallelContext,
                row_axis: str, per_row: int, dtype: torch.dtype):
    """The end of both losses' forward: one FP64 AR over the row axis of
    [loss sum, count, *acc], count = sum_i mask_i, then

        L = loss sum / max(count * per_row, 1)       (0 when no row counts)

    ``loss_sum`` and ``acc`` this rank's rows' (already summed over the class axis);
    ``per_row`` the loss terms a row adds (1, or C for the BCE). Returns L in ``dtype``,
    the count (int64), the accuracy counts (float64), both marked non-differentiable on
    ``ctx``, and the FP64 denominator for the backward. Nothing is read by the host."""
    tot = torch.cat([loss_sum.double().reshape(1), mask.sum().double().reshape(1), acc.double()])
    return _finish_totals(ctx, _kernels(pc), tot, pc, row_axis, per_row, dtype)


def _kernels(pc: ParallelContext):
    """The loss's phases (:mod:`scalegnn._compiled`): ``pc.fused``'s compiled ones, or the
    same functions run eager."""
    return pc.fused if pc.fused is not None else EAGER


def _finish_totals(ctx, kern, tot: torch.Tensor, pc: ParallelContext, row_axis: str, per_row: int,
                   dtype: torch.dtype):
    """:func:`_row_totals` from this rank's FP64 [loss sum, count, *acc]: the row axis'
    all-reduce, then L, count, acc and the denominator (``kern.finish_totals``)."""
    pc.reduce(tot, row_axis, "loss")
    loss, count, acc, denom = kern.finish_totals(tot, per_row, dtype)
    ctx.mark_non_differentiable(count, acc)
    return loss, count, acc, denom


class _ParallelCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy over labeled rows with class-sharded logits (Eq. 12), and the
    argmax accuracy counts of the same logits, in three collectives.

    Per row i (FP32): m = AR_max,d(max_j o_ij), then one AR_d of four columns:
    S = sum_j exp(o_ij - m), o_target = o_i,y_i (on the rank that holds class y_i),
    lower = #{j < y_i: o_ij = m} and hit = [o_i,y_i = m] (class counts, exact in FP32);
    loss_i = m + log S - o_target. The argmax (first maximum, as torch.argmax) is y_i
    iff hit and lower = 0: the prediction is right without an argmax collective.
    One AR_a (a: the row axis) of [sum_i mask_i loss_i, sum_i mask_i, correct, total]
    (FP64) gives L = loss sum / count and the accuracy counts over ``mask & y >= 0``.

    Backward: dO_ij = dL * mask_i / count * (softmax_ij - [j == y_i]). No all-reduce:
    every class replica computes the same row losses (the reductions are consumed
    identically), so the local gradient block is already complete.

    The count stays on the device (never read by the host): with no labeled row,
    L = 0 and dO = 0 follow from dividing by max(count, 1) and masking.

    The phases between the collectives are those of :mod:`scalegnn._compiled`,
    ``torch.compile``-d with ``pc.fused`` and eager otherwise; the backward recomputes
    the softmax from the logits, m and S instead of saving it. A rank that holds no
    classes contributes the identity of each class-axis reduction (m = -inf, zero
    terms) and runs the rest eager.
    """

    @staticmethod
    def forward(ctx, logits, y, mask, pc: ParallelContext, row_axis: str, class_axis: str, class_start: int):
        n_rows, n_cls = logits.shape
        kern = ctx.kern = _kernels(pc) if n_cls else EAGER
        if n_cls:
            m = kern.ce_row_max(logits)
        else:
            m = logits.new_full((n_rows,), float("-inf"), dtype=torch.float32)
        pc.reduce(m, class_axis, "loss", op="max")
        # One FP32 all-reduce: sum-exp, target logit, and the two argmax counts.
        terms = kern.ce_row_terms(logits, m, y, class_start) if n_cls else m.new_zeros(n_rows, 4)
        pc.reduce(terms, class_axis, "loss")
        loss, count, acc, denom = _finish_totals(ctx, kern, kern.ce_totals(m, terms, y, mask), pc, row_axis, 1,
                                                 logits.dtype)
        ctx.save_for_backward(logits, m, terms[:, 0], y, mask, denom)
        ctx.class_start = class_start
        return loss, count, acc

    @staticmethod
    def backward(ctx, dloss, _dcount, _dacc):
        logits, m, s, y, mask, denom = ctx.saved_tensors
        return ctx.kern.ce_backward(logits, m, s, y, mask, ctx.class_start, dloss, denom), \
            None, None, None, None, None, None


def parallel_cross_entropy(logits: torch.Tensor, y: torch.Tensor, mask: torch.Tensor, pc: ParallelContext,
                           row_axis: str, class_axis: str, class_start: int, accuracy: bool = False):
    """Global mean CE; ``logits`` (Br_a, C_d) on (a, d), ``y`` (Br_a,) global class ids,
    ``mask`` (Br_a,) rows whose loss counts; ``class_start`` the first class of C_d.
    Returns (loss, count): the same scalars on every rank of the data-parallel group;
    count is the number of rows that counted (loss is 0 with zero gradient if none).
    ``accuracy``: (loss, count, acc) with acc the float64 [correct, total] of
    :func:`parallel_accuracy_counts` for ``[mask]``, from the same collectives."""
    loss, count, acc = _ParallelCrossEntropy.apply(logits, y, mask, pc, row_axis, class_axis, class_start)
    return (loss, count, acc) if accuracy else (loss, count)


class _ParallelBCE(torch.autograd.Function):
    """Mean BCE-with-logits over labeled rows x all C classes, class-sharded, and the
    micro-F1 counts of the same logits (as :func:`parallel_accuracy_counts`).

    L = AR_a(AR_d(sum_{i in mask, j} bce(o_ij, y_ij))) / (AR_a(count) * C);
    dO_ij = dL * mask_i (sigmoid(o_ij) - y_ij) / (count * C): local and complete.
    The loss sum travels with 2TP and 2TP + FP + FN in one FP64 AR_d, and with the
    row count and those in one FP64 AR_a: two collectives for loss and accuracy.
    As in the cross-entropy, the count is never read by the host (L = 0 without rows).
    """

    @staticmethod
    def forward(ctx, logits, y, mask, pc: ParallelContext, row_axis: str, class_axis: str, num_classes: int):
        o = logits.float()
        per = torch.nn.functional.binary_cross_entropy_with_logits(o, y.float(), reduction="none")
        local = torch.cat([(per * mask[:, None]).sum().reshape(1).double(),
                           micro_f1_counts(logits, y, mask).double()])
        pc.reduce(local, class_axis, "loss")
        loss, count, acc, denom = _row_totals(ctx, local[0], mask, local[1:], pc, row_axis, num_classes, logits.dtype)
        ctx.save_for_backward(o, y, mask, denom)
        ctx.dtype = logits.dtype
        return loss, count, acc

    @staticmethod
    def backward(ctx, dloss, _dcount, _dacc):
        o, y, mask, denom = ctx.saved_tensors
        g = (torch.sigmoid(o) - y.float()) * (dloss.float() / denom).float()
        g = torch.where(mask[:, None], g, 0.0)
        return g.to(ctx.dtype), None, None, None, None, None, None


def parallel_bce(logits: torch.Tensor, y: torch.Tensor, mask: torch.Tensor, pc: ParallelContext, row_axis: str,
                 class_axis: str, num_classes: int, accuracy: bool = False):
    """Global mean BCE-with-logits; ``y`` (Br_a, C_d) the multi-hot block of the logits.
    Returns (loss, count of rows that counted), as :func:`parallel_cross_entropy`;
    ``accuracy``: (loss, count, acc), acc the micro-F1 [2TP, 2TP + FP + FN] (float64)."""
    loss, count, acc = _ParallelBCE.apply(logits, y, mask, pc, row_axis, class_axis, num_classes)
    return (loss, count, acc) if accuracy else (loss, count)


@torch.no_grad()
def parallel_argmax(logits: torch.Tensor, pc: ParallelContext, class_axis: str, class_start: int) -> torch.Tensor:
    """Global argmax class per row of class-sharded logits (first maximum, as torch.argmax)."""
    o = logits.float()
    n_rows, n_cls = o.shape
    m = o.max(-1).values if n_cls else o.new_full((n_rows,), float("-inf"))
    gmax = pc.reduce(m.clone(), class_axis, "loss", op="max")
    big = torch.iinfo(torch.int64).max
    if n_cls:
        hit = o == gmax[:, None]
        ids = torch.arange(class_start, class_start + n_cls, device=o.device).expand(n_rows, n_cls)
        idx = torch.where(hit, ids, torch.full_like(ids, big)).min(-1).values
    else:
        idx = torch.full((n_rows,), big, dtype=torch.int64, device=o.device)
    return pc.reduce(idx, class_axis, "loss", op="min")


@torch.no_grad()
def parallel_accuracy_counts(logits: torch.Tensor, y: torch.Tensor, masks: list[torch.Tensor],
                             pc: ParallelContext, row_axis: str, class_axis: str, class_start: int,
                             multilabel: bool, kind: str = "loss") -> torch.Tensor:
    """(correct, total) per row mask, summed over the data-parallel group's ranks:
    a float64 tensor ``[correct_0, total_0, correct_1, total_1, ...]`` on the logits'
    device (the caller decides when the host reads it).

    Single-label: argmax accuracy over rows with ``mask & y >= 0``. Multi-label: the
    micro-F1 numerator 2TP and denominator 2TP+FP+FN at logit 0 (as
    :func:`scalegnn.metrics.micro_f1_counts`), summed over the class and row axes.
    """
    if multilabel:
        out = torch.cat([micro_f1_counts(logits, y, mk) for mk in masks]).to(torch.float64)
        pc.reduce(out, class_axis, kind)
    else:
        pred = parallel_argmax(logits, pc, class_axis, class_start)
        vals = []
        for mk in masks:
            keep = mk & (y >= 0)
            vals += [((pred == y) & keep).sum(), keep.sum()]
        out = torch.stack(vals).to(torch.float64)
    pc.reduce(out, row_axis, kind)
    return out


def warm_up_compiled(pc: ParallelContext, multilabel: bool, num_classes: int, class_start: int,
                     device: torch.device, dtype: torch.dtype) -> None:
    """Compile ``pc.fused``'s loss phases as training calls them (forward and backward
    of the run's loss, its first class and class count: the ints a graph would
    otherwise specialize on), before training, on a small block."""
    single = ParallelContext(ProcessGrid.single(), fused=pc.fused)
    rows, cols = 11, 5
    logits = torch.randn(rows, cols, device=device, dtype=dtype, requires_grad=True)
    mask = torch.arange(rows, device=device) % 2 == 0
    if multilabel:
        y = torch.arange(rows * cols, device=device).view(rows, cols) % 3 == 0
        loss = parallel_bce(logits * 1, y.to(dtype), mask, single, "x", "y", num_classes)[0]
    else:
        y = class_start + torch.arange(rows, device=device) % cols
        loss = parallel_cross_entropy(logits * 1, y, mask, single, "x", "y", class_start)[0]
    loss.backward()
