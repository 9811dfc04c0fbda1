"""Pure-torch samplers of the PyG-based adapters, for a machine without torch-sparse or pyg-lib.

Shape legend: N vertices, E edges of ``edge_index (2, E)`` (row 0 the source u, row 1
the target v, PyG's convention), B seeds, k_h the fanout of hop h (hop 0 the seeds'),
n the vertices of a sample, e its edges, b a GraphSAINT node budget.

``graphsage``, ``graphsaint`` and ``salient`` sample through PyG (``NeighborLoader``,
``GraphSAINTNodeSampler``) or torch-sparse's C++ ``neighbor_sample``, and aggregate
full-graph evaluation with a torch-sparse ``SparseTensor``. A GPU machine often has
neither torch-sparse nor pyg-lib (and no way to build them). This module gives the same
samples by law (not bit for bit: the random streams differ) with vectorized torch ops
on host tensors, sampling on the host as PyG does:

* :class:`LayerwiseSampler` -- PyG's layer-wise neighbor sampling without replacement
  (``neighbor_sample(colptr, row, seeds, fanouts, replace=False, directed=True)``):
  hop h takes the vertices that hop h-1 added (the seeds at hop 0) and each keeps
  ``min(k_h, deg_in)`` distinct in-neighbors, a uniform random subset (all of them when
  ``k_h = -1``); ``n_id`` lists the seeds first, in order, then every new vertex in the
  order it first appears; ``edge_index`` holds the sampled edges in local ids
  ``[source; target]``. The subset is Floyd's algorithm (each k-subset equally likely;
  torch-sparse draws Floyd's positions from [0, m) instead of [0, m] and is not
  uniform, rusty1s/pytorch_sparse#385), k vector steps over all the frontier at once.
* :class:`SaintNodeSampler` -- PyG's ``GraphSAINTNodeSampler``: b edges drawn
  uniformly with replacement, their sources kept (so ``P(v in a draw) = d_out(v) / E``),
  sorted unique; the induced subgraph in the order of ``SparseTensor.saint_subgraph``
  (by local source, then target) with the ids of its edges in ``edge_index``; PyG's
  sampled normalization statistics (:meth:`SaintNodeSampler.coverage_norms`).
* :func:`adjacency_t` -- the transposed adjacency ``A^T (N, N)`` (row v lists the
  sources of v) that full-graph evaluation aggregates with: a ``SparseTensor`` (pyg) or a
  ``torch.sparse`` CSR tensor (torch), which PyG 2.8's convolutions take alike.

Which one runs: every affected adapter has ``--sampler-impl auto|pyg|torch``
(:func:`sampler_impl_setting`), resolved by :func:`resolve_sampler_impl` (auto: pyg
where torch-sparse imports, so records made with it do not change) and written to the
run record as ``sampler_impl``.

The pieces shared with FastSample's torch path (:mod:`scalegnn.baselines.fastsample_kernel`,
which samples DGL-style message flow graphs with a counter-based hash instead of a
generator) live here: the CSC topology (:class:`TopologyCSC`), one hop's Floyd draws
(:func:`hop_entries`) and the relabeling by first appearance (:func:`relabel`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from scalegnn.settings import setting

__all__ = ["SAMPLER_IMPLS", "sampler_impl_setting", "check_sampler_impl", "pyg_samplers_available",
           "resolve_sampler_impl", "TopologyCSC", "grouped", "segment_arange", "hop_entries", "generator_draw",
           "relabel", "NeighborSample", "LayerwiseSampler", "NeighborBatches", "SaintNodeSampler", "SaintSubgraphs",
           "adjacency_t"]

SAMPLER_IMPLS = ("auto", "pyg", "torch")


# --------------------------------------------------------------------------- which implementation
def sampler_impl_setting():
    """The ``--sampler-impl`` setting of an options dataclass (one definition for all adapters)."""
    return setting("auto", choices=SAMPLER_IMPLS,
                   help="the samplers: PyG's over torch-sparse (pyg), the pure-torch ones of "
                   "baselines/torch_sampling.py (torch, same law), or pyg when torch-sparse imports (auto)")


def check_sampler_impl(choice: str) -> None:
    if choice not in SAMPLER_IMPLS:
        raise ValueError(f"--sampler-impl must be auto, pyg or torch, got {choice!r}")


def pyg_samplers_available() -> bool:
    """True when torch-sparse imports (PyG's ``NeighborLoader`` can then sample, its
    ``GraphSAINTNodeSampler`` build, and ``SparseTensor`` exist)."""
    try:
        import torch_sparse  # noqa: F401
    except (ImportError, OSError):  # OSError: a wheel built for another torch
        return False
    return True


def resolve_sampler_impl(choice: str) -> str:
    """``"pyg"`` or ``"torch"``: ``choice`` itself, or for ``"auto"`` pyg when torch-sparse
    imports. Forcing pyg without torch-sparse is a one-line error naming the fix."""
    check_sampler_impl(choice)
    if choice == "auto":
        return "pyg" if pyg_samplers_available() else "torch"
    if choice == "pyg" and not pyg_samplers_available():
        raise ValueError("--sampler-impl pyg needs torch-sparse, which does not import here; install it "
                         "(pip install torch-sparse) or use --sampler-impl torch (or auto)")
    return choice


# --------------------------------------------------------------------------- topology and one hop
@dataclass(frozen=True)
class TopologyCSC:
    """The graph by target: the sources of v are ``indices[indptr[v]:indptr[v+1]]``
    (``indptr (N+1,)``, ``indices (E,)`` int64); ``edge_ids (E,)`` the column of each CSC
    entry in the ``edge_index`` it was built from (None when unknown)."""

    indptr: torch.Tensor
    indices: torch.Tensor
    edge_ids: torch.Tensor | None = None

    @property
    def num_nodes(self) -> int:
        return self.indptr.numel() - 1

    @staticmethod
    def from_edge_index(edge_index: torch.Tensor, num_nodes: int) -> "TopologyCSC":
        """From PyG's ``[src; dst]``: stable-sorted by target, sources in their given order."""
        src, dst = edge_index
        order, indptr = grouped(dst, num_nodes)
        return TopologyCSC(indptr, src[order].to(torch.int64).contiguous(), order)


