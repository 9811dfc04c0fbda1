"""3D parallel matrix multiplication (paper IV-C, Plexus 3.1-3.2): the sharded SpMM and
GEMM with their backward, the residual's reshard, and the evaluation's row pieces.

Shape legend (per rank; a block's size comes from :mod:`scalegnn.parallel.layout`):
    Br_a   batch rows of this rank's row block along axis a
    H_a    hidden columns of this rank's column block along axis a
    F_z    input-feature columns along z          C_d   class columns along d

The all-reduces of the backward follow from the forward by the chain rule (paper
III-C, Eqs. 13-19), under the package's gradient convention (:mod:`scalegnn.parallel`:
every operator returns complete gradients). For the generic

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
"""

from __future__ import annotations

import torch

from ..ranges import split_bounds
from ..rowsparse import row_sparse_grad
from .collectives import all_gather_uneven, broadcast
from .context import ParallelContext
from .layout import RowPartition, col_bounds, interval_overlap

__all__ = ["sharded_spmm", "sharded_gemm", "reshard", "gather_row_pieces", "csr_rows", "csr_chunk_pointers",
           "row_chunks"]


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


def csr_chunk_pointers(a: torch.Tensor, chunks: list[tuple[int, int]]) -> dict[int, int]:
    """The row pointers of a CSR matrix at every bound of ``chunks`` (row -> entry offset),
    read to the host at once: one device-to-host read for all the chunks of an
    evaluation, where reading two per chunk would stall a GPU thousands of times."""
    rows = sorted({r for chunk in chunks for r in chunk})
    crow = a.crow_indices()
    at = torch.tensor(rows, dtype=torch.int64).to(crow.device, non_blocking=True)
    return dict(zip(rows, crow.index_select(0, at).tolist()))


def csr_rows(a: torch.Tensor, r0: int, r1: int, pointers: dict[int, int] | None = None) -> torch.Tensor:
    """Rows ``[r0, r1)`` of a CSR matrix as a CSR matrix that shares its column ids and
    values (only the ``r1 - r0 + 1`` row pointers are new): an evaluation row chunk of an
    adjacency block or of the features, without copying the block. ``pointers``: the row
    pointers at r0 and r1 already on the host (:func:`csr_chunk_pointers`); else read."""
    crow = a.crow_indices()
    lo, hi = (pointers[r0], pointers[r1]) if pointers is not None else (int(crow[r0]), int(crow[r1]))
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
