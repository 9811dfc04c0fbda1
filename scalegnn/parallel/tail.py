"""The element-wise tail of a layer on a sharded block (paper Eqs. 7-10, 29; V-C).

Shape legend (per rank): Br_row batch rows of the block along the row axis, H_col its
hidden columns along the column axis, H the whole hidden dimension; g (H_col,) the
block's slice of the RMSNorm gain.

    s    = AR_col(sum_j z_j^2)                      FP32 at least      (Eq. 29)
    out  = dropout(relu(z (s / H + eps)^-1/2 g)) + res                  (Eqs. 7-10)

The same arithmetic in three forms:

    layer_tail         one autograd node, its element-wise work in the kernels of
                       :mod:`scalegnn._elementwise` (numba on the CPU, torch elsewhere):
                       what the model runs by default
    fused_layer_tail   the reductions here, the element-wise rest in
                       :func:`norm_relu_dropout`, compiled by ``torch.compile`` (V-C):
                       what the model runs with ``pc.fused``
    parallel_rms_norm  RMSNorm alone, unfused: the reference the two are tested against

Gradients, under the package's convention (:mod:`scalegnn.parallel`): each replica
along the column axis uses s for its own columns, so the backward all-reduces its row
sums over the column axis; g is replicated along the row axis, whose members hold
different rows, so dg is summed over the row axis (or left partial for the deferred
reduction of :class:`~scalegnn.parallel.context.ParallelContext`).
"""

from __future__ import annotations

import torch

from .._elementwise import DropoutBlock, row_sum_squares, tail_backward_input, tail_backward_stats, tail_forward
from ..functional import rms_norm
from .context import ParallelContext

__all__ = ["parallel_rms_norm", "norm_relu_dropout", "fused_layer_tail", "layer_tail"]


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
            grad_w = pc.reduce((dy * x * r).sum(0).contiguous(), ctx.row_axis, "norm")
        return grad_x, grad_w, None, None, None, None, None


def parallel_rms_norm(x: torch.Tensor, weight: torch.Tensor | None, pc: ParallelContext, col_axis: str,
                      row_axis: str, hidden: int, eps: float) -> torch.Tensor:
    """RMSNorm of ``x`` (Br_row, H_col) on (row_axis, col_axis); ``weight`` (H_col,) its slice of g.

    The unfused operator: the model runs :func:`layer_tail`; this is the reference the
    fused tail is tested and benchmarked against (``benchmarks/elementwise.py``)."""
    return _ParallelRMSNorm.apply(x, weight, pc, col_axis, row_axis, hidden, eps)


# ------------------------------------------------------------------------------ fused tail (V-C)
class _NormSumSq(torch.autograd.Function):
    """s = AR_col(sum_j x_j^2) in FP32 (Eq. 29), (Br, 1), differentiable.

    Each replica along the column axis uses s for its own columns, so the complete
    ds is the sum of the replicas' ds: backward all-reduces ds (FP32, kind "norm")
    and returns dx = 2 x ds.
    """

    @staticmethod
    def forward(ctx, x, pc: ParallelContext, col_axis: str):
        s = x.float().pow(2).sum(-1, keepdim=True)
        pc.reduce(s, col_axis, "norm")
        ctx.save_for_backward(x)
        ctx.pc, ctx.col_axis = pc, col_axis
        return s

    @staticmethod
    def backward(ctx, ds):
        (x,) = ctx.saved_tensors
        ds = ds.contiguous().clone()
        ctx.pc.reduce(ds, ctx.col_axis, "norm")
        return (2.0 * x.float() * ds).to(x.dtype), None, None


class _SumGrad(torch.autograd.Function):
    """Identity whose backward all-reduces the gradient over ``axis``: for a parameter
    replicated along an axis whose ranks see different rows (RMSNorm's g over the row
    axis), the complete gradient is the sum of the replicas' partial ones."""

    @staticmethod
    def forward(ctx, t, pc: ParallelContext, axis: str, kind: str):
        ctx.pc, ctx.axis, ctx.kind = pc, axis, kind
        return t.clone()

    @staticmethod
    def backward(ctx, grad):
        return ctx.pc.reduce(grad.contiguous().clone(), ctx.axis, ctx.kind), None, None, None


