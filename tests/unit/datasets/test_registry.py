"""Dataset names (scalegnn/datasets/registry.py): canonical names round-trip, an unknown
name suggests a close one, and ``scalegnn data list`` names the datasets and every form a
file of your own can take.

Every test runs with its own cache folder and with ``SCALEGNN_OFFLINE=1`` (conftest.py)."""

from __future__ import annotations

import pytest

from scalegnn.cli import main
from scalegnn.datasets import DatasetError, list_datasets, load_dataset
from tests.files import assert_same_graph


def test_canonical_names_round_trip():
    g = load_dataset("CSBM:n=1e3,classes=8,signal=0.5", cache=False)
    assert g.name == "csbm:n=1000,signal=0.5" and g.meta["params"]["classes"] == 8
    assert_same_graph(g, load_dataset(g.name, cache=False))
    assert {"cora", "facebook", "twitch-de", "reddit", "ogbn-papers100M", "csbm", "rmat"} <= set(list_datasets())


def test_unknown_name_suggests_close_match():
    with pytest.raises(DatasetError, match=r"unknown dataset 'facebok'; did you mean 'facebook'\? Known: cora"):
        load_dataset("facebok")
    with pytest.raises(DatasetError, match="did you mean 'ogbn-arxiv'"):
        load_dataset("ogbn-arxive")


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


def test_data_list_names_the_new_forms(capsys):
    assert main(["data", "list"]) == 0
    out = capsys.readouterr().out
    assert "<stem>.features.npy" in out and "<stem>.labels.npy" in out and "x_indptr/x_indices/x_data/x_shape" in out
    assert "x.npz (scipy.sparse.save_npz)" in out
