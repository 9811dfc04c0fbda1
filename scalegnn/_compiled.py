"""The kernels of ``--compile`` (paper V-C): the layer tail's and the cross-entropy's
element-wise and reduction phases as torch functions for ``torch.compile``, the
dropout mask hashed inside the kernel that applies it.

Shape legend: B rows of the block, H its columns; C_d the classes of a logits block.
The phases sit between the collectives, which stay in the callers
(:class:`scalegnn.parallel.tail._LayerTail`, :mod:`scalegnn.parallel.losses`), so each
phase is one compiled function, a kernel or two on a device.

The layer tail (Eqs. 7-10, 29):

    sum_squares          s_i = sum_j x_ij^2                     (B,)   FP32 at least
    tail_forward         out = dropout(relu(x rinv g)) + res     (B, H) rinv = (s / H + eps)^-1/2
    tail_backward_stats  dot_i = sum_j u_ij x_ij, dg_j = sum_i dy_ij x_ij rinv_i
    tail_backward_input  dx = u rinv - x c,  c_i = rinv_i^3 dot_i / H   (dx = dy without norm)

with dy = dout / (1 - p) where the gradient passes (dropout keeps the entry and relu's
output is > 0), else 0, and u = dy g. What the eager kernels of
:mod:`scalegnn._elementwise` save between forward and backward (the (B, H) mask of
entries the gradient passes, 1 byte each) is recomputed here instead: the keep bit from
the hash's (B,) row and (H,) column terms (:func:`~scalegnn._elementwise.hash_terms`),
the relu bit from x, rinv and g, which the norm's backward reads anyway. So no (B, H)
int64 hash and no (B, H) mask is ever written to memory: inductor fuses the hash's
shifts, xors and multiplies into the element-wise loop (registers only). The mask has
the definition of :mod:`scalegnn._elementwise` (the same
:func:`~scalegnn._elementwise.keep_from_terms`) and so the same bits.

The cross-entropy over class-sharded logits (Eq. 12; the formulas of
:class:`scalegnn.parallel.losses._ParallelCrossEntropy`):

    ce_row_max     m_i = max_j o_ij                                          (B,)
    ce_row_terms   [S_i, o_i,y_i, lower_i, hit_i] given the all-reduced m    (B, 4)
    ce_totals      [sum_i mask_i loss_i, count, correct, total] (FP64)       (4,)
    finish_totals  L = loss sum / max(count * per_row, 1), count, accuracy counts
    ce_backward    dO = dL mask_i / count (softmax_ij - [j = y_i]), softmax recomputed from o, m, S

Run eager (:data:`EAGER`) they are the losses' only formulas; compiled, they give the
same values up to the order inductor gives the reductions' additions and its exp/log.

The scalars are arguments, so one compiled graph per phase serves every engine and
batch size in a process (``dynamic=True``): H, the threshold and the first class as
ints (symbolic sizes, passed to the kernel as is), eps and 1 - p as 0-d tensors on the
block's device (a Python float would be lifted into a fresh tensor at every call),
made once (:meth:`CompiledKernels.scalars`). A phase compiles one graph per
combination of the optional inputs it is called with (norm, gain, dropout, residual),
which the engine's warm-up runs before training
(:func:`scalegnn.parallel.tail.warm_up_compiled`).
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from ._elementwise import keep_from_terms, stats_dtype

__all__ = ["CompiledKernels", "EAGER"]


def _passes(x, r, g, row_terms, col_terms, thr):
    """Where the gradient passes (B, H): relu's output > 0 and, with dropout, kept."""
    y = x * r[:, None] if r is not None else x
    if g is not None:
        y = y * g
    ok = y > 0
    if row_terms is not None:
        ok = ok & keep_from_terms(row_terms, col_terms, thr)
    return ok


def _rinv(s, hidden, eps):
    return torch.rsqrt(s / hidden + eps)


