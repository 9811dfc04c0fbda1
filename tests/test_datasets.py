"""Dataset layer: real-data statistics, every file format, generators, cache, errors.

Real data comes from ``../shared/data`` (next to the repository); those tests skip
when that folder is absent. Everything else writes tiny files in ``tmp_path``.
Every test runs with its own cache folder and with ``SCALEGNN_OFFLINE=1``.
"""

from __future__ import annotations

import re
import shutil
import warnings

import numpy as np
import pytest
import scipy.io
import scipy.sparse as sp
import torch

from scalegnn.datasets import CACHE_FORMAT_VERSION, DatasetError, describe, edge_homophily, list_datasets, load_dataset
from tests.files import SHARED_DATA, assert_same_graph, fake_ogbn_arxiv, fake_ogbn_papers

# Every test: its own cache folder, an empty default data root, never the network (conftest.py).
pytestmark = pytest.mark.usefixtures("isolated_data")
needs_shared = pytest.mark.skipif(not SHARED_DATA.is_dir(), reason=f"shared data folder {SHARED_DATA} is absent")


# ------------------------------------------------------------------ helpers
def assert_raw(g):
    """The raw-graph contract: symmetric, unit weights, no self loops, sorted unique rows."""
    rows = g.row_ids()
    assert not bool((rows == g.indices).any()), "self loop stored"
    assert bool((g.values == 1).all()), "weights must be 1"
    key = rows * g.num_nodes + g.indices
    assert bool((key[1:] > key[:-1]).all()), "entries not sorted and unique"
    a = g.to_scipy()
    assert (a != a.T).nnz == 0, "adjacency not symmetric"


def split_sizes(g):
    return g.train_idx.numel(), g.val_idx.numel(), g.test_idx.numel()


def stored_entries(pairs, n):
    """Reference count of stored entries for an edge list: both directions, no loops, unique."""
    m = sp.coo_matrix((np.ones(len(pairs)), (pairs[:, 0], pairs[:, 1])), shape=(n, n)).tocsr()
    m = ((m + m.T) > 0).astype(np.int8).tolil()
    m.setdiag(0)
    return m.tocsr().count_nonzero()


# ----------------------------------------------------------- shared datasets
@needs_shared
def test_cora_matches_published_statistics():
    g = load_dataset("cora", data_root=SHARED_DATA)
    assert (g.name, g.num_nodes, g.num_edges, g.num_features, g.num_classes) == ("cora", 2708, 10556, 1433, 7)
    assert split_sizes(g) == (140, 500, 1000)
    assert torch.equal(g.train_idx, torch.arange(140)) and torch.equal(g.val_idx, torch.arange(140, 640))
    assert set(torch.unique(g.x).tolist()) == {0.0, 1.0}  # binary bag of words, not row-normalized
    assert bool((g.y >= 0).all())
    assert torch.bincount(g.y[g.train_idx]).tolist() == [20] * 7
    assert_raw(g)


@needs_shared
def test_citeseer_drops_self_loops_and_pads_missing_test_rows():
    g = load_dataset("citeseer", data_root=SHARED_DATA)
    # The ind.citeseer.graph dict has 9,464 neighbor entries: 124 self loops (each listed
    # twice: 248 entries) plus duplicated pairs. Without them: 4,552 undirected edges, the
    # published count, stored both ways = 9,104 (PyG's number too).
    assert (g.num_nodes, g.num_edges, g.num_features, g.num_classes) == (3327, 9104, 3703, 6)
    assert g.meta["self_loops_dropped"] == 248 and g.meta["input_edge_pairs"] == 9464
    assert split_sizes(g) == (120, 500, 1000)
    # 15 vertices in the test id range have no features in the release: zero rows, label -1,
    # in no split.
    padded = (g.y == -1).nonzero().flatten()
    assert padded.numel() == 15 and g.meta["padded_vertices"] == 15
    assert float(g.x[padded].abs().sum()) == 0.0
    in_splits = torch.cat([g.train_idx, g.val_idx, g.test_idx])
    assert not bool(torch.isin(padded, in_splits).any())
    assert bool((padded >= 2312).all())  # all inside the test id range (after allx)
    assert_raw(g)


