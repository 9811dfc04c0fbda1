"""What every sharded operator needs, in one object passed explicitly: ParallelContext.

The operators of :mod:`~scalegnn.parallel.products`, :mod:`~scalegnn.parallel.tail` and
:mod:`~scalegnn.parallel.losses` communicate through it: over the grid's named axes,
counted in its :class:`~scalegnn.parallel.collectives.CommStats` under the kinds of
:mod:`~scalegnn.parallel.collectives`, their local compute timed by its
:class:`~scalegnn.timing.SpanTimer`, in the wire and operand dtypes it says.

Deferred weight-gradient reductions (paper V-D). A weight W replicated along an axis t
whose members see different rows has the complete gradient

    dW = AR_t(dW_partial)                                          (Eq. 15)

A deferring backward returns dW_partial; the parameter's post-accumulate-grad hook
(:meth:`ParallelContext.weight_grad_hook`) hands it to
:meth:`ParallelContext.reduce_weight_grad`, which launches the all-reduce at once
(asynchronous, overlapping the rest of backward) or, with buckets, holds it until every
gradient of its (axis, wire dtype) has arrived and reduces them in one call;
:meth:`ParallelContext.wait_pending` completes them before the optimizer.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

import torch

from ..timing import SpanTimer
from .collectives import PMM_KINDS, CommStats, PendingReduce, all_reduce, all_reduce_async, bucketed_all_reduce
from .grid import ProcessGrid

__all__ = ["ParallelContext", "tf32_matmuls", "cuda_fp32_matmuls"]


@contextmanager
def cuda_fp32_matmuls(tf32: bool):
    """CUDA matmuls of FP32 tensors in TF32 (``tf32``) or in IEEE FP32 inside the block, the
    setting as it was after: torch's per-backend precision where it has one (2.9+), the
    older flag elsewhere."""
    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):
        name, value = "fp32_precision", "tf32" if tf32 else "ieee"
    else:
        name, value = "allow_tf32", bool(tf32)
    before = getattr(matmul, name)
    setattr(matmul, name, value)
    try:
        yield
    finally:
        setattr(matmul, name, before)


def tf32_matmuls():
    """CUDA matmuls of FP32 tensors in TF32 inside the block (``--gemm-dtype tf32``)."""
    return cuda_fp32_matmuls(True)


@dataclass
class ParallelContext:
    """What every sharded operator needs: the grid, the byte accounting, optional
    compute timers and the communication dtype for 3D-PMM partial sums (None: as is).

    Optimization switches (paper V; defaults are the plain path):
        overlap   asynchronous all-reduces in backward (V-D): the GEMM's feature-
                  gradient all-reduce runs while its weight gradient is computed, and
                  weight-gradient reductions the caller defers (``defer_dw``) are
                  launched by :meth:`reduce_weight_grad` and finished by :meth:`wait_pending`
        bucket    deferred weight-gradient reductions (the GEMMs' dW and, through
                  :attr:`defer_norm_grads`, RMSNorm's dg) go over their axis in buckets,
                  one call per (axis, wire dtype) a step (:meth:`weight_grad_hook`)
        fused     a :class:`~scalegnn._compiled.CompiledKernels`: the layer tail's and
                  the cross-entropy's ``torch.compile``-d phases, the dropout mask
                  hashed inside (V-C); None keeps the eager kernels
        gemm_dtype
                  operand dtype of the local dense GEMM products (None: as is); see
                  :meth:`mm`
        tf32      the local dense GEMM products of FP32 operands in TF32 on a CUDA
                  GPU's tensor cores (``--gemm-dtype tf32``); see :meth:`mm`
        sparse_input_grad
                  with a CSR input (``h_t`` given to
                  :func:`~scalegnn.parallel.products.sharded_gemm`: the input
                  projection) the weight gradient is row-sparse: only the rows of the
                  features present in the batch (:mod:`scalegnn.rowsparse`)
    """

    grid: ProcessGrid
    stats: CommStats | None = None
    timer: SpanTimer | None = None
    pmm_comm_dtype: torch.dtype | None = None
    overlap: bool = False
    fused: object | None = None
    sparse_input_grad: bool = False
    bucket: bool = False
    gemm_dtype: torch.dtype | None = None
    tf32: bool = False
    pending: list = field(default_factory=list)
    # Set by weight_grad_hook for an RMSNorm weight: the norm's backward leaves dg partial.
    defer_norm_grads: bool = field(default=False, init=False)
    _expected: dict = field(default_factory=dict, init=False, repr=False)  # bucket key -> members a step
    _open: dict = field(default_factory=dict, init=False, repr=False)  # bucket key -> [(tensor, kind)] so far

    @property
    def defers_weight_grads(self) -> bool:
        """Whether weight gradients are left partial for :meth:`reduce_weight_grad`."""
        return self.overlap or self.bucket

    def mm(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """The local dense product ``a @ b`` of a GEMM (forward or backward). With
        ``gemm_dtype`` (bf16) both operands are cast and the product, accumulated in
        FP32 by the BLAS / tensor cores and rounded to bf16 by ``mm``, comes back as
        ``a``'s dtype before any all-reduce, so everything around the GEMM stays FP32
        (the same bits on every device: no device-only ``out_dtype``). With ``tf32`` the
        FP32 operands are multiplied in TF32: cuBLAS reads the matmul precision when the
        product is launched, so it is set for this product alone (:func:`tf32_matmuls`).
        A sparse operand (the CSR input features) keeps its FP32 sparse product."""
        if a.layout != torch.strided or b.layout != torch.strided:
            return a @ b
        if self.tf32:
            with tf32_matmuls():
                return a @ b
        if self.gemm_dtype is None:
            return a @ b
        return torch.mm(a.to(self.gemm_dtype), b.to(self.gemm_dtype)).to(a.dtype)

    def reduce_pmm(self, t: torch.Tensor, axis: str) -> torch.Tensor:
        return all_reduce(t, self.grid, axis, self.stats, f"pmm_{axis}", comm_dtype=self.pmm_comm_dtype)

    def reduce_pmm_async(self, t: torch.Tensor, axis: str) -> PendingReduce:
        return all_reduce_async(t, self.grid, axis, self.stats, f"pmm_{axis}", comm_dtype=self.pmm_comm_dtype)

    def reduce(self, t: torch.Tensor, axis: str, kind: str, op: str = "sum") -> torch.Tensor:
        return all_reduce(t, self.grid, axis, self.stats, kind, op=op)

    def _comm_dtype(self, kind: str) -> torch.dtype | None:
        """The wire dtype a collective of ``kind`` asks for: ``pmm_comm_dtype`` for 3D-PMM
        partial sums only (paper V-B), None (as is) for everything else."""
        return self.pmm_comm_dtype if kind in PMM_KINDS else None

    def _bucket_key(self, dtype: torch.dtype, axis: str, kind: str) -> tuple:
        """Gradients share a bucket when they share the axis and the wire dtype: dW in
        ``pmm_comm_dtype`` (a 3D-PMM partial sum), RMSNorm's dg in its own (FP32 rule)."""
        return axis, self._comm_dtype(kind) or dtype

    def weight_grad_hook(self, param: torch.Tensor, axis: str, norm: bool = False):
        """Register ``param``, whose gradient is a partial sum over ``axis``, for the
        deferred reduction; returns its post-accumulate-grad hook, or None where the
        gradient keeps its reduction inside backward (an RMSNorm weight without
        bucketing). ``norm``: an RMSNorm gain (FP32 wire, kind "norm"; its backward then
        leaves dg partial), else a GEMM weight (kind ``pmm_<axis>``)."""
        kind = "norm" if norm else f"pmm_{axis}"
        if norm:
            if not self.bucket:
                return None
            self.defer_norm_grads = True
        if self.bucket:
            key = self._bucket_key(param.dtype, axis, kind)
            self._expected[key] = self._expected.get(key, 0) + 1
        return lambda p: self.reduce_weight_grad(p.grad, axis, kind)

    def reduce_weight_grad(self, grad: torch.Tensor, axis: str, kind: str | None = None) -> None:
        """Reduce a deferred weight gradient over ``axis`` (in place), complete after
        :meth:`wait_pending`. A row-sparse gradient is reduced through its values: its
        rows are agreed over ``axis``.

        Without buckets: launched at once, asynchronously (overlapping the rest of
        backward). With buckets: held until every gradient registered for its bucket
        has arrived, then the bucket goes in one call (asynchronous with ``overlap``,
        else synchronous): the members that arrived first lose the part of the overlap
        between their arrival and the bucket's completion, and the axis saves a call
        per extra member."""
        kind = kind or f"pmm_{axis}"
        t = grad._values() if grad.is_sparse else grad
        if not self.bucket:
            self.pending.append(all_reduce_async(t, self.grid, axis, self.stats, kind,
                                                 comm_dtype=self._comm_dtype(kind)))
            return
        key = self._bucket_key(t.dtype, axis, kind)
        members = self._open.setdefault(key, [])
        members.append((t, kind))
        if len(members) >= self._expected.get(key, 0):
            self._launch_bucket(key)

    def _launch_bucket(self, key: tuple) -> None:
        axis, wire = key
        members = self._open.pop(key)
        handle = bucketed_all_reduce(members, self.grid, axis, self.stats, comm_dtype=wire, async_op=self.overlap)
        if handle is not None:
            self.pending.append(handle)

    def wait_pending(self) -> None:
        """Finish every deferred weight-gradient reduction (before the optimizer). A bucket
        still open (a registered gradient that did not come this step) goes now, in the
        order the buckets were opened: the same on every rank."""
        for key in list(self._open):
            self._launch_bucket(key)
        pending, self.pending = self.pending, []
        for handle in pending:
            handle.wait()

    def time(self, name: str):
        """Time the enclosed local compute under ``name`` (a no-op without a timer)."""
        return self.timer(name) if self.timer is not None else nullcontext()
