"""Out-of-core staging (scalegnn/shards/out_of_core.py): shards of a generated graph written
from memory-mapped arrays in chunks are byte for byte those of the in-memory staging
(their SHA-256 checksums), with several processes too; a killed staging resumes; a
shard that does not match its manifest's checksum is refused at load; bad input is one line."""

from __future__ import annotations

import json

import shutil

import numpy as np
import torch

import pytest

from scalegnn.cli import main
from scalegnn.datasets import load_dataset
from scalegnn.datasets.streaming import generate
from scalegnn.fileio import file_sha256
from scalegnn.parallel.sharding import grid_coords
from scalegnn.shards import load_shard, shard_command
from scalegnn.shards.out_of_core import _write_rank, parse_size, stage_out_of_core, symmetrize
from tests.graphs import same_shard

KINDS = {"powerlaw": "powerlaw:n=2500,avg_degree=10,exponent=2.3",
         "csbm": "csbm:n=1800,avg_degree=8,classes=4,feature_dim=12"}


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    root = tmp_path_factory.mktemp("generated")
    for name, kind in KINDS.items():
        generate(kind, root / name, seed=3, chunk_edges=4000)
    return root


def _in_memory(folder, shape, out, permute="none"):
    shard_command(load_dataset(f"dir:{folder}", seed=3, cache=False), shape, out, seed=3, permute=permute)
    return json.loads((out / "manifest.json").read_text())


def _manifest(out):
    return json.loads((out / "manifest.json").read_text())


@pytest.mark.parametrize("kind, permute", [(k, p) for k in KINDS for p in ("none", "single", "double")])
@pytest.mark.parametrize("shape", [(1, 2, 2, 2), (1, 3, 1, 2), (1, 1, 1, 1)], ids=lambda s: "x".join(map(str, s)))
def test_out_of_core_shards_are_the_in_memory_ones(generated, tmp_path, kind, permute, shape):
    """Rows read 300 stored entries at a time (the graphs hold ~20,000): same files, with
    the seed's relabeling (--permute single) and the double permutation too."""
    want = _in_memory(generated / kind, shape, tmp_path / "mem", permute)
    stage_out_of_core(generated / kind, shape, tmp_path / "ooc", seed=3, chunk_entries=300, permute=permute)
    got = _manifest(tmp_path / "ooc")
    assert got["permute"] == want["permute"] == permute
    assert len(got["sha256"]) == shape[1] * shape[2] * shape[3]
    assert got["sha256"] == want["sha256"] and got["nnz_per_shard"] == want["nnz_per_shard"]
    for key in ("grid_shape", "name", "num_nodes", "num_edges", "num_features", "num_classes", "graph", "seed"):
        assert got[key] == want[key], key
    assert not list((tmp_path / "ooc").glob("*.sha256")) and not list((tmp_path / "ooc").glob("*.tmp"))


def test_several_processes_write_the_same_files_and_a_killed_staging_resumes(generated, tmp_path):
    shape = (1, 2, 1, 2)
    want = _in_memory(generated / "powerlaw", shape, tmp_path / "mem")["sha256"]
    stage_out_of_core(generated / "powerlaw", shape, tmp_path / "par", seed=3, workers=2, chunk_entries=500,
                      memory_budget=1 << 30)
    assert _manifest(tmp_path / "par")["sha256"] == want
    out = tmp_path / "killed"  # a staging killed after two rank files, one of them then damaged
    out.mkdir()
    first, second = (_write_rank(str((generated / "powerlaw").resolve()), 3, shape, c, str(out),
                                 f"dir:{(generated / 'powerlaw').resolve()}", 500) for c in grid_coords(shape)[:2])
    (out / second["file"]).write_bytes(b"half a file")
    stage_out_of_core(generated / "powerlaw", shape, out, seed=3, chunk_entries=500)
    got = _manifest(out)
    assert got["sha256"] == want and got["staged"]["resumed"] == 1  # the intact one kept, the damaged one rewritten


def test_a_shard_that_does_not_match_its_checksum_is_refused(generated, tmp_path):
    stage_out_of_core(generated / "csbm", (1, 1, 1, 2), tmp_path, seed=3)
    shard = load_shard(tmp_path, 1, (2, 1, 1, 2))
    assert shard.num_nodes == 1800 and shard.grid_shape == (2, 1, 1, 2)
    victim = tmp_path / _manifest(tmp_path)["files"][1]
    data = bytearray(victim.read_bytes())
    data[-100] ^= 0xFF
    victim.write_bytes(bytes(data))
    assert file_sha256(victim) != _manifest(tmp_path)["sha256"][victim.name]
    with pytest.raises(ValueError, match="does not match the SHA-256 its manifest lists") as err:
        load_shard(tmp_path, 1)
    assert "\n" not in str(err.value) and str(victim) in str(err.value)
    load_shard(tmp_path, 0)  # the others still load