def grouped(key: torch.Tensor, n: int, then: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Entries ``(E,)`` grouped by ``key`` in [0, n): ``order (E,)`` sorting them by key,
    then by ``then`` (else keeping their order), and ``ptr (n+1,)``: the entries of key v
    are ``order[ptr[v]:ptr[v+1]]``. The sorted layouts of this module (CSC by target,
    SparseTensor's by (source, target) and by (target, source)) are all this."""
    if then is None:
        order = torch.argsort(key, stable=True)
    else:
        by_then = torch.argsort(then, stable=True)
        order = by_then[torch.argsort(key[by_then], stable=True)]
    ptr = torch.zeros(n + 1, dtype=torch.int64)
    ptr[1:] = torch.cumsum(torch.bincount(key, minlength=n), 0)
    return order, ptr


def segment_arange(counts: torch.Tensor) -> torch.Tensor:
    """``[0..c_0-1, 0..c_1-1, ...]`` for ``counts (s,)`` (the rank of each entry in its segment)."""
    total = int(counts.sum())
    return torch.arange(total) - torch.repeat_interleave(torch.cumsum(counts, 0) - counts, counts)


# draw(j, m, v) -> t: Floyd's j-th draw for the sampling vertices v (global ids), t (len(v),)
# int64 uniform in [0, m] per vertex (m (len(v),) int64).
Draw = Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor]


def hop_entries(topo: TopologyCSC, dst: torch.Tensor, k: int, draw: Draw) -> tuple[torch.Tensor, torch.Tensor]:
    """One hop: every vertex of ``dst (n,)`` keeps ``min(k, deg_in)`` of its CSC entries
    (all when ``k < 0`` or ``deg_in <= k``, in adjacency order; else Floyd's k-subset, in
    the order Floyd keeps it: for j = 0..k-1, m = deg - k + j, keep ``t = draw(j, m, v)``
    unless already kept, then m). Returns ``ptr (n+1,)`` (vertex i's entries are
    ``ptr[i]:ptr[i+1]``) and ``entries (e,)``, positions into ``topo.indices``. Vectorized
    over the vertices; the loop runs over the k draws."""
    start = topo.indptr[dst]
    deg = topo.indptr[dst + 1] - start
    take_all = deg <= k if k >= 0 else torch.ones_like(deg, dtype=torch.bool)
    cnt = torch.where(take_all, deg, torch.full_like(deg, max(k, 0)))
    ptr = torch.zeros(dst.numel() + 1, dtype=torch.int64)
    ptr[1:] = torch.cumsum(cnt, 0)
    pos = torch.empty(int(ptr[-1]), dtype=torch.int64)  # adjacency position of every kept entry
    alls = take_all.nonzero().flatten()
    if alls.numel():
        rank_in = segment_arange(deg[alls])
        pos[torch.repeat_interleave(ptr[alls], deg[alls]) + rank_in] = rank_in
    some = (~take_all).nonzero().flatten()
    if some.numel():
        d, v = deg[some], dst[some]
        chosen = torch.empty(some.numel(), k, dtype=torch.int64)
        for j in range(k):  # Floyd, one vector step per draw
            m = d - k + j
            t = draw(j, m, v)
            if j:
                t = torch.where((chosen[:, :j] == t[:, None]).any(1), m, t)
            chosen[:, j] = t
        pos[(ptr[some][:, None] + torch.arange(k)).flatten()] = chosen.flatten()
    owner = torch.repeat_interleave(torch.arange(dst.numel()), cnt)
    return ptr, start[owner] + pos


def generator_draw(generator: torch.Generator) -> Draw:
    """Floyd's draws from a torch generator: ``t = floor(u (m + 1))``, u uniform in [0, 1)
    in float64 (bias below 2^-52 for any degree that fits in memory)."""
    def draw(j: int, m: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        u = torch.rand(v.numel(), generator=generator, dtype=torch.float64)
        return torch.minimum((u * (m + 1).to(torch.float64)).to(torch.int64), m)
    return draw


def relabel(n_id: torch.Tensor, src: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Local ids of the global ids ``src (e,)`` in ``n_id (n,)``, and ``n_id`` grown by the
    vertices it lacked, appended in order of first appearance in ``src``. A vertex that
    ``n_id`` lists twice (duplicate seeds) maps to its first place, as torch-sparse's map
    does. O((n + e) log(n + e)), no (N,) map."""
    local = torch.empty_like(src)
    if n_id.numel():
        sorted_ids, order = torch.sort(n_id, stable=True)
        pos = torch.searchsorted(sorted_ids, src).clamp(max=n_id.numel() - 1)
        known = sorted_ids[pos] == src
        local[known] = order[pos[known]]
    else:
        known = torch.zeros_like(src, dtype=torch.bool)
    new = src[~known]
    if new.numel():
        uniq, inv = torch.unique(new, return_inverse=True)
        first = torch.full((uniq.numel(),), new.numel(), dtype=torch.int64)
        first.scatter_reduce_(0, inv, torch.arange(new.numel()), reduce="amin")
        by_first = torch.argsort(first)
        local_of = torch.empty(uniq.numel(), dtype=torch.int64)
        local_of[by_first] = torch.arange(n_id.numel(), n_id.numel() + uniq.numel())
        local[~known] = local_of[inv]
        n_id = torch.cat([n_id, uniq[by_first]])
    return local, n_id


# --------------------------------------------------------------------------- neighbor sampling
@dataclass
class NeighborSample:
    """One sampled computation graph, as PyG's ``NeighborLoader`` batch has it: ``n_id (n,)``
    global ids, the ``batch_size`` seeds first; ``edge_index (2, e)`` local
    ``[source; target]``; ``e_id (e,)`` the sampled edges' columns in the input
    ``edge_index``; ``y`` the labels of ``n_id`` (when the loader has labels)."""

    n_id: torch.Tensor
    edge_index: torch.Tensor
    e_id: torch.Tensor
    batch_size: int
    y: torch.Tensor | None = None


class LayerwiseSampler:
    """PyG's neighbor sampling without replacement (``directed=True``) in torch; see the
    module docstring. ``sample`` is safe to call from several threads (each call its own
    tensors; a torch generator serializes its draws)."""

    def __init__(self, edge_index: torch.Tensor, num_nodes: int):
        self.topo = TopologyCSC.from_edge_index(edge_index, num_nodes)

    def sample(self, seeds: torch.Tensor, fanouts, generator: torch.Generator) -> NeighborSample:
        """The sample of ``seeds (B,)`` for ``fanouts`` (hop 0 the seeds'; -1 = all)."""
        topo, draw = self.topo, generator_draw(generator)
        n_id = seeds.to(torch.int64)
        begin, end = 0, n_id.numel()
        rows, cols, eids = [], [], []
        for k in fanouts:
            ptr, entries = hop_entries(topo, n_id[begin:end], int(k), draw)
            local, n_id = relabel(n_id, topo.indices[entries])
            rows.append(local)
            cols.append(begin + torch.repeat_interleave(torch.arange(end - begin), ptr[1:] - ptr[:-1]))
            eids.append(topo.edge_ids[entries])
            begin, end = end, n_id.numel()
        empty = torch.zeros(0, dtype=torch.int64)
        edge_index = torch.stack([torch.cat(rows) if rows else empty, torch.cat(cols) if cols else empty])
        return NeighborSample(n_id=n_id, edge_index=edge_index, e_id=torch.cat(eids) if eids else empty,
                              batch_size=int(seeds.numel()))


class NeighborBatches:
    """``NeighborLoader`` in torch: ``seeds`` in batches of ``batch_size`` (shuffled by the
    generator when ``shuffle``), each sampled by ``sampler`` with ``fanouts``; batches carry
    ``y[n_id]`` when ``y`` is given."""

    def __init__(self, sampler: LayerwiseSampler, seeds: torch.Tensor, fanouts, batch_size: int, shuffle: bool,
                 generator: torch.Generator, y: torch.Tensor | None = None):
        self.sampler, self.seeds, self.fanouts = sampler, seeds, list(fanouts)
        self.batch_size, self.shuffle, self.generator, self.y = batch_size, shuffle, generator, y

    def __len__(self) -> int:
        return -(-self.seeds.numel() // self.batch_size)

    def __iter__(self):
        seeds = self.seeds
        if self.shuffle:
            seeds = seeds[torch.randperm(seeds.numel(), generator=self.generator)]
        for chunk in seeds.split(self.batch_size):
            s = self.sampler.sample(chunk, self.fanouts, self.generator)
            if self.y is not None:
                s.y = self.y[s.n_id]
            yield s


# --------------------------------------------------------------------------- GraphSAINT node sampling
class SaintNodeSampler:
    """PyG's ``GraphSAINTNodeSampler`` in torch (see the module docstring).

    The edges are held as ``SparseTensor(row=src, col=dst)`` holds them: sorted by
    (source, target), ``rowptr (N+1,)``, ``col (E,)``, ``e_id (E,)`` their columns in
    ``edge_index``."""

    def __init__(self, edge_index: torch.Tensor, num_nodes: int, budget: int):
        src, dst = edge_index
        order, self.rowptr = grouped(src, num_nodes, then=dst)  # (src, dst) lexicographic
        self.num_nodes, self.num_edges, self.budget = num_nodes, int(src.numel()), budget
        self.row, self.col, self.e_id = src[order], dst[order], order
        self.src = src

    def sample_nodes(self, generator: torch.Generator) -> torch.Tensor:
        """``(n,)`` sorted unique sources of ``budget`` edges drawn uniformly with replacement."""
        if self.num_edges == 0:
            return torch.zeros(0, dtype=torch.int64)
        return self.row[torch.randint(0, self.num_edges, (self.budget,), generator=generator)].unique()

    def subgraph(self, nodes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The subgraph induced by the sorted unique ``nodes (n,)``: ``edge_index (2, e)`` in
        local ids (positions in ``nodes``), ordered by local source then target, and
        ``e_id (e,)`` its edges' columns in the input ``edge_index``."""
        start = self.rowptr[nodes]
        deg = self.rowptr[nodes + 1] - start
        entries = torch.repeat_interleave(start, deg) + segment_arange(deg)
        assoc = torch.full((self.num_nodes,), -1, dtype=torch.int64)  # as torch-sparse's saint_subgraph
        assoc[nodes] = torch.arange(nodes.numel())
        col = assoc[self.col[entries]]
        keep = col >= 0
        row_local = torch.repeat_interleave(torch.arange(nodes.numel()), deg)
        return torch.stack([row_local[keep], col[keep]]), self.e_id[entries[keep]]

    def coverage_norms(self, num_steps: int, coverage: int, generator: torch.Generator):
        """PyG's sampled normalization (``GraphSAINTSampler._compute_norm``): whole epochs of
        ``num_steps`` subgraphs until ``coverage * N`` vertices were drawn;
        ``edge_norm_e = count(src_e) / count(e)`` clamped to [0, 1e4] (0.1 where 0/0) and
        ``node_norm_v = samples / count(v) / N`` (a count of 0 read as 0.1)."""
        n = self.num_nodes
        node_count = torch.zeros(n)
        edge_count = torch.zeros(self.num_edges)
        num_samples = total = 0
        while total < n * coverage:
            for _ in range(num_steps):
                nodes = self.sample_nodes(generator)
                _, e_id = self.subgraph(nodes)
                node_count[nodes] += 1
                edge_count[e_id] += 1
                total += nodes.numel()
            num_samples += num_steps
        edge_norm = (node_count[self.src] / edge_count).clamp_(0, 1e4)
        edge_norm[torch.isnan(edge_norm)] = 0.1
        node_count[node_count == 0] = 0.1
        return num_samples / node_count / n, edge_norm


class SaintSubgraphs:
    """The ``GraphSAINTNodeSampler`` loader in torch: ``num_steps`` subgraphs per iteration,
    each a ``data.__class__`` with ``num_nodes``, the local ``edge_index``, every node-sized
    tensor of ``data`` sliced to the subgraph's vertices and every edge-sized one to its
    edges (as PyG collates), plus ``node_norm`` / ``edge_norm`` when ``sample_coverage > 0``
    (statistics drawn with ``stats_generator``)."""

    def __init__(self, data, budget: int, num_steps: int, sample_coverage: int, generator: torch.Generator,
                 stats_generator: torch.Generator | None = None):
        self.data, self.num_steps, self.generator = data, num_steps, generator
        self.sampler = SaintNodeSampler(data.edge_index, data.num_nodes, budget)
        self.norms = None
        if sample_coverage > 0:
            self.norms = self.sampler.coverage_norms(num_steps, sample_coverage, stats_generator or generator)

    def __len__(self) -> int:
        return self.num_steps

    def __iter__(self):
        for _ in range(self.num_steps):
            yield self.collate(self.sampler.sample_nodes(self.generator))

    def collate(self, nodes: torch.Tensor):
        edge_index, e_id = self.sampler.subgraph(nodes)
        n, e = self.sampler.num_nodes, self.sampler.num_edges
        out = self.data.__class__()
        out.num_nodes = nodes.numel()
        out.edge_index = edge_index
        for key, item in self.data:
            if key in ("edge_index", "num_nodes"):
                continue
            if isinstance(item, torch.Tensor) and item.size(0) == n:
                out[key] = item[nodes]
            elif isinstance(item, torch.Tensor) and item.size(0) == e:
                out[key] = item[e_id]
            else:
                out[key] = item
        if self.norms is not None:
            out.node_norm, out.edge_norm = self.norms[0][nodes], self.norms[1][e_id]
        return out


# --------------------------------------------------------------------------- the aggregation matrix
def adjacency_t(edge_index: torch.Tensor, num_nodes: int, impl: str, value: torch.Tensor | None = None):
    """``A^T (N, N)``: row v holds the sources u of the edges (u, v), with ``value (E,)``
    (ones when None); a torch-sparse ``SparseTensor`` for ``impl="pyg"``, a ``torch.sparse``
    CSR tensor for ``"torch"``. PyG's convolutions aggregate with either in one SpMM."""
    src, dst = edge_index
    n = num_nodes
    if impl == "pyg":
        from torch_sparse import SparseTensor

        return SparseTensor(row=dst, col=src, value=value, sparse_sizes=(n, n))
    order, crow = grouped(dst, n, then=src)  # (dst, src) lexicographic, as SparseTensor sorts
    values = value[order] if value is not None else torch.ones(order.numel())
    return torch.sparse_csr_tensor(crow, src[order], values, (n, n))
