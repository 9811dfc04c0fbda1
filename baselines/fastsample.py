"""``fastsample``: FastSample, written from the paper's text (``../shared/papers/fastsample.txt``;
its sections and Algorithm 1 are cited below).

Shape legend: N vertices, F features, P ranks, B seeds per rank and step, L layers,
n_0 the input vertices of a step's sample, R the remote ones among them.

The two techniques of the paper, and the rest as it describes it:

* **Hybrid partitioning (section 3.3).** The graph *topology* (the CSC adjacency,
  :class:`scalegnn.baselines.fastsample_kernel.TopologyCSC`) is replicated on every rank; the
  node *features* and labels are partitioned by vertex: ``part (N,)`` from METIS
  (pymetis; the paper uses the metis library) or at random, then the training
  (labeled) vertices rebalanced so every rank owns the same number within one (the
  paper: "we also assign roughly the same number of labeled nodes to each
  partition"), :func:`hybrid_placement`. Each rank draws its seeds from the training
  vertices it owns, so "each machine stores the node features of the seed nodes
  allocated to it". Sampling is then local on every rank: no topology communication.
* **Per step, two rounds of communication** (the paper's 2 instead of 2L; collectives
  only, ``all_to_all``, as the paper uses torch_ccl's): round 1 sends the ids of the
  remote input vertices to their owners, round 2 replies with their feature rows
  (:class:`FeatureExchange`). The split sizes of round 1 travel in one small
  all_to_all before it (P int64 per rank), recorded as its own kind
  (``feature_sizes``); round 2's sizes are known from round 1. The exchange runs on the
  training device (so NCCL carries it on GPUs, gloo on CPU).
* **Fused sampling kernel (section 3.2, Algorithm 1).** All L levels sampled, counted
  and relabeled into per-layer CSC blocks in one compiled call
  (:mod:`scalegnn.baselines.fastsample_kernel`: numba, its draw loop over ``--sampler-threads``
  threads, with a torch path giving the same blocks bit for bit). Sampling semantics are
  DGL's message flow graphs: each level samples ``min(fanout, deg)`` in-neighbors of
  every vertex of V^l without replacement, uniformly. (PyG's NeighborLoader over
  torch-sparse, which ``graphsage`` and ``salient`` use, means the same law but draws
  Floyd's positions from [0, m) instead of [0, m]: not uniform, rusty1s/pytorch_sparse#385;
  ``tests/baselines/test_fastsample.py`` shows it.)
* **Model and training (section 4).** GraphSAGE (``SAGEConv`` mean, the
  :class:`scalegnn.baselines.models.SAGENet` of ``graphsage``), one block per layer, DDP over the
  ranks. Paper defaults: 3 layers, hidden 256, dropout between layers, batch 1000 per
  machine, lr 0.006 (the common ``--lr``: pass ``--lr 0.006`` to follow the paper;
  the default stays the harness's). Fanouts: the paper sweeps several; the default is
  ``graphsage``'s 15,10,5 so the two compare at equal fanouts.

Communication recorded per step (epoch rows: ``comm_bytes`` = bytes this rank handed to
the collectives by kind, the house convention; ``fastsample`` = per-step rounds, bytes
sent and received by kind, and the bytes a partitioned-topology sampler would have
moved for the same samples, :func:`topology_sampler_traffic`: its 2(L-1) sampling
rounds plus the same 2 feature rounds, 2L in all, as the paper counts them).

Evaluation: neighbor-sampled inference (fanouts 20,20,20 as ``graphsage``) with the
same sampler and exchange, each rank over the labeled vertices it owns.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from scalegnn.config import RunConfig
from scalegnn.device import to_device
from scalegnn.model import node_loss
from scalegnn.sampling import select_rows
from scalegnn.settings import int_tuple, setting

from .common import (BaselineData, DataParallelTrainer, EpochStats, all_reduce_sum, backward_and_step, baseline_data,
                     ddp, owned_eval_batches, split_accuracies)
from .fastsample_kernel import SampledBlocks, Scratch, TopologyCSC, available, sample_blocks, step_key
from .graphsage import DEFAULT_EVAL_FANOUTS, DEFAULT_FANOUTS, fanouts_for
from .models import SAGENet
from .partition import PARTITION_METHODS, partition_vertices

__all__ = ["FastSampleOptions", "FastSampleTrainer", "FeatureExchange", "hybrid_placement", "topology_sampler_traffic",
           "blocks_forward", "make_trainer", "EXCHANGE_KINDS"]

EXCHANGE_KINDS = ("feature_sizes", "feature_ids", "feature_rows")
EVAL_KEY = 0x6576616C  # the "epoch" word of evaluation sampling keys


@dataclass(kw_only=True)
class FastSampleOptions:
    fanouts: tuple | None = setting(None, type=int_tuple, metavar="F1,F2,...",
                                    help="neighbor-sampling fanouts, seeds' hop first (default 15,10,5, cut or "
                                    "padded to --layers; -1 = all neighbors)")
    batch_size: int = setting(1000, help="seed vertices per step (per rank; the paper's 1000)")
    eval_fanouts: tuple | None = setting(None, type=int_tuple, metavar="F1,F2,...",
                                         help="fanouts of sampled evaluation (default 20,20,20)")
    eval_batch_size: int = setting(4096, help="seeds per batch of sampled evaluation")
    partition: str = setting("metis", choices=PARTITION_METHODS, help="vertex partitioning of the features")
    kernel: str = setting("auto", choices=("auto", "numba", "torch"),
                          help="the fused sampler: the numba kernel, the torch path (same samples), or auto")
    sampler_threads: int = setting(1, help="threads of the numba kernel's draw loop (the paper parallelizes it; "
                                   "the samples do not depend on it)")

    def __post_init__(self):
        if self.partition not in PARTITION_METHODS:
            raise ValueError(f"--partition must be one of {PARTITION_METHODS}, got {self.partition!r}")
        if self.kernel not in ("auto", "numba", "torch"):
            raise ValueError(f"--kernel must be auto, numba or torch, got {self.kernel!r}")
        if self.batch_size < 1 or self.eval_batch_size < 1:
            raise ValueError("--batch-size and --eval-batch-size must be >= 1")
        if self.sampler_threads < 1:
            raise ValueError(f"--sampler-threads must be >= 1, got {self.sampler_threads}")
        for name in ("fanouts", "eval_fanouts"):
            f = getattr(self, name)
            if f and any(int(k) == 0 or int(k) < -1 for k in int_tuple(f)):
                raise ValueError(f"--{name.replace('_', '-')} takes positive fanouts or -1 (all), got {f}")


# --------------------------------------------------------------------------- placement
def hybrid_placement(graph, world: int, method: str, seed: int, train_idx: torch.Tensor) -> torch.Tensor:
    """``part (N,)``: the rank storing each vertex's features and label.

    A vertex partition (METIS or random, :func:`scalegnn.baselines.partition.partition_vertices`),
    then the training vertices rebalanced: while a rank owns more than
    ``ceil(T / P)`` of the T training vertices, its highest-numbered ones move to the
    ranks owning fewer than ``floor(T / P)`` (lowest rank first) until every rank owns
    ``floor`` or ``ceil``. Deterministic; the topology is not partitioned at all.
    """
    part = partition_vertices(graph, world, method, seed).clone()
    if world == 1 or train_idx.numel() == 0:
        return part
    t = train_idx.numel()
    lo, hi = t // world, -(-t // world)
    counts = torch.bincount(part[train_idx], minlength=world)
    surplus = []  # training vertices to move, from the ranks above their share
    for r in range(world):
        mine = torch.sort(train_idx[part[train_idx] == r]).values
        keep = hi if counts[r] > hi else int(counts[r])
        surplus.extend(mine[keep:].tolist())
        counts[r] = min(int(counts[r]), keep)
    extra = t - int(counts.sum())  # == len(surplus)
    for r in range(world):  # fill to floor first, then to ceil while vertices remain
        while counts[r] < lo and surplus:
            part[surplus.pop()] = r
            counts[r] += 1
    for r in range(world):
        if counts[r] < hi and surplus:
            part[surplus.pop()] = r
            counts[r] += 1
    assert not surplus and extra >= 0, "placement: training vertices left over"
    return part


# --------------------------------------------------------------------------- the exchange
class FeatureExchange:
    """This rank's feature rows and the two-round fetch of the rows it lacks.

    ``gather(n_id)`` returns the (n, F) dense float32 rows of ``n_id`` on ``device``