@needs_shared
def test_facebook_matches_published_statistics():
    g = load_dataset("facebook-pagepage", data_root=SHARED_DATA)
    assert g.name == "facebook"
    # edges.csv has 171,002 rows, 179 of them self loops and no repeated pairs:
    # 170,823 undirected edges, stored both ways = 341,646 entries.
    assert g.meta["input_edge_pairs"] == 171002 and g.meta["self_loops_dropped"] == 179
    assert (g.num_nodes, g.num_edges, g.num_features, g.num_classes) == (22470, 341646, 4714, 4)
    assert torch.bincount(g.y).tolist() == [6495, 3327, 5768, 6880]
    assert split_sizes(g) == (11235, 5618, 5617)
    assert_raw(g)


@needs_shared
def test_twitch_de_uses_linkx_split():
    g = load_dataset("twitch-de", data_root=SHARED_DATA)
    assert (g.num_nodes, g.num_edges, g.num_features, g.num_classes) == (9498, 2 * 153138, 3170, 2)
    assert split_sizes(g) == (4749, 2374, 2375)
    splits = np.load(SHARED_DATA / "twitch_musae/linkx_splits/twitch-e-DE-splits.npy", allow_pickle=True)
    assert torch.equal(g.train_idx, torch.from_numpy(np.sort(np.asarray(splits[0]["train"]))))
    assert torch.equal(g.test_idx, torch.from_numpy(np.sort(np.asarray(splits[0]["test"]))))
    g2 = load_dataset("twitch-de:split=2", data_root=SHARED_DATA)
    assert g2.name == "twitch-de:split=2" and g2.meta["split"] == "linkx 2"
    assert torch.equal(g2.val_idx, torch.from_numpy(np.sort(np.asarray(splits[2]["valid"]))))
    assert not torch.equal(g.train_idx, g2.train_idx)
    assert load_dataset("twitch-de:split=0", data_root=SHARED_DATA).name == "twitch-de"  # default dropped
    with pytest.raises(DatasetError, match="split=7 is out of range"):
        load_dataset("twitch-de:split=7", data_root=SHARED_DATA)
    assert_raw(g)


@needs_shared
def test_fractional_ids_in_a_linkx_split_are_refused_not_truncated(tmp_path):
    """A split id of 10.5 used to become vertex 10 silently; it is one line naming the
    file, the split, the key and the fix (the integral floats of a float-saved file pass)."""
    root = tmp_path / "root"
    shutil.copytree(SHARED_DATA / "twitch_musae" / "DE", root / "twitch_musae" / "DE")
    linkx = root / "twitch_musae" / "linkx_splits" / "twitch-e-DE-splits.npy"
    linkx.parent.mkdir(parents=True)
    split = {"train": np.arange(0.0, 100.0), "valid": np.arange(100.0, 150.0), "test": np.arange(150.0, 200.0)}
    np.save(linkx, np.array([split], dtype=object), allow_pickle=True)
    assert torch.equal(load_dataset("twitch-de", data_root=root).train_idx, torch.arange(100))
    split["train"] = np.array([0.0, 10.5, 20.0])
    np.save(linkx, np.array([split], dtype=object), allow_pickle=True)
    with pytest.raises(DatasetError) as err:
        load_dataset("twitch-de", data_root=root)
    message = str(err.value)
    assert "\n" not in message and str(linkx) in message and "'train'" in message and "10.5" in message


@needs_shared
def test_twitch_engb():
    g = load_dataset("twitch_ENGB", data_root=SHARED_DATA)
    assert (g.name, g.num_nodes, g.num_edges, g.num_features) == ("twitch-engb", 7126, 2 * 35324, 3170)
    assert split_sizes(g) == (3563, 1782, 1781)  # seeded random 50/25/25
    assert set(torch.unique(g.y).tolist()) == {0, 1}
    assert_raw(g)


