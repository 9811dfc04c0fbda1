"""CAGNET's distributed operators (Tripathy, Yelick, Buluc, SC20, section IV): the
process-grid layouts, the SpMMs with explicit collectives, and the analytic
communication volume of a training step. :mod:`scalegnn.baselines.cagnet` builds the model
and the trainer on them.

Shape legend (per rank; every split is :func:`scalegnn.ranges.split_range`, so
uneven sizes differ by at most one and may be empty):

    n        vertices                      h   hidden width (every SpMM moves h columns)
    n_i      rows of block row i           h_j hidden columns of process column j (2D)
    A        the GCN-normalized adjacency of the serial model: forward H' = A H,
             backward dH = A^T dH' (the paper writes the forward as A^T H; the same
             algorithm with the roles of A and A^T exchanged)

Process grid. A :class:`~scalegnn.parallel.grid.ProcessGrid` of shape
``1 x R x C x 1``: process P(i, j) has x index i (its *process row*) and y index j
(its *process column*). The group along ``y`` is the process row P(i, :), the group
along ``x`` the process column P(:, j).

    1D     R = P, C = 1: block rows of A, A^T and H over the P processes (Table II).
    1.5D   R = P/c, C = c: block rows over the R process rows, replicated over the c
           processes of a row. Process column j owns the *chunk* j of block rows
           (``split_range(R, c, j)``: the first chunks take one more block when c
           does not divide R, where the paper gives the last column more stages).
           1D is 1.5D with c = 1 (the paper's Fig. 1 labels 1D "c=1").
    2D     R = pr, C = pc: A, A^T and H in 2D blocks, rows over pr, columns over pc
           (A's columns: vertices over pc; H's columns: hidden over pc).

Gradient convention (as in :mod:`scalegnn.parallel`): every operator returns
*complete* gradients for the activation blocks it was given (identical on the
replicas of a block); a weight gradient is this rank's *contribution*, and the
contributions of distinct ranks are disjoint parts of the sum, so the trainer
all-reduces them once per step (1D/1.5D over the process column, 2D over all P).

Collective kinds (bytes counted as :mod:`scalegnn.parallel.collectives` does: the
payload of the buffer this rank hands to the collective, root or receiver; a
collective over an axis of size 1 or an empty buffer is skipped and costs nothing):

    spmm_bcast_dense    broadcasts of H blocks (forward) and G blocks (backward)
    spmm_allreduce      1.5D: the all-reduce of partial sums within a process row
    spmm_bcast_sparse   2D: broadcasts of A (forward) and A^T (backward) blocks, each as
                        CSR: int64 [indptr; col indices] and float values
    gemm_bcast          2D: the "partial SUMMA" broadcasts of T = A H (forward) and of
                        G (backward) along the process row, and the gather of the last
                        layer's rows for the output head (forward only)
    norm                2D: RMSNorm's FP32 row sums of squares (forward) and of
                        sum_k g_k dy_k x_k (backward) within the process row
    grad                the weight-gradient all-reduce, every parameter in one buffer
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from scalegnn.parallel.collectives import CommStats, all_reduce, all_reduce_world, broadcast
from scalegnn.parallel.grid import ProcessGrid
from scalegnn.ranges import split_bounds, split_range

__all__ = ["ALGORITHMS", "CagnetPlan", "process_grid_shape", "square_grid", "parse_process_grid", "local_blocks",
           "LocalBlocks", "spmm_15d", "spmm_2d", "row_gather_gemm", "row_gather_head", "row_sum_sq",
           "all_reduce_grads", "analytic_comm_bytes", "stage_nnz", "KINDS"]

ALGORITHMS = ("1d", "1.5d", "2d")
KINDS = ("spmm_bcast_dense", "spmm_allreduce", "spmm_bcast_sparse", "gemm_bcast", "norm", "grad")


# ----------------------------------------------------------------------------- process grids
def square_grid(p: int) -> tuple[int, int]:
    """The most square pr x pc = p with pr >= pc (the paper's implementation uses square grids)."""
    pc = max(d for d in range(1, int(p**0.5) + 1) if p % d == 0)
    return p // pc, pc


def parse_process_grid(text: str) -> tuple[int, int] | None:
    """``"auto"`` -> None; ``"2x3"`` -> (2, 3)."""
    text = str(text).strip().lower()
    if text == "auto":
        return None
    parts = text.split("x")
    if len(parts) != 2 or not all(p.isdigit() and int(p) >= 1 for p in parts):
        raise ValueError(f"--process-grid must be PRxPC with two positive integers (e.g. 2x3) or auto, got {text!r}")
    return int(parts[0]), int(parts[1])


def process_grid_shape(algorithm: str, world: int, c: int = 1, grid2d: tuple[int, int] | None = None
                       ) -> tuple[int, int]:
    """(R, C) of the process grid of ``algorithm`` on ``world`` processes."""
    if algorithm == "1d":
        return world, 1
    if algorithm == "1.5d":
        if c < 1 or world % c:
            raise ValueError(f"cagnet-1.5d: the replication factor c={c} must divide the process count {world} "
                             f"(a P/c x c grid); pick --replication among "
                             f"{[d for d in range(1, world + 1) if world % d == 0]}")
        return world // c, c
    if algorithm == "2d":
        pr, pc = grid2d if grid2d is not None else square_grid(world)
        if pr * pc != world:
            raise ValueError(f"cagnet-2d: --process-grid {pr}x{pc} has {pr * pc} processes but the run has {world}; "
                             f"use a PRxPC with PR*PC = {world} or auto")
        return pr, pc
    raise ValueError(f"unknown CAGNET algorithm {algorithm!r}; use one of {ALGORITHMS}")


@dataclass
class CagnetPlan:
    """Who holds what on one rank; pure arithmetic on (algorithm, n, h, R, C, rank)."""

    algorithm: str
    n: int
    hidden: int
    R: int
    C: int
    i: int  # process row
    j: int  # process column
    row_bounds: list = field(init=False)  # block rows of the vertices over R
    rows: tuple = field(init=False)  # this rank's vertex rows [r0, r1)
    chunk: range = field(init=False)  # 1.5D: the block rows whose broadcasts this process column runs
    hid_bounds: list = field(init=False)  # 2D: hidden columns over C
    cols: tuple = field(init=False)  # hidden columns this rank holds: 2D its block, else all
    stages: list = field(init=False)  # 2D: the inner-dimension stages (a, b, owner column, owner row)

    def __post_init__(self):
        self.row_bounds = split_bounds(self.n, self.R)
        self.rows = (self.row_bounds[self.i], self.row_bounds[self.i + 1])
        if self.algorithm == "2d":
            self.chunk = range(0)
            self.hid_bounds = split_bounds(self.hidden, self.C)
            self.cols = (self.hid_bounds[self.j], self.hid_bounds[self.j + 1])
            col_bounds = split_bounds(self.n, self.C)  # A's columns over the process columns
            cuts = sorted(set(col_bounds) | set(self.row_bounds))
            self.stages = []
            for a, b in zip(cuts[:-1], cuts[1:]):  # the common refinement of both splits of the inner dim
                owner_col = int(np.searchsorted(col_bounds, a, side="right")) - 1
                owner_row = int(np.searchsorted(self.row_bounds, a, side="right")) - 1
                self.stages.append((a, b, owner_col, owner_row))
        else:
            self.chunk = range(*split_range(self.R, self.C, self.j))
            self.hid_bounds = [0, self.hidden]
            self.cols = (0, self.hidden)
            self.stages = []

    @classmethod
    def of(cls, algorithm: str, n: int, hidden: int, grid: ProcessGrid) -> "CagnetPlan":
        return cls(algorithm, n, hidden, grid.axis_size("x"), grid.axis_size("y"), grid.axis_index("x"),
                   grid.axis_index("y"))

    @property
    def n_rows(self) -> int:
        return self.rows[1] - self.rows[0]

    def block_rows(self, q: int) -> int:
        return self.row_bounds[q + 1] - self.row_bounds[q]

    def hid_cols(self, j: int) -> int:
        return self.hid_bounds[j + 1] - self.hid_bounds[j]

    @property
    def replication(self) -> int:
        """How many ranks hold the same rows of the logits (the process row)."""
        return self.C


# ----------------------------------------------------------------------------- local sparse blocks
def _torch_csr(m, device) -> torch.Tensor:
    m = m.tocsr()
    m.sort_indices()
    return torch.sparse_csr_tensor(torch.from_numpy(m.indptr.astype(np.int64)),
                                   torch.from_numpy(m.indices.astype(np.int64)),
                                   torch.from_numpy(m.data.astype(np.float32)), m.shape).to(device)


@dataclass
class LocalBlocks:
    """This rank's pieces of A (forward) and A^T (backward), cut by the inner dimension.

    1D/1.5D: ``fwd[q]`` = A[rows_i, rows of block q] for q in the rank's chunk.
    2D: ``fwd[s]`` = A[rows_i, stage s] for the stages whose column owner is this rank;
    ``nnz_fwd[s]`` the nonzeros of A[rows_i, stage s] for every stage (the receivers'
    buffer sizes: metadata of the partition, known before the first step).
    """

    fwd: dict
    bwd: dict
    nnz_fwd: list
    nnz_bwd: list


def stage_nnz(adj, plan: CagnetPlan) -> list[int]:
    """Nonzeros of ``adj`` (scipy CSR) in this rank's rows, per 2D stage."""
    r0, r1 = plan.rows
    block = adj[r0:r1]
    return [int(block[:, a:b].nnz) for a, b, _, _ in plan.stages]


def local_blocks(adj, adj_t, plan: CagnetPlan, device) -> LocalBlocks:
    """Cut this rank's blocks from the serial model's A and A^T (scipy CSR). Only the
    rank's own blocks are kept; the whole matrix is read here because the harness
    loads the whole graph on every rank (as every baseline does)."""
    r0, r1 = plan.rows
    if plan.algorithm == "2d":
        fwd = {s: _torch_csr(adj[r0:r1, a:b], device) for s, (a, b, oc, _) in enumerate(plan.stages) if oc == plan.j}
        bwd = {s: _torch_csr(adj_t[r0:r1, a:b], device) for s, (a, b, oc, _) in enumerate(plan.stages)
               if oc == plan.j}
        return LocalBlocks(fwd, bwd, stage_nnz(adj, plan), stage_nnz(adj_t, plan))
    b = plan.row_bounds
    fwd = {q: _torch_csr(adj[r0:r1, b[q]:b[q + 1]], device) for q in plan.chunk}
    bwd = {q: _torch_csr(adj_t[r0:r1, b[q]:b[q + 1]], device) for q in plan.chunk}
    return LocalBlocks(fwd, bwd, [], [])


def _spmm_into(out: torch.Tensor, a: torch.Tensor, x: torch.Tensor) -> None:
    """out += a @ x for a CSR ``a`` (nothing to add when it holds no nonzero)."""
    if a._nnz() and x.shape[1]:
        out += torch.sparse.mm(a, x)


# ----------------------------------------------------------------------------- 1D / 1.5D SpMM
def _spmm_15d(x: torch.Tensor, pieces: dict, plan: CagnetPlan, grid: ProcessGrid, stats: CommStats | None
              ) -> torch.Tensor:
    """Algorithm 2 (Algorithm 1 when C = 1): for q in chunk j, H_q is broadcast within
    the process column P(:, j) from P(q, j); Z_i += A_iq H_q; the partial sums are
    all-reduced within the process row P(i, :)."""
    out = x.new_zeros(plan.n_rows, x.shape[1])
    for q in plan.chunk:
        buf = x if q == plan.i else x.new_empty(plan.block_rows(q), x.shape[1])
        broadcast(buf, grid, "x", q, stats, "spmm_bcast_dense")
        _spmm_into(out, pieces[q], buf)
    return all_reduce(out, grid, "y", stats, "spmm_allreduce")


class _SpMM15D(torch.autograd.Function):
    """Z_i = sum_q A_iq H_q (Eq. 3); backward dH_i = sum_q (A^T)_iq dZ_q, the same
    algorithm on the row blocks of A^T and the (complete, replicated) dZ."""

    @staticmethod
    def forward(ctx, x, blocks: LocalBlocks, plan, grid, stats):
        ctx.blocks, ctx.plan, ctx.grid, ctx.stats = blocks, plan, grid, stats
        return _spmm_15d(x.contiguous(), blocks.fwd, plan, grid, stats)

    @staticmethod
    def backward(ctx, g):
        return _spmm_15d(g.contiguous(), ctx.blocks.bwd, ctx.plan, ctx.grid, ctx.stats), None, None, None, None


def spmm_15d(x, blocks: LocalBlocks, plan: CagnetPlan, grid: ProcessGrid, stats: CommStats | None):
    """A @ X for X (n_i, h) in block rows replicated over the process row; returns (n_i, h)."""
    return _SpMM15D.apply(x, blocks, plan, grid, stats)


# ----------------------------------------------------------------------------- 2D SUMMA SpMM
def _bcast_csr(piece, rows: int, cols: int, nnz: int, owner: int, device, grid, stats) -> torch.Tensor:
    """Broadcast a CSR piece (rows, cols) with ``nnz`` nonzeros within the process row from
    column ``owner``: one int64 buffer [indptr; indices], one float buffer of values."""
    if piece is not None:
        idx = torch.cat([piece.crow_indices(), piece.col_indices()])
        vals = piece.values()
    else:
        idx = torch.empty(rows + 1 + nnz, dtype=torch.int64, device=device)
        vals = torch.empty(nnz, dtype=torch.float32, device=device)
    broadcast(idx, grid, "y", owner, stats, "spmm_bcast_sparse")
    broadcast(vals, grid, "y", owner, stats, "spmm_bcast_sparse")
    if piece is not None:
        return piece
    return torch.sparse_csr_tensor(idx[: rows + 1], idx[rows + 1:], vals, (rows, cols))


def _spmm_2d(x: torch.Tensor, pieces: dict, nnz: list, plan: CagnetPlan, grid: ProcessGrid,
             stats: CommStats | None) -> torch.Tensor:
    """Algorithm 3, first phase (SUMMA): for every stage [a, b) of the inner dimension,
    A_i[:, a:b] is broadcast within the process row from its column owner and
    H[a:b, cols_j] within the process column from its row owner; T_ij += their product."""
    out = x.new_zeros(plan.n_rows, x.shape[1])
    for s, (a, b, owner_col, owner_row) in enumerate(plan.stages):
        mine = pieces.get(s) if owner_col == plan.j else None
        piece = _bcast_csr(mine, plan.n_rows, b - a, nnz[s], owner_col, x.device, grid, stats)
        if owner_row == plan.i:
            lo = plan.row_bounds[owner_row]
            buf = x[a - lo: b - lo].contiguous()
        else:
            buf = x.new_empty(b - a, x.shape[1])
        broadcast(buf, grid, "x", owner_row, stats, "spmm_bcast_dense")
        _spmm_into(out, piece, buf)
    return out


class _SpMM2D(torch.autograd.Function):
    """T = A H by SUMMA; backward dH = A^T dT by SUMMA on the 2D blocks of A^T."""

    @staticmethod
    def forward(ctx, x, blocks: LocalBlocks, plan, grid, stats):
        ctx.blocks, ctx.plan, ctx.grid, ctx.stats = blocks, plan, grid, stats
        return _spmm_2d(x.contiguous(), blocks.fwd, blocks.nnz_fwd, plan, grid, stats)

    @staticmethod
    def backward(ctx, g):
        b = ctx.blocks
        return _spmm_2d(g.contiguous(), b.bwd, b.nnz_bwd, ctx.plan, ctx.grid, ctx.stats), None, None, None, None


def spmm_2d(x, blocks: LocalBlocks, plan: CagnetPlan, grid: ProcessGrid, stats: CommStats | None):
    """A @ X for X (n_i, h_j) in 2D blocks; returns (n_i, h_j)."""
    return _SpMM2D.apply(x, blocks, plan, grid, stats)


# ----------------------------------------------------------------------------- 2D partial SUMMA
def _row_gather(t: torch.Tensor, plan: CagnetPlan, grid, stats) -> torch.Tensor:
    """[t_i0, ..., t_i(C-1)] (n_i, h): every column block of the process row, by C broadcasts."""
    parts = []
    for c in range(plan.C):
        buf = t.contiguous() if c == plan.j else t.new_empty(plan.n_rows, plan.hid_cols(c))
        broadcast(buf, grid, "y", c, stats, "gemm_bcast")
        parts.append(buf)
    return torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]


