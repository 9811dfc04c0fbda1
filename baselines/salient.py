"""``salient``: a SALIENT++-style pipeline (Kaler et al., MLSys 2023), written from the paper's ideas.

Shape legend: N vertices, F features, k ranks, B seeds per batch, n sampled vertices.

* **Vertex-partitioned features.** ``part (N,)`` (METIS via pymetis, or random)
  assigns each vertex to a rank, which alone stores its feature row. The topology
  is replicated (as in SALIENT++), so sampling needs no communication; each rank's
  seeds are the training vertices it owns (padded by wrap-around so every rank
  runs the same number of steps, as ``DistributedSampler`` pads).
* **Fast multi-threaded neighbor sampling, pipelined.** ``sampler_threads``
  threads run torch-sparse's C++ neighbor sampler (or, with ``--sampler-impl torch`` or
  without torch-sparse, the pure-torch sampler of the same law,
  :mod:`scalegnn.baselines.torch_sampling`; the record's ``sampler_impl`` says which) ahead of training; a fetch
  thread takes the sampled batches *in order*, gathers their features (local rows,
  cached rows, and the rest from their owners with one ``all_to_all`` on a process
  group of its own) and queues up to ``prefetch`` ready batches while the model step
  of the current batch runs.
* **Feature cache.** Each rank caches the rows of the remote vertices it accesses
  most: access counts come from simulating ``cache_warmup_epochs`` epochs of this
  rank's sampling before training (SALIENT++'s VIP analysis estimates the same
  access probabilities analytically); the top ``cache_budget * N`` remote vertices
  are fetched once and kept. Hits, misses and local accesses are counted per
  epoch and recorded (``cache`` in every epoch row; ``cache_hit_rate`` in the record).
* **Training:** GraphSAGE (SAGEConv, :class:`scalegnn.baselines.models.SAGENet`), DDP.
* **Evaluation:** neighbor-sampled inference (fanouts 20,20,20) through the same
  pipeline, each rank over the labeled vertices it owns (SALIENT++ evaluates so).
"""

from __future__ import annotations

import queue
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from scalegnn.config import RunConfig
from scalegnn.csr import select_rows
from scalegnn.device import to_device
from scalegnn.model import node_loss
from scalegnn.settings import int_tuple, setting

from .common import (BaselineData, DataParallelTrainer, EpochStats, all_reduce_sum, backward_and_step, baseline_data,
                     ddp, owned_eval_batches, split_accuracies)
from .graphsage import DEFAULT_EVAL_FANOUTS, DEFAULT_FANOUTS, fanouts_for
from .models import SAGENet
from .partition import PARTITION_METHODS, partition_vertices
from .torch_sampling import LayerwiseSampler, check_sampler_impl, resolve_sampler_impl, sampler_impl_setting

__all__ = ["SalientOptions", "SalientTrainer", "FeatureStore", "NeighborSampler", "make_trainer", "SampledBatch"]


@dataclass(kw_only=True)
class SalientOptions:
    fanouts: tuple | None = setting(None, type=int_tuple, metavar="F1,F2,...",
                                    help="neighbor-sampling fanouts, seeds' hop first (default 15,10,5)")
    batch_size: int = setting(1024, help="seed vertices per step (per rank)")
    eval_fanouts: tuple | None = setting(None, type=int_tuple, metavar="F1,F2,...",
                                         help="fanouts of sampled evaluation (default 20,20,20)")
    eval_batch_size: int = setting(4096, help="seeds per batch of sampled evaluation")
    partition: str = setting("metis", choices=PARTITION_METHODS, help="vertex partitioning")
    cache_budget: float = setting(0.1, help="cached remote feature rows per rank, as a fraction of N")
    cache_warmup_epochs: int = setting(1, help="epochs of simulated sampling that rank the remote vertices")
    sampler_threads: int = setting(2, help="neighbor-sampling threads")
    prefetch_batches: int = setting(4, help="prepared batches queued ahead of the model step")
    sampler_impl: str = sampler_impl_setting()
    record_batches: bool = False        # keep every batch's vertex ids (tests)

    def __post_init__(self):
        check_sampler_impl(self.sampler_impl)
        if self.partition not in PARTITION_METHODS:
            raise ValueError(f"--partition must be one of {PARTITION_METHODS}, got {self.partition!r}")
        if not 0.0 <= self.cache_budget <= 1.0:
            raise ValueError(f"--cache-budget is a fraction of N in [0, 1], got {self.cache_budget}")
        if self.sampler_threads < 1 or self.prefetch_batches < 1:
            raise ValueError("--sampler-threads and --prefetch-batches must be >= 1")
        if self.batch_size < 1 or self.eval_batch_size < 1:
            raise ValueError("--batch-size and --eval-batch-size must be >= 1")