def norm_relu_dropout(x: torch.Tensor, sum_sq: torch.Tensor | None, weight: torch.Tensor | None,
                      keep: torch.Tensor | None, hidden: int, eps: float, p: float) -> torch.Tensor:
    """The element-wise tail of a layer (Eqs. 7-9) given the all-reduced FP32 sum of
    squares: ``dropout(relu(x * (s / H + eps)^-1/2 * g))``, each term written exactly as
    the unfused operators compute it. Pure element-wise torch, so ``torch.compile``
    fuses forward and backward into a kernel each (paper V-C); eager it is the same
    arithmetic, unfused. ``sum_sq=None``: no norm; ``keep=None``: no dropout."""
    if sum_sq is not None:
        x = x * torch.rsqrt(sum_sq / hidden + eps).to(x.dtype)
        if weight is not None:
            x = x * weight
    x = torch.relu(x)
    if keep is not None:
        x = x * keep / (1.0 - p)
    return x


def fused_layer_tail(z: torch.Tensor, weight: torch.Tensor | None, keep: torch.Tensor | None,
                     pc: ParallelContext, col_axis: str, row_axis: str, hidden: int, eps: float, p: float,
                     norm: bool) -> torch.Tensor:
    """RMSNorm + ReLU + dropout of ``z`` (Br_row, H_col) with ``pc.fused`` (V-C): the
    two reductions stay outside the fused function (FP32 all-reduces of the sum of
    squares and, in backward, of ds and dg), everything element-wise inside it."""
    sum_sq = _NormSumSq.apply(z, pc, col_axis) if norm else None
    if weight is not None and not pc.defer_norm_grads:  # deferred: the weight's hook reduces dg
        weight = _SumGrad.apply(weight, pc, row_axis, "norm")
    return pc.fused(z, sum_sq, weight, keep, hidden, eps, p)


class _LayerTail(torch.autograd.Function):
    """out = dropout(relu(rmsnorm(x))) + res in one custom Function (Eqs. 7-10): the
    element-wise work in the kernels of :mod:`scalegnn._elementwise` (numba on the
    CPU, torch elsewhere), the reductions across ranks here, between the kernels.

    Forward: s = AR_col(sum_j x_j^2) (Eq. 29, FP32 at least), rinv = (s / H + eps)^-1/2,
    one pass writes out and the mask of entries the gradient passes (dropout's keep and
    relu's output > 0, 1 byte each). Backward, with dy = dout / (1 - p) where it
    passes, else 0, and u = dy * g (as :class:`_ParallelRMSNorm`):
        dot = AR_col(sum_j u_j x_j)        (each column replica holds one block)
        dx  = u * rinv - x * rinv^3 * dot / H
        dg  = AR_row(sum_rows dy x rinv)   (g replicated along the row axis, rows differ; with
                                            ``pc.defer_norm_grads`` left partial for g's hook)
        dres = dout
    Without norm: dx = dy and no collective.
    """

    @staticmethod
    def forward(ctx, x, weight, res, pc: ParallelContext, col_axis: str, row_axis: str, hidden: int, eps: float,
                norm: bool, drop: DropoutBlock | None, save: bool):
        rinv = r = None
        if norm:
            s = row_sum_squares(x)
            pc.reduce(s, col_axis, "norm")
            rinv = torch.rsqrt(s / hidden + eps)  # (Br,) in stats_dtype, as _ParallelRMSNorm's
            r = rinv.to(x.dtype)
        out, pas = tail_forward(x, r, weight, drop, res, save)
        if save:  # x only for the norm's backward (without norm, dx needs the mask alone)
            ctx.save_for_backward(x if norm else None, weight, rinv, pas)
        ctx.pc, ctx.col_axis, ctx.row_axis, ctx.hidden = pc, col_axis, row_axis, hidden
        ctx.den = drop.den if drop is not None else 1.0
        return out

    @staticmethod
    def backward(ctx, dout):
        x, weight, rinv, pas = ctx.saved_tensors
        pc = ctx.pc
        dout = dout.contiguous()
        grad_x = grad_w = c = r = None
        want_dg = weight is not None and ctx.needs_input_grad[1]
        if rinv is not None and (ctx.needs_input_grad[0] or want_dg):
            r = rinv.to(x.dtype)
            dot, grad_w = tail_backward_stats(dout, x, r, weight, pas, ctx.den, want_dg)
            if ctx.needs_input_grad[0]:
                pc.reduce(dot, ctx.col_axis, "norm")
                c = (rinv.pow(3) * dot / ctx.hidden).to(x.dtype)
            if want_dg:
                grad_w = grad_w.to(weight.dtype).contiguous()
                if not pc.defer_norm_grads:  # deferred: partial, the weight's hook reduces it (bucketed)
                    grad_w = pc.reduce(grad_w, ctx.row_axis, "norm")
        if ctx.needs_input_grad[0]:
            grad_x = tail_backward_input(dout, x, r, c, weight, pas, ctx.den)
        grad_res = dout if ctx.needs_input_grad[2] else None
        return grad_x, grad_w, grad_res, None, None, None, None, None, None, None, None


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
