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


def test_a_path_given_without_its_form_is_named_not_guessed(tmp_path, monkeypatch):
    """A file or folder that exists but was given without ``npz:`` / ``edgelist:`` /
    ``dir:`` gets the form to write, from its ending; never "unknown dataset"."""
    monkeypatch.chdir(tmp_path)
    for name in ("graph.npz", "graph.edges", "graph.py"):
        (tmp_path / name).write_text("")
    (tmp_path / "arrays").mkdir()
    with pytest.raises(DatasetError, match=r"^dataset 'graph.npz' is a file: name its format, e.g. --dataset "
                                           r"npz:graph.npz$"):
        load_dataset("graph.npz")
    with pytest.raises(DatasetError, match=r"--dataset edgelist:graph.edges$"):
        load_dataset("graph.edges")
    with pytest.raises(DatasetError, match=r"is a folder: name its format, e.g. --dataset dir:.*arrays$"):
        load_dataset(str(tmp_path / "arrays"))
    with pytest.raises(DatasetError, match=r"--dataset edgelist:graph.py or mtx:graph.py or npz:graph.py$"):
        load_dataset("graph.py")  # an ending that names no form: every file form
    with pytest.raises(DatasetError, match="unknown dataset 'graph.mtx'"):
        load_dataset("graph.mtx")  # no such file: the name is unknown, as before


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
