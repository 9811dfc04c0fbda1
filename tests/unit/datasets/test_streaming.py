"""Streamed generators (scalegnn/datasets/streaming.py): `scalegnn data generate` writes a
CSR folder that `dir:` reads back; the graph is symmetric, loop-free, without repeats,
the same for a seed whatever the chunk size; degrees follow the asked profile; the
features come from a seed per vertex and are never stored; memory does not grow with
the graph at a fixed chunk size; bad input is one line."""

from __future__ import annotations

import json
import tracemalloc

import numpy as np
import pytest

from scalegnn.cli import main
from scalegnn.datasets import DatasetError, load_dataset
from scalegnn.datasets.streaming import SeededFeatures, generate, hash_uniform, seeded_normal

FILES = ("indptr.npy", "indices.npy", "y.npy", "features.json")


def _arrays(folder):
    return {f: np.load(folder / f, allow_pickle=False) for f in FILES[:3]}


def _check_csr(indptr, indices, n):
    """Sorted rows, no repeats, no self loops, symmetric."""
    assert indptr.shape == (n + 1,) and indptr[0] == 0 and indptr[-1] == indices.size
    rows = np.repeat(np.arange(n), np.diff(indptr))
    keys = rows.astype(np.int64) * n + indices
    assert np.all(np.diff(keys) > 0)  # rows in order, columns strictly increasing: no repeats
    assert not np.any(rows == indices)
    assert np.array_equal(np.sort(indices.astype(np.int64) * n + rows), keys)  # (u, v) stored <=> (v, u) stored


@pytest.mark.parametrize("kind", ["csbm:n=3000,avg_degree=12,classes=5,homophily=0.8",
                                  "powerlaw:n=3000,avg_degree=12,exponent=2.2"])
def test_generated_graph_is_symmetric_simple_and_independent_of_the_chunk_size(tmp_path, kind):
    small = generate(kind, tmp_path / "a", seed=4, chunk_edges=700)
    big = generate(kind, tmp_path / "b", seed=4, chunk_edges=1 << 20)
    other = generate(kind, tmp_path / "c", seed=5, chunk_edges=700)
    a, b, c = _arrays(tmp_path / "a"), _arrays(tmp_path / "b"), _arrays(tmp_path / "c")
    assert all(np.array_equal(a[k], b[k]) for k in a) and small["stored_entries"] == big["stored_entries"]
    assert not np.array_equal(a["indices.npy"], c["indices.npy"]) and other["seed"] == 5
    _check_csr(a["indptr.npy"], a["indices.npy"], 3000)
    assert small["stored_entries"] <= 2 * small["edge_draws"] == 2 * 18000
    assert not (tmp_path / "a" / "x.npy").exists() and not (tmp_path / "a" / ".buckets").exists()


def test_csbm_classes_are_balanced_and_edges_homophilous(tmp_path):
    generate("csbm:n=4000,avg_degree=10,classes=8,homophily=0.7", tmp_path, seed=1, chunk_edges=5000)
    a = _arrays(tmp_path)
    y = a["y.npy"]
    assert np.bincount(y).tolist() == [500] * 8
    rows = np.repeat(np.arange(4000), np.diff(a["indptr.npy"]))
    same = np.mean(y[rows] == y[a["indices.npy"]])
    assert abs(same - 0.7) < 0.02  # 20,000 draws: std < 0.004
    assert abs(a["indices.npy"].size / 4000 - 10) < 0.2


def test_powerlaw_degrees_are_heavy_tailed_and_classes_follow_degree(tmp_path):
    info = generate("powerlaw:n=20000,avg_degree=10,exponent=2.2", tmp_path, seed=2, chunk_edges=30000)
    a = _arrays(tmp_path)
    deg, y = np.diff(a["indptr.npy"]), a["y.npy"]
    assert info["max_degree"] == deg.max() > 50 * deg.mean() and np.median(deg) < deg.mean()
    # the CCDF's log-log slope between degrees 10 and 100 is about -(exponent - 1) = -1.2
    slope = np.log(np.mean(deg >= 100) / np.mean(deg >= 10)) / np.log(10)
    assert -1.6 < slope < -0.8
    assert info["num_classes"] == 32 and y.min() == 0 and y.max() == 31
    for d0, d1 in zip(np.unique(deg)[:-1], np.unique(deg)[1:]):  # a higher degree never has a lower class
        assert y[deg == d0].max() <= y[deg == d1].min()
    assert np.all(np.abs(np.bincount(y, minlength=32) - 20000 / 32) < 5 * np.sqrt(20000 / 32) + 1)


