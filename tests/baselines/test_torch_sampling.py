"""The pure-torch samplers (baselines/torch_sampling.py) that stand in for torch-sparse and
pyg-lib: the invariants and the law of layer-wise neighbor sampling, GraphSAINT's node
distribution and induced subgraphs, the CSR aggregation matrix (its convolutions on every device: test_device.py),
the ``--sampler-impl`` choice, and graphsage / graphsaint / salient trained with them.

Statistical tests run on fixed seeds, so they are deterministic; the false-failure rate
stated with each is the chance that a *correct* sampler fails for a seed picked at
random (the bound the thresholds are set from). Each has a planted bug it rejects.
Comparisons with torch-sparse skip where it is missing (the GPU machine); the rest
needs only torch and PyG."""

from __future__ import annotations

import math
import sys
import warnings
from itertools import combinations

import pytest
import torch

pytest.importorskip("torch_geometric")
stats = pytest.importorskip("scipy.stats")

warnings.filterwarnings("ignore", message=".*pyg-lib.*")

import scalegnn  # noqa: E402
from scalegnn.baselines.torch_sampling import (LayerwiseSampler, SaintNodeSampler, SaintSubgraphs,  # noqa: E402
                                               TopologyCSC, adjacency_t, generator_draw, hop_entries,
                                               pyg_samplers_available, resolve_sampler_impl)

needs_torch_sparse = pytest.mark.skipif(not pyg_samplers_available(), reason="torch-sparse is not installed")
ALPHA = 1e-4  # the false-failure rate of each statistical check below


def random_graph(n=60, m=400, seed=0):
    """A symmetric random graph ``edge_index (2, E)`` with a hub (adjacent to a third of the
    vertices), isolated vertices and a degree-1 pair, its columns in random order."""
    gen = torch.Generator().manual_seed(seed)
    src, dst = torch.randint(0, n - 3, (m,), generator=gen), torch.randint(0, n - 3, (m,), generator=gen)
    spokes = torch.arange(1, n - 3, 3)
    src, dst = torch.cat([src, torch.zeros_like(spokes), torch.tensor([n - 2])]), \
        torch.cat([dst, spokes, torch.tensor([n - 1])])  # vertex n-3 isolated
    ei = torch.stack([torch.cat([src, dst]), torch.cat([dst, src])])
    ei = ei[:, ei[0] != ei[1]].unique(dim=1)
    return ei[:, torch.randperm(ei.size(1), generator=gen)], n


def in_degree(ei, n):
    return torch.bincount(ei[1], minlength=n)


def hop_levels(sample, hops: int) -> list[tuple[int, int]]:
    """The local-id ranges ``[begin, end)`` of the frontier of each hop (hop 0: the seeds),
    read from the sample: a hop's new vertices are the largest source it names."""
    src, dst = sample.edge_index
    levels, begin, end = [], 0, sample.batch_size
    for _ in range(hops):
        levels.append((begin, end))
        mine = (dst >= begin) & (dst < end)
        begin, end = end, max(end, int(src[mine].max()) + 1 if bool(mine.any()) else end)
    return levels