(CSR features stay CSR in memory and are densified row by row as they are read):
    the owned ones from local memory; the others, sorted by owner, requested in round 1
    (``all_to_all`` of their ids) and received in round 2 (``all_to_all`` of the rows the
    owners read). A collective: every rank calls it the same number of times (with an
    empty ``n_id`` when it has nothing to fetch). ``stats`` accumulates bytes sent and
    received and rounds per kind (:data:`EXCHANGE_KINDS`).
    """

    def __init__(self, features: torch.Tensor, part: torch.Tensor, rank: int, world: int, device):
        self.rank, self.world, self.part = rank, world, part
        self.device = torch.device(device)
        self.width = features.shape[1]
        owned = (part == rank).nonzero().flatten()
        self.local = select_rows(features, owned)  # dense, or CSR (bag-of-words) kept sparse
        self.sparse = self.local.layout != torch.strided
        self.slot = torch.full((part.numel(),), -1, dtype=torch.int64)
        self.slot[owned] = torch.arange(owned.numel())
        self.sent: dict = defaultdict(int)
        self.received: dict = defaultdict(int)
        self.rounds: dict = defaultdict(int)

    def _rows(self, vertices: torch.Tensor) -> torch.Tensor:
        """Dense float32 rows of owned ``vertices`` (global ids)."""
        rows = select_rows(self.local, self.slot[vertices])
        return (rows.to_dense() if self.sparse else rows).to(torch.float32)

    def _a2a(self, kind: str, out: torch.Tensor, inp: torch.Tensor, out_split=None, in_split=None) -> None:
        dist.all_to_all_single(out, inp, out_split, in_split)
        self.sent[kind] += inp.numel() * inp.element_size()
        self.received[kind] += out.numel() * out.element_size()
        self.rounds[kind] += 1

    def gather(self, n_id: torch.Tensor) -> torch.Tensor:
        dev = self.device
        owner = self.part[n_id]
        is_local = owner == self.rank
        x = torch.empty(n_id.numel(), self.width, device=dev)
        loc = is_local.nonzero().flatten()
        x[loc.to(dev)] = self._rows(n_id[loc]).to(dev)
        if self.world == 1:
            return x
        rem = (~is_local).nonzero().flatten()
        order = torch.argsort(owner[rem], stable=True)
        rem = rem[order]
        want = n_id[rem]
        counts = torch.bincount(owner[rem], minlength=self.world)
        peer = torch.empty_like(counts, device=dev)
        self._a2a("feature_sizes", peer, counts.to(dev))  # the split sizes of round 1
        peer = peer.cpu()
        asked = torch.empty(int(peer.sum()), dtype=torch.int64, device=dev)
        self._a2a("feature_ids", asked, want.to(dev), peer.tolist(), counts.tolist())  # round 1: requests
        rows = self._rows(asked.cpu()).to(dev)
        got = torch.empty(want.numel(), self.width, device=dev)
        self._a2a("feature_rows", got, rows.contiguous(), counts.tolist(), peer.tolist())  # round 2: replies
        x[rem.to(dev)] = got
        return x

    def snapshot(self) -> dict:
        return {"sent": dict(self.sent), "received": dict(self.received), "rounds": dict(self.rounds)}

    def reset(self) -> None:
        self.sent.clear()
        self.received.clear()
        self.rounds.clear()


def topology_sampler_traffic(batch: SampledBlocks, part: torch.Tensor, rank: int, width: int,
                             feature_bytes: int = 4) -> dict:
    """What a sampler over a *partitioned* topology (DistDGL's; paper section 3.3, Fig. 3)
    would move for this rank's sample ``batch``: bytes of the traffic it causes (its
    requests and the replies to them) and its rounds.

    The top hop samples the seeds, which the rank owns: local. Each lower hop h
    (levels l = L-1 .. 1) needs the sampled in-edges of the dst vertices V^l owned by
    other ranks: round 1 sends their ids (8 bytes each), round 2 returns their sampled
    edges as global (src, dst) int64 pairs (16 bytes each, DistDGL's COO reply).
    Then the same 2 feature rounds as FastSample: ids of the remote input vertices (8
    bytes each) and their rows (``width * feature_bytes`` each). Rounds: 2(L-1) + 2 = 2L.
    The sizes exchanged before each round are left out here (as in the paper's count).
    """
    hops = batch.blocks[::-1]  # the seeds' hop first
    L = len(hops)
    request = reply = 0
    for blk in hops[1:]:
        dst = batch.n_id[: blk.num_dst]
        remote = part[dst] != rank
        request += 8 * int(remote.sum())
        kept = blk.indptr[1:] - blk.indptr[:-1]
        reply += 16 * int(kept[remote].sum())
    r = int((part[batch.n_id] != rank).sum())
    return {"rounds": 2 * L, "bytes": {"adjacency_requests": request, "adjacency_replies": reply,
                                       "feature_ids": 8 * r, "feature_rows": r * width * feature_bytes}}


# --------------------------------------------------------------------------- the model over blocks
def blocks_forward(model: SAGENet, x: torch.Tensor, blocks) -> torch.Tensor:
    """GraphSAGE over the sampled blocks: layer i maps the n_{i-1} source rows to the
    n_i destination rows (the first n_i sources, since V^i is a prefix of V^{i-1}):
    ``SAGEConv((h, h[:n_i]), edge_index_i)``, then ReLU and dropout as
    :meth:`SAGENet.layer`. Returns (n_L, C) logits of the seeds."""
    h = x
    last = model.num_layers - 1
    for i, blk in enumerate(blocks):
        conv = model.first.conv if i == 0 else model.convs[i - 1]
        ei = blk.edge_index.to(h.device)
        h = conv((h, h[: blk.num_dst]), ei, size=(h.shape[0], blk.num_dst))
        if i < last:
            h = F.dropout(F.relu(h), p=model.dropout, training=model.training)
    return h


# --------------------------------------------------------------------------- the trainer
class FastSampleTrainer(DataParallelTrainer):
    def __init__(self, cfg: RunConfig, data: BaselineData, env):
        opts = cfg.options  # FastSampleOptions
        self.cfg, self.opts = cfg, opts
        super().__init__(data, env)
        g = data.graph
        opts.fanouts = fanouts_for(cfg.model.layers, opts.fanouts, DEFAULT_FANOUTS)
        opts.eval_fanouts = fanouts_for(cfg.model.layers, opts.eval_fanouts, DEFAULT_EVAL_FANOUTS)
        self.kernel = opts.kernel if opts.kernel != "auto" else ("numba" if available() else "torch")
        train = g.train_idx if g.multilabel else g.train_idx[g.y[g.train_idx] >= 0]
        t0 = time.perf_counter()
        self.part = hybrid_placement(g, self.world, opts.partition, cfg.seed, train)
        self.topology = TopologyCSC.from_edge_index(data.edge_index, data.num_nodes)  # replicated
        self.partition_s = time.perf_counter() - t0
        self.exchange = FeatureExchange(data.features, self.part, self.rank, self.world,
                                        self.device if self.device.type == "cuda" else "cpu")
        self.scratch = Scratch()
        self.my_train = train[self.part[train] == self.rank]
        counts = all_reduce_sum([float(self.my_train.numel())], op=dist.ReduceOp.MAX if self.world > 1 else None)
        self.batch_size = opts.batch_size
        self.steps_per_epoch = max(1, -(-int(counts[0]) // opts.batch_size))
        torch.manual_seed(cfg.seed)
        self.model = SAGENet(g.num_features, cfg.model.hidden, g.num_classes, cfg.model.layers, cfg.model.dropout,
                             "sage")
        self.model.to(self.device)
        self.ddp = ddp(BlockSAGE(self.model), self.world, self.device)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay)
        self.train_per_rank = torch.bincount(self.part[train], minlength=self.world).tolist()
        self.num_params = sum(p.numel() for p in self.model.parameters())

    # ------------------------------------------------------------------ sampling
    def seed_batches(self, epoch: int) -> list:
        """This rank's training seeds for ``epoch``, shuffled, padded by wrap-around to
        ``steps_per_epoch`` batches (every rank runs the same number of steps)."""
        gen = torch.Generator().manual_seed(self.cfg.seed * 1_000_003 + epoch * 7919 + self.rank)
        mine = self.my_train[torch.randperm(self.my_train.numel(), generator=gen)]
        if mine.numel() == 0:
            return [mine] * self.steps_per_epoch
        chunks = list(mine.split(self.opts.batch_size))
        k = 0
        while len(chunks) < self.steps_per_epoch:
            chunks.append(mine[torch.arange(k, k + self.opts.batch_size) % mine.numel()].unique())
            k += self.opts.batch_size
        return chunks

    def sample(self, seeds: torch.Tensor, fanouts, *key) -> SampledBlocks:
        return sample_blocks(self.topology, seeds, fanouts, step_key(self.cfg.seed, *key), self.kernel, self.scratch,
                             threads=self.opts.sampler_threads)

    # ------------------------------------------------------------------ training
    def train_epoch(self, epoch: int) -> EpochStats:
        st = EpochStats()
        comp = defaultdict(float)
        self.ddp.train()
        self.exchange.reset()
        g = self.data.graph
        by_step = defaultdict(list)
        topo = defaultdict(int)
        for step, seeds in enumerate(self.seed_batches(epoch)):
            t0 = time.perf_counter()
            batch = self.sample(seeds, self.opts.fanouts, epoch, step, self.rank)
            t1 = time.perf_counter()
            before = self.exchange.snapshot()
            x = self.exchange.gather(batch.n_id)
            after = self.exchange.snapshot()
            t2 = time.perf_counter()
            comp["sampling"] += t1 - t0
            comp["feature_exchange"] += t2 - t1
            for kind in EXCHANGE_KINDS:
                by_step[kind].append(after["sent"].get(kind, 0) - before["sent"].get(kind, 0))
                by_step[kind + "_received"].append(after["received"].get(kind, 0) - before["received"].get(kind, 0))
            by_step["remote_rows"].append(int((self.part[batch.n_id] != self.rank).sum()))
            for k, v in topology_sampler_traffic(batch, self.part, self.rank, self.exchange.width)["bytes"].items():
                topo[k] += v
            n = batch.num_seeds
            out = self.ddp(x, batch.blocks)
            if n == 0:  # a rank without training vertices still joins DDP's all-reduce
                loss = out.sum() * 0.0
            else:
                y = to_device(g.y[batch.n_id[:n]], self.device)
                loss = node_loss(out, y, torch.ones(n, dtype=torch.bool, device=self.device))
            backward_and_step(self.optimizer, loss, comp, t2)
            if n:
                st.add_batch(float(loss.detach()), out.detach(), y)
        steps = self.steps_per_epoch
        snap = self.exchange.snapshot()
        st.components = dict(comp)
        st.comm_bytes = dict(snap["sent"])
        if self.world > 1:
            st.comm_bytes["dp"] = self.num_params * 4 * steps  # the gradient payload DDP all-reduces per step
        L = len(self.opts.fanouts)
        st.extra = {"fastsample": {
            "steps": steps,
            "rounds_per_step": {k: v / steps for k, v in snap["rounds"].items()},
            "data_rounds_per_step": 2 if self.world > 1 else 0,
            "bytes_sent_per_step": {k: v / steps for k, v in snap["sent"].items()},
            "bytes_received_per_step": {k: v / steps for k, v in snap["received"].items()},
            "bytes_by_step": dict(by_step),
            "topology_sampler": {"rounds_per_step": 2 * L if self.world > 1 else 0,
                                 "bytes_per_step": {k: v / steps for k, v in topo.items()}},
        }}
        return st

    # ---------------------------------------------------------------- evaluation
    @torch.no_grad()
    def evaluate(self):
        self.model.eval()
        g = self.data.graph
        batches = owned_eval_batches(g, self.part, self.rank, self.opts.eval_batch_size,
                                     pad=torch.zeros(0, dtype=torch.int64))
        outs, ids = [], []
        for i, seeds in enumerate(batches):
            batch = self.sample(seeds, self.opts.eval_fanouts, EVAL_KEY, i, self.rank)
            x = self.exchange.gather(batch.n_id)
            if seeds.numel():
                outs.append(blocks_forward(self.model, x, batch.blocks).cpu())
                ids.append(batch.n_id[: batch.num_seeds])
        logits = torch.cat(outs) if outs else torch.zeros(0, g.num_classes)
        got = torch.cat(ids) if ids else torch.zeros(0, dtype=torch.int64)
        return split_accuracies(logits, g, got)

    def record_extra(self) -> dict:
        topo_bytes = (self.topology.indptr.numel() + self.topology.indices.numel()) * 8
        owned = torch.bincount(self.part, minlength=self.world).tolist()
        return {"partition_s": self.partition_s, "fastsample": {
            "kernel": self.kernel, "partition": self.opts.partition, "owned_vertices_per_rank": owned,
            "train_vertices_per_rank": self.train_per_rank,
            "topology_bytes_per_rank": topo_bytes,
            "feature_bytes_this_rank": _nbytes(self.exchange.local),
        }}


def _nbytes(t: torch.Tensor) -> int:
    if t.layout == torch.strided:
        return t.numel() * t.element_size()
    return sum(p.numel() * p.element_size() for p in (t.crow_indices(), t.col_indices(), t.values()))


class BlockSAGE(torch.nn.Module):
    """``SAGENet`` applied to sampled blocks (:func:`blocks_forward`), as one module so
    DDP wraps it (the parameters are the SAGENet's)."""

    def __init__(self, model: SAGENet):
        super().__init__()
        self.sage = model

    def forward(self, x, blocks):
        return blocks_forward(self.sage, x, blocks)


def make_trainer(cfg: RunConfig, graph, env) -> FastSampleTrainer:
    """This rank's trainer (the registry's ``trainer`` of --system fastsample)."""
    return FastSampleTrainer(cfg, baseline_data(cfg, graph), env)