def test_features_come_from_a_seed_per_vertex_and_dir_reads_them(tmp_path):
    whole = seeded_normal(7, (0, 300), 16)
    assert np.array_equal(seeded_normal(7, (120, 250), 16), whole[120:250])
    assert not np.array_equal(seeded_normal(8, (0, 300), 16), whole)
    big = seeded_normal(3, (0, 4000), 32)
    assert abs(big.mean()) < 0.01 and abs(big.std() - 1) < 0.01
    u = hash_uniform(1, "draw", np.arange(100000, dtype=np.uint64))
    assert 0 <= u.min() and u.max() < 1 and abs(u.mean() - 0.5) < 0.005

    generate("csbm:n=600,avg_degree=6,classes=3,feature_dim=8", tmp_path / "g", seed=9, chunk_edges=500)
    spec = json.loads((tmp_path / "g" / "features.json").read_text())
    feats = SeededFeatures(8, 9, np.asarray(spec["means"], dtype=np.float32))
    g = load_dataset(f"dir:{tmp_path / 'g'}", cache=False)
    y = np.load(tmp_path / "g" / "y.npy")
    assert np.array_equal(g.x.numpy(), feats.matrix(y, block=64)) and np.array_equal(g.y.numpy(), y)
    assert np.array_equal(g.x.numpy()[10:20], feats.rows(10, 20, y[10:20]))
    assert np.array_equal(g.indices.numpy(), np.load(tmp_path / "g" / "indices.npy"))


def _peak_bytes(tmp_path, n: int, chunk: int) -> int:
    tracemalloc.start()
    try:
        generate(f"powerlaw:n={n},avg_degree=16,exponent=2.5", tmp_path / f"m{n}", seed=0, chunk_edges=chunk)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_memory_is_bounded_by_the_chunk_not_the_graph(tmp_path):
    """numpy reports its allocations to tracemalloc: with 4x the vertices and edges, the
    peak at a fixed chunk stays put, and it is a small multiple of the chunk's bytes."""
    chunk = 8000
    small, large = _peak_bytes(tmp_path, 10000, chunk), _peak_bytes(tmp_path, 40000, chunk)
    assert large < 1.5 * small, (small, large)  # measured 0.44 MB and 0.53 MB; 30 MB with one chunk for all
    assert large < 120 * chunk + (1 << 20), large  # ~100 bytes per draw of the chunk, whatever N
    assert large < 40000 * 16 * 8  # less than the graph's stored indices as int64


def test_the_cli_writes_a_folder_that_dir_and_data_shard_read(tmp_path, capsys):
    out = tmp_path / "g"
    assert main(["data", "generate", "powerlaw:n=400,avg_degree=6", "--out", str(out), "--chunk-edges", "300"]) == 0
    assert f"dir:{out}" in capsys.readouterr().out
    assert main(["data", "shard", f"dir:{out}", "--grid", "1x1x1x2", "--out", str(tmp_path / "s")]) == 0
    assert json.loads((tmp_path / "s" / "manifest.json").read_text())["num_nodes"] == 400


@pytest.mark.parametrize("kind, match", [
    ("rmatx:n=10", "unknown generator 'rmatx'; use one of csbm, powerlaw"),
    ("csbm:n=10,degree=3", "parameter 'degree=3' must be key=value with key one of"),
    ("csbm:n=ten", "n='ten' is not a number"),
    ("csbm:n=10.5", "must be a whole number"),
    ("powerlaw:exponent=2", "exponent=2.0 must be > 2"),
    ("csbm:n=100,avg_degree=100", r"avg_degree=100.0 must be in \(0, n\)"),
])
def test_bad_input_is_one_line_naming_it(tmp_path, kind, match):
    with pytest.raises(DatasetError, match=match) as err:
        generate(kind, tmp_path / "g")
    assert "\n" not in str(err.value)


def test_an_occupied_folder_is_refused_and_a_killed_one_rewritten(tmp_path):
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    with pytest.raises(DatasetError, match="is not empty; pass an empty or new folder"):
        generate("csbm:n=50", tmp_path / "busy")
    with pytest.raises(DatasetError, match="is an existing file, not a folder"):
        generate("csbm:n=50", tmp_path / "busy" / "notes.txt")
    generate("csbm:n=50,avg_degree=4", tmp_path / "g")
    with pytest.raises(DatasetError, match="already holds a generated graph"):
        generate("csbm:n=50,avg_degree=4", tmp_path / "g")
    (tmp_path / "g" / "graph.json").unlink()  # as a killed run leaves it: written again
    (tmp_path / "g" / ".buckets").mkdir()
    assert generate("csbm:n=50,avg_degree=4", tmp_path / "g")["num_nodes"] == 50
