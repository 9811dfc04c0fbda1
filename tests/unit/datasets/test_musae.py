"""MUSAE Facebook and Twitch (scalegnn/datasets/musae.py): published statistics on the real
files in ``../shared/data`` (skipped when absent), the LINKX split of twitch-de and its
seeded fallback, the seeded split of the others.

Every test runs with its own cache folder and with ``SCALEGNN_OFFLINE=1`` (conftest.py)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from scalegnn.datasets import CACHE_FORMAT_VERSION, DatasetError, load_dataset
from tests.files import SHARED_DATA, assert_same_graph, needs_shared
from tests.graphs import assert_raw, split_sizes


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
