"""3D parallel matrix multiplication and the other sharded operators (paper IV-C).

Shape legend (per rank; a block's size comes from :mod:`scalegnn.parallel.layout`):
    Br_a   batch rows of this rank's row block along axis a
    H_a    hidden columns of this rank's column block along axis a
    F_z    input-feature columns along z          C_d   class columns along d

Gradient convention. A matrix laid out on (a, b) is replicated along the third
axis. Every operator here returns *complete* gradients: after its backward, each
replica of an input block holds the full gradient of that block (identical on all
replicas), never a partial sum. The all-reduces that make this true follow from
the forward by the chain rule (paper III-C, Eqs. 13-19). For the generic

    C[a, c] = AllReduce_b( A[a, b] @ B[b, c] )       (C replicated along b)

with a complete dC (identical on the replicas along b):

    dA[a, b] = sum_c dC[a, c] B[b, c]^T  -> local dC @ B^T, all-reduce over c
               (A is replicated along c; each replica has one c-block of the sum)
    dB[b, c] = sum_a A[a, b]^T dC[a, c]  -> local A^T @ dC, all-reduce over a
               (B is replicated along a; each replica has one a-block of the sum)

and the forward all-reduce itself back-propagates as the identity (each partial
product's gradient is dC). Applied to the layer of the rotation table with input
on (r, c) and third axis t:

    SpMM  H[t, c] = AR_r(A[t, r] @ X[r, c])   backward dX = AR_t(A^T[r, t] @ dH)   (Eq. 17)
    GEMM  Z[t, r] = AR_c(H[t, c] @ W[c, r])   backward dH = AR_r(dZ @ W^T)         (Eq. 16)
                                                       dW = AR_t(H^T @ dZ)         (Eq. 15)

i.e. the weight gradient is summed over the axis along which W is replicated and
H's row blocks differ (t), and the feature gradient over the axis of W's columns.
Data-parallel reduction of weight gradients is left to the engine.

Operators whose replicas consume a replicated value *differently* (RMSNorm's row
sum of squares: each replica uses it for its own columns) need an all-reduce in
backward as well; operators whose replicas consume it identically (the cross-
entropy's log-sum-exp: every class replica computes the same row loss) do not.
Each backward below states which case it is.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .._elementwise import DropoutBlock, row_sum_squares, tail_backward_input, tail_backward_stats, tail_forward
from ..functional import dropout_keep_mask, rms_norm
from ..metrics import micro_f1_counts
from ..ranges import split_bounds
from ..rowsparse import row_sparse_grad
from ..timing import SpanTimer
from .collectives import (PMM_KINDS, CommStats, PendingReduce, _maybe_time, all_gather_uneven, all_reduce,
                          all_reduce_async, broadcast, bucketed_all_reduce)
from .grid import ProcessGrid
from .layout import RowPartition, col_bounds, interval_overlap

__all__ = ["ParallelContext", "sharded_spmm", "sharded_gemm", "reshard", "gather_row_pieces",
           "csr_rows", "row_chunks", "parallel_rms_norm", "parallel_dropout",
           "norm_relu_dropout", "fused_layer_tail", "layer_tail", "DropoutBlock",
           "parallel_cross_entropy", "parallel_bce", "parallel_argmax", "parallel_accuracy_counts"]


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
        fused     the element-wise tail of a layer, ``norm_relu_dropout`` or its
                  ``torch.compile``-d version (V-C); None keeps the unfused operators
        gemm_dtype
                  operand dtype of the local dense GEMM products (None: as is); see
                  :meth:`mm`
        sparse_input_grad
                  with a CSR input (``h_t`` given to :func:`sharded_gemm`: the input
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
        (the same bits on every device: no device-only ``out_dtype``). A sparse operand
        (the CSR input features) keeps its FP32 sparse product."""
        if self.gemm_dtype is None or a.layout != torch.strided or b.layout != torch.strided:
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
        return _maybe_time(self.timer, name)


