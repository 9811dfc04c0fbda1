"""The element-wise tail of a layer on a sharded block (paper Eqs. 7-10, 29; V-C).

Shape legend (per rank): Br_row batch rows of the block along the row axis, H_col its
hidden columns along the column axis, H the whole hidden dimension; g (H_col,) the
block's slice of the RMSNorm gain.

    s    = AR_col(sum_j z_j^2)                      FP32 at least      (Eq. 29)
    out  = dropout(relu(z (s / H + eps)^-1/2 g)) + res                  (Eqs. 7-10)

    layer_tail         one autograd node, its element-wise work in kernels between the
                       collectives: those of :mod:`scalegnn._elementwise` (numba on the
                       CPU, torch elsewhere), or with ``pc.fused`` (``--compile``, V-C) the
                       ``torch.compile``-d phases of :mod:`scalegnn._compiled`, the
                       dropout mask hashed inside them: what the model runs
    warm_up_compiled   compiles those phases for every way a run calls them, before it
    parallel_rms_norm  RMSNorm alone, unfused: the pre-norm of a layer's input, and the
                       reference the tail is tested against

Gradients, under the package's convention (:mod:`scalegnn.parallel`): each replica
along the column axis uses s for its own columns, so the backward all-reduces its row
sums over the column axis; g is replicated along the row axis, whose members hold
different rows, so dg is summed over the row axis (or left partial for the deferred
reduction of :class:`~scalegnn.parallel.context.ParallelContext`).
"""

from __future__ import annotations

import torch
from torch import nn

from .._elementwise import (DropoutBlock, hash_terms, row_sum_squares, tail_backward_input, tail_backward_stats,
                            tail_forward, threshold)
from ..functional import rms_norm
from .context import ParallelContext
from .grid import ProcessGrid

__all__ = ["parallel_rms_norm", "layer_tail", "warm_up_compiled"]


# ------------------------------------------------------------------------------ RMSNorm
class _ParallelRMSNorm(torch.autograd.Function):
    """y = x * rinv * g with rinv = (s / H + eps)^-1/2, s = sum over ALL H columns of x^2
    (Eq. 29: FP32 local sums all-reduced over the column axis).

    Backward, per row, with u_j = g_j dy_j:
        dx_j = rinv * u_j - x_j * rinv^3 / H * sum_k u_k x_k     (sum over all columns:
               each replica along the column axis holds one block -> all-reduce, FP32)
        dg_j = sum_rows dy_j x_j rinv                             (g is replicated along the
               row axis and the rows differ there -> all-reduce over the row axis)
    """

    @staticmethod
    def forward(ctx, x, weight, pc: ParallelContext, col_axis: str, row_axis: str, hidden: int, eps: float):
        sum_sq = x.float().pow(2).sum(-1, keepdim=True)
        pc.reduce(sum_sq, col_axis, "norm")
        y = rms_norm(x, weight, eps, sum_sq=sum_sq, dim=hidden)
        rinv = torch.rsqrt(sum_sq / hidden + eps)  # (Br, 1) FP32
        ctx.save_for_backward(x, weight, rinv)
        ctx.pc, ctx.col_axis, ctx.row_axis, ctx.hidden = pc, col_axis, row_axis, hidden
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, rinv = ctx.saved_tensors
        pc = ctx.pc
        grad_x = grad_w = None
        r = rinv.to(x.dtype)
        if ctx.needs_input_grad[0]:
            u = dy * weight if weight is not None else dy
            dot = (u.float() * x.float()).sum(-1, keepdim=True)
            pc.reduce(dot, ctx.col_axis, "norm")
            grad_x = u * r - x * (rinv.pow(3) * dot / ctx.hidden).to(x.dtype)
        if weight is not None and ctx.needs_input_grad[1]:
            grad_w = (dy * x * r).sum(0).contiguous()
            if not pc.defer_norm_grads:  # deferred: partial, the weight's hook reduces it (bucketed)
                grad_w = pc.reduce(grad_w, ctx.row_axis, "norm")
        return grad_x, grad_w, None, None, None, None, None


def parallel_rms_norm(x: torch.Tensor, weight: torch.Tensor | None, pc: ParallelContext, col_axis: str,
                      row_axis: str, hidden: int, eps: float) -> torch.Tensor:
    """RMSNorm of ``x`` (Br_row, H_col) on (row_axis, col_axis); ``weight`` (H_col,) its slice of g.

    The unfused operator: the model's pre-norm (``--norm-position pre``, on a layer's
    input), and the reference the fused tail is tested and benchmarked against
    (``benchmarks/elementwise.py``)."""
    return _ParallelRMSNorm.apply(x, weight, pc, col_axis, row_axis, hidden, eps)