@needs_shared
def test_facebook_seeded_split_reproducible_and_cached(tmp_path):
    a = load_dataset("facebook", data_root=SHARED_DATA, seed=0)
    b = load_dataset("facebook", data_root=SHARED_DATA, seed=0)  # from the cache
    c = load_dataset("facebook", data_root=SHARED_DATA, seed=1)
    assert not a.meta["from_cache"] and b.meta["from_cache"] and not c.meta["from_cache"]
    assert_same_graph(a, b)
    assert not torch.equal(a.train_idx, c.train_idx)
    assert torch.equal(a.indices, c.indices) and torch.equal(a.y, c.y)
    for g in (a, c):
        every = torch.sort(torch.cat([g.train_idx, g.val_idx, g.test_idx])).values
        assert torch.equal(every, torch.arange(g.num_nodes))  # disjoint and covering
    names = sorted(p.name for p in (tmp_path / "cache").iterdir())
    assert names == [f"facebook-seed0-v{CACHE_FORMAT_VERSION}.pt", f"facebook-seed1-v{CACHE_FORMAT_VERSION}.pt"]


# ------------------------------------------------------------ file formats
def test_reddit_npz_pair(tmp_path):
    rng = np.random.default_rng(0)
    n = 12
    d = tmp_path / "reddit"
    d.mkdir()
    types = np.array([1] * 6 + [2] * 3 + [3] * 3)
    np.savez(d / "reddit_data.npz", feature=rng.standard_normal((n, 5)), label=np.arange(n) % 3, node_types=types)
    pairs = np.array([[0, 1], [1, 2], [2, 2], [3, 4], [4, 3], [5, 11], [0, 1]])
    sp.save_npz(d / "reddit_graph.npz", sp.csr_matrix((np.ones(len(pairs)), pairs.T), shape=(n, n)))
    g = load_dataset("reddit", data_root=tmp_path)
    assert (g.num_nodes, g.num_features, g.num_classes) == (n, 5, 3)
    assert g.num_edges == stored_entries(pairs, n) == 8
    assert torch.equal(g.val_idx, torch.tensor([6, 7, 8])) and torch.equal(g.test_idx, torch.tensor([9, 10, 11]))
    assert_raw(g)


def _byo_arrays(n=10):
    rng = np.random.default_rng(1)
    return {
        "edge_index": np.array([[0, 1, 2, 3, 3, 9], [1, 2, 0, 4, 3, 8]]),
        "x": rng.standard_normal((n, 3)).astype(np.float32),
        "y": np.array([0, 1, 2, 0, 1, 2, 0, 1, 2, -1]),
        "train_idx": np.array([0, 1, 2, 3]),
        "val_idx": np.array([4, 5]),
        "test_idx": np.array([6, 7, 8]),
    }


def test_byo_npz_and_dir_agree(tmp_path):
    a = _byo_arrays()
    np.savez(tmp_path / "g.npz", **a)
    folder = tmp_path / "arrays"
    folder.mkdir()
    for k, v in a.items():
        np.save(folder / f"{k}.npy", v)
    g = load_dataset(f"npz:{tmp_path / 'g.npz'}")
    h = load_dataset(f"dir:{folder}")
    assert g.name == f"npz:{tmp_path / 'g.npz'}" and h.name == f"dir:{folder}"
    assert (g.num_nodes, g.num_classes, g.num_edges) == (10, 3, 10)  # loop 3-3 dropped, symmetrized
    for f in ("indptr", "indices", "x", "y", "train_idx", "val_idx", "test_idx"):
        assert torch.equal(getattr(g, f), getattr(h, f)), f
    assert_raw(g)