# ------------------------------------------------------------------------------ SpMM
class _ShardedSpMM(torch.autograd.Function):
    """H[t, c] = AllReduce_r(A[t, r] @ X[r, c]) (Eq. 27); dX = AllReduce_t(A^T dH) (Eq. 17)."""

    @staticmethod
    def forward(ctx, x, adj, adj_t, pc: ParallelContext, spmm_axis: str, grad_axis: str):
        ctx.adj_t, ctx.pc, ctx.grad_axis = adj_t, pc, grad_axis
        with pc.time("spmm"):
            h = torch.sparse.mm(adj, x)  # (Br_t, H_c): a partial sum over the r-blocks of A's columns
        return pc.reduce_pmm(h, spmm_axis)

    @staticmethod
    def backward(ctx, grad_h):
        pc = ctx.pc
        if not ctx.needs_input_grad[0]:
            return None, None, None, None, None, None
        with pc.time("spmm"):
            grad_x = torch.sparse.mm(ctx.adj_t, grad_h.contiguous())  # (Br_r, H_c): partial over t
        return pc.reduce_pmm(grad_x, ctx.grad_axis), None, None, None, None, None


def sharded_spmm(x: torch.Tensor, adj: torch.Tensor, adj_t: torch.Tensor | None, pc: ParallelContext,
                 spmm_axis: str, grad_axis: str) -> torch.Tensor:
    """Aggregation of one layer: ``x`` (Br_r, H_c) on (r, c), ``adj`` (Br_t, Br_r) the CSR
    shard of A on (t, r) and ``adj_t`` its transpose (None: no backward, as in the
    evaluation). Returns H (Br_t, H_c) on (t, c), replicated along r.
    ``spmm_axis`` = r, ``grad_axis`` = t (the axis of A's row blocks)."""
    return _ShardedSpMM.apply(x, adj, adj_t, pc, spmm_axis, grad_axis)


# ------------------------------------------------------------------------------ GEMM
class _ShardedGEMM(torch.autograd.Function):
    """Z[t, r] = AllReduce_c(H[t, c] @ W[c, r]) (Eq. 28) with
    dH = AllReduce_r(dZ W^T) (Eq. 16) and dW = AllReduce_t(H^T dZ) (Eq. 15)."""

    @staticmethod
    def forward(ctx, h, w, pc: ParallelContext, reduce_axis: str, dh_axis: str, dw_axis: str, defer_dw: bool,
                h_t=None):
        ctx.save_for_backward(h, w)
        ctx.pc, ctx.dh_axis, ctx.dw_axis, ctx.defer_dw, ctx.h_t = pc, dh_axis, dw_axis, defer_dw, h_t
        with pc.time("gemm"):
            z = pc.mm(h, w)
        return pc.reduce_pmm(z, reduce_axis)

    @staticmethod
    def backward(ctx, grad_z):
        h, w = ctx.saved_tensors
        pc = ctx.pc
        grad_h = grad_w = pending_h = None
        if ctx.needs_input_grad[0]:
            with pc.time("gemm"):
                grad_h = pc.mm(grad_z, w.t()).contiguous()  # partial over the column blocks of W (axis dh_axis)
            if pc.overlap:  # V-D: the dH all-reduce runs while dW is computed
                pending_h = pc.reduce_pmm_async(grad_h, ctx.dh_axis)
            else:
                grad_h = pc.reduce_pmm(grad_h, ctx.dh_axis)
        if ctx.needs_input_grad[1] and ctx.h_t is not None and pc.sparse_input_grad:
            grad_w = _row_sparse_dw(ctx.h_t, grad_z, w.shape, pc, ctx.dw_axis, ctx.defer_dw)
        elif ctx.needs_input_grad[1]:
            with pc.time("gemm"):  # partial over the row blocks of H (axis dw_axis)
                grad_w = (pc.mm(h.t(), grad_z) if ctx.h_t is None else torch.sparse.mm(ctx.h_t, grad_z)).contiguous()
            if not ctx.defer_dw:  # deferred: the caller's hook reduces it after accumulation
                grad_w = pc.reduce_pmm(grad_w, ctx.dw_axis)
        if pending_h is not None:
            grad_h = pending_h.wait()
        return grad_h, grad_w, None, None, None, None, None, None