def test_the_cli_stages_out_of_core_and_names_bad_input(generated, tmp_path, capsys):
    assert main(["data", "shard", f"dir:{generated / 'csbm'}", "--grid", "1x1x2x1", "--out", str(tmp_path / "s"),
                 "--seed", "3", "--memory-budget", "128M"]) == 0
    assert "out of core" in capsys.readouterr().out
    assert _manifest(tmp_path / "s")["staged"]["memory_budget"] == 128 << 20
    assert main(["data", "shard", f"dir:{generated / 'csbm'}", "--grid", "1x1x2x1", "--out", str(tmp_path / "t"),
                 "--seed", "3", "--memory-budget", "128M", "--split", "random:0.6,0.2,0.2", "--split-seed", "4"]) == 0
    assert _manifest(tmp_path / "t")["split"] == ["random:0.6,0.2,0.2", 4] and "out of core" in capsys.readouterr().out
    assert main(["data", "shard", f"dir:{generated / 'csbm'}", "--grid", "1x1x2x1", "--out", str(tmp_path / "b"),
                 "--seed", "3", "--memory-budget", "128M", "--layout", "blocks"]) == 0
    assert _manifest(tmp_path / "b")["layout"] == "blocks" and "out of core" in capsys.readouterr().out
    assert parse_size("512M") == 512 << 20 and parse_size("1.5GiB") == 3 << 29 and parse_size("4096") == 4096
    for argv, message in (
            (["cora", "--layout", "blocks"], "--layout blocks is written by out-of-core staging; add --memory-budget"),
            ([f"dir:{generated / 'csbm'}", "--memory-budget", "1G", "--layout", "blocks", "--permute", "double"],
             "--permute double needs two"),
            (["cora", "--memory-budget", "1G"], "stages a dir: folder (CSR indptr.npy, indices.npy; or written by"),
            ([f"npz:{tmp_path / 'g.npz'}", "--memory-budget", "1G"], "npz: file not found"),
            ([f"dir:{tmp_path / 's'}", "--memory-budget", "1G"],
             "has no indptr.npy, indices.npy, y.npy, x.npy: stage it without"),
            ([f"dir:{generated / 'csbm'}", "--memory-budget", "12Q"], "is not a size; give e.g. 512M"),
            ([f"dir:{generated / 'csbm'}", "--memory-budget", "1G", "--split", "random:0.0001,0.5,0.4"],
             "leaves a split empty")):
        assert main(["data", "shard", *argv, "--grid", "1x1x2x1", "--out", str(tmp_path / "bad")]) != 0
        err = capsys.readouterr().err.strip()
        assert message in err and "\n" not in err and "Traceback" not in err, err


# ---------------------------------------------------------------- a user's CSR folder
def _user_folder(path, n, edges, seed, *, symmetric, loops, own_split=False, features="float"):
    """A dir: folder of CSR indptr.npy / indices.npy, x.npy, y.npy (a tenth unlabeled):
    symmetric and simple, or as users hand them in (one direction of most edges, both of
    some, duplicates, self loops, columns unsorted within rows)."""
    rng = np.random.default_rng(seed)
    src, dst = rng.integers(0, n, edges), rng.integers(0, n, edges)
    if symmetric:
        keep = src != dst
        key = np.unique(np.concatenate([src[keep] * n + dst[keep], dst[keep] * n + src[keep]]))
        src, dst = key // n, key % n
    else:
        # some edges both ways, some twice
        src, dst = np.concatenate([src, dst[:50], src[:30]]), np.concatenate([dst, src[:50], dst[:30]])
        if loops:
            src, dst = np.concatenate([src, np.arange(0, n, 7)]), np.concatenate([dst, np.arange(0, n, 7)])
        shuffle = rng.permutation(src.size)
        src, dst = src[shuffle], dst[shuffle]
    order = np.argsort(src, kind="stable")
    path.mkdir(parents=True)
    np.save(path / "indptr.npy", np.concatenate([[0], np.cumsum(np.bincount(src, minlength=n))]))
    np.save(path / "indices.npy", dst[order].astype(np.int32))
    x = rng.normal(size=(n, 9))
    np.save(path / "x.npy", x if features == "float" else (x > 0).astype(np.int8))
    y = rng.integers(0, 5, n)
    y[rng.random(n) < 0.1] = -1
    np.save(path / "y.npy", y)
    if own_split:
        ids = rng.permutation(np.flatnonzero(y >= 0))
        for name, part in (("train_idx", ids[:300]), ("val_idx", ids[300:450]), ("test_idx", ids[450:])):
            np.save(path / f"{name}.npy", part)
    return path


