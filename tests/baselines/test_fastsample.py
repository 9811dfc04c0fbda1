"""FastSample: the fused sampler's distribution and its torch twin, the two-round feature
exchange and its bytes, end to end through the CLI, accuracy next to graphsage.

Statistical tests run on fixed seeds, so they are deterministic; the false-failure
rate stated with each is the chance that a *correct* sampler would fail for a seed
picked at random (the bound the thresholds were set from)."""

import warnings

import pytest
import torch

from scalegnn import records
from scalegnn.cli import main
from scalegnn.config import make_config

pytest.importorskip("torch_geometric")
pytest.importorskip("torch_sparse")
stats = pytest.importorskip("scipy.stats")

warnings.filterwarnings("ignore", message=".*pyg-lib.*")

from scalegnn.baselines.fastsample import (FeatureExchange, blocks_forward, hybrid_placement,  # noqa: E402
                                  topology_sampler_traffic)
from scalegnn.baselines.fastsample_kernel import TopologyCSC, available, sample_blocks  # noqa: E402
from scalegnn.launch import launch

TINY = "csbm:n=400,avg_degree=6,classes=3,feature_dim=12"
needs_numba = pytest.mark.skipif(not available(), reason="numba is not installed")


def random_topology(n=60, m=400, seed=0, hub=True):
    """A symmetric random graph with isolated vertices, degree-1 vertices and (``hub``) one
    vertex adjacent to a third of the others: awkward degrees on both sides of any fanout."""
    gen = torch.Generator().manual_seed(seed)
    src, dst = torch.randint(0, n - 3, (m,), generator=gen), torch.randint(0, n - 3, (m,), generator=gen)
    if hub:
        spokes = torch.arange(1, n - 3, 3)
        src, dst = torch.cat([src, torch.zeros_like(spokes)]), torch.cat([dst, spokes])
    src, dst = torch.cat([src, torch.tensor([n - 2])]), torch.cat([dst, torch.tensor([n - 1])])  # n-3 isolated
    ei = torch.stack([torch.cat([src, dst]), torch.cat([dst, src])])
    ei = ei[:, ei[0] != ei[1]].unique(dim=1)
    return TopologyCSC.from_edge_index(ei, n), ei


def neighbors(topo, v):
    return topo.indices[topo.indptr[v]:topo.indptr[v + 1]]


# ----------------------------------------------------------------------------- the fused kernel
@needs_numba
@pytest.mark.parametrize("fanouts", [(3,), (5, 3), (10, 4, 2), (-1, 2), (2, 2, 2, 2), (100, 1), (70, 70)])
def test_fused_kernel_equals_the_torch_path_bit_for_bit(fanouts):
    """Serial and threaded kernel against the torch path; (70, 70) on a graph whose hub
    has ~100 neighbors (Floyd over a long list)."""
    topo, _ = random_topology(n=300 if 70 in fanouts else 60, seed=len(fanouts))
    gen = torch.Generator().manual_seed(1)
    for key in (0, 7, 2**32 - 1):
        seeds = torch.randperm(topo.num_nodes, generator=gen)[:17]
        seeds[0] = 0  # the hub
        a = sample_blocks(topo, seeds.unique(), fanouts, key, backend="numba", threads=1 + key % 2)
        b = sample_blocks(topo, seeds.unique(), fanouts, key, backend="torch")
        assert torch.equal(a.n_id, b.n_id)
        assert len(a.blocks) == len(b.blocks) == len(fanouts)
        for x, y in zip(a.blocks, b.blocks):
            assert (x.num_src, x.num_dst) == (y.num_src, y.num_dst)
            assert torch.equal(x.indptr, y.indptr) and torch.equal(x.indices, y.indices)