class _LayerTail(torch.autograd.Function):
    """out = dropout(relu(rmsnorm(x))) + res in one custom Function (Eqs. 7-10): the
    element-wise work in kernels, the reductions across ranks here, between them.

    Forward: s = AR_col(sum_j x_j^2) (Eq. 29, FP32 at least), rinv = (s / H + eps)^-1/2,
    one pass writes out. Backward, with dy = dout / (1 - p) where the gradient passes
    (dropout keeps the entry and relu's output is > 0), else 0, and u = dy * g (as
    :class:`_ParallelRMSNorm`):
        dot = AR_col(sum_j u_j x_j)        (each column replica holds one block)
        dx  = u * rinv - x * rinv^3 * dot / H
        dg  = AR_row(sum_rows dy x rinv)   (g replicated along the row axis, rows differ; with
                                            ``pc.defer_norm_grads`` left partial for g's hook)
        dres = dout
    Without norm: dx = dy and no collective.

    The kernels: those of :mod:`scalegnn._elementwise` (numba on the CPU, torch
    elsewhere; forward also writes the mask of entries the gradient passes, 1 byte
    each, for the backward), or with ``pc.fused`` the compiled phases of
    :class:`~scalegnn._compiled.CompiledKernels` (V-C), which save nothing (B, H)
    beyond x and recompute the mask from the hash's row and column terms.
    """

    @staticmethod
    def forward(ctx, x, weight, res, pc: ParallelContext, col_axis: str, row_axis: str, hidden: int, eps: float,
                norm: bool, drop: DropoutBlock | None, save: bool):
        ctx.pc, ctx.col_axis, ctx.row_axis, ctx.hidden, ctx.eps = pc, col_axis, row_axis, hidden, eps
        ctx.den = drop.den if drop is not None else 1.0
        ctx.kern = pc.fused  # the backward runs the same kernels' phases as the forward
        if pc.fused is not None:
            return _LayerTail._compiled_forward(ctx, pc.fused, x, weight, res, norm, drop, save)
        rinv = r = None
        if norm:
            s = row_sum_squares(x)
            pc.reduce(s, col_axis, "norm")
            rinv = torch.rsqrt(s / hidden + eps)  # (Br,) in stats_dtype, as _ParallelRMSNorm's
            r = rinv.to(x.dtype)
        out, pas = tail_forward(x, r, weight, drop, res, save)
        if save:  # x only for the norm's backward (without norm, dx needs the mask alone)
            ctx.save_for_backward(x if norm else None, weight, rinv, pas)
        return out

    @staticmethod
    def _compiled_forward(ctx, kern, x, weight, res, norm, drop, save):
        s = None
        if norm:
            s = kern.sum_squares(x)
            ctx.pc.reduce(s, ctx.col_axis, "norm")
        row_terms, col_terms = hash_terms(drop.key, drop.rows, drop.cols) if drop is not None else (None, None)
        ctx.thr = threshold(drop.p) if drop is not None else 0
        ctx.tensor_scalars = kern.scalars(ctx.eps, ctx.den, x)
        eps, den = ctx.tensor_scalars
        out = kern.tail_forward(x, s, weight, row_terms, col_terms, res, ctx.hidden, eps, ctx.thr, den)
        if save:  # x for the relu bit (and the norm's backward), the hash's terms for the keep bit
            ctx.save_for_backward(x, weight, s, row_terms, col_terms)
        return out

    @staticmethod
    def backward(ctx, dout):
        dout = dout.contiguous()
        if ctx.kern is not None:
            grad_x, grad_w = _LayerTail._compiled_backward(ctx, ctx.kern, dout)
        else:
            grad_x, grad_w = _LayerTail._eager_backward(ctx, dout)
        grad_res = dout if ctx.needs_input_grad[2] else None
        return grad_x, grad_w, grad_res, None, None, None, None, None, None, None, None

    @staticmethod
    def _reduce_dg(ctx, grad_w, weight):
        grad_w = grad_w.to(weight.dtype).contiguous()
        if not ctx.pc.defer_norm_grads:  # deferred: partial, the weight's hook reduces it (bucketed)
            grad_w = ctx.pc.reduce(grad_w, ctx.row_axis, "norm")
        return grad_w

    @staticmethod
    def _eager_backward(ctx, dout):
        x, weight, rinv, pas = ctx.saved_tensors
        grad_x = grad_w = c = r = None
        want_dg = weight is not None and ctx.needs_input_grad[1]
        if rinv is not None and (ctx.needs_input_grad[0] or want_dg):
            r = rinv.to(x.dtype)
            dot, grad_w = tail_backward_stats(dout, x, r, weight, pas, ctx.den, want_dg)
            if ctx.needs_input_grad[0]:
                ctx.pc.reduce(dot, ctx.col_axis, "norm")
                c = (rinv.pow(3) * dot / ctx.hidden).to(x.dtype)
            if want_dg:
                grad_w = _LayerTail._reduce_dg(ctx, grad_w, weight)
        if ctx.needs_input_grad[0]:
            grad_x = tail_backward_input(dout, x, r, c, weight, pas, ctx.den)
        return grad_x, grad_w

    @staticmethod
    def _compiled_backward(ctx, kern, dout):
        x, weight, s, row_terms, col_terms = ctx.saved_tensors
        grad_x = grad_w = dot = None
        want_dg = weight is not None and ctx.needs_input_grad[1]
        eps, den = ctx.tensor_scalars
        scalars = (ctx.hidden, eps, ctx.thr, den)
        if s is not None and (ctx.needs_input_grad[0] or want_dg):
            dot, grad_w = kern.tail_backward_stats(dout, x, s, weight, row_terms, col_terms, *scalars, want_dg)
            if ctx.needs_input_grad[0]:
                ctx.pc.reduce(dot, ctx.col_axis, "norm")
            if want_dg:
                grad_w = _LayerTail._reduce_dg(ctx, grad_w, weight)
        if ctx.needs_input_grad[0]:
            grad_x = kern.tail_backward_input(dout, x, s, dot, weight, row_terms, col_terms, *scalars)
        return grad_x, grad_w