USERS = {"symmetric": dict(symmetric=True, loops=False),
         "one-way+loops": dict(symmetric=False, loops=True, features="int"),
         "one-way+own-split": dict(symmetric=False, loops=False, own_split=True)}


@pytest.fixture(scope="module")
def users(tmp_path_factory):
    root = tmp_path_factory.mktemp("users")
    for i, (name, how) in enumerate(USERS.items()):
        _user_folder(root / name, 900, 3000, i, **how)
    return root


@pytest.mark.parametrize("user", list(USERS))
@pytest.mark.parametrize("permute, shape, split", [
    ("none", (1, 2, 2, 2), (None, None)), ("single", (1, 3, 1, 2), (None, None)),
    ("double", (1, 2, 1, 2), (None, None)),
    ("none", (1, 1, 2, 1), ("random:0.6,0.2,0.2", None)), ("double", (1, 2, 2, 1), ("random:0.3,0.1,0.1", 11))],
    ids=lambda v: v if isinstance(v, str) else "x".join(map(str, v)) if isinstance(v[0], int) else str(v[0]))
def test_a_users_csr_folder_stages_out_of_core_as_in_memory(users, tmp_path, user, permute, shape, split):
    """Symmetrized (A + A^T), self loops dropped, duplicates merged, exactly as
    load_byo does; the folder's own split or the seeded one; --split in place of it."""
    folder = users / user
    graph = load_dataset(f"dir:{folder}", seed=3, cache=False, split=split[0], split_seed=split[1])
    shard_command(graph, shape, tmp_path / "mem", seed=3, permute=permute, split=split)
    want = _manifest(tmp_path / "mem")
    stage_out_of_core(folder, shape, tmp_path / "ooc", seed=3, chunk_entries=400, permute=permute, split=split)
    got = _manifest(tmp_path / "ooc")
    assert got["sha256"] == want["sha256"] and got["nnz_per_shard"] == want["nnz_per_shard"]
    for key in ("grid_shape", "name", "num_nodes", "num_edges", "num_features", "num_classes", "graph", "seed",
                "split", "permute"):
        assert got[key] == want[key], key
    assert sorted(p.name for p in (tmp_path / "ooc").iterdir()) == sorted(p.name for p in (tmp_path / "mem").iterdir())
    given = int(np.load(folder / "indptr.npy")[-1])  # one-way edges: made undirected, and the record says so
    assert got["graph"].get("symmetrized", False) == (user != "symmetric")
    assert got["graph"].get("input_edges") == (None if user == "symmetric" else given)


def test_edge_weights_in_a_users_folder_are_refused_out_of_core_not_dropped(users, tmp_path):
    folder = tmp_path / "weighted"
    shutil.copytree(users / "symmetric", folder)
    np.save(folder / "values.npy", np.full(int(np.load(folder / "indptr.npy")[-1]), 2.0))
    with pytest.raises(ValueError, match="trains unit weights and .* holds edge weights .values.npy.: stage it "
                       "without --memory-budget"):
        stage_out_of_core(folder, (1, 1, 1, 1), tmp_path / "ooc", seed=3)
    assert load_dataset(f"dir:{folder}", seed=3, cache=False).meta["weighted"]  # in memory: used


def test_split_on_a_generated_folder_is_the_in_memory_one(generated, tmp_path):
    split = ("random:0.5,0.3,0.2", 7)
    graph = load_dataset(f"dir:{generated / 'csbm'}", seed=3, cache=False, split=split[0], split_seed=split[1])
    shard_command(graph, (1, 2, 1, 1), tmp_path / "mem", seed=3, permute="single", split=split)
    stage_out_of_core(generated / "csbm", (1, 2, 1, 1), tmp_path / "ooc", seed=3, permute="single", split=split)
    got, want = _manifest(tmp_path / "ooc"), _manifest(tmp_path / "mem")
    assert got["sha256"] == want["sha256"] and got["graph"] == want["graph"] and got["split"] == want["split"]


class _Guard:
    """A memory-mapped stored-entries array that refuses to be read whole, or in a slice
    longer than ``limit``: a planted full materialization (np.asarray(indices)) fails."""

    def __init__(self, a, limit):
        self.a, self.limit, self.shape, self.dtype, self.ndim = a, limit, a.shape, a.dtype, a.ndim

    def __len__(self):
        return len(self.a)

    def __array__(self, *args, **kwargs):
        raise AssertionError(f"read whole: {self.shape}")

    def __getitem__(self, key):
        out = self.a[key]
        assert np.size(out) <= self.limit, f"read {np.size(out)} entries at once"
        return out