def test_byo_csr_masks_and_directed(tmp_path):
    n = 4
    masks = {s: np.zeros(n, bool) for s in ("train_mask", "valid_mask", "test_mask")}
    masks["train_mask"][:2], masks["valid_mask"][2], masks["test_mask"][3] = True, True, True
    np.savez(
        tmp_path / "d.npz",
        indptr=np.array([0, 2, 3, 3, 4]),
        indices=np.array([1, 2, 2, 0]),
        values=np.array([2.0, 3.0, 4.0, 5.0]),
        x=np.ones((n, 2)),
        y=np.array([[1, 0], [0, 1], [1, 1], [0, 0]]),
        undirected=np.array(False),
        **masks,
    )
    g = load_dataset(f"npz:{tmp_path / 'd.npz'}")
    assert g.multilabel and g.num_classes == 2
    assert g.indptr.tolist() == [0, 2, 3, 3, 4] and g.values.tolist() == [2.0, 3.0, 4.0, 5.0]  # kept as given
    assert split_sizes(g) == (2, 1, 1)


def test_byo_missing_key_names_key_and_shape(tmp_path):
    a = _byo_arrays()
    del a["test_idx"]
    np.savez(tmp_path / "g.npz", **a)
    with pytest.raises(DatasetError, match=r"missing key 'test_idx' \(expected a 1-D int array.*'test_mask'.*or none"):
        load_dataset(f"npz:{tmp_path / 'g.npz'}")
    a = _byo_arrays()
    del a["edge_index"]
    np.savez(tmp_path / "h.npz", **a)
    with pytest.raises(DatasetError, match=r"missing key 'edge_index' \(expected a \(2, E\) int array\)"):
        load_dataset(f"npz:{tmp_path / 'h.npz'}")


def test_byo_without_a_split_gets_the_seeded_random_split(tmp_path):
    """No split keys at all: the labeled vertices (9 of 10 here) are split 50/25/25 by
    the seed, the graph says so, and another seed is another split (not a cached one)."""
    a = {k: v for k, v in _byo_arrays().items() if not k.endswith("_idx")}
    np.savez(tmp_path / "g.npz", **a)
    folder = tmp_path / "arrays"
    folder.mkdir()
    for k, v in a.items():
        np.save(folder / f"{k}.npy", v)
    for name in (f"npz:{tmp_path / 'g.npz'}", f"dir:{folder}"):
        g, again, other = (load_dataset(name, seed=s) for s in (3, 3, 4))
        assert g.meta["split"] == "random 50/25/25 seed 3 (the file has no split)"
        assert sorted(torch.cat([g.train_idx, g.val_idx, g.test_idx]).tolist()) == list(range(9))  # 9 unlabeled
        assert split_sizes(g) == (4, 2, 3)  # round(4.5) = 4, round(2.25) = 2, the rest
        assert torch.equal(g.train_idx, again.train_idx)
        assert not torch.equal(g.train_idx, other.train_idx) and other.meta["split"].endswith("seed 4 (the file has no split)")


EDGELIST = """# a comment
% another comment style
src,dst
10,20
20,10
20,30,0.5
30,30
40,10
10,20
"""


def test_edgelist_featureless_protocol(tmp_path):
    f = tmp_path / "g.csv"
    f.write_text(EDGELIST)
    g = load_dataset(f"edgelist:{f}", seed=3)
    # ids {10, 20, 30, 40} -> 0..3; edges 0-1, 1-2, 3-0 (loop 30-30 and repeats dropped)
    assert g.num_nodes == 4 and g.num_edges == 6
    assert g.indptr.tolist() == [0, 2, 4, 5, 6] and g.indices.tolist() == [1, 3, 0, 2, 1, 0]
    assert (g.num_features, g.num_classes) == (128, 32)
    assert_raw(g)
    again = load_dataset(f"edgelist:{f}", seed=3, cache=False)
    other = load_dataset(f"edgelist:{f}", seed=4, cache=False)
    assert_same_graph(g, again)
    assert not torch.equal(g.x, other.x)