class _RowGatherGEMM(torch.autograd.Function):
    """Algorithm 3, second phase: Z_ij = sum_c T_ic W[c, j] = T_i: W[:, cols_j].

    Backward (the paper's "same communication pattern"): the G blocks dZ_ic are
    broadcast within the process row, dT_ij = dZ_i: W[cols_j, :]^T; the weight
    contribution of this rank is dW[:, cols_j] = T_i:^T dZ_ij (rows i only: the
    process column's ranks hold disjoint parts of the sum)."""

    @staticmethod
    def forward(ctx, t, w, plan, grid, stats):
        full = _row_gather(t, plan, grid, stats)
        c0, c1 = plan.cols
        ctx.save_for_backward(full, w)
        ctx.plan, ctx.grid, ctx.stats = plan, grid, stats
        return full @ w[:, c0:c1]

    @staticmethod
    def backward(ctx, dz):
        full, w = ctx.saved_tensors
        plan = ctx.plan
        c0, c1 = plan.cols
        dz = dz.contiguous()
        dz_full = _row_gather(dz, plan, ctx.grid, ctx.stats)
        dt = dz_full @ w[c0:c1, :].t()
        dw = torch.zeros_like(w)
        dw[:, c0:c1] = full.t() @ dz
        return dt, dw, None, None, None