def test_memory_stays_bounded_a_full_read_is_caught(users, tmp_path, monkeypatch):
    import scalegnn.shards.out_of_core as staging

    load = staging._load
    monkeypatch.setattr(staging, "_load", lambda path: _Guard(load(path), 2 * 9 * 400))
    folder = users / "one-way+loops"
    stage_out_of_core(folder, (1, 2, 1, 2), tmp_path / "ok", seed=3, chunk_entries=400, permute="double")
    source = staging._Source.__init__

    def planted(self, *args, **kwargs):  # a regression that reads the whole column array
        source(self, *args, **kwargs)
        np.asarray(self.indices)

    monkeypatch.setattr(staging._Source, "__init__", planted)
    with pytest.raises(AssertionError, match="read whole"):
        stage_out_of_core(folder, (1, 2, 1, 2), tmp_path / "bad", seed=3, chunk_entries=400)


def test_inputs_it_cannot_stage_are_named_in_one_line_before_any_work(users, tmp_path):
    def folder(name, **arrays):
        path = tmp_path / name
        path.mkdir()
        for key, value in arrays.items():
            np.save(path / f"{key}.npy", value)
        return path

    base = {k: np.load(users / "symmetric" / f"{k}.npy") for k in ("indptr", "indices", "x", "y")}
    cases = [
        (folder("edges", edge_index=np.zeros((2, 3), dtype=np.int64), x=base["x"], y=base["y"]),
         "{} holds edge_index.npy, which stage_source streams into CSR first"),
        (folder("sparse", indptr=base["indptr"], indices=base["indices"], x_indptr=base["indptr"], y=base["y"]),
         "holds sparse ones (x_indptr.npy): stage it without --memory-budget"),
        (folder("directed", **base, undirected=np.bool_(False)), "says directed and weighted: stage it without"),
        (folder("multihot", **{**base, "y": np.eye(5)[base["y"].clip(0)]}), "y.npy is multi-hot: stage it without"),
        (folder("nox", indptr=base["indptr"], indices=base["indices"], y=base["y"]), "has no x.npy: stage it without"),
        (folder("short", **{**base, "x": base["x"][:-1]}), "'indptr' must be (900,) for N=899 rows of x"),
        (folder("labels", **{**base, "y": base["y"] - 3}), "holds class id -4; class ids are 0..C-1"),
        (tmp_path / "absent", "dir: folder not found")]
    for path, message in cases:
        with pytest.raises(ValueError) as err:
            stage_out_of_core(path, (1, 1, 2, 1), tmp_path / "out", seed=3)
        assert message.format(path) in str(err.value) and "\n" not in str(err.value), str(err.value)
    assert not (tmp_path / "out").exists()  # refused before any work
    from scalegnn.datasets import DatasetError
    from scalegnn.shards.out_of_core import stage_source

    arrays = _edge_graph(1)
    np.savez(tmp_path / "sparse.npz", edge_index=arrays["edge_index"], y=arrays["y"], x_indptr=np.zeros(901),
             x_indices=np.zeros(0), x_data=np.zeros(0), x_shape=np.array([900, 3]))
    np.savez(tmp_path / "noy.npz", edge_index=arrays["edge_index"], x=arrays["x"])
    for name, message in ((f"npz:{tmp_path / 'sparse.npz'}", "holds sparse ones (x_indptr): stage it without"),
                          (f"npz:{tmp_path / 'noy.npz'}", "out-of-core staging needs 'y'"),
                          ("cora", "an npz: file or OGB's raw files of ogbn-papers100M, not 'cora'"),
                          ("ogbn-papers100M", "data.npz and node-label.npz not found: put OGB's")):
        with pytest.raises((ValueError, DatasetError)) as err:
            stage_source(name, (1, 1, 2, 1), tmp_path / "out", data_root=tmp_path, seed=3)
        assert message in str(err.value) and "\n" not in str(err.value), str(err.value)
    np.savez(tmp_path / "good.npz", **arrays)
    for options, message in (({"memory_budget": 2 << 20}, "--memory-budget 2M is below what staging this graph needs"),
                             ({"permute": "double", "layout": "blocks"}, "--permute double needs two")):
        with pytest.raises(ValueError, match=message):  # before the conversion's pass over the edges
            stage_source(f"npz:{tmp_path / 'good.npz'}", (1, 1, 2, 1), tmp_path / "out", seed=3, **options)
    assert not (tmp_path / "out").exists()