def test_edgelist_whitespace_and_bad_line(tmp_path):
    f = tmp_path / "g.txt"
    f.write_text("0 1\n1\t2 7\n\n2  3\n")
    assert load_dataset(f"edgelist:{f}").num_edges == 6
    h = tmp_path / "h.csv"  # SNAP-like: '#' comments, then a header, then pairs
    h.write_text("# Directed graph\n# Nodes: 5\nFromNodeId,ToNodeId\n0,1\n1,2\n2,3\n3,4\n4,0\n")
    g = load_dataset(f"edgelist:{h}")
    assert (g.num_nodes, g.num_edges) == (5, 10)
    bad = tmp_path / "bad.txt"
    bad.write_text("0 1\n1 2\nthree four\n")
    with pytest.raises(DatasetError, match=rf"{re.escape(str(bad))}, line 3: expected two integer vertex ids"):
        load_dataset(f"edgelist:{bad}")


def test_degree_classes_are_balanced_and_follow_degree():
    g = load_dataset("rmat:scale=12,edge_factor=8", cache=False)
    counts = torch.bincount(g.y, minlength=32)
    assert int(counts.max() - counts.min()) <= 1  # balanced
    deg = g.degrees()
    lo, hi = deg[g.y == 0].max(), deg[g.y == 31].min()
    assert int(lo) <= int(hi)  # classes are degree-rank bins
    for c in range(31):  # degree ranges of consecutive classes touch but never cross
        assert int(deg[g.y == c].max()) <= int(deg[g.y == c + 1].min())


def test_mtx_symmetric_and_general(tmp_path):
    a = sp.coo_matrix((np.ones(3), ([1, 2, 3], [0, 1, 1])), shape=(6, 6))  # lower triangle
    scipy.io.mmwrite(tmp_path / "sym.mtx", a, symmetry="symmetric")
    g = load_dataset(f"mtx:{tmp_path / 'sym.mtx'}")
    assert g.num_nodes == 6 and g.num_edges == 6  # vertices 4, 5 isolated but kept
    assert describe(g)["isolated"] == 2
    b = sp.coo_matrix((np.ones(4), ([0, 1, 2, 2], [1, 0, 2, 0])), shape=(4, 4))
    scipy.io.mmwrite(tmp_path / "gen.mtx", b)
    h = load_dataset(f"mtx:{tmp_path / 'gen.mtx'}")
    assert h.num_nodes == 4 and h.num_edges == 4 and h.meta["self_loops_dropped"] == 1
    assert_raw(g)
    assert_raw(h)
    scipy.io.mmwrite(tmp_path / "rect.mtx", sp.coo_matrix(np.ones((2, 3))))
    with pytest.raises(DatasetError, match="must be square"):
        load_dataset(f"mtx:{tmp_path / 'rect.mtx'}")


def test_named_featureless_graph_found_under_root(tmp_path):
    (tmp_path / "europe_osm").mkdir()
    a = sp.coo_matrix((np.ones(3), ([1, 2, 3], [0, 1, 2])), shape=(4, 4))
    scipy.io.mmwrite(tmp_path / "europe_osm" / "europe_osm.mtx", a, symmetry="symmetric")
    g = load_dataset("europe-osm", data_root=tmp_path)
    assert (g.name, g.num_nodes, g.num_edges, g.num_features) == ("europe-osm", 4, 6, 128)
    with pytest.raises(
        DatasetError,
        match=rf"isolate-3-8m: no graph file found; expected {re.escape(str(tmp_path / 'isolate-3-8m.mtx'))}",
    ):
        load_dataset("isolate-3-8m", data_root=tmp_path)