@pytest.mark.parametrize("backend", ["torch", pytest.param("numba", marks=needs_numba)])
def test_blocks_are_message_flow_graphs_without_replacement(backend):
    """Seeds first, every V^l a prefix of V^{l-1}, unique vertices, edges of the graph
    only, min(fanout, deg) distinct sources per destination, each block's sources the
    next level's vertices; and a pure function of the key."""
    topo, ei = random_topology()
    edges = set(zip(ei[0].tolist(), ei[1].tolist()))
    seeds = torch.tensor([0, 5, 9, 57, 59, 30])  # the hub, ordinary ones, the isolated one, a degree-1 one
    fanouts = (4, 3, 2)
    s = sample_blocks(topo, seeds, fanouts, 42, backend=backend)
    assert torch.equal(s.n_id[:6], seeds) and s.n_id.unique().numel() == s.n_id.numel()
    sizes = s.level_sizes()
    assert sizes[-1] == 6 and all(a >= b for a, b in zip(sizes, sizes[1:])) and sizes[0] == s.n_id.numel()
    for layer, blk in enumerate(s.blocks):
        k = fanouts[len(fanouts) - 1 - layer]
        assert blk.indptr.numel() == blk.num_dst + 1
        assert blk.indices.numel() == 0 or int(blk.indices.max()) < blk.num_src
        for i in range(blk.num_dst):
            v = int(s.n_id[i])
            srcs = s.n_id[blk.indices[blk.indptr[i]:blk.indptr[i + 1]]].tolist()
            deg = neighbors(topo, v).numel()
            assert len(srcs) == min(k, deg) and len(set(srcs)) == len(srcs)
            assert all((u, v) in edges for u in srcs)
    again = sample_blocks(topo, seeds, fanouts, 42, backend=backend)
    assert torch.equal(again.n_id, s.n_id)
    other = sample_blocks(topo, seeds, fanouts, 43, backend=backend)
    assert not torch.equal(other.n_id, s.n_id) or not torch.equal(other.blocks[-1].indices, s.blocks[-1].indices)


# ----------------------------------------------------------------------------- the distribution
TRIALS = 1500
ALPHA = 1e-4  # the false-failure rate of each statistical check below (Bonferroni over its cells)


def _one_hop_counts(draw, topo, k, trials=TRIALS):
    """counts[e] = trials in which the entry e of the CSC (a neighbor of its target) was drawn;
    ``draw(trial)`` returns the (target, source) pairs of one hop over all vertices."""
    n = topo.num_nodes
    pos = {}
    for v in range(n):
        for j, u in enumerate(neighbors(topo, v).tolist()):
            pos[(v, u)] = int(topo.indptr[v]) + j
    counts = torch.zeros(topo.indices.numel(), dtype=torch.int64)
    for t in range(trials):
        pairs = draw(t)
        assert len(set(pairs)) == len(pairs), "a neighbor drawn twice in one sample: with replacement"
        for vu in pairs:
            counts[pos[vu]] += 1
    return counts


def _fused_draw(topo, k, backend="auto"):
    seeds = torch.arange(topo.num_nodes)

    def draw(t):
        s = sample_blocks(topo, seeds, (k,), 1000 + t, backend=backend)
        blk = s.blocks[0]
        dst = torch.repeat_interleave(torch.arange(blk.num_dst), blk.indptr[1:] - blk.indptr[:-1])
        return list(zip(s.n_id[dst].tolist(), s.n_id[blk.indices].tolist()))
    return draw


def _pyg_draw(topo, k):
    """PyG NeighborLoader's sampler (torch-sparse's ``neighbor_sample``, replace=False), one hop."""
    seeds = torch.arange(topo.num_nodes)

    def draw(t):
        torch.manual_seed(1000 + t)
        node, row, col, _ = torch.ops.torch_sparse.neighbor_sample(topo.indptr, topo.indices, seeds, [k], False, True)
        return list(zip(node[col].tolist(), node[row].tolist()))
    return draw