def _row_sparse_dw(x_t: torch.Tensor, grad_z: torch.Tensor, shape, pc: ParallelContext, dw_axis: str,
                   defer_dw: bool) -> torch.Tensor:
    """dW = X^T dZ (Eq. 18) for a CSR input, as a row-sparse gradient: row f of X^T dZ
    is zero unless feature f has an entry in the batch rows, so only those rows are
    computed (no dense (F_z, H) temporary) and returned as the coalesced sparse COO
    tensor of :func:`scalegnn.rowsparse.row_sparse_grad`.

    The replicas along ``dw_axis`` hold different batch rows, hence different present
    features; they agree on the union (an int32 all-reduce of F_z flags, counted with
    the partial sums' kind) so that the values can be summed and every replica of W_in
    updates the same rows. The row set is data-dependent in size: one host read
    (``nonzero``) per step on a GPU, which is why ``--sparse-input-update auto`` keeps it
    to the CPU. ``defer_dw``: the values stay partial, the caller's hook reduces them.
    """
    crow = x_t.crow_indices()
    present = crow[1:] > crow[:-1]  # (F_z,) features with an entry in this rank's batch rows
    if pc.grid.axis_size(dw_axis) > 1:
        present = pc.reduce(present.to(torch.int32), dw_axis, f"pmm_{dw_axis}") > 0
    rows = present.nonzero().squeeze(1)  # (R,) sorted
    with pc.time("gemm"):
        # The CSR of X^T's rows ``rows``: a superset of its non-empty rows, so their
        # entries are all of X^T's entries, in order, and only the row pointers change.
        compact = torch.sparse_csr_tensor(torch.cat([crow.index_select(0, rows), crow[-1:]]), x_t.col_indices(),
                                          x_t.values(), (rows.numel(), x_t.shape[1]), check_invariants=False)
        values = (torch.sparse.mm(compact, grad_z) if rows.numel() else
                  grad_z.new_zeros(0, grad_z.shape[1])).contiguous()  # (R, H): partial over dw_axis
    if not defer_dw:
        values = pc.reduce_pmm(values, dw_axis)
    return row_sparse_grad(rows, values, shape)


def sharded_gemm(h: torch.Tensor, w: torch.Tensor, pc: ParallelContext, reduce_axis: str, dh_axis: str,
                 dw_axis: str, defer_dw: bool = False, h_t: torch.Tensor | None = None) -> torch.Tensor:
    """Dense 3D PMM: ``h`` on (t, c), ``w`` on (c, r) -> (t, r), replicated along c.

    ``reduce_axis`` = c (inner dim), ``dh_axis`` = r (W's columns), ``dw_axis`` = t
    (H's rows; W is replicated along it). Used for the layer GEMM (Eq. 6), the input
    projection (Eq. 4: X_in on (x, z), W_in on (z, y): reduce z, dW over x) and the
    output head (Eq. 11: X on (a, b), W_out on (b, d): reduce b, dX over d, dW over a).

    ``defer_dw``: the backward returns dW as this rank's PARTIAL sum and leaves the
    all-reduce over ``dw_axis`` to the caller (a post-accumulate-grad hook on the
    parameter that calls :meth:`ParallelContext.reduce_weight_grad`), so the weight-
    gradient sync overlaps with the rest of backward (paper V-D).

    ``h_t``: the CSR of ``h^T`` when ``h`` is a sparse CSR input (the features): dW
    is then the CSR x dense product ``h_t @ dZ`` (see :func:`scalegnn.csr.csr_transpose`),
    and with ``pc.sparse_input_grad`` only its rows of the features present in the
    batch, as a row-sparse gradient (:func:`_row_sparse_dw`).
    """
    return _ShardedGEMM.apply(h, w, pc, reduce_axis, dh_axis, dw_axis, defer_dw, h_t)