# ------------------------------------------------------------------- OGB
def test_ogb_fake_arxiv_raw_then_processed(tmp_path):
    pytest.importorskip("ogb")
    import ogb.nodeproppred.dataset as ogb_ds

    edges = fake_ogbn_arxiv(tmp_path)
    first = load_dataset("ogbn-arxiv", data_root=tmp_path, cache=False)  # parses raw/, writes processed/
    assert (tmp_path / "ogbn_arxiv" / "processed" / "data_processed").is_file()
    # The second read goes through ogb's torch.load of its pickle (weights_only patch).
    second = load_dataset("ogbn-arxiv", data_root=tmp_path, cache=False)
    assert ogb_ds.torch is torch and "input" not in vars(ogb_ds)  # patches undone
    assert_same_graph(first, second)
    assert (first.num_nodes, first.num_features, first.num_classes) == (30, 4, 40)
    assert first.num_edges == stored_entries(edges, 30)  # directed in ogb: symmetrized here
    assert split_sizes(first) == (15, 7, 8)
    assert_raw(first)


def test_ogb_fake_papers100m_nan_labels(tmp_path):
    pytest.importorskip("ogb")
    edges, labels = fake_ogbn_papers(tmp_path)
    g = load_dataset("OGBN_PAPERS100M", data_root=tmp_path)
    assert g.name == "ogbn-papers100M" and g.num_classes == 172
    assert g.y[10:].tolist() == [-1] * 10 and g.y[:10].tolist() == labels[:10].astype(int).tolist()
    assert g.num_edges == stored_entries(edges.T, 20)
    assert split_sizes(g) == (4, 3, 3)
    assert_same_graph(g, load_dataset("ogbn-papers100M", data_root=tmp_path))  # cached copy


def test_ogb_offline_without_copy_names_folder(tmp_path):
    pytest.importorskip("ogb")
    with pytest.raises(
        DatasetError, match=rf"no local copy at {re.escape(str(tmp_path / 'ogbn_products'))}.*SCALEGNN_OFFLINE"
    ):
        load_dataset("ogbn-products", data_root=tmp_path)
    (tmp_path / "ogbn_arxiv").mkdir()  # a folder without RELEASE file: ogb would prompt on stdin
    with pytest.raises(DatasetError, match="has no RELEASE_v1.txt"):
        load_dataset("ogbn-arxiv", data_root=tmp_path)


# ------------------------------------------------------------- generators
def test_csbm_reproducible_and_homophily():
    a = load_dataset("csbm:n=5000", seed=1)
    b = load_dataset("csbm:n=5000", seed=1, cache=False)
    c = load_dataset("csbm:n=5000", seed=2, cache=False)
    assert_same_graph(a, b)
    assert not torch.equal(a.indices, c.indices) and not torch.equal(a.x, c.x)
    assert_raw(a)
    assert torch.bincount(a.y).tolist() == [625] * 8
    # 25,000 edge draws: the in-class fraction has std sqrt(h(1-h)/25000) < 0.003, and
    # dropping repeats/loops (<1% of draws) moves it less than that; 0.02 is > 6 sigma.
    for h in (0.7, 0.2):
        g = a if h == 0.7 else load_dataset(f"csbm:n=5000,homophily={h}", seed=1, cache=False)
        assert abs(edge_homophily(g) - h) < 0.02
        assert abs(g.num_edges / g.num_nodes - 10) < 0.2  # avg_degree default 10
    # Features carry the class signal: class means are `signal` = 0.75 apart.
    means = torch.stack([a.x[a.y == k].mean(0) for k in range(8)])
    dist = torch.cdist(means, means)[~torch.eye(8, dtype=torch.bool)]
    assert abs(float(dist.mean()) - 0.75) < 0.15


def test_rmat_reproducible_and_heavy_tailed():
    a = load_dataset("rmat:scale=14,edge_factor=8", seed=0)
    b = load_dataset("rmat:scale=14,edge_factor=8", seed=0, cache=False)
    c = load_dataset("rmat:scale=14,edge_factor=8", seed=5, cache=False)
    assert_same_graph(a, b)
    assert not torch.equal(a.indptr, c.indptr)
    assert a.num_nodes == 2**14 and a.num_features == 128 and a.num_classes == 32
    deg = a.degrees().double()
    assert float(deg.max()) > 50 * float(deg.mean())  # power law: hubs (measured ~170x)
    assert_raw(a)