def _with_replacement_draw(topo, k):
    """A planted bug: k draws with replacement (then unique) -- inclusion 1 - (1 - 1/d)^k < k/d."""
    gen = torch.Generator().manual_seed(5)

    def draw(t):
        out = []
        for v in range(topo.num_nodes):
            nb = neighbors(topo, v)
            if nb.numel() <= k:
                out += [(v, int(u)) for u in nb]
            else:
                out += [(v, int(u)) for u in nb[torch.randint(0, nb.numel(), (k,), generator=gen)].unique()]
        return out
    return draw


def inclusion_ok(topo, k, counts, trials=TRIALS, alpha=ALPHA) -> bool:
    """Every entry drawn with probability min(1, k/deg): each count inside its exact
    two-sided binomial interval at level alpha / (number of entries); certain ones always."""
    deg = (topo.indptr[1:] - topo.indptr[:-1])
    owner = torch.repeat_interleave(torch.arange(topo.num_nodes), deg)
    p = torch.clamp(k / deg[owner].double(), max=1.0)
    cells = int((p < 1).sum())
    lo, hi = stats.binom.interval(1 - alpha / max(cells, 1), trials, p.numpy())
    certain = p == 1
    ok_certain = bool((counts[certain] == trials).all())
    ok_rest = bool(((counts[~certain].numpy() >= lo[~certain.numpy()]) &
                    (counts[~certain].numpy() <= hi[~certain.numpy()])).all())
    return ok_certain and ok_rest


TORCH_SPARSE_BIAS = pytest.mark.xfail(
    strict=True, reason="torch-sparse's neighbor_sample (PyG NeighborLoader without pyg-lib) draws Floyd's t from "
    "[0, m) instead of [0, m]: not uniform (rusty1s/pytorch_sparse#385, open; fix proposed in #386). If this passes, "
    "torch-sparse was fixed: drop the mark.")


@pytest.mark.parametrize("which", ["fused", pytest.param("pyg", marks=TORCH_SPARSE_BIAS)])
def test_each_neighbor_is_drawn_with_probability_min_1_fanout_over_degree(which):
    """Our fused sampler passes the exact binomial check of neighbor sampling's law
    (false-failure rate ALPHA = 1e-4). PyG's NeighborLoader sampler (torch-sparse here)
    is meant to have the same law; the same check shows its known bias."""
    topo, _ = random_topology(n=40, m=160)
    k = 3
    draw = _fused_draw(topo, k) if which == "fused" else _pyg_draw(topo, k)
    assert inclusion_ok(topo, k, _one_hop_counts(draw, topo, k))


def test_the_inclusion_check_rejects_sampling_with_replacement():
    topo, _ = random_topology(n=40, m=160)
    assert not inclusion_ok(topo, 3, _one_hop_counts(_with_replacement_draw(topo, 3), topo, 3))


def _subset_chi2_pvalue(draw_subset, d, k, trials=3000) -> float:
    from itertools import combinations

    subsets = {s: 0 for s in combinations(range(d), k)}
    for t in range(trials):
        subsets[tuple(sorted(draw_subset(t)))] += 1
    observed = list(subsets.values())
    return float(stats.chisquare(observed).pvalue)


@pytest.mark.parametrize("which", ["fused", pytest.param("pyg", marks=TORCH_SPARSE_BIAS)])
def test_every_fanout_subset_is_equally_likely(which):
    """Joint law: a vertex of degree 7 with fanout 3 -- all 35 subsets equally likely
    (chi-square, false-failure rate 1e-4), the law PyG's sampler without replacement
    is meant to have (torch-sparse's has the bias of the planted bug below)."""
    d, k = 7, 3
    ei = torch.stack([torch.arange(1, d + 1), torch.zeros(d, dtype=torch.int64)])
    ei = torch.cat([ei, ei.flip(0)], 1)
    topo = TopologyCSC.from_edge_index(ei, d + 1)
    nb = neighbors(topo, 0).tolist()
    seeds = torch.tensor([0])

    def fused(t):
        s = sample_blocks(topo, seeds, (k,), 5000 + t)
        return [nb.index(int(u)) for u in s.n_id[s.blocks[0].indices]]

    def pyg(t):
        torch.manual_seed(5000 + t)
        node, row, col, _ = torch.ops.torch_sparse.neighbor_sample(topo.indptr, topo.indices, seeds, [k], False, True)
        return [nb.index(int(u)) for u in node[row]]

    assert _subset_chi2_pvalue(fused if which == "fused" else pyg, d, k) > 1e-4


