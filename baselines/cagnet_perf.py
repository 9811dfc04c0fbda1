"""Performance model of one CAGNET training step (= one full-graph epoch) on a cluster.

The same machine constants and placement rule as ScaleGNN's model
(:mod:`scalegnn.perfmodel`), applied to the collectives that
:mod:`scalegnn.baselines.cagnet_ops` issues, counted from its own plan
(:class:`~scalegnn.baselines.cagnet_ops.CagnetPlan`: the block rows, 1.5D's chunks, 2D's
stages), so the model's bytes are the recorded bytes (a test holds them equal to
:func:`~scalegnn.baselines.cagnet_ops.analytic_comm_bytes` on every rank's plan of an
even graph).

Placement. CAGNET's R x C process grid is the 4D grid ``1 x R x C x 1``: rank
``i C + j`` sits at x = i (the process column: R processes with different block rows)
and y = j (the process row: 1.5D's c replicas, 2D's column blocks), which is how
:class:`~scalegnn.parallel.grid.ProcessGrid` numbers ranks; the bandwidth of each axis
is :func:`scalegnn.perfmodel.axis_bandwidth`'s.

Costs (alpha-beta, as CAGNET's section IV analysis): a broadcast of M bytes among n
processes ``ceil(log2 n) alpha + M / beta`` (the paper's cost of a broadcast, the
latency of a binomial tree with a pipelined payload); a ring all-reduce
``2 (n-1) alpha + 2 (n-1)/n M / beta`` (as :mod:`scalegnn.perfmodel`). Compute per
rank: SpMM ``2 nnz_local f`` per product (forward A H, backward A^T G) at the
profile's SpMM rate, with the graph's nonzeros spread evenly over the blocks (the
model's one assumption about the graph; the recorded bytes use the real blocks); the
dense products at the GEMM rate. There is no sampling term: CAGNET trains on the
full graph, one step per epoch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scalegnn.perfmodel import Machine, Workload, axis_bandwidth, oversubscription

from .cagnet_ops import CagnetPlan, process_grid_shape

__all__ = ["CagnetCollective", "step_collectives", "predicted_bytes_per_step", "step_times", "configurations"]


@dataclass(frozen=True)
class CagnetCollective:
    axis: str  # "x" (process column), "y" (process row) or "world"
    kind: str  # the CommStats kind cagnet_ops records it under
    op: str  # "broadcast" | "all_reduce"
    nbytes: float


def _plan(algorithm: str, w: Workload, P: int, c: int, grid2d, rank: int) -> CagnetPlan:
    R, C = process_grid_shape(algorithm, P, c, grid2d)
    i, j = divmod(rank, C)
    return CagnetPlan(algorithm, w.num_nodes, w.hidden, R, C, i, j)


def _num_params(w: Workload) -> int:
    h = w.hidden
    return w.num_features * h + w.layers * (h * h + (h if w.norm else 0)) + h * w.num_classes


def step_collectives(algorithm: str, w: Workload, P: int, c: int = 2, grid2d: tuple[int, int] | None = None,
                     rank: int = 0) -> list[CagnetCollective]:
    """Every collective ``rank`` takes part in during one step, in cagnet_ops' order of
    kinds (not of time); 4-byte floats, 2D's sparse pieces as CSR (8-byte row pointers
    and column indices, 4-byte values) with the even-spread nonzero count."""
    p = _plan(algorithm, w, P, c, grid2d, rank)
    R, C, n, ni = p.R, p.C, p.n, p.n_rows
    out: list[CagnetCollective] = []

    def add(axis, kind, op, nbytes, size):
        if size > 1 and nbytes > 0:
            out.append(CagnetCollective(axis, kind, op, float(nbytes)))

    f = w.hidden
    for _layer in range(w.layers):
        for _direction in ("forward A H", "backward A^T G"):
            if algorithm in ("1d", "1.5d"):
                for q in p.chunk:  # Algorithm 2: the chunk's block rows, each broadcast down the process column
                    add("x", "spmm_bcast_dense", "broadcast", p.block_rows(q) * f * 4, R)
                add("y", "spmm_allreduce", "all_reduce", ni * f * 4, C)
            else:
                hj = p.hid_cols(p.j)
                for a, b, _owner_col, _owner_row in p.stages:  # Algorithm 3: A's piece along the row, H's down
                    k = w.nnz * (ni / n) * ((b - a) / n)
                    add("y", "spmm_bcast_sparse", "broadcast", (ni + 1 + k) * 8, C)  # [indptr; indices]
                    add("y", "spmm_bcast_sparse", "broadcast", k * 4, C)  # values
                    add("x", "spmm_bcast_dense", "broadcast", (b - a) * hj * 4, R)
                for col in range(C):  # partial SUMMA: the row's T (forward) or G (backward) blocks
                    add("y", "gemm_bcast", "broadcast", ni * p.hid_cols(col) * 4, C)
                if w.norm and ni:
                    add("y", "norm", "all_reduce", ni * 4, C)
    if algorithm == "2d":
        for col in range(C):  # the output head's gather of the last hidden blocks
            add("y", "gemm_bcast", "broadcast", ni * p.hid_cols(col) * 4, C)
        add("world", "grad", "all_reduce", _num_params(w) * 4, P)
    else:
        add("x", "grad", "all_reduce", _num_params(w) * 4, R)
    return out


def predicted_bytes_per_step(algorithm: str, w: Workload, P: int, c: int = 2, grid2d=None, rank: int = 0) -> dict:
    """Bytes ``rank`` hands to each kind of collective per step (the record's ``comm_bytes``)."""
    out: dict[str, float] = {}
    for col in step_collectives(algorithm, w, P, c, grid2d, rank):
        out[col.kind] = out.get(col.kind, 0.0) + col.nbytes
    return out


def _compute(algorithm: str, w: Workload, p: CagnetPlan) -> tuple[float, float]:
    """(SpMM flops, GEMM flops) of one step on the rank of plan ``p``."""
    n, ni, f = p.n, p.n_rows, w.hidden
    if algorithm == "2d":
        inner, cols = 1.0, p.hid_cols(p.j)  # every stage of the inner dimension, on the rank's hidden block
    else:
        inner, cols = sum(p.block_rows(q) for q in p.chunk) / n, f  # 1.5D: the chunk's share of A_i:
    spmm = w.layers * 2 * 2.0 * w.nnz * (ni / n) * inner * cols  # forward and backward
    gemm = w.layers * 3 * 2.0 * ni * f * cols  # Z = T W, dT, dW
    gemm += 2 * 2.0 * ni * w.num_features * cols  # input projection and its weight gradient
    gemm += 3 * 2.0 * ni * f * w.num_classes  # the head, on every replica of the block row
    return spmm, gemm


def step_times(algorithm: str, w: Workload, P: int, machine: Machine, c: int = 2,
               grid2d: tuple[int, int] | None = None) -> dict:
    """The terms of :data:`scalegnn.perfmodel.TERMS` for one step, in seconds: the slowest
    rank's (the 1.5D chunks and uneven splits differ between ranks)."""
    if w.batch_size is not None:
        raise ValueError("CAGNET trains on the full graph: build the Workload with batch_ratio=1.0")
    R, C = process_grid_shape(algorithm, P, c, grid2d)
    grid = (1, R, C, 1)
    sizes = {"x": R, "y": C, "world": P}
    best = None
    for rank in range(P):
        bw = lat = 0.0
        for col in step_collectives(algorithm, w, P, c, grid2d, rank):
            n = sizes[col.axis]
            if col.axis == "world":  # the slower of the two axes carries the world's ring
                beta = min(axis_bandwidth(grid, a, machine)[0] for a in ("x", "y") if sizes[a] > 1)
            else:
                beta = axis_bandwidth(grid, col.axis, machine)[0]
            if col.op == "broadcast":
                bw += col.nbytes / beta
                lat += math.ceil(math.log2(n)) * machine.latency_s
            else:
                bw += 2 * (n - 1) / n * col.nbytes / beta
                lat += 2 * (n - 1) * machine.latency_s
        spmm, gemm = _compute(algorithm, w, _plan(algorithm, w, P, c, grid2d, rank))
        over = oversubscription(grid, machine)
        terms = {"bandwidth": bw, "latency": lat,
                 "compute": over * (spmm / machine.spmm_flops + gemm / machine.gemm_flops),
                 "sampling": 0.0, "overhead": over * machine.step_overhead_s}
        if best is None or sum(terms.values()) > sum(best.values()):
            best = terms
    return best


def configurations(P: int) -> list[tuple[str, dict]]:
    """Every CAGNET configuration of ``P`` processes: 1D, 1.5D for each c > 1 dividing
    P, 2D for each pr x pc = P with pr >= pc; as (system name, keyword arguments)."""
    out: list[tuple[str, dict]] = [("cagnet-1d", {})]
    out += [("cagnet-1.5d", {"c": c}) for c in range(2, P + 1) if P % c == 0]
    out += [("cagnet-2d", {"grid2d": (P // pc, pc)}) for pc in range(1, P + 1) if P % pc == 0 and P // pc >= pc]
    return out