@dataclass
class SampledBatch:
    """One sampled computation graph: ``n_id`` (n,) global ids, seeds first;
    ``edge_index`` (2, e) local [source; target]; ``num_seeds`` B; ``x`` filled by the fetcher."""

    n_id: torch.Tensor
    edge_index: torch.Tensor
    num_seeds: int
    x: torch.Tensor | None = None
    stats: dict = field(default_factory=dict)


class NeighborSampler:
    """torch-sparse's C++ neighbor sampler over a CSC copy of the replicated topology
    (``impl="pyg"``, drawing from torch's global generator), or the pure-torch sampler of
    the same law (``"torch"``, drawing from its own generator seeded with ``seed``)."""

    def __init__(self, data: BaselineData, impl: str = "pyg", seed: int = 0):
        self.impl = impl
        if impl == "torch":
            self.layerwise = LayerwiseSampler(data.edge_index, data.num_nodes)
            self.generator = torch.Generator().manual_seed(seed)
            return
        from torch_sparse import SparseTensor

        src, dst = data.edge_index
        n = data.num_nodes
        adj = SparseTensor(row=dst, col=src, sparse_sizes=(n, n))  # row i lists the sources of target i
        self.colptr, self.row, _ = adj.csr()

    def sample(self, seeds: torch.Tensor, fanouts) -> SampledBatch:
        if self.impl == "torch":
            s = self.layerwise.sample(seeds, fanouts, self.generator)
            return SampledBatch(n_id=s.n_id, edge_index=s.edge_index, num_seeds=seeds.numel())
        node, row, col, _ = torch.ops.torch_sparse.neighbor_sample(
            self.colptr, self.row, seeds, list(fanouts), False, True)
        return SampledBatch(n_id=node, edge_index=torch.stack([row, col]), num_seeds=seeds.numel())


def _vstack(parts: list[torch.Tensor], width: int, sparse: bool) -> torch.Tensor:
    """Stack row blocks (all dense, or all CSR) into one matrix."""
    parts = [p for p in parts if p.shape[0]]
    if not parts:
        return torch.sparse_csr_tensor(torch.zeros(1, dtype=torch.int64), torch.zeros(0, dtype=torch.int64),
                                       torch.zeros(0), (0, width)) if sparse else torch.zeros(0, width)
    if not sparse:
        return torch.cat(parts)
    ptrs, cols, vals, off = [torch.zeros(1, dtype=torch.int64)], [], [], 0
    for p in parts:
        ptrs.append(p.crow_indices()[1:] + off)
        cols.append(p.col_indices())
        vals.append(p.values())
        off += p.values().numel()
    rows = sum(p.shape[0] for p in parts)
    return torch.sparse_csr_tensor(torch.cat(ptrs), torch.cat(cols), torch.cat(vals), (rows, width),
                                   check_invariants=False)


