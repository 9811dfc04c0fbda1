"""``graphsaint``: PyG ``GraphSAINTNodeSampler`` with its normalization statistics, GCN-style model.

As GraphSAINT (Zeng et al., ICLR 2020) and PyG's ``examples/graph_saint.py``:

* a subgraph per step: ``node_budget`` vertices drawn with probability proportional
  to degree (PyG's node sampler draws edges and keeps their sources), induced edges;
* GraphSAINT's normalization: aggregator weights ``1/alpha`` times ``1/deg_in(v)`` and
  loss weights ``lambda_v = 1 / (N p_v)``, where ``p_v`` is the probability that v is
  in a subgraph and ``alpha`` the probability of an edge given its aggregating vertex.
  ``normalization="exact"`` (the default) computes these probabilities in closed form
  for the node sampler (:func:`node_sampler_norms`); ``"sampled"`` estimates them as
  GraphSAINT and PyG do, from ``sample_coverage`` pre-sampled subgraphs. The estimate
  gives every edge that the pre-sampling never drew the clamped weight 1e4: on
  Facebook page-page with a 2000-vertex budget that is 6 % of the edges, and one such
  edge in a subgraph blows the logits up to ~1e6 (measured; training then stalls at
  0.77 test accuracy). The closed form has no unseen edges. PyG also weights an edge
  by its *source's* count; the exact form uses the aggregating target, which is the
  unbiased estimator of ``sum_u w_uv x_u``;
* the model: L ``GraphConv`` layers (self + neighbor weights) with jumping-knowledge
  concatenation (:class:`scalegnn.baselines.models.SAINTNet`);
* full-graph evaluation (every neighbor, mean aggregation), on rank 0 only, as
  GraphSAINT evaluates on the CPU in one process.

An epoch is ``ceil(N / node_budget)`` subgraphs in all (GraphSAINT's definition:
about N sampled vertices), split over the ranks; each rank samples its own
subgraphs (its own seed) and DDP averages gradients.

``--sampler-impl``: PyG's sampler and a ``SparseTensor`` for evaluation (pyg), or the
pure-torch sampler (the same law and the same induced subgraphs) and a CSR matrix of
:mod:`scalegnn.baselines.torch_sampling` (torch), auto taking pyg where torch-sparse
imports; the record says which ran.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from scalegnn.config import RunConfig
from scalegnn.csr import select_rows
from scalegnn.device import to_device
from scalegnn.sampling import train_mask_of
from scalegnn.settings import setting

from .common import (BaselineData, DataParallelTrainer, EpochStats, backward_and_step, baseline_data,
                     broadcast_floats, ddp)
from .graphsage import split_accuracies_local
from .models import SAINTNet
from .torch_sampling import (SaintSubgraphs, adjacency_t, check_sampler_impl, resolve_sampler_impl,
                             sampler_impl_setting)

__all__ = ["GraphSAINTOptions", "GraphSAINTTrainer", "make_trainer", "saint_sampler"]


@dataclass(kw_only=True)
class GraphSAINTOptions:
    # None: min(8000, N/10). 8000 is GraphSAINT's Reddit/Flickr budget (3-9 % of N);
    # on graphs smaller than 80,000 vertices a tenth of N keeps ~10 subgraphs per epoch
    # instead of one or two (8000 of Facebook's 22,470 gave 3 steps per epoch).
    node_budget: int | None = setting(None, help="vertices drawn per subgraph (PyG's node budget); default "
                                      "min(8000, N/10)")
    sample_coverage: int = setting(50, help="pre-sampled vertices per vertex for the normalization statistics")
    steps_per_epoch: int | None = setting(None, help="subgraphs per epoch in all (default ceil(N / node budget), "
                                          "split over the ranks)")
    normalization: str = setting("exact", choices=("exact", "sampled", "none"),
                                 help="normalization probabilities in closed form (exact), estimated from "
                                 "pre-sampled subgraphs as PyG does (sampled), or none")
    sampler_impl: str = sampler_impl_setting()

    def __post_init__(self):
        check_sampler_impl(self.sampler_impl)
        if self.normalization not in ("exact", "sampled", "none"):
            raise ValueError(f"--normalization must be exact, sampled or none, got {self.normalization!r}")
        if self.node_budget is not None and self.node_budget < 1:
            raise ValueError(f"--node-budget must be >= 1, got {self.node_budget}")
        if self.sample_coverage < 0:
            raise ValueError(f"--sample-coverage must be >= 0, got {self.sample_coverage}")


def saint_data(data: BaselineData):
    """PyG ``Data`` for the sampler: topology, labels, the train mask, the vertex ids
    (``n_id``, sliced to the subgraph, so features can stay CSR) and ``1/deg_in``."""
    from torch_geometric.data import Data
    from torch_geometric.utils import degree

    g = data.graph
    n = data.num_nodes
    train_mask = train_mask_of(g)
    col = data.edge_index[1]
    inv_deg = 1.0 / degree(col, n).clamp(min=1)[col]
    return Data(edge_index=data.edge_index, num_nodes=n, y=g.y, train_mask=train_mask,
                n_id=torch.arange(n), edge_weight=inv_deg)


def node_sampler_norms(edge_index: torch.Tensor, num_nodes: int, budget: int):
    """GraphSAINT's normalization for PyG's node sampler, in closed form.

    The sampler draws ``budget`` edges uniformly with replacement and keeps their
    sources, so with ``d_v`` the out-degree and E the edge count, a draw misses v with
    probability ``q_v = 1 - d_v/E`` and v is in the subgraph with ``p_v = 1 - q_v^b``.
    Edge (u, v) is in the induced subgraph when both ends are:
    ``p_uv = 1 - q_u^b - q_v^b + (1 - (d_u + d_v)/E)^b`` (``p_u`` for a self loop).
    Returns ``edge_norm = p_v / p_uv`` (aggregation at the target v, so that the
    subgraph sum is an unbiased estimate of the full one) and
    ``node_norm = 1 / (N p_v)`` (0 for vertices no draw can reach).
    """
    src, dst = edge_index
    e = max(int(src.numel()), 1)
    deg = torch.bincount(src, minlength=num_nodes).to(torch.float64)

    def miss_all(frac):  # (1 - frac)^budget, stable for small frac
        return torch.exp(budget * torch.log1p(-frac.clamp(max=1.0 - 1e-15)))

    q_b = miss_all(deg / e)
    p = 1.0 - q_b
    both = 1.0 - q_b[src] - q_b[dst] + miss_all((deg[src] + deg[dst]) / e)
    both = torch.where(src == dst, p[src], both).clamp(min=1e-300)
    edge_norm = (p[dst] / both).to(torch.float32)
    node_norm = torch.where(p > 0, 1.0 / (num_nodes * p.clamp(min=1e-300)), torch.zeros_like(p))
    return edge_norm, node_norm.to(torch.float32)


def saint_sampler(pyg, node_budget: int, num_steps: int, sample_coverage: int, impl: str = "pyg",
                  generator: torch.Generator | None = None, stats_generator: torch.Generator | None = None):
    """PyG's ``GraphSAINTNodeSampler`` (``impl="pyg"``: draws from torch's global generator),
    or its pure-torch counterpart (``"torch"``: draws from ``generator``, the statistics of
    ``sample_coverage`` from ``stats_generator``): iterating yields ``num_steps`` subgraphs."""
    if impl == "torch":
        return SaintSubgraphs(pyg, node_budget, num_steps, sample_coverage, generator, stats_generator)
    from torch_geometric.loader import GraphSAINTNodeSampler

    return GraphSAINTNodeSampler(pyg, batch_size=node_budget, num_steps=num_steps,
                                 sample_coverage=sample_coverage, log=False, num_workers=0)


class GraphSAINTTrainer(DataParallelTrainer):
    def __init__(self, cfg: RunConfig, data: BaselineData, env):
        opts = cfg.options  # GraphSAINTOptions
        self.cfg, self.opts = cfg, opts
        super().__init__(data, env)
        g = data.graph
        n = data.num_nodes
        budget = opts.node_budget if opts.node_budget is not None else min(8000, max(1, round(n / 10)))
        self.batch_size = min(budget, n)
        total = opts.steps_per_epoch or -(-n // self.batch_size)
        self.steps_per_epoch = max(1, -(-total // self.world))
        self.pyg = saint_data(data)
        self.sampler_impl = resolve_sampler_impl(opts.sampler_impl)
        self.gen_seed = cfg.seed * 1_000_003 + 17 * self.rank + 1  # each rank its own subgraphs
        t0 = time.perf_counter()
        self.norm = opts.normalization
        if self.norm == "exact":  # sliced with the subgraph like any node / edge attribute
            self.pyg.saint_edge_norm, self.pyg.saint_node_norm = node_sampler_norms(
                self.pyg.edge_index, n, self.batch_size)
        torch.manual_seed(cfg.seed)  # the same statistics on every rank
        self.sampler = saint_sampler(self.pyg, self.batch_size, self.steps_per_epoch,
                                     opts.sample_coverage if self.norm == "sampled" else 0, self.sampler_impl,
                                     torch.Generator().manual_seed(self.gen_seed),
                                     torch.Generator().manual_seed(cfg.seed))
        self.preprocess_s = time.perf_counter() - t0
        torch.manual_seed(cfg.seed)
        self.model = SAINTNet(g.num_features, cfg.model.hidden, g.num_classes, cfg.model.layers, cfg.model.dropout).to(self.device)
        self.ddp = ddp(self.model, self.world, self.device)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay)
        self._adj_t = None
        torch.manual_seed(self.gen_seed)

    def train_epoch(self, epoch: int) -> EpochStats:
        st = EpochStats()
        comp = defaultdict(float)
        self.ddp.train()
        it = iter(self.sampler)
        norm = self.norm != "none"
        for _ in range(self.steps_per_epoch):
            t0 = time.perf_counter()
            sub = next(it)
            x = select_rows(self.data.features, sub.n_id)
            if self.norm == "exact":
                edge_norm, node_norm = sub.saint_edge_norm, sub.saint_node_norm
            elif self.norm == "sampled":
                edge_norm, node_norm = sub.edge_norm, sub.node_norm
            ew = edge_norm * sub.edge_weight if norm else sub.edge_weight
            x, edge_index, ew, y, mask = to_device((x, sub.edge_index, ew, sub.y, sub.train_mask), self.device)
            node_norm = to_device(node_norm, self.device) if norm else None
            t1 = time.perf_counter()
            comp["sampling"] += t1 - t0
            out = self.ddp(x, edge_index, ew)
            if self.data.graph.multilabel:
                per = F.binary_cross_entropy_with_logits(out, y, reduction="none").mean(1)
            else:
                per = F.cross_entropy(out, y.clamp(min=0), reduction="none")
            if not bool(mask.any()):  # still step, so every DDP rank runs the same backward passes
                loss = out.sum() * 0.0
            else:
                loss = (per * node_norm)[mask].sum() if norm else per[mask].mean()
            backward_and_step(self.optimizer, loss, comp, t1)
            if bool(mask.any()):
                st.add_batch(float(per.detach()[mask].mean()), out.detach()[mask], y[mask])
        st.components = dict(comp)
        return st

    @torch.no_grad()
    def full_logits(self) -> torch.Tensor:
        """Full-graph forward: every neighbor, mean aggregation (weights 1/deg_in)."""
        self.model.eval()
        if self._adj_t is None:  # the same weights as a sparse matrix: PyG then aggregates with one SpMM
            self._adj_t = adjacency_t(self.pyg.edge_index, self.data.num_nodes, self.sampler_impl,
                                      self.pyg.edge_weight).to(self.device)
        return self.model(to_device(self.data.features, self.device), self._adj_t, None).cpu()

    def evaluate(self):
        accs = list(split_accuracies_local(self.full_logits(), self.data.graph)) if self.rank == 0 else None
        return tuple(broadcast_floats(accs, 3))

    def record_extra(self) -> dict:
        return {"preprocess_s": self.preprocess_s, "sampler_impl": self.sampler_impl}


def make_trainer(cfg: RunConfig, graph, env) -> GraphSAINTTrainer:
    """This rank's trainer (the registry's ``trainer`` of --system graphsaint)."""
    return GraphSAINTTrainer(cfg, baseline_data(cfg, graph), env)