# ------------------------------------------------------------------------------ reshard
def _move_rows(x, src_ax, dst_ax, rows: RowPartition, pc: ParallelContext, target: tuple[int, int] | None = None):
    """Row blocks along ``src_ax`` -> along ``dst_ax`` (columns unchanged), by an
    uneven all-gather over ``src_ax`` of each member's overlap with my target rows
    (``target``: a batch-row range inside my ``dst_ax`` block, default all of it)."""
    grid = pc.grid
    if target is None:
        target = rows.block(dst_ax)
    elif src_ax == dst_ax:
        lo, hi = rows.block(src_ax)
        return x[target[0] - lo: target[1] - lo]
    if src_ax == dst_ax:
        return x
    mine = rows.block(src_ax)
    sizes = []
    for i in range(grid.axis_size(src_ax)):
        lo, hi = interval_overlap(rows.block(src_ax, i), target)
        sizes.append(hi - lo)
    lo, hi = interval_overlap(mine, target)
    piece = x[lo - mine[0]: hi - mine[0]]
    return all_gather_uneven(piece.contiguous(), sizes, grid, src_ax, pc.stats, "reshard", dim=0)


def _move_cols(x, src_ax, dst_ax, dim: int, pc: ParallelContext):
    """Column blocks along ``src_ax`` -> along ``dst_ax`` (rows unchanged)."""
    if src_ax == dst_ax:
        return x
    grid = pc.grid
    sb, db = col_bounds(dim, grid, src_ax), col_bounds(dim, grid, dst_ax)
    j = grid.axis_index(dst_ax)
    target = (db[j], db[j + 1])
    sizes = []
    for i in range(grid.axis_size(src_ax)):
        lo, hi = interval_overlap((sb[i], sb[i + 1]), target)
        sizes.append(hi - lo)
    me = grid.axis_index(src_ax)
    lo, hi = interval_overlap((sb[me], sb[me + 1]), target)
    piece = x[:, lo - sb[me]: hi - sb[me]]
    return all_gather_uneven(piece.contiguous(), sizes, grid, src_ax, pc.stats, "reshard", dim=1)


def _reshard_blocks(x, src, dst, rows: RowPartition, dim: int, pc: ParallelContext,
                    target: tuple[int, int] | None = None):
    (r1, c1), (r2, c2) = src, dst
    if src == dst and target is None:
        return x
    if r2 != c1:  # rows first: gather over r1 (members share c1 and r2), then over c1
        x = _move_rows(x, r1, r2, rows, pc, target)
        return _move_cols(x, c1, c2, dim, pc)
    if c2 != r1:  # columns first: gather over c1 (members share r1 and c2), then over r1
        x = _move_cols(x, c1, c2, dim, pc)
        return _move_rows(x, r1, r2, rows, pc, target)
    raise NotImplementedError(f"reshard between transposed layouts {src} -> {dst} is not needed by the model")


class _Reshard(torch.autograd.Function):
    """Pure data movement; the backward is the reverse movement of the (complete) gradient."""

    @staticmethod
    def forward(ctx, x, src, dst, rows, dim, pc):
        ctx.args = (src, dst, rows, dim, pc)
        return _reshard_blocks(x, src, dst, rows, dim, pc)

    @staticmethod
    def backward(ctx, grad):
        src, dst, rows, dim, pc = ctx.args
        return _reshard_blocks(grad.contiguous(), dst, src, rows, dim, pc), None, None, None, None, None