def test_a_users_folder_with_several_processes_and_resumed(users, tmp_path):
    shape, folder = (1, 2, 1, 2), users / "one-way+loops"
    shard_command(load_dataset(f"dir:{folder}", seed=3, cache=False), shape, tmp_path / "mem", seed=3)
    want = _manifest(tmp_path / "mem")["sha256"]
    stage_out_of_core(folder, shape, tmp_path / "par", seed=3, workers=2, chunk_entries=500,
                      memory_budget=1 << 30)
    assert _manifest(tmp_path / "par")["sha256"] == want
    out = tmp_path / "killed"  # killed after two rank files, one of them then damaged
    (out / ".symmetric-csr").mkdir(parents=True)
    symmetrize(folder.resolve(), out / ".symmetric-csr", 500)
    first, second = (_write_rank(str(folder.resolve()), 3, shape, c, str(out), f"dir:{folder.resolve()}", 500,
                                 topology=str(out / ".symmetric-csr")) for c in grid_coords(shape)[:2])
    (out / second["file"]).write_bytes(b"half a file")
    stage_out_of_core(folder, shape, out, seed=3, chunk_entries=500)
    got = _manifest(out)
    assert got["sha256"] == want and got["staged"]["resumed"] == 1  # the intact one kept, the damaged one rewritten
    assert not (out / ".symmetric-csr").exists() and not list(out.glob("*.sha256"))


# ------------------------------------------------------------------ blocks layout
def _ranks(shape):
    return range(shape[1] * shape[2] * shape[3])


@pytest.mark.parametrize("kind, permute", [(k, p) for k in KINDS for p in ("none", "single")])
@pytest.mark.parametrize("shape", [(1, 2, 2, 2), (1, 3, 1, 2), (1, 1, 1, 1), (1, 2, 4, 1)],
                         ids=lambda s: "x".join(map(str, s)))
def test_the_blocks_layout_loads_every_ranks_shard_of_the_files_layout(generated, tmp_path, monkeypatch, kind,
                                                                        permute, shape):
    """Seeded features (computed at load from the seed, with the relabeling's ids, a few
    rows at a time), shared planes and row slices (1x2x4x1: the (x, y) plane is rows of a
    stored block)."""
    import scalegnn.shards.format as shard_format

    monkeypatch.setattr(shard_format, "SEEDED_ROWS_ENTRIES", 100)
    want = _in_memory(generated / kind, shape, tmp_path / "mem", permute)
    stage_out_of_core(generated / kind, shape, tmp_path / "blk", seed=3, chunk_entries=300, permute=permute,
                      layout="blocks")
    got = _manifest(tmp_path / "blk")
    assert got["layout"] == "blocks" and got["features"]["kind"] == "seeded"
    assert got["nnz_per_shard"] == want["nnz_per_shard"]
    for key in ("grid_shape", "name", "num_nodes", "num_edges", "num_features", "num_classes", "graph", "seed",
                "permute", "split"):
        assert got[key] == want[key], key
    for rank in _ranks(shape):
        same_shard(load_shard(tmp_path / "blk", rank), load_shard(tmp_path / "mem", rank))
    assert not [p for p in (tmp_path / "blk").rglob("*") if p.name.endswith((".part", ".tmp", ".json"))
                and p.name != "manifest.json"]


@pytest.mark.parametrize("user, permute, shape, split", [
    ("one-way+own-split", "none", (1, 2, 2, 2), (None, None)), ("symmetric", "single", (1, 3, 1, 2), (None, None)),
    ("one-way+loops", "none", (1, 2, 1, 2), ("random:0.6,0.2,0.2", 5))],
    ids=lambda v: v if isinstance(v, str) else None)
def test_the_blocks_layout_of_a_users_folder_holds_its_dense_features(users, tmp_path, user, permute, shape, split):
    folder = users / user
    graph = load_dataset(f"dir:{folder}", seed=3, cache=False, split=split[0], split_seed=split[1])
    shard_command(graph, shape, tmp_path / "mem", seed=3, permute=permute, split=split)
    stage_out_of_core(folder, shape, tmp_path / "blk", seed=3, chunk_entries=400, permute=permute, split=split,
                      layout="blocks")
    got = _manifest(tmp_path / "blk")
    assert got["features"] == {"kind": "dense"} and got["split"] == _manifest(tmp_path / "mem")["split"]
    for rank in _ranks(shape):
        same_shard(load_shard(tmp_path / "blk", rank), load_shard(tmp_path / "mem", rank))


