"""What every loader shares (scalegnn/datasets/_core.py): missing, partial and corrupt
files named with the fix, degree classes for featureless graphs, and the ``--split``
flag, which replaces a file's split (drawn over the labeled vertices with
``--split-seed``), applies to every file form and PyG graphs, and is refused in one line
when malformed.

Every test runs with its own cache folder and with ``SCALEGNN_OFFLINE=1`` (conftest.py)."""

from __future__ import annotations

import re
import shutil

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from scalegnn.cli import main
from scalegnn.config import make_config
from scalegnn.datasets import DatasetError, load_dataset
from scalegnn.launch import launch
from tests.files import N, SHARED_DATA, graph_arrays, needs_shared, sparse_npz


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


def test_degree_classes_are_balanced_and_follow_degree():
    g = load_dataset("rmat:scale=12,edge_factor=8", cache=False)
    counts = torch.bincount(g.y, minlength=32)
    assert int(counts.max() - counts.min()) <= 1  # balanced
    deg = g.degrees()
    lo, hi = deg[g.y == 0].max(), deg[g.y == 31].min()
    assert int(lo) <= int(hi)  # classes are degree-rank bins
    for c in range(31):  # degree ranges of consecutive classes touch but never cross
        assert int(deg[g.y == c].max()) <= int(deg[g.y == c + 1].min())


# ----------------------------------------------------------------------------- --split
def _split_sizes(g):
    return tuple(t.numel() for t in (g.train_idx, g.val_idx, g.test_idx))


def test_split_flag_replaces_the_files_split_and_the_record_says_so(isolated_data):
    """A file with its own split: --split wins, drawn over the labeled vertices with
    --split-seed (default --seed); the record's graph.split names it and what it replaced."""
    ei, x, y = graph_arrays()
    path = sparse_npz(isolated_data / "g.npz", train_idx=np.arange(5, 20), val_idx=np.arange(20, 30),
                      test_idx=np.arange(30, 40))
    cfg = make_config(dataset=f"npz:{path}", split="random:0.6,0.2,0.2", split_seed=7, epochs=1, hidden=8,
                      progress=False, out_dir=str(isolated_data / "runs"))
    assert cfg.data.split == "random:0.6,0.2,0.2"
    rec = launch(cfg)
    assert rec["graph"]["split"] == ("random 60/20/20 seed 7 (--split random:0.6,0.2,0.2; replaces: "
                                     f"{load_dataset(f'npz:{path}').meta['split']})")
    g = load_dataset(f"npz:{path}", split="random:0.6,0.2,0.2", split_seed=7)
    assert _split_sizes(g) == (69, 23, 23)  # of the 115 labeled: round(69.0), round(23.0), the rest
    assert not set(torch.cat([g.train_idx, g.val_idx, g.test_idx]).tolist()) & set(range(5))  # unlabeled left out
    other = load_dataset(f"npz:{path}", split="random:0.6,0.2,0.2", split_seed=8)
    assert not torch.equal(g.train_idx, other.train_idx)
    part = load_dataset(f"npz:{path}", split="random:0.2,0.1,0.1")  # below 1: the rest is in no split
    assert _split_sizes(part) == (23, 12, 12)


@pytest.mark.parametrize("flags, message", ids=["sum", "negative", "count", "numbers", "kind", "seed"], argvalues=[
    (["--split", "random:0.5,0.5,0.5"], r"sum to 1.5 > 1"),
    (["--split", "random:0.5,-0.1,0.2"], r"every fraction must be in \(0, 1\]"),
    (["--split", "random:0.5,0.25"], r"2 fractions, not 3"),
    (["--split", "random:a,b,c"], r"not three numbers"),
    (["--split", "planetoid"], r"the only kind is 'random'"),
    (["--split-seed", "3"], r"--split-seed needs --split"),
])
def test_bad_split_flags_are_one_line_errors(isolated_data, capsys, flags, message):
    path = sparse_npz(isolated_data / "g.npz")
    try:
        code = main(["train", "--dataset", f"npz:{path}", "--out", str(isolated_data / "runs"), *flags])
    except SystemExit as stop:  # argparse's usage error
        code = stop.code
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(("scalegnn: error:", "scalegnn train: error:")) and re.search(message, err)
    assert "random:TRAIN,VAL,TEST" in err or "--split-seed" in err
    assert not (isolated_data / "runs").exists()  # refused before any work


def test_split_flag_applies_to_every_file_form_and_pyg_graphs(isolated_data):
    ei, x, y = graph_arrays()
    folder = isolated_data / "arrays"
    folder.mkdir()
    for key, value in (("edge_index", ei), ("x", x.toarray()), ("y", y)):
        np.save(folder / f"{key}.npy", value)
    (isolated_data / "g.txt").write_text("\n".join(f"{s} {d}" for s, d in ei.T))
    sp_adj = sp.coo_matrix((np.ones(ei.shape[1]), (ei[0], ei[1])), shape=(N, N))
    import scipy.io

    scipy.io.mmwrite(isolated_data / "g.mtx", sp_adj)
    for name in (f"npz:{sparse_npz(isolated_data / 'g.npz')}", f"dir:{folder}", f"edgelist:{isolated_data / 'g.txt'}",
                 f"mtx:{isolated_data / 'g.mtx'}", "csbm:n=200"):
        g = load_dataset(name, split="random:0.6,0.2,0.2")
        assert g.meta["split"].startswith("random 60/20/20 seed 0 (--split random:0.6,0.2,0.2; replaces: "), name
    from torch_geometric.data import Data

    import scalegnn

    data = Data(x=torch.from_numpy(x.toarray()), y=torch.from_numpy(y), edge_index=torch.from_numpy(ei))
    rec = scalegnn.train(data, split="random:0.6,0.2,0.2", epochs=1, hidden=8, progress=False,
                         out_dir=str(isolated_data / "runs"))
    assert rec["graph"]["split"].startswith("random 60/20/20 seed 0 (--split random:0.6,0.2,0.2; replaces: random "
                                            "50/25/25 seed 0 (the PyG object has no masks))")