def reshard(x: torch.Tensor, src: tuple[str, str], dst: tuple[str, str], rows: RowPartition, dim: int,
            pc: ParallelContext, target: tuple[int, int] | None = None) -> torch.Tensor:
    """Move a (B, dim) matrix from layout ``src`` to layout ``dst`` (residual, IV-C4).

    Two uneven all-gathers over single axes, each receiving only the part of the
    target block that the sender holds (received volume = the target block size):
    for the layer residual ``(r, c) -> (t, r)`` first the rows (over r), then the
    columns (over c). Differentiable; the backward is the reverse reshard.

    ``target``: only the batch rows ``[target[0], target[1])`` of my destination block,
    without autograd (the evaluation's row chunks: every member of the two gathering
    axes names the same range, as they share the destination row block).
    """
    if target is not None:
        if torch.is_grad_enabled() and x.requires_grad:
            raise ValueError("reshard of a row range is for the no-grad evaluation; call it under torch.no_grad()")
        return _reshard_blocks(x, tuple(src), tuple(dst), rows, dim, pc, target)
    return _Reshard.apply(x, tuple(src), tuple(dst), rows, dim, pc)


# ------------------------------------------------------------------------------ evaluation pieces
def gather_row_pieces(piece: torch.Tensor, n: int, pc: ParallelContext, axis: str) -> torch.Tensor:
    """The (n, W) block whose row pieces ``split_bounds(n, G_axis)`` the members of
    ``axis`` hold (mine: ``piece``), gathered into one new (n, W) tensor: my piece is
    copied to its rows and every member's rows are broadcast in place from it. Not an
    all-gather: gloo's all-gather stages its output in a second buffer as large as the
    block (measured: 2 x the output at peak), exactly the array the evaluation bounds.
    Counted as kind "gather"."""
    grid = pc.grid
    parts = grid.axis_size(axis)
    if parts == 1:
        return piece
    bounds = split_bounds(n, parts)
    me = grid.axis_index(axis)
    if piece.shape[0] != bounds[me + 1] - bounds[me]:
        raise ValueError(f"piece has {piece.shape[0]} rows, member {me} of {axis} holds rows "
                         f"[{bounds[me]}, {bounds[me + 1]}) of {n}")
    out = piece.new_empty((n,) + tuple(piece.shape[1:]))
    out[bounds[me]: bounds[me + 1]] = piece
    for i in range(parts):
        broadcast(out[bounds[i]: bounds[i + 1]], grid, axis, i, pc.stats, "gather")
    return out


def csr_rows(a: torch.Tensor, r0: int, r1: int) -> torch.Tensor:
    """Rows ``[r0, r1)`` of a CSR matrix as a CSR matrix that shares its column ids and
    values (only the ``r1 - r0 + 1`` row pointers are new): an evaluation row chunk of an
    adjacency block or of the features, without copying the block."""
    crow = a.crow_indices()
    lo, hi = int(crow[r0]), int(crow[r1])
    return torch.sparse_csr_tensor(crow[r0: r1 + 1] - lo, a.col_indices()[lo:hi], a.values()[lo:hi],
                                   (r1 - r0, a.shape[1]), check_invariants=False)