class FeatureStore:
    """This rank's feature rows, its cache of remote rows, and the fetch of the rest.

    ``fetch(n_id)`` returns the (n, F) features of ``n_id`` (dense, or CSR when the
    input is sparse) and counts local rows, cache hits and misses (remote rows
    fetched from their owners with ``all_to_all``; misses are the rows actually sent).
    Every rank must call ``fetch`` the same number of times (it is a collective).
    """

    def __init__(self, features: torch.Tensor, part: torch.Tensor, rank: int, world: int, group=None):
        self.rank, self.world, self.group = rank, world, group
        self.part = part
        self.sparse = features.layout != torch.strided
        self.width = features.shape[1]
        self.owned = (part == rank).nonzero().flatten()
        self.local = select_rows(features, self.owned)
        n = part.numel()
        self.slot = torch.full((n,), -1, dtype=torch.int64)  # local row, or cache row, per vertex
        self.slot[self.owned] = torch.arange(self.owned.numel())
        self.cache_ids = torch.zeros(0, dtype=torch.int64)
        self.cache = _vstack([], self.width, self.sparse)
        self.in_cache = torch.zeros(n, dtype=torch.bool)
        self.cache_slot = torch.full((n,), -1, dtype=torch.int64)

    def _dense(self, x: torch.Tensor) -> torch.Tensor:
        return x.to_dense() if self.sparse else x

    def _exchange(self, want: torch.Tensor) -> tuple[torch.Tensor, int]:
        """Rows of the remote vertices ``want`` from their owners (collective); bytes sent."""
        owners = self.part[want]
        order = torch.argsort(owners, stable=True)
        want, owners = want[order], owners[order]
        counts = torch.bincount(owners, minlength=self.world)
        if self.world == 1:
            return _vstack([], self.width, self.sparse), 0
        peer = torch.empty_like(counts)
        dist.all_to_all_single(peer, counts, group=self.group)
        asked = torch.empty(int(peer.sum()), dtype=torch.int64)
        dist.all_to_all_single(asked, want, peer.tolist(), counts.tolist(), group=self.group)
        rows = self._dense(select_rows(self.local, self.slot[asked])) if asked.numel() else \
            torch.zeros(0, self.width)
        got = torch.empty(int(counts.sum()), self.width)
        dist.all_to_all_single(got, rows.contiguous(), counts.tolist(), peer.tolist(), group=self.group)
        sent = rows.numel() * rows.element_size() + asked.numel() * 8 + self.world * 8
        got = got[torch.argsort(order)]  # back to the order of ``want``
        return (got.to_sparse_csr() if self.sparse else got), sent

    def fill_cache(self, ids: torch.Tensor) -> int:
        """Fetch and keep the rows of the remote vertices ``ids`` (collective); bytes sent."""
        ids = ids[self.part[ids] != self.rank].unique()
        rows, sent = self._exchange(ids)
        self.cache_ids, self.cache = ids, rows
        self.in_cache[:] = False
        self.in_cache[ids] = True
        self.cache_slot[:] = -1
        self.cache_slot[ids] = torch.arange(ids.numel())
        return sent

    def fetch(self, n_id: torch.Tensor) -> tuple[torch.Tensor, dict]:
        is_local = self.part[n_id] == self.rank
        hit = ~is_local & self.in_cache[n_id]
        miss = ~is_local & ~hit
        loc_pos, hit_pos, miss_pos = is_local.nonzero().flatten(), hit.nonzero().flatten(), miss.nonzero().flatten()
        remote, sent = self._exchange(n_id[miss_pos])
        parts = [select_rows(self.local, self.slot[n_id[loc_pos]]),
                 select_rows(self.cache, self.cache_slot[n_id[hit_pos]]), remote]
        stacked = _vstack(parts, self.width, self.sparse)
        order = torch.empty(n_id.numel(), dtype=torch.int64)
        order[torch.cat([loc_pos, hit_pos, miss_pos])] = torch.arange(n_id.numel())
        x = select_rows(stacked, order)
        return x, {"local": int(loc_pos.numel()), "hits": int(hit_pos.numel()),
                   "misses": int(miss_pos.numel()), "bytes": sent}


class BatchPipeline:
    """Sampler threads -> in-order feature fetch thread -> bounded queue -> training.

    Iterating yields :class:`SampledBatch` with ``x`` filled; ``None`` seeds mean an
    empty step (a padding batch that still joins the fetch collective).
    """

    def __init__(self, sampler: NeighborSampler, store: FeatureStore, seed_batches: list, fanouts,
                 threads: int, prefetch: int):
        self.q: queue.Queue = queue.Queue(maxsize=prefetch)
        self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="salient-sampler")
        self.sampler, self.store, self.fanouts = sampler, store, fanouts
        self.seed_batches = seed_batches
        self.ahead = prefetch + threads
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._fetch_loop, name="salient-fetch", daemon=True)
        self.thread.start()

    def _sample(self, seeds):
        if seeds is None or seeds.numel() == 0:
            return SampledBatch(n_id=torch.zeros(0, dtype=torch.int64), edge_index=torch.zeros(2, 0, dtype=torch.int64),
                                num_seeds=0)
        t0 = time.perf_counter()
        b = self.sampler.sample(seeds, self.fanouts)
        b.stats["sample_s"] = time.perf_counter() - t0
        return b

    def _fetch_loop(self):
        try:
            futures = [self.pool.submit(self._sample, s) for s in self.seed_batches[: self.ahead]]
            nxt = len(futures)
            for i in range(len(self.seed_batches)):
                batch = futures[i].result()
                futures[i] = None
                if nxt < len(self.seed_batches):
                    futures.append(self.pool.submit(self._sample, self.seed_batches[nxt]))
                    nxt += 1
                t0 = time.perf_counter()
                batch.x, st = self.store.fetch(batch.n_id)
                batch.stats.update(st)
                batch.stats["fetch_s"] = time.perf_counter() - t0
                self.q.put(batch)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the training thread
            self.error = exc
            self.q.put(None)

    def __iter__(self):
        for _ in range(len(self.seed_batches)):
            batch = self.q.get()
            if batch is None:
                raise RuntimeError(f"SALIENT pipeline failed: {self.error!r}") from self.error
            yield batch
        self.close()

    def close(self):
        self.thread.join(timeout=60)
        self.pool.shutdown(wait=True)