# ----------------------------------------------------------------------------- neighbor sampling
@pytest.mark.parametrize("fanouts", [(3,), (4, 2), (2, -1, 3), (-1,)])
def test_neighbor_samples_keep_their_invariants(fanouts):
    """Every sampled edge is an edge of the graph (and ``e_id`` names it); each frontier
    vertex of hop h receives exactly min(k_h, deg_in) distinct in-neighbors; the seeds come
    first, in order, every other vertex once, in order of first appearance as a source."""
    ei, n = random_graph()
    deg = in_degree(ei, n)
    edges = set(zip(ei[0].tolist(), ei[1].tolist()))
    sampler = LayerwiseSampler(ei, n)
    seeds = torch.tensor([0, 5, n - 3, n - 2, 17, 30])  # the hub, an isolated vertex, a degree-1 one
    s = sampler.sample(seeds, fanouts, torch.Generator().manual_seed(1))
    src, dst = s.edge_index
    assert torch.equal(s.n_id[: seeds.numel()], seeds) and s.batch_size == seeds.numel()
    assert s.n_id.unique().numel() == s.n_id.numel()
    assert torch.equal(ei[:, s.e_id], s.n_id[s.edge_index])
    assert all(e in edges for e in zip(s.n_id[src].tolist(), s.n_id[dst].tolist()))
    pairs = list(zip(src.tolist(), dst.tolist()))
    assert len(set(pairs)) == len(pairs), "an in-neighbor drawn twice for one target"
    got = torch.bincount(dst, minlength=s.n_id.numel())
    levels = hop_levels(s, len(fanouts))
    want = torch.zeros_like(got)
    for (begin, end), k in zip(levels, fanouts):
        d = deg[s.n_id[begin:end]]
        want[begin:end] = d if k < 0 else torch.clamp(d, max=k)
    assert torch.equal(got, want)
    assert bool((dst[1:] >= dst[:-1]).all()), "edges grouped by target, hop by hop"
    first = torch.full((s.n_id.numel(),), src.numel(), dtype=torch.int64)
    first.scatter_reduce_(0, src, torch.arange(src.numel()), reduce="amin")
    new = first[seeds.numel():]
    assert bool((new[1:] > new[:-1]).all()), "new vertices numbered in order of first appearance"


def test_neighbor_samples_are_a_function_of_the_generator():
    ei, n = random_graph()
    sampler = LayerwiseSampler(ei, n)
    seeds = torch.arange(0, 40, 3)

    def draw(seed):
        return sampler.sample(seeds, (3, 2), torch.Generator().manual_seed(seed))

    a, b, c = draw(7), draw(7), draw(8)
    assert torch.equal(a.n_id, b.n_id) and torch.equal(a.edge_index, b.edge_index)
    assert not (a.n_id.numel() == c.n_id.numel() and torch.equal(a.n_id, c.n_id)
                and torch.equal(a.edge_index, c.edge_index))


@needs_torch_sparse
@pytest.mark.parametrize("fanouts", [(-1, -1), (100, 100, 100)])
def test_taking_every_neighbor_gives_torch_sparses_sample_exactly(fanouts):
    """Where no draw happens (fanout -1 or above every degree) the sample is deterministic:
    the same ``n_id`` and ``edge_index`` as torch-sparse's ``neighbor_sample``, duplicate
    seeds included (SALIENT pads batches by wrap-around)."""
    ei, n = random_graph()
    ei = ei[:, torch.argsort(ei[1] * n + ei[0])]  # torch-sparse's CSC order: by target, then source
    topo = TopologyCSC.from_edge_index(ei, n)
    seeds = torch.tensor([3, 0, 11, 3, 40])
    node, row, col, _ = torch.ops.torch_sparse.neighbor_sample(topo.indptr, topo.indices, seeds, list(fanouts),
                                                               False, True)
    s = LayerwiseSampler(ei, n).sample(seeds, fanouts, torch.Generator().manual_seed(0))
    assert torch.equal(s.n_id, node) and torch.equal(s.edge_index, torch.stack([row, col]))


def _subset_pvalue(draw, d=6, k=2, targets=3000) -> float:
    """Chi-square p-value of the k-subsets that ``targets`` vertices, each with the same
    d in-neighbors (K_{targets,d}), drew in one sample: all C(d, k) equally likely."""
    ei = torch.stack([targets + torch.arange(d).repeat(targets),
                      torch.arange(targets).repeat_interleave(d)])
    topo = TopologyCSC.from_edge_index(ei, targets + d)
    ptr, entries = hop_entries(topo, torch.arange(targets), k, draw)
    chosen = (topo.indices[entries] - targets).view(targets, k).sort(1).values
    counts = {s: 0 for s in combinations(range(d), k)}
    for row in chosen.tolist():
        counts[tuple(row)] += 1
    return float(stats.chisquare(list(counts.values())).pvalue)


def test_every_fanout_subset_is_equally_likely():
    """The joint law: 3000 independent draws of 2 of 6 in-neighbors; every one of the 15
    subsets is equally likely (chi-square, false-failure rate ALPHA); and one uniform
    draw that LayerwiseSampler makes gives the same (the sampler is hop_entries with
    generator_draw)."""
    assert _subset_pvalue(generator_draw(torch.Generator().manual_seed(11))) > ALPHA