def sum_squares(x):
    """(B,) sum of squares of each row, in stats dtype (FP32 for FP32 and BF16 blocks)."""
    return x.to(stats_dtype(x.dtype)).pow(2).sum(-1)


def tail_forward(x, s, g, row_terms, col_terms, res, hidden: int, eps, thr: int, den):
    """dropout(relu(x rinv g)) + res; ``s`` None: no norm; ``row_terms`` None: no dropout."""
    y = x
    if s is not None:
        y = y * _rinv(s, hidden, eps).to(x.dtype)[:, None]
        if g is not None:
            y = y * g
    y = torch.relu(y)
    if row_terms is not None:
        y = y * keep_from_terms(row_terms, col_terms, thr) / den
    if res is not None:
        y = y + res
    return y


def tail_backward_stats(dout, x, s, g, row_terms, col_terms, hidden: int, eps, thr: int, den, want_dg: bool):
    """(dot (B,), dg (H,) or None), the backward's local reductions in stats dtype."""
    rinv = _rinv(s, hidden, eps)
    r = rinv.to(x.dtype)
    dy = torch.where(_passes(x, r, g, row_terms, col_terms, thr), dout / den, 0.0)
    u = dy * g if g is not None else dy
    acc = stats_dtype(x.dtype)
    dot = (u.to(acc) * x.to(acc)).sum(-1)
    dg = (dy * x * r[:, None]).to(acc).sum(0) if want_dg else None
    return dot, dg


def tail_backward_input(dout, x, s, dot, g, row_terms, col_terms, hidden: int, eps, thr: int, den):
    """dx (B, H): u rinv - x c with norm (``dot`` all-reduced), dy without (``s`` None)."""
    rinv = _rinv(s, hidden, eps) if s is not None else None
    r = rinv.to(x.dtype) if rinv is not None else None
    dy = torch.where(_passes(x, r, g, row_terms, col_terms, thr), dout / den, 0.0)
    if rinv is None:
        return dy
    u = dy * g if g is not None else dy
    c = (rinv.pow(3) * dot / hidden).to(x.dtype)
    return u * r[:, None] - x * c[:, None]


# ----------------------------------------------------------------------------- cross-entropy
def ce_row_max(logits):
    """(B,) FP32 maximum logit of each row of a block with at least one class."""
    return logits.float().amax(-1)


def _targets(y, class_start: int, n_cls):
    """(column of y_i in this block clamped into it (B,), whether the block holds y_i (B,))."""
    has = (y >= class_start) & (y < class_start + n_cls) & (y >= 0)
    return (y - class_start).clamp(min=0).clamp(max=n_cls - 1), has


def ce_row_terms(logits, m, y, class_start: int):
    """(B, 4) FP32 [S_i = sum_j exp(o_ij - m_i), o_i,y_i (0 off this block), lower_i =
    #{j < y_i: o_ij = m_i}, hit_i = [o_i,y_i = m_i]]: what the class axis sums."""
    o = logits.float()
    n_cls = o.shape[1]
    col, has = _targets(y, class_start, n_cls)
    at_max = o == m[:, None]
    ids = torch.arange(class_start, class_start + n_cls, device=o.device)
    lower = (at_max & (ids[None, :] < y[:, None])).sum(-1)
    tgt = torch.where(has, o.gather(1, col[:, None]).squeeze(1), 0.0)
    hit = has & at_max.gather(1, col[:, None]).squeeze(1)
    s = torch.exp(o - m[:, None]).sum(-1)
    return torch.stack([s, tgt, lower.float(), hit.float()], 1)


def ce_totals(m, terms, y, mask):
    """(4,) FP64 [sum_i mask_i loss_i, count, correct, total] of the rows, loss_i =
    m_i + log S_i - o_i,y_i, the argmax right iff hit and no lower maximum."""
    keep = mask & (y >= 0)
    correct = keep & (terms[:, 3] > 0) & (terms[:, 2] == 0)
    row_loss = torch.where(mask, m + torch.log(terms[:, 0]) - terms[:, 1], 0.0)
    return torch.stack([row_loss.sum().double(), mask.sum().double(), correct.sum().double(),
                        keep.sum().double()])