def test_the_blocks_layout_stores_each_block_once(generated, tmp_path):
    """A 2x2x2 grid: 4 distinct blocks of A + I on disk, each rank's three planes cut from
    them; the per-rank files hold 8 ranks' planes (2 of them on the diagonal stored once)."""
    shape = (1, 2, 2, 2)
    stage_out_of_core(generated / "powerlaw", shape, tmp_path / "blk", seed=3, layout="blocks")
    stage_out_of_core(generated / "powerlaw", shape, tmp_path / "files", seed=3)
    got = _manifest(tmp_path / "blk")
    assert len([f for f in got["files"] if f.endswith(".indices.npy")]) == 4
    stored = sum(np.load(tmp_path / "blk" / f, mmap_mode="r").shape[0] for f in got["files"]
                 if f.endswith(".indices.npy"))
    assert stored == got["graph"]["adjacency_nnz"]  # every entry of A + I once
    per_rank = sum((tmp_path / "files" / f).stat().st_size for f in _manifest(tmp_path / "files")["files"])
    blocks = sum((tmp_path / "blk" / f).stat().st_size for f in got["files"])
    assert blocks < per_rank / 2


def test_a_killed_blocks_staging_resumes_and_a_damaged_block_is_refused(generated, tmp_path, monkeypatch):
    import scalegnn.shards.out_of_core as staging

    shape, out = (1, 2, 1, 2), tmp_path / "blk"
    real, calls = staging._Source.entries, []

    def dies_in_the_second_row_range(self, a, b, view="A"):
        calls.append(a)
        if a >= self.n // 2:
            raise KeyboardInterrupt("killed")
        return real(self, a, b, view)

    monkeypatch.setattr(staging._Source, "entries", dies_in_the_second_row_range)
    with pytest.raises(KeyboardInterrupt):
        stage_out_of_core(generated / "powerlaw", shape, out, seed=3, chunk_entries=300, layout="blocks")
    assert not (out / "manifest.json").exists() and not list(out.rglob("*.part"))
    monkeypatch.setattr(staging._Source, "entries", real)
    stage_out_of_core(generated / "powerlaw", shape, out, seed=3, chunk_entries=300, layout="blocks")
    assert _manifest(out)["staged"]["resumed"] == 1  # the first row range's blocks were kept
    stage_out_of_core(generated / "powerlaw", shape, tmp_path / "whole", seed=3, layout="blocks")
    assert _manifest(out)["sha256"] == _manifest(tmp_path / "whole")["sha256"]
    stage_out_of_core(generated / "powerlaw", shape, tmp_path / "two", seed=3, layout="blocks", workers=2,
                      memory_budget=1 << 30)  # a row range of blocks per process: the same files
    assert _manifest(tmp_path / "two")["sha256"] == _manifest(tmp_path / "whole")["sha256"]
    victim = out / next(f for f in _manifest(out)["files"] if f.endswith(".values.npy"))
    data = bytearray(victim.read_bytes())
    data[-1] ^= 1
    victim.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="does not match the SHA-256 its manifest lists"):
        for rank in _ranks(shape):
            load_shard(out, rank)


def test_the_blocks_layout_refuses_the_double_permutation_in_one_line(generated, tmp_path):
    with pytest.raises(ValueError, match="--layout blocks stores the run's one labeling; --permute double"):
        stage_out_of_core(generated / "csbm", (1, 2, 1, 1), tmp_path / "x", seed=3, permute="double", layout="blocks")
    assert not (tmp_path / "x" / "manifest.json").exists()


@pytest.mark.distributed
def test_a_run_on_the_blocks_layout_trains_as_on_the_rank_files(generated, tmp_path):
    """Four gloo ranks (1x2x1x2, the seed's relabeling): the same epoch losses and
    accuracies, bit for bit, whichever layout the ranks read their shards from."""
    from scalegnn.config import make_config
    from scalegnn.launch import launch

    folder, shape = generated / "csbm", (1, 2, 1, 2)
    for layout in ("files", "blocks"):
        stage_out_of_core(folder, shape, tmp_path / layout, seed=3, permute="single", layout=layout)
    recs = [launch(make_config(dataset=f"dir:{folder}", shard_dir=str(tmp_path / layout), grid=shape, nproc=4,
                               epochs=2, eval_every=1, hidden=8, batch_ratio=0.3, seed=3, permute="single",
                               progress=False, out_dir=str(tmp_path / "runs" / layout)), timeout_s=240)
            for layout in ("files", "blocks")]
    assert [r["status"] for r in recs] == ["ok", "ok"], [r.get("error") for r in recs]
    rows = [[(e["loss"], e["train_acc"], e["val_acc"], e["test_acc"]) for e in r["epochs"]] for r in recs]
    assert rows[0] == rows[1] and len(rows[0]) == 2


_PEAK = r"""
import json, sys
from scalegnn.shards.out_of_core import stage_out_of_core
def status(key):  # kB in /proc/self/status
    return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith(key + ":"))
with open("/proc/self/clear_refs", "w") as f:  # the peak so far (importing torch's) set back to the current RSS
    f.write("5")
base = status("VmRSS")
folder, out, layout, permute, budget = sys.argv[1:6]
stage_out_of_core(folder, (1, 2, 2, 2), out, seed=3, memory_budget=int(budget), layout=layout, permute=permute)
print(json.dumps({"above": status("VmHWM") - base}))
"""