def row_chunks(n: int, rows: int) -> list[tuple[int, int]]:
    """``[0, n)`` in consecutive chunks of ``rows`` rows. A last chunk of one row joins the
    one before: a one-row dense product runs as a matrix-vector product whose rounding
    differs from the matrix product's, and the chunked evaluation equals the unchunked
    one bit for bit only without it."""
    rows = max(2, int(rows))
    bounds = list(range(0, n, rows)) + [n]
    if len(bounds) > 2 and bounds[-1] - bounds[-2] == 1:
        del bounds[-2]
    return list(zip(bounds[:-1], bounds[1:]))


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
    ``parallel_dropout`` -> add (the unfused reference) up to the rounding of the row
    sums. ``weight`` (H_col,) the slice of g (None: no gain); ``res`` (Br_row, H_col)
    the resharded layer input (None: no residual); ``drop`` the block's dropout (None:
    none); ``norm`` False skips RMSNorm (and its collectives)."""
    if norm is False and weight is not None:
        raise ValueError("a norm weight was given with norm=False; pass weight=None")
    save = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (z, weight, res))
    return _LayerTail.apply(z, weight, res, pc, col_axis, row_axis, hidden, eps, norm, drop, save)


# ------------------------------------------------------------------------------ dropout
def parallel_dropout(x: torch.Tensor, key: int, row_ids: torch.Tensor, col_ids: torch.Tensor,
                     p: float) -> torch.Tensor:
    """Dropout (Eq. 9) of a block whose rows are global vertices ``row_ids`` and whose
    columns are global hidden ids ``col_ids``: the block of the serial mask, exactly."""
    keep = dropout_keep_mask(key, row_ids, col_ids, p)
    return x * keep / (1.0 - p)


# ------------------------------------------------------------------------------ losses
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
    """

    @staticmethod
    def forward(ctx, logits, y, mask, pc: ParallelContext, row_axis: str, class_axis: str, class_start: int):
        o = logits.float()
        n_rows, n_cls = o.shape
        m = o.max(-1).values if n_cls else o.new_full((n_rows,), float("-inf"))
        pc.reduce(m, class_axis, "loss", op="max")
        e = torch.exp(o - m[:, None])
        s = e.sum(-1)
        local_t = (y - class_start).clamp(min=0)
        has = (y >= class_start) & (y < class_start + n_cls) & (y >= 0)
        if n_cls:
            at_max = o == m[:, None]
            ids = torch.arange(class_start, class_start + n_cls, device=o.device)
            lower = (at_max & (ids[None, :] < y[:, None])).sum(-1)
            at_t = local_t.clamp(max=n_cls - 1)[:, None]
            tgt = torch.where(has, o.gather(1, at_t).squeeze(1), o.new_zeros(n_rows))
            hit = has & at_max.gather(1, at_t).squeeze(1)
        else:
            lower = hit = tgt = o.new_zeros(n_rows)
        # One FP32 all-reduce: sum-exp, target logit, and the two argmax counts.
        four = torch.stack([s, tgt, lower.to(torch.float32), hit.to(torch.float32)], 1).contiguous()
        pc.reduce(four, class_axis, "loss")
        s, tgt = four[:, 0], four[:, 1]
        keep = mask & (y >= 0)
        correct = keep & (four[:, 3] > 0) & (four[:, 2] == 0)
        row_loss = torch.where(mask, m + torch.log(s) - tgt, torch.zeros_like(s))
        tot = torch.cat([torch.stack([row_loss.sum(), mask.sum().to(torch.float32)]).double(),
                         torch.stack([correct.sum(), keep.sum()]).double()])
        pc.reduce(tot, row_axis, "loss")
        count = tot[1].clamp(min=1.0)  # the sum is 0 when no row counts: L = 0
        loss = tot[0] / count
        ctx.save_for_backward(e / s[:, None], local_t, has, mask, count)
        ctx.dtype = logits.dtype
        count_t = tot[1].to(torch.int64)
        acc = tot[2:].clone()
        ctx.mark_non_differentiable(count_t, acc)
        return loss.to(logits.dtype), count_t, acc

    @staticmethod
    def backward(ctx, dloss, _dcount, _dacc):
        prob, local_t, has, mask, count = ctx.saved_tensors
        g = prob.clone()
        if g.shape[1]:  # subtract 1 at the target class of the rows whose class is on this rank
            g.scatter_add_(1, local_t.clamp(max=g.shape[1] - 1)[:, None], -has[:, None].to(g.dtype))
        g = torch.where(mask[:, None], g * (dloss.float() / count).to(g.dtype), 0.0)
        return g.to(ctx.dtype), None, None, None, None, None, None


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
        tot = torch.cat([local[:1], mask.sum().double().reshape(1), local[1:]])
        pc.reduce(tot, row_axis, "loss")
        denom = (tot[1] * num_classes).clamp(min=1.0)
        ctx.save_for_backward(o, y, mask, denom)
        ctx.dtype = logits.dtype
        loss = tot[0] / denom
        count_t = tot[1].to(torch.int64)
        acc = tot[2:].clone()
        ctx.mark_non_differentiable(count_t, acc)
        return loss.to(logits.dtype), count_t, acc

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