def row_gather_gemm(t, w, plan: CagnetPlan, grid: ProcessGrid, stats: CommStats | None):
    """(T W)[rows_i, cols_j] for T (n_i, h_j) in 2D blocks and W (h, h) replicated."""
    return _RowGatherGEMM.apply(t, w, plan, grid, stats)


class _RowGatherHead(torch.autograd.Function):
    """O_i = H_i: W_out (n_i, C classes), replicated over the process row.

    Every replica computes the same O_i and, from the same loss, the same complete dO_i,
    so backward needs no communication: dH_ij = dO_i W_out[cols_j, :]^T, and this rank's
    contribution to dW_out is its rows cols_j: H_ij^T dO_i (disjoint over all ranks)."""

    @staticmethod
    def forward(ctx, h, w, plan, grid, stats):
        ctx.save_for_backward(h, w)
        ctx.plan = plan
        return _row_gather(h, plan, grid, stats) @ w

    @staticmethod
    def backward(ctx, do):
        h, w = ctx.saved_tensors
        c0, c1 = ctx.plan.cols
        dw = torch.zeros_like(w)
        dw[c0:c1] = h.t() @ do
        return do @ w[c0:c1].t(), dw, None, None, None


def row_gather_head(h, w, plan: CagnetPlan, grid: ProcessGrid, stats: CommStats | None):
    return _RowGatherHead.apply(h, w, plan, grid, stats)


