"""OGB node datasets (scalegnn/datasets/ogbn.py) through ``ogb`` on fake files in ogb's own
layouts: raw then processed, NaN labels of papers100M, offline without a copy.

Every test runs with its own cache folder and with ``SCALEGNN_OFFLINE=1`` (conftest.py)."""

from __future__ import annotations

import re

import pytest
import torch

from scalegnn.datasets import DatasetError, load_dataset
from tests.files import assert_same_graph, fake_ogbn_arxiv, fake_ogbn_papers
from tests.graphs import assert_raw, split_sizes, stored_entries


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