def test_the_subset_check_rejects_a_biased_draw():
    """A planted bug: Floyd's draw over [0, m) instead of [0, m] (the last position is
    kept only as the fallback; torch-sparse's bug): the chi-square test rejects it."""
    d, k = 7, 3
    gen = torch.Generator().manual_seed(3)

    def biased(t):
        chosen = []
        for j in range(k):
            m = d - k + j
            r = int(torch.randint(0, m, (1,), generator=gen))
            chosen.append(m if r in chosen else r)
        return chosen

    assert _subset_chi2_pvalue(biased, d, k) < 1e-4


# ----------------------------------------------------------------------------- model over blocks
def test_blocks_forward_with_all_neighbors_is_the_full_graph_forward():
    """fanouts -1 (every neighbor at every level): the seeds' logits over the blocks equal
    the full-graph SAGENet forward (eval mode)."""
    from scalegnn.baselines.models import SAGENet

    topo, ei = random_topology(n=50, m=200)
    torch.manual_seed(0)
    model = SAGENet(6, 8, 3, 3, 0.5).eval()
    x = torch.randn(50, 6)
    seeds = torch.tensor([3, 0, 17, 44])
    s = sample_blocks(topo, seeds, (-1, -1, -1), 0)
    with torch.no_grad():
        got = blocks_forward(model, x[s.n_id], s.blocks)
        ref = model(x, ei)[seeds]
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- placement and exchange
def test_hybrid_placement_balances_the_labeled_vertices():
    """METIS placement of the features, then every rank owns the same number of training
    vertices within one (the paper's equal seeds per machine); no rank is empty."""
    from scalegnn.baselines.common import load_data

    data = load_data(make_config("fastsample", dataset=TINY, data_root=str(_data_root())))
    train = data.graph.train_idx
    for world in (2, 3, 5):
        part = hybrid_placement(data.graph, world, "metis", 0, train)
        counts = torch.bincount(part[train], minlength=world)
        assert int(counts.max() - counts.min()) <= 1 and int(counts.sum()) == train.numel()
        assert set(part.unique().tolist()) == set(range(world))


_ROOT = {}


def _data_root():
    import tempfile

    if "d" not in _ROOT:
        _ROOT["d"] = tempfile.mkdtemp(prefix="fastsample-data-")
    return _ROOT["d"]


def _exchange_rank(rank, world, n, width, part, wants):
    x = torch.arange(n, dtype=torch.float32)[:, None] * 1000 + torch.arange(width, dtype=torch.float32)
    ex = FeatureExchange(x, part, rank, world, "cpu")
    got = [ex.gather(w) for w in wants[rank]]
    return {"got": got, **ex.snapshot()}


