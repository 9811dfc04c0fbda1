"""``bns-gcn``: partition-parallel full-graph training with boundary-vertex sampling.

Written from the BNS-GCN paper (Wan et al., MLSys 2022). Shape legend: N vertices,
n_in inner vertices of this rank, n_b sampled boundary vertices, d layer width.

* METIS (pymetis) assigns every vertex to one rank; rank r owns its *inner*
  vertices and the edges pointing to them. Sources owned by another rank are r's
  *boundary* vertices.
* Every epoch each rank keeps each boundary vertex with probability ``p``
  (``--boundary-rate``, 0.1 as the paper; 1.0 is vanilla partition parallelism),
  tells the owners which ones (all_to_all of ids), and builds its local
  aggregation matrix A_r (n_in, n_in + n_b): weight ``1/deg(v)`` for an inner
  source, ``1/(p deg(v))`` for a sampled boundary source, deg the full-graph
  in-degree. The mean aggregation is then unbiased: E[A_r H] = mean over all neighbors.
* A layer is GraphSAGE-mean (BNS-GCN's model): ``h_v' = W_n mean_u h_u + W_s h_v + b``.
  Each layer exchanges the boundary rows with ``all_to_all`` forward, and their
  gradients backward (:class:`BoundaryExchange`). The rows sent are ``h_u W_n^T``
  (projected first: the same function, width d_out; for sparse input features this
  also avoids sending F-wide rows, see docs/systems.md).
* The loss is the sum of cross-entropy over the rank's training vertices divided
  by the global number of training vertices; weight gradients are summed over the
  ranks (all_reduce), so every step is one full-graph gradient step.
* Evaluation: single-process full-graph inference on rank 0 (as BNS-GCN does).
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from scalegnn.config import RunConfig
from scalegnn.device import to_device
from scalegnn.metrics import accuracy_counts
from scalegnn.settings import setting

from .common import BaselineData, DataParallelTrainer, EpochStats, baseline_data, broadcast_floats
from .graphsage import split_accuracies_local
from .models import FullGraphModel
from .partition import PARTITION_METHODS, partition_vertices

__all__ = ["BNSOptions", "BNSTrainer", "BoundaryExchange", "BNSModel", "make_trainer"]


@dataclass(kw_only=True)
class BNSOptions:
    boundary_rate: float = setting(0.1, help="boundary-vertex sampling rate p (1.0: vanilla partition "
                                   "parallelism, every boundary vertex)")
    partition: str = setting("metis", choices=PARTITION_METHODS, help="vertex partitioning")

    def __post_init__(self):
        if not 0.0 < self.boundary_rate <= 1.0:
            raise ValueError(f"--boundary-rate must be in (0, 1], got {self.boundary_rate}")
        if self.partition not in PARTITION_METHODS:
            raise ValueError(f"--partition must be one of {PARTITION_METHODS}, got {self.partition!r}")


def _a2a(send: torch.Tensor, send_counts: list[int], recv_counts: list[int], tail=()) -> torch.Tensor:
    out = torch.empty((sum(recv_counts), *tail), dtype=send.dtype, device=send.device)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_to_all_single(out, send.contiguous(), recv_counts, send_counts)
    else:
        out.copy_(send)
    return out


class BoundaryExchange(torch.autograd.Function):
    """Forward: rows ``h[send_idx]`` go to their requesters, the requested boundary rows
    come back (n_b, d). Backward: the boundary rows' gradients go back to the owners,
    which add them into ``grad h`` at ``send_idx``."""

    @staticmethod
    def forward(ctx, h, send_idx, send_counts, recv_counts, stats):
        ctx.save_for_backward(send_idx)
        ctx.counts, ctx.n, ctx.stats = (send_counts, recv_counts), h.shape[0], stats
        t0 = time.perf_counter()
        out = _a2a(h[send_idx], send_counts, recv_counts, (h.shape[1],))
        stats["boundary_comm_s"] += time.perf_counter() - t0
        stats["bytes"] += send_idx.numel() * h.shape[1] * h.element_size()
        return out

    @staticmethod
    def backward(ctx, grad_out):
        (send_idx,) = ctx.saved_tensors
        send_counts, recv_counts = ctx.counts
        t0 = time.perf_counter()
        back = _a2a(grad_out, recv_counts, send_counts, (grad_out.shape[1],))
        ctx.stats["boundary_comm_s"] += time.perf_counter() - t0
        ctx.stats["bytes"] += grad_out.numel() * grad_out.element_size()
        grad = torch.zeros(ctx.n, grad_out.shape[1], dtype=grad_out.dtype, device=grad_out.device)
        grad.index_add_(0, send_idx, back)
        return grad, None, None, None, None


def _project(x: torch.Tensor, lin: nn.Linear) -> torch.Tensor:
    w = lin.weight
    return torch.sparse.mm(x, w.t().contiguous()) if x.layout != torch.strided else x @ w.t()


class BNSModel(FullGraphModel):
    """GraphSAGE-mean layers; ``neigh[l]`` carries the bias, ``self_[l]`` none."""

    def __init__(self, in_dim: int, hidden: int, out_dim: int, layers: int, dropout: float):
        super().__init__()
        dims = [in_dim] + [hidden] * (layers - 1) + [out_dim]
        self.neigh = nn.ModuleList(nn.Linear(dims[i], dims[i + 1]) for i in range(layers))
        self.self_ = nn.ModuleList(nn.Linear(dims[i], dims[i + 1], bias=False) for i in range(layers))
        self.dropout = dropout
        self.architecture = dict(in_dim=in_dim, hidden=hidden, out_dim=out_dim, layers=layers, dropout=dropout)

    def logits(self, graph) -> torch.Tensor:
        """Single-process full-graph inference, as its evaluation: every neighbour, weights 1/deg."""
        x, edge_index = self.inputs(graph)
        return self(x, full_mean_operator(edge_index, graph.num_nodes), None)

    def forward(self, x, agg: torch.Tensor, exchange=None):
        """x (n_in, F) dense or CSR; agg (n_in, n_in + n_b) CSR; exchange(P) -> boundary rows."""
        h = x
        for i, (ln, ls) in enumerate(zip(self.neigh, self.self_)):
            p = _project(h, ln)
            ext = torch.cat([p, exchange(p)]) if exchange is not None else p
            h = torch.sparse.mm(agg, ext) + ln.bias + _project(h, ls)
            if i < len(self.neigh) - 1:
                h = F.dropout(F.relu(h), p=self.dropout, training=self.training)
        return h


def full_mean_operator(edge_index: torch.Tensor, n: int) -> torch.Tensor:
    """The (n, n) CSR mean over every in-neighbour (weights 1/deg_in): full-graph inference."""
    src, dst = edge_index
    deg = torch.bincount(dst, minlength=n).clamp(min=1).to(torch.float32)
    return _csr(dst, src, 1.0 / deg[dst], (n, n))


def _csr(rows, cols, vals, shape) -> torch.Tensor:
    order = torch.argsort(rows * shape[1] + cols)
    rows, cols, vals = rows[order], cols[order], vals[order]
    indptr = torch.zeros(shape[0] + 1, dtype=torch.int64)
    indptr[1:] = torch.cumsum(torch.bincount(rows, minlength=shape[0]), 0)
    return torch.sparse_csr_tensor(indptr, cols, vals, shape)


class BNSTrainer(DataParallelTrainer):
    def __init__(self, cfg: RunConfig, data: BaselineData, env):
        opts = cfg.options  # BNSOptions
        self.cfg, self.opts = cfg, opts
        super().__init__(data, env)
        g = data.graph
        n = data.num_nodes
        t0 = time.perf_counter()
        self.part = partition_vertices(g, self.world, opts.partition, cfg.seed)
        self.partition_s = time.perf_counter() - t0
        self.inner = (self.part == self.rank).nonzero().flatten()
        self.n_in = self.inner.numel()
        local = torch.full((n,), -1, dtype=torch.int64)
        local[self.inner] = torch.arange(self.n_in)
        self.local = local
        src, dst = data.edge_index
        deg = torch.bincount(dst, minlength=n).clamp(min=1).to(torch.float32)
        mine = self.part[dst] == self.rank
        src, dst = src[mine], dst[mine]
        self.inv_deg = 1.0 / deg[dst]
        self.e_dst = local[dst]
        inner_src = self.part[src] == self.rank
        self.e_src = src
        self.e_inner = inner_src
        # boundary vertices per owner, sorted
        bnd = src[~inner_src].unique()
        self.need = [bnd[self.part[bnd] == s] for s in range(self.world)]
        self.boundary_total = int(bnd.numel())
        self.features = to_device(select_local(data.features, self.inner), self.device)
        y = g.y[self.inner]
        tmask = torch.zeros(n, dtype=torch.bool)
        tmask[g.train_idx] = True
        if not g.multilabel:
            tmask &= g.y >= 0
        self.train_local = tmask[self.inner].to(self.device)
        self.y = y.to(self.device)
        self.num_train_global = int(tmask.sum())
        self.batch_size = n
        self.steps_per_epoch = 1
        torch.manual_seed(cfg.seed)
        self.model = BNSModel(g.num_features, cfg.model.hidden, g.num_classes, cfg.model.layers, cfg.model.dropout).to(self.device)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay)
        self._full = None
        self.sampled_fraction: list[float] = []

    # ------------------------------------------------------------ per-epoch sampling
    def sample_boundary(self, epoch: int):
        """Keep each boundary vertex with probability p; agree with the owners on the ids.

        Returns (agg CSR (n_in, n_in + n_b), send_idx, send_counts, recv_counts)."""
        p = self.opts.boundary_rate
        rng = np.random.default_rng(np.random.SeedSequence([self.cfg.seed, epoch, self.rank, 77]))
        kept = []
        for s in range(self.world):
            ids = self.need[s]
            if p < 1.0 and ids.numel():
                ids = ids[torch.from_numpy(rng.random(ids.numel()) < p)]
            kept.append(ids)
        recv_counts = [int(k.numel()) for k in kept]  # rows r will receive from each s
        counts = torch.tensor(recv_counts, dtype=torch.int64)
        send_counts_t = _a2a(counts, [1] * self.world, [1] * self.world)
        send_counts = send_counts_t.tolist()
        req = torch.cat(kept) if kept else torch.zeros(0, dtype=torch.int64)
        asked = _a2a(req, recv_counts, send_counts)  # global ids others want from r
        send_idx = self.local[asked]
        assert bool((send_idx >= 0).all()), "a rank asked for a vertex this rank does not own"
        # columns: inner (local ids), then the kept boundary vertices in request order
        col_of = torch.full((self.data.num_nodes,), -1, dtype=torch.int64)
        col_of[self.inner] = torch.arange(self.n_in)
        col_of[req] = self.n_in + torch.arange(req.numel())
        cols = col_of[self.e_src]
        keep = cols >= 0
        vals = torch.where(self.e_inner, self.inv_deg, self.inv_deg / p)[keep]
        agg = _csr(self.e_dst[keep], cols[keep], vals, (self.n_in, self.n_in + req.numel()))
        frac = req.numel() / max(self.boundary_total, 1)
        return agg.to(self.device), send_idx.to(self.device), send_counts, recv_counts, frac

    def train_epoch(self, epoch: int) -> EpochStats:
        comp = defaultdict(float)
        stats = defaultdict(float)
        t0 = time.perf_counter()
        agg, send_idx, send_counts, recv_counts, frac = self.sample_boundary(epoch)
        t1 = time.perf_counter()
        comp["sampling"] = t1 - t0
        self.model.train()

        def exchange(p):
            return BoundaryExchange.apply(p, send_idx, send_counts, recv_counts, stats)

        out = self.model(self.features, agg, exchange if self.world > 1 else None)
        mask = self.train_local
        if self.data.graph.multilabel:
            per = F.binary_cross_entropy_with_logits(out, self.y, reduction="none").mean(1)
        else:
            per = F.cross_entropy(out, self.y.clamp(min=0), reduction="none")
        loss = per[mask].sum() / max(self.num_train_global, 1)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        t2 = time.perf_counter()
        comp["forward_backward"] = t2 - t1 - stats["boundary_comm_s"]
        comp["boundary_comm"] = stats["boundary_comm_s"]
        dp_bytes = 0
        if self.world > 1:
            flat = torch.cat([p.grad.flatten() for p in self.model.parameters()])
            dist.all_reduce(flat)
            dp_bytes = flat.numel() * flat.element_size()
            off = 0
            for p in self.model.parameters():
                p.grad.copy_(flat[off: off + p.numel()].view_as(p))
                off += p.numel()
        t3 = time.perf_counter()
        comp["dp_allreduce"] = t3 - t2
        self.optimizer.step()
        comp["optimizer"] = time.perf_counter() - t3
        c, k = accuracy_counts(out.detach()[mask], self.y[mask]) if bool(mask.any()) else (0.0, 0.0)
        local_loss = float(per.detach()[mask].sum())
        return EpochStats(loss_sum=local_loss, loss_n=int(mask.sum()), correct=c, count=k,
                          components=dict(comp),
                          comm_bytes={"boundary": int(stats["bytes"]), "dp": dp_bytes},
                          extra={"boundary_sampled_fraction": frac})

    # --------------------------------------------------------------- evaluation
    @torch.no_grad()
    def full_logits(self) -> torch.Tensor:
        """Single-process full-graph inference: every neighbor, weights 1/deg."""
        if self._full is None:
            self._full = full_mean_operator(self.data.edge_index, self.data.num_nodes).to(self.device)
        self.model.eval()
        return self.model(to_device(self.data.features, self.device), self._full, None).cpu()

    def evaluate(self):
        accs = list(split_accuracies_local(self.full_logits(), self.data.graph)) if self.rank == 0 else None
        return tuple(broadcast_floats(accs, 3))

    def record_extra(self) -> dict:
        return {"partition_s": self.partition_s}


def select_local(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    from scalegnn.csr import select_rows

    return select_rows(x, rows)


def make_trainer(cfg: RunConfig, graph, env) -> BNSTrainer:
    """This rank's trainer (the registry's ``trainer`` of --system bns-gcn)."""
    return BNSTrainer(cfg, baseline_data(cfg, graph), env)