def finish_totals(tot, per_row: int, dtype: torch.dtype):
    """(L in ``dtype``, count int64, accuracy counts FP64, denominator FP64) from the
    row-reduced totals [loss sum, count, *acc] (:func:`scalegnn.parallel.losses._row_totals`)."""
    denom = (tot[1] * per_row).clamp(min=1.0)
    return (tot[0] / denom).to(dtype), tot[1].to(torch.int64), tot[2:].clone(), denom


def ce_backward(logits, m, s, y, mask, class_start: int, dloss, denom):
    """dO (B, C_d) in the logits' dtype: dL mask_i / count (softmax_ij - [j = y_i])."""
    o = logits.float()
    n_cls = o.shape[1]
    col, has = _targets(y, class_start, n_cls)
    ids = torch.arange(n_cls, device=o.device)
    g = torch.exp(o - m[:, None]) / s[:, None] - ((ids[None, :] == col[:, None]) & has[:, None]).float()
    g = torch.where(mask[:, None], g * (dloss.float() / denom).to(g.dtype), 0.0)
    return g.to(logits.dtype)


def _detaching(fn):
    """``fn`` called with its tensor arguments detached. The phases run inside autograd
    Functions, where nothing is recorded anyway; detached, every call
    shows the compiled graph plain tensors: an RMSNorm gain is an ``nn.Parameter``,
    whose sizes Dynamo would guard as static (one graph per H_col), and a block that
    requires grad in training but not in evaluation would need a graph for each."""
    def call(*args):
        return fn(*(a.detach() if isinstance(a, torch.Tensor) else a for a in args))

    return call


_PHASES = (sum_squares, tail_forward, tail_backward_stats, tail_backward_input,
           ce_row_max, ce_row_terms, ce_totals, finish_totals, ce_backward)

# The phases run eager, under the names CompiledKernels gives them: the losses call the
# same functions with --compile off (the layer tail keeps its own eager kernels,
# scalegnn._elementwise, which save the mask instead of recomputing it).
EAGER = SimpleNamespace(**{f.__name__: f for f in _PHASES})


class CompiledKernels:
    """Every phase above, each ``torch.compile``-d with ``backend`` (``dynamic=True``:
    one graph for every B and H), under the phase's name. The functions are compiled
    once per process and backend and shared by every instance, so engines built one
    after another in a process (tests, sweeps run locally) reuse the graphs."""

    _compiled: dict[tuple, dict] = {}

    def __init__(self, backend: str = "inductor"):
        self.backend = backend
        # torch.compile itself is part of the key: where it is replaced (a test planting a
        # compiler that fails), the phases are wrapped by the replacement, not taken from before
        key = (backend, torch.compile)
        if key not in self._compiled:
            self._compiled[key] = {f.__name__: _detaching(torch.compile(f, dynamic=True, backend=backend))
                                   for f in _PHASES}
        for name, fn in self._compiled[key].items():
            setattr(self, name, fn)
        self._scalars: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def scalars(self, eps: float, den: float, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(eps, 1 - p) as 0-d tensors on x's device, eps in the statistics' dtype and
        1 - p in x's (the dtypes in which torch applies the Python scalars of the eager
        formulas), made once per value, device and dtype."""
        key = (eps, den, x.device, x.dtype)
        if key not in self._scalars:
            self._scalars[key] = (torch.tensor(eps, dtype=stats_dtype(x.dtype), device=x.device),
                                  torch.tensor(den, dtype=x.dtype, device=x.device))
        return self._scalars[key]

    def __repr__(self) -> str:
        return f"CompiledKernels(backend={self.backend!r})"