class SalientTrainer(DataParallelTrainer):
    def __init__(self, cfg: RunConfig, data: BaselineData, env):
        opts = cfg.options  # SalientOptions
        self.cfg, self.opts = cfg, opts
        super().__init__(data, env)
        g = data.graph
        opts.fanouts = fanouts_for(cfg.model.layers, opts.fanouts, DEFAULT_FANOUTS)
        opts.eval_fanouts = fanouts_for(cfg.model.layers, opts.eval_fanouts, DEFAULT_EVAL_FANOUTS)
        t0 = time.perf_counter()
        self.part = partition_vertices(g, self.world, opts.partition, cfg.seed)
        self.partition_s = time.perf_counter() - t0
        group = dist.new_group(backend="gloo") if self.world > 1 else None  # the fetch thread's own group
        self.store = FeatureStore(data.features, self.part, self.rank, self.world, group)
        self.sampler_impl = resolve_sampler_impl(opts.sampler_impl)
        self.sampler = NeighborSampler(data, self.sampler_impl, seed=cfg.seed * 1_000_003 + 31 * self.rank + 7)
        train = g.train_idx if g.multilabel else g.train_idx[g.y[g.train_idx] >= 0]
        self.my_train = train[self.part[train] == self.rank]
        counts = all_reduce_sum([0.0] * self.rank + [float(self.my_train.numel())] + [0.0] * (self.world - self.rank - 1))
        self.batch_size = opts.batch_size
        self.steps_per_epoch = max(1, -(-int(max(counts)) // opts.batch_size))
        self.batch_log: list[torch.Tensor] = []
        t0 = time.perf_counter()
        self.cache_bytes = self._build_cache()
        self.cache_build_s = time.perf_counter() - t0
        torch.manual_seed(cfg.seed)
        self.model = SAGENet(g.num_features, cfg.model.hidden, g.num_classes, cfg.model.layers, cfg.model.dropout, "sage")
        self.model.to(self.device)
        self.ddp = ddp(self.model, self.world, self.device)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay)
        self.totals = defaultdict(int)

    def seed_batches(self, epoch: int) -> list:
        """This rank's training seeds for ``epoch``, shuffled, padded by wrap-around to
        ``steps_per_epoch`` batches (the same count on every rank)."""
        gen = torch.Generator().manual_seed(self.cfg.seed * 1_000_003 + epoch * 7919 + self.rank)
        mine = self.my_train[torch.randperm(self.my_train.numel(), generator=gen)]
        if mine.numel() == 0:
            return [None] * self.steps_per_epoch
        chunks = list(mine.split(self.opts.batch_size))
        k = 0
        while len(chunks) < self.steps_per_epoch:  # wrap around: fewer seeds than the busiest rank
            idx = torch.arange(k, k + self.opts.batch_size) % mine.numel()
            chunks.append(mine[idx])
            k += self.opts.batch_size
        return chunks

    def _build_cache(self) -> int:
        """Rank remote vertices by simulated access counts; cache the top ``budget * N``."""
        n = self.data.num_nodes
        budget = int(self.opts.cache_budget * n)
        if budget == 0 or self.world == 1:
            return self.store.fill_cache(torch.zeros(0, dtype=torch.int64)) if self.world > 1 else 0
        counts = torch.zeros(n, dtype=torch.int64)
        for e in range(self.opts.cache_warmup_epochs):
            for seeds in self.seed_batches(1_000_000 + e):
                if seeds is None:
                    continue
                counts += torch.bincount(self.sampler.sample(seeds, self.opts.fanouts).n_id, minlength=n)
        counts[self.part == self.rank] = 0
        order = torch.argsort(counts, descending=True, stable=True)
        top = order[:budget]
        top = top[counts[top] > 0]
        return self.store.fill_cache(top)

    def _pipeline(self, seed_batches, fanouts):
        return BatchPipeline(self.sampler, self.store, seed_batches, fanouts, self.opts.sampler_threads,
                             self.opts.prefetch_batches)

    def train_epoch(self, epoch: int) -> EpochStats:
        st = EpochStats()
        comp = defaultdict(float)
        cache = defaultdict(int)
        self.ddp.train()
        t_wait = time.perf_counter()
        for batch in self._pipeline(self.seed_batches(epoch), self.opts.fanouts):
            t1 = time.perf_counter()
            comp["pipeline_wait"] += t1 - t_wait
            comp["sampling"] += batch.stats.get("sample_s", 0.0)
            comp["feature_fetch"] += batch.stats.get("fetch_s", 0.0)
            for k in ("local", "hits", "misses", "bytes"):
                cache[k] += batch.stats.get(k, 0)
            if self.opts.record_batches:
                self.batch_log.append(batch.n_id)
            if batch.num_seeds == 0:  # padding step of a rank without training vertices
                x, edge_index = _empty_like_x(self.store), torch.zeros(2, 0, dtype=torch.int64)
                out = self.ddp(*to_device((x, edge_index), self.device))
                loss = out.sum() * 0.0
            else:
                x, edge_index = to_device((batch.x, batch.edge_index), self.device)
                out = self.ddp(x, edge_index)[: batch.num_seeds]
                y = to_device(self.data.graph.y[batch.n_id[: batch.num_seeds]], self.device)
                loss = node_loss(out, y, torch.ones(batch.num_seeds, dtype=torch.bool, device=self.device))
            backward_and_step(self.optimizer, loss, comp, t1)
            if batch.num_seeds:
                st.add_batch(float(loss.detach()), out.detach(), y)
            t_wait = time.perf_counter()
        st.components = dict(comp)
        st.comm_bytes = {"feature_fetch": int(cache["bytes"])}
        local, hits, misses = all_reduce_sum([cache["local"], cache["hits"], cache["misses"]])
        for k, v in (("local", local), ("hits", hits), ("misses", misses)):
            self.totals[k] += int(v)
        st.extra = {"cache": {"local": int(local), "hits": int(hits), "misses": int(misses),
                              "hit_rate": hits / (hits + misses) if hits + misses else None}}
        return st

    @torch.no_grad()
    def evaluate(self):
        self.model.eval()
        g = self.data.graph
        batches = owned_eval_batches(g, self.part, self.rank, self.opts.eval_batch_size)
        outs, ids = [], []
        for batch in self._pipeline(batches, self.opts.eval_fanouts):
            if batch.num_seeds == 0:
                continue
            outs.append(self.model(*to_device((batch.x, batch.edge_index), self.device))[: batch.num_seeds].cpu())
            ids.append(batch.n_id[: batch.num_seeds])
        logits = torch.cat(outs) if outs else torch.zeros(0, g.num_classes)
        got = torch.cat(ids) if ids else torch.zeros(0, dtype=torch.int64)
        return split_accuracies(logits, g, got)

    def record_extra(self) -> dict:
        t = self.totals
        remote = t["hits"] + t["misses"]
        return {"partition_s": self.partition_s, "cache_build_s": self.cache_build_s,
                "sampler_impl": self.sampler_impl, "cache_size_per_rank": int(self.store.cache_ids.numel()),
                "cache_hit_rate": t["hits"] / remote if remote else None,
                "cache_totals": dict(t)}


def _empty_like_x(store: FeatureStore) -> torch.Tensor:
    return _vstack([], store.width, store.sparse) if store.sparse else torch.zeros(0, store.width)


def make_trainer(cfg: RunConfig, graph, env) -> SalientTrainer:
    """This rank's trainer (the registry's ``trainer`` of --system salient)."""
    return SalientTrainer(cfg, baseline_data(cfg, graph), env)