def test_two_round_exchange_delivers_exactly_the_rows_and_counts_their_bytes():
    """Rows valued by their vertex id (closed form): each rank's gather equals the rows of
    the full matrix; per rank and step, ids sent = 8 x remote rows, rows received =
    remote rows x F x 4, one round of each kind; the bytes sent over all ranks equal the
    bytes received. Three ranks, one of which asks for nothing in the second step."""
    from scalegnn.launch.job import spawn

    n, width, world = 30, 5, 3
    part = torch.arange(n) % world
    gen = torch.Generator().manual_seed(0)
    wants = [[torch.randperm(n, generator=gen)[:12], torch.randperm(n, generator=gen)[:7]] for _ in range(world)]
    wants[1][1] = torch.arange(1, n, world)  # rank 1's second step: its own rows only
    out = spawn(_exchange_rank, world, n, width, part, wants, timeout_s=120)
    x = torch.arange(n, dtype=torch.float32)[:, None] * 1000 + torch.arange(width, dtype=torch.float32)
    sent = received = 0
    for rank, res in enumerate(out):
        remote = sum(int((part[w] != rank).sum()) for w in wants[rank])
        for w, got in zip(wants[rank], res["got"]):
            assert torch.equal(got, x[w])
        assert res["sent"]["feature_ids"] == 8 * remote
        assert res["received"]["feature_rows"] == remote * width * 4
        assert res["rounds"] == {"feature_sizes": 2, "feature_ids": 2, "feature_rows": 2}
        sent += res["sent"]["feature_rows"] + res["sent"]["feature_ids"]
        received += res["received"]["feature_rows"] + res["received"]["feature_ids"]
    assert sent == received


def test_exchange_reads_csr_features_as_dense_rows_and_refuses_bad_seeds():
    gen = torch.Generator().manual_seed(0)
    x = (torch.rand(20, 9, generator=gen) < 0.2).float()
    ex = FeatureExchange(x.to_sparse_csr(), torch.zeros(20, dtype=torch.int64), 0, 1, "cpu")
    ids = torch.tensor([4, 0, 19, 7])
    assert torch.equal(ex.gather(ids), x[ids]) and ex.snapshot()["sent"] == {}
    topo, _ = random_topology()
    with pytest.raises(ValueError, match="unique"):
        sample_blocks(topo, torch.tensor([1, 2, 1]), (2,), 0)
    with pytest.raises(ValueError, match="vertex ids"):
        sample_blocks(topo, torch.tensor([1, topo.num_nodes]), (2,), 0)


def test_topology_sampler_traffic_counts_the_remote_frontier_and_its_sampled_edges():
    """The partitioned-topology comparator, against a direct count: below the seeds'
    hop, each remote destination costs an 8-byte request and 16 bytes per sampled
    in-edge; 2L rounds; the feature part is FastSample's own."""
    topo, _ = random_topology()
    part = torch.arange(topo.num_nodes) % 2
    seeds = torch.tensor([0, 2, 4, 6, 8])  # owned by rank 0
    s = sample_blocks(topo, seeds, (4, 3, 2), 9)
    got = topology_sampler_traffic(s, part, 0, width=7)
    req = rep = 0
    for blk in s.blocks[:-1]:  # every block but the seeds'
        for i in range(blk.num_dst):
            if int(part[s.n_id[i]]) != 0:
                req += 8
                rep += 16 * int(blk.indptr[i + 1] - blk.indptr[i])
    remote = int((part[s.n_id] != 0).sum())
    assert got == {"rounds": 6, "bytes": {"adjacency_requests": req, "adjacency_replies": rep,
                                          "feature_ids": 8 * remote, "feature_rows": remote * 7 * 4}}
    assert req > 0 and rep > 0