class _RowSumSq(torch.autograd.Function):
    """s_i = sum over ALL hidden columns of x^2, FP32 (RMSNorm, 2D): the local row sums
    all-reduced within the process row. Each replica uses s for its own columns, so the
    complete ds is the sum of the replicas' ds: backward all-reduces ds too."""

    @staticmethod
    def forward(ctx, x, grid, stats):
        s = x.float().pow(2).sum(-1, keepdim=True)
        all_reduce(s, grid, "y", stats, "norm")
        ctx.save_for_backward(x)
        ctx.grid, ctx.stats = grid, stats
        return s

    @staticmethod
    def backward(ctx, ds):
        (x,) = ctx.saved_tensors
        ds = all_reduce(ds.contiguous().clone(), ctx.grid, "y", ctx.stats, "norm")
        return (2.0 * x.float() * ds).to(x.dtype), None, None


def row_sum_sq(x, grid: ProcessGrid, stats: CommStats | None):
    return _RowSumSq.apply(x, grid, stats)


# ----------------------------------------------------------------------------- weight gradients
def all_reduce_grads(params, algorithm: str, grid: ProcessGrid, stats: CommStats | None) -> None:
    """Sum the weight-gradient contributions in one buffer (Eq. 3's outer product
    reduction): 1D/1.5D within the process column (rows replicated along the process
    row give identical contributions there), 2D over all P ranks."""
    params = [p for p in params if p.grad is not None]
    if grid.world_size == 1 or not params:
        return
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    if algorithm == "2d":  # the 1 x pr x pc x 1 grid is the whole world
        all_reduce_world(flat, grid, stats, "grad")
    else:
        all_reduce(flat, grid, "x", stats, "grad")
    off = 0
    for p in params:
        p.grad.copy_(flat[off: off + p.numel()].view_as(p.grad))
        off += p.numel()