def test_generator_parameter_errors():
    with pytest.raises(DatasetError, match=r"unknown parameter 'nodes'; valid parameters: n \(default 10000\)"):
        load_dataset("csbm:nodes=10")
    with pytest.raises(DatasetError, match="parameter n='ten' is not an integer"):
        load_dataset("csbm:n=ten")
    with pytest.raises(DatasetError, match="homophily=1.5 must be in"):
        load_dataset("csbm:homophily=1.5")
    with pytest.raises(DatasetError, match="must be 1"):
        load_dataset("rmat:a=0.9")
    with pytest.raises(DatasetError, match="cora takes no parameters"):
        load_dataset("cora:n=3")


def test_canonical_names_round_trip():
    g = load_dataset("CSBM:n=1e3,classes=8,signal=0.5", cache=False)
    assert g.name == "csbm:n=1000,signal=0.5" and g.meta["params"]["classes"] == 8
    assert_same_graph(g, load_dataset(g.name, cache=False))
    assert {"cora", "facebook", "twitch-de", "reddit", "ogbn-papers100M", "csbm", "rmat"} <= set(list_datasets())


# ----------------------------------------------------------------- errors
def test_unknown_name_suggests_close_match():
    with pytest.raises(DatasetError, match=r"unknown dataset 'facebok'; did you mean 'facebook'\? Known: cora"):
        load_dataset("facebok")
    with pytest.raises(DatasetError, match="did you mean 'ogbn-arxiv'"):
        load_dataset("ogbn-arxive")


def test_missing_files_name_exact_path(tmp_path, monkeypatch):
    with pytest.raises(
        DatasetError,
        match=rf"file not found: {re.escape(str(tmp_path / 'planetoid_cora' / 'ind.cora.x'))}.*--data-root",
    ):
        load_dataset("cora", data_root=tmp_path)
    with pytest.raises(DatasetError, match=r"containing facebook_pagepage/edges.csv"):
        load_dataset("facebook", data_root=tmp_path)
    monkeypatch.setenv("SCALEGNN_DATA_ROOT", str(tmp_path / "env-root"))
    with pytest.raises(DatasetError, match=rf"{re.escape(str(tmp_path / 'env-root' / 'reddit' / 'reddit_data.npz'))}"):
        load_dataset("reddit")
    with pytest.raises(DatasetError, match=rf"npz: file not found: {re.escape(str(tmp_path / 'nope.npz'))}"):
        load_dataset(f"npz:{tmp_path / 'nope.npz'}")


@needs_shared
def test_partial_and_corrupt_files_are_named(tmp_path):
    root = tmp_path / "root"
    shutil.copytree(SHARED_DATA / "planetoid_cora", root / "planetoid_cora")
    for f in (root / "planetoid_cora").iterdir():
        f.chmod(0o644)
    graph_file = root / "planetoid_cora" / "ind.cora.graph"
    graph_file.write_bytes(graph_file.read_bytes()[:1000])  # truncated pickle
    with pytest.raises(
        DatasetError, match=rf"could not read {re.escape(str(graph_file))}: .*The file is corrupt, truncated"
    ):
        load_dataset("cora", data_root=root)
    (root / "planetoid_cora" / "ind.cora.ty").unlink()
    with pytest.raises(
        DatasetError, match=rf"incomplete copy, missing {re.escape(str(root / 'planetoid_cora' / 'ind.cora.ty'))}"
    ):
        load_dataset("cora", data_root=root)
    fb = root / "facebook_pagepage"
    fb.mkdir()
    (fb / "edges.csv").write_text("id_1,id_2\n0,1\n")
    (fb / "new_target.csv").write_text("id,target\n0,0\n1,1\n")
    (fb / "features.json").write_text('{"0": [1, 2], "1": [')
    with pytest.raises(DatasetError, match=rf"could not read {re.escape(str(fb / 'features.json'))}"):
        load_dataset("facebook", data_root=root)
    shutil.copytree(SHARED_DATA / "twitch_musae" / "DE", root / "twitch_musae" / "DE")
    with pytest.raises(DatasetError, match=r"LINKX split file not found: .*twitch-e-DE-splits.npy"):
        load_dataset("twitch-de:split=1", data_root=root)
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(DatasetError, match=rf"could not read {re.escape(str(bad))}"):
        load_dataset(f"npz:{bad}")