@pytest.fixture(scope="module")
def bigger(tmp_path_factory):
    """200,000 vertices, ~1.9 M stored entries: the N-sized vectors and the chunks both matter."""
    root = tmp_path_factory.mktemp("bigger")
    generate("powerlaw:n=200000,avg_degree=10,exponent=2.5", root / "g", seed=3)
    return root / "g"


@pytest.mark.parametrize("layout, permute, budget", [
    ("blocks", "none", 128 << 20), ("blocks", "single", 160 << 20), ("files", "none", 320 << 20),
    ("files", "double", 400 << 20)])
def test_the_memory_budget_bounds_the_peak(bigger, tmp_path, layout, permute, budget):
    """A fresh process's peak RSS above the imported interpreter stays within
    --memory-budget, with chunks as large as the budget leaves (not a few entries)."""
    import subprocess
    import sys

    from scalegnn.shards.out_of_core import BYTES_PER_ENTRY, memory_plan

    info = json.loads((bigger / "graph.json").read_text())
    plan = memory_plan(budget, n=info["num_nodes"], nnz=info["stored_entries"], num_features=128, num_classes=32,
                       shape=(1, 2, 2, 2), permute=permute, layout=layout, workers=1, user_csr=False)
    assert plan["chunk"] * BYTES_PER_ENTRY >= budget // 8  # the chunks are a real share of the budget
    done = subprocess.run([sys.executable, "-c", _PEAK, str(bigger), str(tmp_path / "s"), layout, permute,
                           str(budget)], capture_output=True, text=True, timeout=600,
                          env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    above = json.loads(done.stdout.strip().splitlines()[-1])["above"]
    assert above <= budget, f"peak {above / 2**20:.0f} MiB above the interpreter, budget {budget / 2**20:.0f} MiB"


def test_a_budget_too_small_is_refused_before_any_work(bigger, tmp_path, capsys):
    out = tmp_path / "s"
    assert main(["data", "shard", f"dir:{bigger}", "--grid", "1x2x2x2", "--out", str(out), "--memory-budget", "50M",
                 "--layout", "blocks"]) != 0
    err = capsys.readouterr().err.strip()
    assert "--memory-budget 50M is below what staging this graph needs" in err and "give at least" in err
    assert "\n" not in err and not (out / "manifest.json").exists() and not list(out.rglob("*.npy"))
    longest = json.loads((bigger / "graph.json").read_text())["max_degree"]
    from scalegnn.shards.out_of_core import BASE_BYTES, BYTES_PER_ENTRY, VERTEX_BYTES

    tight = BASE_BYTES + VERTEX_BYTES["none"] * 200000 + (longest // 2) * BYTES_PER_ENTRY  # chunks under a row
    with pytest.raises(ValueError, match=f"below this graph's longest row \\({longest:,} entries\\)"):
        stage_out_of_core(bigger, (1, 2, 2, 2), out, memory_budget=tight, layout="blocks")


# ------------------------------------------------------- edge lists streamed into CSR first
def _edge_graph(seed, n=900, e=3000):
    rng = np.random.default_rng(seed)
    src = rng.integers(0, n, e)
    dst = (src + rng.zipf(2.0, e)) % n  # some loops and repeats
    y = rng.integers(0, 5, n)
    y[rng.random(n) < 0.2] = -1
    return {"edge_index": np.stack([src, dst]), "x": rng.standard_normal((n, 6)).astype(np.float32), "y": y}


@pytest.mark.parametrize("form", ["npz-stored", "npz-deflated", "dir-(E,2)"])
@pytest.mark.parametrize("layout", ["files", "blocks"])
def test_an_edge_list_is_streamed_into_csr_and_staged_as_in_memory(tmp_path, form, layout):
    """npz members read as streams (stored or deflated), a folder's (E, 2) edge_index;
    the staged shards are the in-memory path's (same SHA-256 for per-rank files, same
    tensors for the blocks layout)."""
    arrays = _edge_graph(4)
    if form.startswith("npz"):
        name = f"npz:{tmp_path / 'g.npz'}"
        (np.savez if form == "npz-stored" else np.savez_compressed)(tmp_path / "g.npz", **arrays)
    else:
        (tmp_path / "g").mkdir()
        for k, v in arrays.items():
            np.save(tmp_path / "g" / f"{k}.npy", v.T if k == "edge_index" else v)
        name = f"dir:{tmp_path / 'g'}"
    from scalegnn.shards.out_of_core import stage_source

    shape = (1, 2, 1, 2)
    graph = load_dataset(name, seed=3, cache=False)
    shard_command(graph, shape, tmp_path / "mem", seed=3, permute="single")
    stage_source(name, shape, tmp_path / "ooc", seed=3, chunk_entries=350, permute="single", layout=layout)
    got, want = _manifest(tmp_path / "ooc"), _manifest(tmp_path / "mem")
    for key in ("name", "num_nodes", "num_edges", "num_features", "num_classes", "graph", "nnz_per_shard"):
        assert got[key] == want[key], key
    if layout == "files":
        assert got["sha256"] == want["sha256"]
    for rank in _ranks(shape):
        same_shard(load_shard(tmp_path / "ooc", rank), load_shard(tmp_path / "mem", rank))
    assert not (tmp_path / "ooc" / ".converted").exists()


def _ogb_papers(root, arrays):
    """A small graph in OGB's ogbn-papers100M layout, as OGB ships it (binary raw files)."""
    import gzip

    d = root / "ogbn_papers100M"
    (d / "raw").mkdir(parents=True)
    (d / "RELEASE_v1.txt").write_text("1\n")
    n, e = arrays["x"].shape[0], arrays["edge_index"].shape[1]
    np.savez_compressed(d / "raw" / "data.npz", edge_index=arrays["edge_index"], node_feat=arrays["x"],
                        num_nodes_list=np.array([n]), num_edges_list=np.array([e]),
                        node_year=np.full((n, 1), 2020))
    label = arrays["y"].astype(np.float64)
    label[label < 0] = np.nan
    np.savez_compressed(d / "raw" / "node-label.npz", node_label=label[:, None])
    (d / "split" / "time").mkdir(parents=True)
    ids = np.random.default_rng(0).permutation(np.flatnonzero(arrays["y"] >= 0))
    for part, chunk in (("train", ids[:300]), ("valid", ids[300:450]), ("test", ids[450:])):
        with gzip.open(d / "split" / "time" / f"{part}.csv.gz", "wt") as f:
            f.write("".join(f"{i}\n" for i in chunk))


def test_ogbs_papers100m_files_as_shipped_stage_as_ogbs_own_loader_reads_them(tmp_path, monkeypatch):
    """OGB's raw files (data.npz, node-label.npz, split/time/*.csv.gz), streamed without
    ogb's processed/ step, give the shards of the in-memory path through ogb itself."""
    pytest.importorskip("ogb")
    from scalegnn.shards.out_of_core import stage_source

    monkeypatch.setenv("SCALEGNN_OFFLINE", "1")
    _ogb_papers(tmp_path / "root", _edge_graph(6))
    shape = (1, 2, 2, 1)
    graph = load_dataset("ogbn-papers100M", data_root=str(tmp_path / "root"), seed=3, cache=False)
    shard_command(graph, shape, tmp_path / "mem", seed=3)
    stage_source("ogbn-papers100M", shape, tmp_path / "ooc", data_root=tmp_path / "root", seed=3, chunk_entries=500)
    got, want = _manifest(tmp_path / "ooc"), _manifest(tmp_path / "mem")
    assert got["sha256"] == want["sha256"] and got["graph"] == want["graph"] and got["name"] == "ogbn-papers100M"


def test_a_disk_too_small_is_refused_before_any_work(generated, tmp_path, monkeypatch):
    """The estimate of what staging writes against the free space of --out's disk."""
    import shutil

    from scalegnn.shards.out_of_core import disk_plan

    info = json.loads((generated / "powerlaw" / "graph.json").read_text())
    sizes = dict(n=info["num_nodes"], nnz=info["stored_entries"], num_features=128, num_classes=32)
    need = {layout: disk_plan(tmp_path, **sizes, shape=(1, 2, 2, 2), layout=layout, seeded=True, user_csr=False)
            for layout in ("files", "blocks")}
    for layout in ("files", "blocks"):  # the estimate against what is written
        stage_out_of_core(generated / "powerlaw", (1, 2, 2, 2), tmp_path / layout, seed=3, layout=layout)
        written = sum(f.stat().st_size for f in (tmp_path / layout).rglob("*") if f.is_file())
        assert 0.9 * written <= need[layout] <= 1.1 * written, (layout, need[layout], written)  # within 10 %
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda p: real(p)._replace(free=need["blocks"] // 2))
    with pytest.raises(ValueError, match="but its disk has .* free; free space there or pass another --out"):
        stage_out_of_core(generated / "powerlaw", (1, 2, 2, 2), tmp_path / "small", seed=3, layout="blocks")
    assert not list((tmp_path / "small").rglob("*"))