# ----------------------------------------------------------------------------- analytic volume
def analytic_comm_bytes(algorithm: str, rank: int, *, n: int, widths: list[int], num_params: int, P: int,
                        c: int = 1, grid2d: tuple[int, int] | None = None, norm: bool = True,
                        nnz_fwd: list[int] | None = None, nnz_bwd: list[int] | None = None,
                        itemsize: int = 4) -> dict:
    """Bytes ``rank`` hands to each kind of collective in one training step (forward,
    backward and the gradient all-reduce), exactly, for uneven splits too.

    ``widths``: the width of the dense matrix each layer's SpMM moves (here every layer
    moves the hidden width h); ``num_params``: parameters in the gradient buffer;
    ``nnz_fwd`` / ``nnz_bwd`` (2D only): nonzeros of A / A^T in this rank's rows per stage
    (:func:`stage_nnz`: they depend on the graph, so they are counted from its blocks).

    Relation to the paper's per-process volumes (section IV), per SpMM of width f:
    1D  n f words of broadcasts (the paper's beta n f, counting the process's own block);
    1.5D n f / c of broadcasts + (n c / P) f of all-reduce (beta (nf/c + nfc/P)) when c^2
        divides P; otherwise the process columns own unequal chunks of block rows
        (``CagnetPlan.chunk``) and each moves its own chunk's rows;
    2D  n f / pc of H broadcasts + the process row's block of A cut at the stage
        boundaries, each piece as CSR ((n_i + 1) row pointers and nnz column indices at
        8 bytes, nnz values at 4) + n f / pr of partial SUMMA (the rectangular-grid
        formula beta (nnz/pr + nf/pc + nf/pr)); the backward moves A^T's pieces.
    Terms the paper leaves out and that are counted here: the 2D output head's gather
    (n f / pr), RMSNorm's two row-sum all-reduces (2D), and the gradient all-reduce of
    every parameter (the paper's f^2 per layer, plus the input and output projections
    and the norm gains). The loss and the evaluation are not part of the step's count.
    """
    R, C = process_grid_shape(algorithm, P, c, grid2d)
    i, j = divmod(rank, C)
    hidden = widths[0] if widths else 0
    plan = CagnetPlan(algorithm, n, hidden, R, C, i, j)
    out = dict.fromkeys(KINDS, 0)
    if algorithm in ("1d", "1.5d"):
        for f in widths:
            for _ in range(2):  # forward A H, backward A^T G
                if R > 1:
                    out["spmm_bcast_dense"] += sum(plan.block_rows(q) * f for q in plan.chunk) * itemsize
                if C > 1:
                    out["spmm_allreduce"] += plan.n_rows * f * itemsize
        if R > 1:
            out["grad"] += num_params * itemsize
    else:
        for layer, f in enumerate(widths):
            hj = split_range(f, C, j)[1] - split_range(f, C, j)[0]
            for nnz in (nnz_fwd, nnz_bwd):
                if R > 1 and hj:
                    out["spmm_bcast_dense"] += n * hj * itemsize
                if C > 1:
                    out["spmm_bcast_sparse"] += sum((plan.n_rows + 1 + k) * 8 + k * 4 for k in nnz)
                    out["gemm_bcast"] += plan.n_rows * f * itemsize  # T forward, G backward
                    if norm and plan.n_rows:
                        out["norm"] += plan.n_rows * 4
        if C > 1:
            out["gemm_bcast"] += plan.n_rows * hidden * itemsize  # the output head's gather
        if P > 1:
            out["grad"] += num_params * itemsize
    return {k: v for k, v in out.items() if v}