def test_the_subset_check_rejects_a_biased_draw():
    """A planted bug, torch-sparse's (rusty1s/pytorch_sparse#385): Floyd's t drawn from
    [0, m) instead of [0, m]. The same check rejects it."""
    gen = torch.Generator().manual_seed(11)

    def biased(j, m, v):
        return (torch.rand(v.numel(), generator=gen, dtype=torch.float64) * m).to(torch.int64)

    assert _subset_pvalue(biased) < ALPHA


def test_each_in_neighbor_is_drawn_with_probability_fanout_over_degree():
    """The marginal law through the whole sampler: over 1500 samples of every vertex with
    fanout 3, each edge (u, v) is drawn with probability min(1, 3 / deg_in(v)): every count
    inside its exact binomial interval at level ALPHA / (number of uncertain edges)."""
    ei, n = random_graph(n=40, m=160)
    deg = in_degree(ei, n)
    sampler, gen, k, trials = LayerwiseSampler(ei, n), torch.Generator().manual_seed(3), 3, 1500
    counts = torch.zeros(ei.size(1), dtype=torch.int64)
    for _ in range(trials):
        s = sampler.sample(torch.arange(n), (k,), gen)
        counts += torch.bincount(s.e_id, minlength=ei.size(1))
    p = torch.clamp(k / deg[ei[1]].double(), max=1.0)
    certain = p == 1
    assert bool((counts[certain] == trials).all())
    lo, hi = stats.binom.interval(1 - ALPHA / int((~certain).sum()), trials, p[~certain].numpy())
    c = counts[~certain].numpy()
    assert ((c >= lo) & (c <= hi)).all()


# ----------------------------------------------------------------------------- GraphSAINT
def test_saint_draws_vertices_with_probability_one_minus_miss_to_the_budget():
    """PyG's node sampler law: ``budget`` uniform edges, their sources kept, so v is in a
    subgraph with p_v = 1 - (1 - d_v/E)^budget. Over 2000 subgraphs every count lies in
    its exact binomial interval (Bonferroni over the vertices, false-failure rate ALPHA),
    and a planted bug (vertices drawn uniformly) is rejected."""
    ei, n = random_graph()
    e, budget, trials = ei.size(1), 25, 2000
    d = torch.bincount(ei[0], minlength=n).double()
    p = 1 - (1 - d / e) ** budget
    sampler, gen = SaintNodeSampler(ei, n, budget), torch.Generator().manual_seed(5)

    def within(draw) -> bool:
        counts = torch.zeros(n, dtype=torch.int64)
        for _ in range(trials):
            nodes = draw()
            assert bool((nodes[1:] > nodes[:-1]).all()), "sorted and unique"
            counts[nodes] += 1
        live = p > 0
        lo, hi = stats.binom.interval(1 - ALPHA / int(live.sum()), trials, p[live].numpy())
        c = counts[live].numpy()
        return bool(((c >= lo) & (c <= hi)).all()) and bool((counts[~live] == 0).all())

    assert within(lambda: sampler.sample_nodes(gen))
    assert not within(lambda: torch.randint(0, n, (budget,), generator=gen).unique())


def test_saint_subgraphs_are_the_induced_subgraphs():
    """For random vertex sets: the subgraph holds exactly the graph's edges with both ends
    in the set, in local ids, ordered by (source, target); ``e_id`` names them."""
    ei, n = random_graph()
    edges = list(zip(ei[0].tolist(), ei[1].tolist()))
    sampler, gen = SaintNodeSampler(ei, n, 30), torch.Generator().manual_seed(2)
    for _ in range(20):
        nodes = sampler.sample_nodes(gen)
        sub, e_id = sampler.subgraph(nodes)
        inside = set(nodes.tolist())
        want = sorted((u, v) for u, v in edges if u in inside and v in inside)
        got = list(zip(nodes[sub[0]].tolist(), nodes[sub[1]].tolist()))
        assert got == want
        assert torch.equal(ei[:, e_id], nodes[sub])


