"""``cagnet-1d``, ``cagnet-1.5d``, ``cagnet-2d``: CAGNET's full-graph GCN training.

Written from Tripathy, Yelick and Buluc, "Reducing Communication in Graph Neural
Network Training" (SC20), section IV; the operators and their collectives are in
:mod:`scalegnn.baselines.cagnet_ops` (read its docstring for the layouts and the shape legend).

Model. The GCN of the serial full-graph reference (:class:`scalegnn.model.ScaleGNN`
with B = N: input projection, L x [SpMM, GEMM, RMSNorm, ReLU, dropout, residual],
output head; ``--no-norm``/``--no-residual`` are ScaleGNN's flags only, so CAGNET runs
train with the defaults), with the same initial weights (built from the same seed)
and the same dropout masks (:func:`scalegnn.functional.dropout_keep_mask`, a function of
global vertex and hidden ids). Every weight is replicated on every process (Table II);
every SpMM is CAGNET's. Per layer, on process P(i, j):

    1D / 1.5D (block rows n_i, all h columns, replicated over the process row):
        T_i = SpMM15D(H_i)                  Alg. 1 / Alg. 2: broadcasts + row all-reduce
        Z_i = T_i W                         local (W replicated)
        H'_i = dropout(relu(rmsnorm(Z_i))) + H_i     local
    2D (blocks n_i x h_j):
        T_ij = SUMMA(A, H)_ij               Alg. 3 phase 1: A and H broadcasts
        Z_ij = T_i: W[:, cols_j]            Alg. 3 phase 2 ("partial SUMMA"): T broadcasts
        RMSNorm with the row sum of squares all-reduced in the process row; the rest
        element-wise on the block
    Input projection X_i W_in[:, cols_j] (the feature rows of block i are read on every
    process of row i); output head O_i = H_i: W_out (2D: one more row gather), each
    process of row i computing the same O_i and loss rows.

Backward (paper Eqs. 2-3), derived per operator in :mod:`scalegnn.baselines.cagnet_ops`: the
SpMM's backward runs the same algorithm on A^T and the complete G = dZ (the paper's
A G^l; it stores A^T in 1D/1.5D, and in 2D this code stores the 2D blocks of A^T too,
where the paper, for undirected graphs, uses A = A^T); the weight gradient
Y = H^T (A G) is each process's local contribution, summed by one all-reduce of all
parameters per step (1D/1.5D: within the process column; 2D: over all P). Loss:
each process sums its rows' cross-entropy (or BCE) and divides by the global count of
training labels (the serial mean); reported sums are divided by the replication
(the c or pc processes that hold the same rows).

Communication is recorded per step and per rank by kind (``comm_bytes`` of every
epoch row: rank 0's; ``cagnet.comm_bytes_per_step_per_rank``: every rank's, from the
first epoch) next to the analytic volume of
:func:`scalegnn.baselines.cagnet_ops.analytic_comm_bytes` (``cagnet.analytic_...``), which the
tests hold equal byte for byte.

3D. CAGNET's Split-3D-SpMM (section IV-D) is *not* covered by the repository's 3D PMM
path (``fullgraph-3d``, the Plexus algorithm of :mod:`scalegnn.parallel.products`): both put
processes on a 3D mesh, but Plexus keeps every operand stationary and only all-reduces
partial sums along one axis per multiplication (the layer rotation), while Split-3D
runs 2D SUMMA per layer of the mesh (broadcasting blocks of the sparse A and of H
within each plane) and reduce-scatters along the fiber, with a partial 3D SUMMA for
H W and an all-gather of the weight gradient. Their volumes differ (Split-3D moves
nnz(A)/P^(2/3) of the sparse matrix per SpMM, Plexus none), so ``fullgraph-3d``'s
numbers cannot stand for CAGNET-3D; the paper did not evaluate its 3D algorithm
either (section IV-D is analysis only). It is not built here.

Components of an epoch (one step): ``compute`` (forward and backward less their
collectives), ``comm`` (the collectives of the SpMMs, GEMMs and norms), ``grad_allreduce``
and ``optimizer``. The record's ``grid`` is the harness's data-parallel field of every
baseline ({dp: P}); CAGNET's own process grid is ``cagnet.process_grid`` ([R, C]).

Evaluation: one distributed forward (eval mode) over the whole graph with the same
algorithm; the accuracy counts are summed over one replica of each block row.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from scalegnn.config import RunConfig
from scalegnn.device import resolve_backend, synchronize, to_device
from scalegnn.optim import make_optimizer
from scalegnn.functional import dropout_keep_mask, rms_norm
from scalegnn.metrics import accuracy_counts
from scalegnn.model import ModelConfig, ScaleGNN, dropout_key
from scalegnn.parallel.collectives import CommStats
from scalegnn.parallel.grid import ProcessGrid
from scalegnn.csr import select_rows
from scalegnn.sampling import train_mask_of
from scalegnn.settings import setting

from . import cagnet_ops as ops
from .common import DataParallelTrainer, EpochStats, baseline_data, split_accuracies

__all__ = ["Cagnet1DOptions", "Cagnet15DOptions", "Cagnet2DOptions", "CagnetGCN", "CagnetTrainer", "SYSTEM_ALGORITHM",
           "make_trainer"]

SYSTEM_ALGORITHM = {"cagnet-1d": "1d", "cagnet-1.5d": "1.5d", "cagnet-2d": "2d"}


@dataclass(kw_only=True)
class Cagnet1DOptions:
    """1D block rows over the P processes: no settings of its own."""


@dataclass(kw_only=True)
class Cagnet15DOptions:
    c: int = setting(2, flag="--replication", help="replication factor c: a P/c x c process grid (c must divide P; "
                     "c = 1 is the 1D algorithm)")

    def __post_init__(self):
        if self.c < 1:
            raise ValueError(f"--replication must be >= 1, got {self.c}")

    def check_world(self, world: int) -> None:
        """Refuse a c that does not divide the process count, before any data is loaded."""
        ops.process_grid_shape("1.5d", world, self.c)


@dataclass(kw_only=True)
class Cagnet2DOptions:
    process_grid: str = setting("auto", metavar="PRxPC", help="the pr x pc process grid (pr * pc = P); auto: the "
                                "most square one, pr >= pc")

    def __post_init__(self):
        ops.parse_process_grid(self.process_grid)

    def check_world(self, world: int) -> None:
        """Refuse a --process-grid whose size is not the process count, before any data is loaded."""
        ops.process_grid_shape("2d", world, grid2d=ops.parse_process_grid(self.process_grid))


def grid_of(algorithm: str, world: int, options) -> tuple[int, int]:
    c = getattr(options, "c", 1)
    g2 = ops.parse_process_grid(getattr(options, "process_grid", "auto"))
    return ops.process_grid_shape(algorithm, world, c, g2)


class CagnetGCN:
    """The serial model's parameters, replicated, and CAGNET's distributed forward.

    ``graph``: GCN-normalized; ``grid``: 1 x R x C x 1 (or single); the parameters are
    those of ``ScaleGNN(F, classes, config, seed)`` on ``device``.
    """

    def __init__(self, graph, algorithm: str, grid: ProcessGrid, config: ModelConfig, seed: int, device,
                 stats: CommStats | None = None, features: torch.Tensor | None = None):
        if config.pre_norm:  # its layer loop is the paper's (post-convolution norm) only
            raise ValueError("CAGNET runs the paper's post-convolution RMSNorm only: drop --norm-position pre")
        self.algorithm, self.grid, self.config, self.device, self.stats = algorithm, grid, config, device, stats
        self.plan = ops.CagnetPlan.of(algorithm, graph.num_nodes, config.hidden, grid)
        self.module = ScaleGNN(graph.num_features, graph.num_classes, config, seed=seed).to(device)
        adj = graph.to_scipy().tocsr()
        adj_t = adj.T.tocsr()
        self.blocks = ops.local_blocks(adj, adj_t, self.plan, device)
        self._row_nnz = {}  # 2D: per process row, the stage nonzeros of A and A^T (the analytic volume of any rank)
        if algorithm == "2d":
            for i in range(self.plan.R):
                p = ops.CagnetPlan(algorithm, self.plan.n, self.plan.hidden, self.plan.R, self.plan.C, i, 0)
                self._row_nnz[i] = (ops.stage_nnz(adj, p), ops.stage_nnz(adj_t, p))
        r0, r1 = self.plan.rows
        self.row_ids = torch.arange(r0, r1, device=device)
        x = features if features is not None else graph.x
        self.x = to_device(select_rows(x, torch.arange(r0, r1)), device)
        self.y = graph.y[r0:r1].to(device)
        self.train_mask = train_mask_of(graph)[r0:r1].to(device)
        self.num_train = int(train_mask_of(graph).sum())
        self.num_classes = graph.num_classes
        self.multilabel = graph.multilabel

    def parameters(self):
        return list(self.module.parameters())

    def forward(self, training: bool, dropout_seed: int = 0, step: int = 0) -> torch.Tensor:
        """Logits (n_i, classes) of this rank's block rows (every class)."""
        m, cfg, plan, grid, stats = self.module, self.config, self.plan, self.grid, self.stats
        c0, c1 = plan.cols
        cols = torch.arange(c0, c1, device=self.device)
        two_d = self.algorithm == "2d"
        h = self.x @ m.w_in[:, c0:c1]
        for layer in range(cfg.layers):
            if two_d:
                t = ops.spmm_2d(h, self.blocks, plan, grid, stats)
                z = ops.row_gather_gemm(t, m.w[layer], plan, grid, stats)
            else:
                z = ops.spmm_15d(h, self.blocks, plan, grid, stats) @ m.w[layer]
            if cfg.norm:
                gain = m.norm[layer][c0:c1]
                sum_sq = ops.row_sum_sq(z, grid, stats) if two_d else None
                z = rms_norm(z, gain, cfg.norm_eps, sum_sq=sum_sq, dim=cfg.hidden if two_d else None)
            z = torch.relu(z)
            if training and cfg.dropout > 0:
                keep = dropout_keep_mask(dropout_key(dropout_seed, step, layer), self.row_ids, cols, cfg.dropout)
                z = z * keep / (1.0 - cfg.dropout)
            h = z + h if cfg.residual else z
        if two_d:
            return ops.row_gather_head(h, m.w_out, plan, grid, stats)
        return h @ m.w_out

    def loss(self, logits: torch.Tensor) -> torch.Tensor:
        """This rank's share of the serial mean loss over the training labels: the sum
        over its training rows divided by the global count (every replica of a block row
        holds the same share and the same complete gradient)."""
        mask = self.train_mask
        if self.multilabel:
            total = F.binary_cross_entropy_with_logits(logits[mask], self.y[mask], reduction="sum")
            return total / max(self.num_train * self.num_classes, 1)
        return F.cross_entropy(logits[mask], self.y[mask], reduction="sum") / max(self.num_train, 1)

    def sync_grads(self) -> None:
        ops.all_reduce_grads(self.parameters(), self.algorithm, self.grid, self.stats)

    @property
    def is_first_replica(self) -> bool:
        return self.plan.j == 0

    def analytic_bytes(self, rank: int) -> dict:
        """:func:`scalegnn.baselines.cagnet_ops.analytic_comm_bytes` of ``rank`` for this model and graph."""
        kw = {}
        if self.algorithm == "2d":
            kw = dict(nnz_fwd=self._nnz_of(rank, 0), nnz_bwd=self._nnz_of(rank, 1), grid2d=(self.plan.R, self.plan.C))
        return ops.analytic_comm_bytes(self.algorithm, rank, n=self.plan.n,
                                       widths=[self.config.hidden] * self.config.layers,
                                       num_params=sum(p.numel() for p in self.parameters()),
                                       P=self.plan.R * self.plan.C, c=self.plan.C, norm=self.config.norm, **kw)

    def _nnz_of(self, rank: int, which: int) -> list[int]:
        return self._row_nnz[rank // self.plan.C][which]


class CagnetTrainer(DataParallelTrainer):
    """One full-graph step per epoch with one of CAGNET's algorithms (``cfg.system``)."""

    def __init__(self, cfg: RunConfig, data, env):
        self.cfg = cfg
        self.algorithm = SYSTEM_ALGORITHM[cfg.system]
        super().__init__(data, env)
        R, C = grid_of(self.algorithm, self.world, cfg.options)
        if self.world > 1:
            grid = ProcessGrid(1, R, C, 1, backend=resolve_backend(cfg.parallel.backend, self.device))
        else:
            grid = ProcessGrid.single()
        graph = data.graph.gcn_normalize()
        self.graph = graph
        self.stats = CommStats(device=self.device)
        self.model = CagnetGCN(graph, self.algorithm, grid, cfg.model, cfg.seed, self.device, self.stats,
                               features=data.features)
        self.optimizer, self.scheduler = make_optimizer(self.model.parameters(), cfg.optim, cfg.loop.epochs)
        self.batch_size, self.steps_per_epoch = graph.num_nodes, 1
        self.process_grid = (R, C)
        self.bytes_per_rank: list | None = None

    def train_epoch(self, epoch: int) -> EpochStats:
        self.stats.reset()
        synchronize(self.device)
        t0 = time.perf_counter()
        logits = self.model.forward(True, self.cfg.seed, epoch - 1)
        loss = self.model.loss(logits)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        synchronize(self.device)
        t1 = time.perf_counter()
        self.model.sync_grads()
        synchronize(self.device)
        t2 = time.perf_counter()
        self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        synchronize(self.device)
        t3 = time.perf_counter()
        snap = self.stats.snapshot()
        comm_s = sum(v for k, v in snap["seconds"].items() if k != "grad")  # the SpMMs' and GEMMs' collectives
        components = {"compute": max(t1 - t0 - comm_s, 0.0), "comm": comm_s, "grad_allreduce": t2 - t1,
                      "optimizer": t3 - t2}
        if self.bytes_per_rank is None:  # the step's bytes of every rank (once: every step moves the same)
            mine = dict(snap["bytes"])
            self.bytes_per_rank = self._gather(mine)
        rep = self.model.plan.replication
        mask = self.model.train_mask
        correct, count = accuracy_counts(logits.detach()[mask], self.model.y[mask]) if bool(mask.any()) else (0.0, 0)
        return EpochStats(loss_sum=float(loss.detach()) / rep, loss_n=1 if self.rank == 0 else 0,
                          correct=correct / rep, count=count / rep, components=components,
                          comm_bytes=dict(snap["bytes"]), seconds=t3 - t0)

    def _gather(self, obj) -> list:
        if self.world == 1:
            return [obj]
        out = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    @torch.no_grad()
    def saved_model(self):
        """The serial ScaleGNN whose parameters every rank holds whole (CAGNET replicates them)."""
        return self.model.module if self.cfg.loop.save_model and self.rank == 0 else None

    def evaluate(self):
        logits = self.model.forward(False).cpu()
        r0, r1 = self.model.plan.rows
        nodes = torch.arange(r0, r1) if self.model.is_first_replica else torch.arange(0)
        return split_accuracies(logits, self.graph, nodes)

    def record_extra(self) -> dict:
        return {"cagnet": {
            "algorithm": self.algorithm, "process_grid": list(self.process_grid),
            "comm_bytes_per_step_per_rank": self.bytes_per_rank,
            "analytic_comm_bytes_per_step_per_rank": [self.model.analytic_bytes(r) for r in range(self.world)],
        }}


def make_trainer(cfg: RunConfig, graph, env) -> CagnetTrainer:
    """This rank's trainer (the registry's ``trainer`` of cagnet-1d, cagnet-1.5d and cagnet-2d)."""
    return CagnetTrainer(cfg, baseline_data(cfg, graph), env)
