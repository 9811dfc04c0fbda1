"""``graphsage``: PyG ``NeighborLoader`` + ``SAGEConv`` (or ``GCNConv``), DDP over the ranks.

Defaults from the GraphSAGE / SALIENT++ setups: 3 layers, hidden 256, fanouts
15,10,5 (outermost hop first, PyG's order: ``num_neighbors[0]`` is the seeds' hop),
batch 1024 seeds, Adam lr 0.001 (the common ``--lr``; 0.001-0.003 is the range
those setups use). Each rank trains on its own 1/world share of the shuffled
training vertices; DDP averages gradients; ``Join`` absorbs uneven batch counts.

Evaluation (as GraphSAGE and SALIENT++ do): neighbor-sampled inference with
fanouts 20,20,20 over every labeled vertex, the vertices split across ranks.
``--eval-mode layerwise`` runs exact full-graph layer-wise inference instead
(all neighbors, one layer at a time over all vertices, on rank 0).

``--sampler-impl``: PyG's ``NeighborLoader`` and a ``SparseTensor`` (pyg), or the
pure-torch sampler and CSR matrix of :mod:`scalegnn.baselines.torch_sampling` (torch, the
same law), auto taking pyg where torch-sparse imports; the record says which ran.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass

import torch

from scalegnn.config import RunConfig
from scalegnn.csr import select_rows
from scalegnn.device import to_device
from scalegnn.metrics import accuracy_counts
from scalegnn.settings import int_tuple, setting

from .common import (BaselineData, DataParallelTrainer, EpochStats, baseline_data, broadcast_floats, ddp,
                     split_accuracies, step_on_labeled_rows)
from .models import SAGENet
from .torch_sampling import (LayerwiseSampler, NeighborBatches, adjacency_t, check_sampler_impl,
                             resolve_sampler_impl, sampler_impl_setting)

__all__ = ["GraphSAGEOptions", "GraphSAGETrainer", "make_trainer", "neighbor_loader"]

DEFAULT_FANOUTS = (15, 10, 5)
DEFAULT_EVAL_FANOUTS = (20, 20, 20)


def fanouts_for(layers: int, given, default) -> tuple[int, ...]:
    """``given`` (must have ``layers`` entries), else ``default`` cut or padded to ``layers``."""
    if given:
        f = int_tuple(given)
        if len(f) != layers:
            raise ValueError(f"fanouts {','.join(map(str, f))} have {len(f)} hops but --layers is {layers}; "
                             f"give one fanout per layer")
        return f
    return tuple(default[:layers]) + (default[-1],) * max(0, layers - len(default))


@dataclass(kw_only=True)
class GraphSAGEOptions:
    conv: str = setting("sage", choices=("sage", "gcn"), help="the convolution: SAGEConv (sage) or GCNConv (gcn)")
    fanouts: tuple | None = setting(None, type=int_tuple, metavar="F1,F2,...",
                                    help="neighbor-sampling fanouts, seeds' hop first (default 15,10,5, cut or "
                                    "padded to --layers)")
    batch_size: int = setting(1024, help="seed vertices per step (per rank)")
    eval_mode: str = setting("sampled", choices=("sampled", "layerwise"),
                             help="neighbor-sampled evaluation, or exact full-graph layer-wise inference")
    eval_fanouts: tuple | None = setting(None, type=int_tuple, metavar="F1,F2,...",
                                         help="fanouts of sampled evaluation (default 20,20,20)")
    eval_batch_size: int = setting(4096, help="seeds per batch of sampled evaluation")
    sampler_impl: str = sampler_impl_setting()

    def __post_init__(self):
        check_sampler_impl(self.sampler_impl)
        if self.conv not in ("sage", "gcn"):
            raise ValueError(f"--conv must be sage or gcn, got {self.conv!r}")
        if self.eval_mode not in ("sampled", "layerwise"):
            raise ValueError(f"--eval-mode must be sampled or layerwise, got {self.eval_mode!r}")
        if self.batch_size < 1 or self.eval_batch_size < 1:
            raise ValueError("--batch-size and --eval-batch-size must be >= 1")


def pyg_data(data: BaselineData):
    """A PyG ``Data`` with the topology only: features stay in ``data.features`` (maybe CSR)
    and are sliced by ``batch.n_id``; labels ride along."""
    from torch_geometric.data import Data

    return Data(edge_index=data.edge_index, num_nodes=data.num_nodes, y=data.graph.y)


def neighbor_loader(data: BaselineData, seeds: torch.Tensor, fanouts, batch_size: int, shuffle: bool, seed: int,
                    pyg=None, impl: str = "pyg", sampler: LayerwiseSampler | None = None):
    """PyG's ``NeighborLoader`` over ``seeds`` (``impl="pyg"``), or its pure-torch
    counterpart (``"torch"``; ``sampler`` reused when given): each batch is the sampled
    subgraph with the seeds first (``batch.n_id[:batch.batch_size]`` are the seeds, in
    order), its ``edge_index`` local ``[source; target]`` and ``y`` the labels of ``n_id``."""
    if impl == "torch":
        sampler = sampler or LayerwiseSampler(data.edge_index, data.num_nodes)
        return NeighborBatches(sampler, seeds, fanouts, batch_size, shuffle, torch.Generator().manual_seed(seed),
                               y=data.graph.y)
    from torch_geometric.loader import NeighborLoader

    import warnings

    gen = torch.Generator().manual_seed(seed)
    with warnings.catch_warnings():  # PyG prefers pyg-lib; torch-sparse's C++ sampler is what we have
        warnings.filterwarnings("ignore", message=".*pyg-lib.*")
        return NeighborLoader(pyg if pyg is not None else pyg_data(data), num_neighbors=list(fanouts),
                              input_nodes=seeds, batch_size=batch_size, shuffle=shuffle, generator=gen)


class GraphSAGETrainer(DataParallelTrainer):
    def __init__(self, cfg: RunConfig, data: BaselineData, env):
        opts = cfg.options  # GraphSAGEOptions
        self.cfg, self.opts = cfg, opts
        super().__init__(data, env)
        g = data.graph
        opts.fanouts = fanouts_for(cfg.model.layers, opts.fanouts, DEFAULT_FANOUTS)
        opts.eval_fanouts = fanouts_for(cfg.model.layers, opts.eval_fanouts, DEFAULT_EVAL_FANOUTS)
        self.batch_size = opts.batch_size
        self.sampler_impl = resolve_sampler_impl(opts.sampler_impl)
        self.pyg = pyg_data(data) if self.sampler_impl == "pyg" else None
        self.sampler = LayerwiseSampler(data.edge_index, data.num_nodes) if self.sampler_impl == "torch" else None
        train = g.train_idx if g.multilabel else g.train_idx[g.y[g.train_idx] >= 0]
        self.train_idx = train
        share = -(-train.numel() // self.world)
        self.steps_per_epoch = -(-share // opts.batch_size)
        torch.manual_seed(cfg.seed)
        self.model = SAGENet(g.num_features, cfg.model.hidden, g.num_classes, cfg.model.layers, cfg.model.dropout, opts.conv)
        self.model.to(self.device)
        self.ddp = ddp(self.model, self.world, self.device)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay)

    # ------------------------------------------------------------------ training
    def _rank_seeds(self, epoch: int) -> torch.Tensor:
        """This rank's share of the training vertices, reshuffled every epoch (the same
        permutation on every rank, like ``DistributedSampler``)."""
        gen = torch.Generator().manual_seed(self.cfg.seed * 1_000_003 + epoch)
        perm = self.train_idx[torch.randperm(self.train_idx.numel(), generator=gen)]
        return perm.tensor_split(self.world)[self.rank]

    def train_loader(self, epoch: int):
        return neighbor_loader(self.data, self._rank_seeds(epoch), self.opts.fanouts, self.opts.batch_size,
                               shuffle=False, seed=self.cfg.seed * 7919 + epoch * 131 + self.rank, pyg=self.pyg,
                               impl=self.sampler_impl, sampler=self.sampler)

    def train_epoch(self, epoch: int) -> EpochStats:
        st = EpochStats()
        comp = defaultdict(float)
        self.ddp.train()
        loader = iter(self.train_loader(epoch))
        joins = [self.ddp] if self.world > 1 else []
        from torch.distributed.algorithms.join import Join

        with Join(joins) if joins else _nullctx():
            while True:
                t0 = time.perf_counter()
                batch = next(loader, None)
                if batch is None:
                    break
                x = to_device(select_rows(self.data.features, batch.n_id), self.device)
                edge_index, y = to_device((batch.edge_index, batch.y[: batch.batch_size]), self.device)
                t1 = time.perf_counter()
                comp["sampling"] += t1 - t0
                step_on_labeled_rows(self.optimizer, self.ddp(x, edge_index)[: batch.batch_size], y, st, comp, t1)
        st.components = dict(comp)
        return st

    # ---------------------------------------------------------------- evaluation
    @torch.no_grad()
    def evaluate(self):
        self.model.eval()
        if self.opts.eval_mode == "layerwise":
            accs = None
            if self.rank == 0:
                logits = self.layerwise_inference()
                accs = list(split_accuracies_local(logits, self.data.graph))
            return tuple(broadcast_floats(accs, 3))
        g = self.data.graph
        nodes = torch.cat([g.train_idx, g.val_idx, g.test_idx]).unique()
        mine = nodes.tensor_split(self.world)[self.rank]
        outs, ids = [], []
        loader = neighbor_loader(self.data, mine, self.opts.eval_fanouts, self.opts.eval_batch_size, shuffle=False,
                                 seed=self.cfg.seed + 99991 + self.rank, pyg=self.pyg, impl=self.sampler_impl,
                                 sampler=self.sampler)
        for batch in loader:
            x, edge_index = to_device((select_rows(self.data.features, batch.n_id), batch.edge_index), self.device)
            outs.append(self.model(x, edge_index)[: batch.batch_size].cpu())
            ids.append(batch.n_id[: batch.batch_size])
        logits = torch.cat(outs) if outs else torch.zeros(0, g.num_classes)
        got = torch.cat(ids) if ids else torch.zeros(0, dtype=torch.int64)
        return split_accuracies(logits, g, got)

    @torch.no_grad()
    def layerwise_inference(self, chunk: int = 8192) -> torch.Tensor:
        """Exact inference: layer l for all vertices (all neighbors) before layer l+1."""
        n = self.data.num_nodes
        h = to_device(self.data.features, self.device)
        ei = adjacency_t(self.data.edge_index, n, self.sampler_impl).to(self.device)  # one SpMM per layer
        for i in range(self.model.num_layers):
            h = self.model.layer(i, h, ei)
        assert h.shape[0] == n
        return h.cpu()

    def record_extra(self) -> dict:
        return {"sampler_impl": self.sampler_impl}


def split_accuracies_local(logits, graph):
    """Accuracies from full logits without any collective (rank-0-only evaluation)."""
    out = []
    for idx in (graph.train_idx, graph.val_idx, graph.test_idx):
        y = graph.y[idx]
        lg = logits[idx]
        if y.dim() == 1:
            lg, y = lg[y >= 0], y[y >= 0]
        c, t = accuracy_counts(lg, y)
        out.append(c / t if t else float("nan"))
    return tuple(out)


class _nullctx:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def make_trainer(cfg: RunConfig, graph, env) -> GraphSAGETrainer:
    """This rank's trainer (the registry's ``trainer`` of --system graphsage)."""
    return GraphSAGETrainer(cfg, baseline_data(cfg, graph), env)