@needs_torch_sparse
def test_saint_subgraphs_equal_torch_sparses():
    """The same vertex set gives torch-sparse's ``saint_subgraph`` exactly (edges, order, edge ids)."""
    from torch_sparse import SparseTensor

    ei, n = random_graph()
    adj = SparseTensor(row=ei[0], col=ei[1], value=torch.arange(ei.size(1)), sparse_sizes=(n, n))
    sampler, gen = SaintNodeSampler(ei, n, 30), torch.Generator().manual_seed(4)
    for _ in range(10):
        nodes = sampler.sample_nodes(gen)
        theirs, _ = adj.saint_subgraph(nodes)
        row, col, e_id = theirs.coo()
        sub, mine = sampler.subgraph(nodes)
        assert torch.equal(sub, torch.stack([row, col])) and torch.equal(mine, e_id)


def test_saint_loader_slices_node_and_edge_attributes_and_estimates_the_norms():
    """Every node-sized attribute is sliced by the subgraph's vertices, every edge-sized one
    by its edges; the sampled statistics are PyG's estimates: node_norm_v = samples /
    (count_v N) estimates 1 / (N p_v), checked within 25 % on a well-covered graph."""
    from torch_geometric.data import Data

    ei, n = random_graph()
    data = Data(edge_index=ei, num_nodes=n, n_id=torch.arange(n), edge_weight=torch.arange(ei.size(1)).float())
    loader = SaintSubgraphs(data, 25, 4, 400, torch.Generator().manual_seed(1), torch.Generator().manual_seed(2))
    subs = list(loader)
    assert len(subs) == len(loader) == 4
    for sub in subs:
        assert torch.equal(ei[:, sub.edge_weight.long()], sub.n_id[sub.edge_index])
        assert sub.node_norm.shape == sub.n_id.shape and sub.edge_norm.numel() == sub.edge_index.size(1)
    d = torch.bincount(ei[0], minlength=n).double()
    p = 1 - (1 - d / ei.size(1)) ** 25
    node_norm = loader.norms[0].double()
    live = p > 0.3
    assert torch.allclose(node_norm[live], 1 / (n * p[live]), rtol=0.25)


# ----------------------------------------------------------------------------- the aggregation matrix
def test_csr_aggregation_is_a_t():
    """Row v of the matrix lists the sources of v's in-edges with their values. (That every
    convolution gives the same output over it as over ``edge_index`` and torch-sparse's
    ``SparseTensor``, on every device: ``tests/baselines/test_device.py``.)"""
    ei, n = random_graph()
    w = torch.rand(ei.size(1))
    dense = adjacency_t(ei, n, "torch", w).to_dense()
    want = torch.zeros(n, n)
    want[ei[1], ei[0]] = w
    assert torch.equal(dense, want)


# ----------------------------------------------------------------------------- which implementation
def test_auto_picks_pyg_where_torch_sparse_imports_and_torch_elsewhere(monkeypatch):
    import scalegnn.baselines.torch_sampling as ts

    assert resolve_sampler_impl("auto") == ("pyg" if pyg_samplers_available() else "torch")
    assert resolve_sampler_impl("torch") == "torch"
    monkeypatch.setitem(sys.modules, "torch_sparse", None)  # import torch_sparse now raises ImportError
    assert not ts.pyg_samplers_available()
    assert resolve_sampler_impl("auto") == "torch"
    with pytest.raises(ValueError, match="--sampler-impl pyg needs torch-sparse.*--sampler-impl torch"):
        resolve_sampler_impl("pyg")
    with pytest.raises(ValueError, match="--sampler-impl must be auto, pyg or torch, got 'dgl'"):
        resolve_sampler_impl("dgl")


@needs_torch_sparse
def test_auto_picks_pyg_here():
    assert resolve_sampler_impl("auto") == "pyg"


# ----------------------------------------------------------------------------- training
# A graph where the neighbors matter (homophily 0.85, weak features): a sampler that drew
# wrong edges would lose accuracy the margin below does not cover.
EASY = "csbm:n=1500,avg_degree=8,classes=3,feature_dim=8,homophily=0.85,signal=1.0"
SYSTEMS = {"graphsage": dict(batch_size=64), "graphsaint": dict(node_budget=200),
           "salient": dict(batch_size=64, partition="random")}