def layer_tail(z: torch.Tensor, weight: torch.Tensor | None, res: torch.Tensor | None, drop: DropoutBlock | None,
               pc: ParallelContext, col_axis: str, row_axis: str, hidden: int, eps: float,
               norm: bool) -> torch.Tensor:
    """``dropout(relu(rmsnorm(z))) + res`` of ``z`` (Br_row, H_col) on (row_axis, col_axis)
    in one autograd node (:class:`_LayerTail`); equals ``parallel_rms_norm`` -> relu ->
    dropout (``* keep / (1 - p)``) -> add (the unfused reference) up to the rounding of
    the row sums. ``weight`` (H_col,) the slice of g (None: no gain); ``res``
    (Br_row, H_col) the resharded layer input (None: no residual); ``drop`` the block's
    dropout (None: none); ``norm`` False skips RMSNorm (and its collectives)."""
    if norm is False and weight is not None:
        raise ValueError("a norm weight was given with norm=False; pass weight=None")
    save = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (z, weight, res))
    return _LayerTail.apply(z, weight, res, pc, col_axis, row_axis, hidden, eps, norm, drop, save)


def warm_up_compiled(pc: ParallelContext, hidden: int, eps: float, p: float, norm: bool, residual: bool,
                     device: torch.device, dtype: torch.dtype) -> None:
    """Compile ``pc.fused``'s phases for every way a run calls them, so that no frame
    compiles once training has begun: the training step (inputs that require grad, an
    ``nn.Parameter`` gain, dropout when p > 0, forward and backward) and the evaluation
    (no grad, no dropout), through :func:`layer_tail` itself. The block's sizes are
    distinct, at least 2, and differ from H: the dynamic graphs then assume no size
    equal to another (a run's H_col may equal H, its B not), which a later call
    could break and so recompile."""
    sizes = [n for n in (11, 7, 5, 3) if n != hidden][:2]
    b, h = sizes
    single = ParallelContext(ProcessGrid.single(), fused=pc.fused)
    for training in (True, False):
        with torch.set_grad_enabled(training):
            x = torch.randn(b, h, device=device, dtype=dtype, requires_grad=training)
            res = torch.randn(b, h, device=device, dtype=dtype, requires_grad=training) if residual else None
            z, res = (x * 1, res * 1 if res is not None else None) if training else (x, res)  # non-leaves
            gain = nn.Parameter(torch.ones(h, device=device, dtype=dtype)) if norm else None
            drop = DropoutBlock(1, torch.arange(b, device=device), torch.arange(h, device=device), p) \
                if training and p > 0 else None
            out = layer_tail(z, gain, res, drop, single, "x", "y", hidden, eps, norm)
            if training:
                out.backward(torch.ones_like(out))