# ----------------------------------------------------------------------------- end to end
def test_cli_two_processes_write_an_ok_record_with_the_exchange_bytes(tmp_path, capsys):
    rc = main(["train", "--system", "fastsample", "--nproc", "2", "--dataset", TINY, "--data-root", _data_root(),
               "--epochs", "2", "--hidden", "16", "--layers", "2", "--batch-size", "64", "--out", str(tmp_path),
               "--quiet", "--partition", "random"])
    assert rc == 0, capsys.readouterr()
    [path] = list(tmp_path.glob("*.json"))
    rec = records.read_record(path)
    assert rec["status"] == "ok" and rec["world_size"] == 2 and rec["system"] == "fastsample"
    assert rec["config"]["options"]["fanouts"] == [15, 10] and rec["config"]["options"]["batch_size"] == 64
    width = rec["graph"]["num_features"]
    for row in rec["epochs"]:
        fs = row["fastsample"]
        steps = fs["steps"]
        by = fs["bytes_by_step"]
        assert len(by["remote_rows"]) == steps == rec["steps_per_epoch"]
        assert by["feature_rows_received"] == [r * width * 4 for r in by["remote_rows"]]
        assert by["feature_ids"] == [8 * r for r in by["remote_rows"]]
        assert fs["rounds_per_step"] == {"feature_sizes": 1.0, "feature_ids": 1.0, "feature_rows": 1.0}
        assert fs["data_rounds_per_step"] == 2 and fs["topology_sampler"]["rounds_per_step"] == 4
        topo = fs["topology_sampler"]["bytes_per_step"]
        assert topo["adjacency_requests"] > 0 and topo["feature_rows"] == fs["bytes_received_per_step"]["feature_rows"]
        assert row["comm_bytes"]["feature_rows"] > 0 and row["comm_bytes"]["dp"] > 0
    a, b = rec["fastsample"]["train_vertices_per_rank"]
    assert abs(a - b) <= 1


@needs_numba
def test_training_with_the_torch_path_equals_training_with_the_kernel(tmp_path):
    losses = {}
    for kernel in ("numba", "torch"):
        cfg = make_config("fastsample", dataset=TINY, data_root=_data_root(), epochs=2, hidden=16, layers=2,
                          dropout=0.0, batch_size=64, out_dir=str(tmp_path), progress=False, kernel=kernel)
        rec = launch(cfg)
        assert rec["status"] == "ok"
        losses[kernel] = [(r["loss"], r["test_acc"]) for r in rec["epochs"]]
    assert losses["numba"] == losses["torch"]


ACC_DATA = "csbm:n=1200,avg_degree=8,classes=4,feature_dim=16,signal=0.5"


def test_single_process_accuracy_is_close_to_graphsage(tmp_path):
    """Same graph, split, fanouts (10,5), batch, initial weights (both seed torch alike),
    five epochs, seeds 0-2; the samples differ (different samplers). Measured on this
    graph over seeds 0-9: final test accuracy graphsage 0.482 +- 0.032, fastsample
    0.481 +- 0.037 (300 test vertices, chance 0.25); paired differences (same seed)
    mean -0.001, sd 0.024. The mean of 3 paired differences then has sd ~0.014, so the
    tolerance 0.05 is ~3.6 sd (false-failure rate ~3e-4, normal approximation). Features
    read for the wrong vertices (a planted bug in the exchange) fall outside; subtler
    model bugs are the full-neighborhood forward test's to catch."""
    from scalegnn.baselines import fastsample, graphsage

    acc = {"graphsage": [], "fastsample": []}
    for seed in range(3):
        for name, mod in (("graphsage", graphsage), ("fastsample", fastsample)):
            cfg = make_config(name, dataset=ACC_DATA, data_root=_data_root(), epochs=5, hidden=32, layers=2,
                              dropout=0.0, lr=0.01, batch_size=64, fanouts=(10, 5), seed=seed, out_dir=str(tmp_path),
                              progress=False)
            rec = launch(cfg)
            assert rec["status"] == "ok"
            acc[name].append(rec["epochs"][-1]["test_acc"])
    mean = {k: sum(v) / len(v) for k, v in acc.items()}
    assert mean["graphsage"] > 0.4, acc  # the reference learned something
    assert abs(mean["fastsample"] - mean["graphsage"]) <= 0.05, acc


# ----------------------------------------------------------------------------- benchmark smoke
def test_neighbor_sampler_bench_runs_at_toy_size():
    from scalegnn.benchmarks.fastsample import neighbor_sampler_bench

    payload, md = neighbor_sampler_bench(n=2000, nnz=20000, batch=64, fanouts=(5, 3), reps=2, dgl_python="")
    assert "fused (numba)" in payload["median_ms"] or not available()
    assert "PyG NeighborLoader sampler" in payload["median_ms"] and "|" in md