def _train(system, impl, tmp_path, **over):
    kw = dict(system=system, dataset=EASY, epochs=6, seed=1, hidden=16, layers=2, lr=0.01, dropout=0.0, progress=False,
              out_dir=str(tmp_path / f"runs-{impl}"), data_root=str(tmp_path / "data"), sampler_impl=impl)
    return scalegnn.train(**{**kw, **SYSTEMS[system], **over})


def _margin(acc: float, count: int) -> float:
    """Three standard deviations of the difference of two independent accuracies of
    ``acc`` over ``count`` vertices: the two runs draw their samples from the same law, so
    their accuracies differ by sampling noise alone (on the same vertices the runs are
    positively correlated, so this bound is conservative)."""
    return 3 * math.sqrt(2 * acc * (1 - acc) / count)


@needs_torch_sparse
@pytest.mark.parametrize("system", list(SYSTEMS))
def test_training_with_the_torch_samplers_matches_training_with_pyg(system, tmp_path):
    """Forced ``torch`` against forced ``pyg`` on the same run: both ok, the record says
    which ran, the same steps per epoch and configuration but the impl, and validation and
    test accuracy within :func:`_margin` of each other (measured apart by <= 0.011)."""
    from scalegnn.datasets import load_graph
    from scalegnn.config import make_config

    pyg, mine = _train(system, "pyg", tmp_path), _train(system, "torch", tmp_path)
    assert pyg["status"] == mine["status"] == "ok"
    assert (pyg["sampler_impl"], mine["sampler_impl"]) == ("pyg", "torch")
    assert pyg["steps_per_epoch"] == mine["steps_per_epoch"] and len(pyg["epochs"]) == len(mine["epochs"])
    g = load_graph(make_config(system, dataset=EASY, data_root=str(tmp_path / "data")).data, 1)
    for split, idx in (("val_acc", g.val_idx), ("test_acc", g.test_idx)):
        a, b = pyg["epochs"][-1][split], mine["epochs"][-1][split]
        assert abs(a - b) <= _margin(a, idx.numel()), (split, a, b)
    assert mine["epochs"][-1]["test_acc"] > 0.55  # far above chance (1/3) for every system
    assert math.isfinite(mine["epochs"][-1]["loss"]) and mine["epochs"][-1]["loss"] < mine["epochs"][0]["loss"]


@pytest.mark.parametrize("system", list(SYSTEMS))
def test_without_torch_sparse_auto_trains_with_the_torch_samplers(system, tmp_path, monkeypatch):
    """As on a GPU machine without torch-sparse: ``import torch_sparse`` fails, auto picks
    torch, the run is ok and its record says so (graphsage with exact layer-wise evaluation
    too, which aggregates with the CSR matrix)."""
    monkeypatch.setitem(sys.modules, "torch_sparse", None)
    over = dict(eval_mode="layerwise") if system == "graphsage" else {}
    rec = _train(system, "auto", tmp_path, epochs=2, **over)
    assert rec["status"] == "ok", rec.get("error")
    assert rec["sampler_impl"] == "torch" and rec["config"]["options"]["sampler_impl"] == "auto"
    with pytest.raises(ValueError, match="--sampler-impl pyg needs torch-sparse"):
        _train(system, "pyg", tmp_path, epochs=1)


@needs_torch_sparse
def test_graphsage_layerwise_inference_is_the_same_with_either_matrix(tmp_path):
    """Exact inference of the same model over torch-sparse's SparseTensor and over the CSR
    matrix: the same logits to 1e-5 (three layers of float32 aggregation)."""
    from scalegnn.baselines.common import load_data
    from scalegnn.baselines.graphsage import GraphSAGETrainer
    from scalegnn.config import make_config
    from scalegnn.launch.environment import single_env

    logits = {}
    for impl in ("pyg", "torch"):
        cfg = make_config("graphsage", dataset=EASY, data_root=str(tmp_path / "data"), hidden=16, layers=3,
                          sampler_impl=impl, seed=3)
        trainer = GraphSAGETrainer(cfg, load_data(cfg), single_env(cfg.parallel))
        trainer.model.eval()
        logits[impl] = trainer.layerwise_inference()
    assert torch.allclose(logits["pyg"], logits["torch"], rtol=1e-5, atol=1e-5)