def test_twitch_without_linkx_file_falls_back_to_seeded_split(tmp_path):
    d = tmp_path / "twitch_musae" / "DE"
    d.mkdir(parents=True)
    (d / "musae_DE_edges.csv").write_text("from,to\n0,1\n1,2\n2,3\n")
    (d / "musae_DE_features.json").write_text('{"0": [5, 5], "1": [3169], "3": []}')
    (d / "musae_DE_target.csv").write_text(
        "id,days,mature,views,partner,new_id\n7,1,True,1,False,2\n8,1,False,1,False,0\n"
        "9,1,True,1,False,1\n9,1,True,1,False,1\n6,1,False,1,False,3\n"
    )
    g = load_dataset("twitch-de", data_root=tmp_path, seed=4)
    assert g.y.tolist() == [0, 1, 1, 0] and g.meta["split"] == "random 50/25/25 seed 4"
    assert g.num_features == 3170 and g.x.sum().item() == 2.0  # repeated feature id counts once


# ------------------------------------------------------------------ cache
def test_cache_layout_corruption_and_staleness(tmp_path, monkeypatch):
    monkeypatch.delenv("SCALEGNN_CACHE_DIR")
    root = tmp_path / "root"
    first = load_dataset("csbm:n=300", data_root=root, seed=7)
    path = root / ".scalegnn-cache" / f"csbm-n=300-seed7-v{CACHE_FORMAT_VERSION}.pt"
    assert path.is_file() and first.meta["cache_path"] == str(path)

    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])  # truncated
    with pytest.warns(UserWarning, match=rf"cache file {re.escape(str(path))} is corrupt or unreadable.*rebuilding"):
        rebuilt = load_dataset("csbm:n=300", data_root=root, seed=7)
    assert not rebuilt.meta["from_cache"]
    assert_same_graph(first, rebuilt)
    path.write_bytes(b"garbage")
    with pytest.warns(UserWarning, match="rebuilding"):
        load_dataset("csbm:n=300", data_root=root, seed=7)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # the rewritten file is valid again
        again = load_dataset("csbm:n=300", data_root=root, seed=7)
    assert again.meta["from_cache"]
    assert_same_graph(first, again)

    # A data root without write permission bits is never written to (even by root):
    # the cache falls back to ~/.cache/scalegnn/data/.scalegnn-cache.
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    ro = tmp_path / "read-only-root"
    ro.mkdir(mode=0o555)
    g = load_dataset("csbm:n=300", data_root=ro, seed=7)
    assert g.meta["cache_path"].startswith(str(tmp_path / "home" / ".cache" / "scalegnn" / "data" / ".scalegnn-cache"))
    assert list(ro.iterdir()) == []

    # A changed source file invalidates its cache entry.
    f = tmp_path / "g.txt"
    f.write_text("0 1\n1 2\n2 3\n")
    assert load_dataset(f"edgelist:{f}", data_root=root).num_edges == 6
    f.write_text("0 1\n1 2\n2 3\n3 0\n")
    assert load_dataset(f"edgelist:{f}", data_root=root).num_edges == 8


def test_data_list_shows_the_file_forms(capsys):
    """`scalegnn data list` names the registered datasets and every form a user's own
    file can take, with what it holds."""
    from scalegnn.cli import main

    assert main(["data", "list"]) == 0
    out = capsys.readouterr().out
    assert "facebook" in out and "csbm" in out
    for kind in ("edgelist", "mtx", "npz", "dir"):
        assert f"  {kind}:<path>" in out
    assert "seeded random 50/25/25 split" in out
