"""The one feature layout rule (scalegnn.csr.sparse_enough) and the built-in loaders
that follow it: multi-hot features (Planetoid, Facebook, Twitch) are built as CSR,
never as the dense N x F matrix, come back as CSR from the cache too, and hold exactly
the values of a dense parse of the same files.

Every test runs with its own cache folder and with ``SCALEGNN_OFFLINE=1`` (conftest.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
import torch

from scalegnn.csr import SPARSE_FEATURE_DENSITY, feature_layout, is_csr, sparse_enough
from scalegnn.datasets import load_dataset
from scalegnn.datasets._core import multihot_features
from scalegnn.sampling import training_features
from tests.files import REPO, SHARED_DATA, assert_same_graph, needs_shared

BINARY = ("cora", "citeseer", "facebook", "twitch-de", "twitch-engb")


# ------------------------------------------------------------------ the rule
def test_one_rule_decides_the_layout_everywhere():
    """Under 5 % nonzeros is CSR, at or over it dense: for the loaders' builder, for a
    matrix put in its layout, and for the trainers' input alike."""
    n, f = 40, 10  # 400 entries: 19 ones are under 5 %, 20 are not
    for ones, layout in ((19, torch.sparse_csr), (20, torch.strided)):
        rows, cols = np.divmod(np.arange(ones) * 7 % (n * f), f)
        assert sparse_enough(ones, n, f) == (layout == torch.sparse_csr)
        built = multihot_features(rows, cols, (n, f), "test")
        dense = torch.zeros(n, f)
        dense[rows, cols] = 1.0
        assert built.layout == feature_layout(dense).layout == training_features(dense).layout == layout
        assert torch.equal(built.to_dense(), dense)
    assert not sparse_enough(0, 0, 5) and SPARSE_FEATURE_DENSITY == 0.05


def test_multihot_repeats_count_once_and_bad_ids_are_refused():
    x = multihot_features(np.array([0, 0, 3, 3]), np.array([5, 5, 99, 0]), (100, 100), "f.json")
    assert is_csr(x) and x.values().tolist() == [1.0, 1.0, 1.0] and x.col_indices().tolist() == [5, 0, 99]
    with pytest.raises(ValueError, match=r"f.json: feature id 100 is outside \[0, 100\)"):
        multihot_features(np.array([0]), np.array([100]), (100, 100), "f.json")


# ------------------------------------------------------- the real datasets
def _dense_parse(name: str) -> torch.Tensor:
    """The features of ``name`` parsed here into a dense matrix, independently of the loader."""
    if name.startswith("cora") or name.startswith("citeseer"):
        from scalegnn.datasets.planetoid import _unpickle

        d = SHARED_DATA / f"planetoid_{name}"
        allx, tx = (_unpickle(d / f"ind.{name}.{p}", name).toarray() for p in ("allx", "tx"))
        test_index = np.loadtxt(d / f"ind.{name}.test.index", dtype=np.int64)
        n = max(len(allx), test_index.max() + 1)
        x = np.zeros((n, allx.shape[1]), dtype=np.float32)
        x[: len(allx)] = allx
        x[test_index] = tx
        return torch.from_numpy(x)
    if name == "facebook":
        path, n, width = SHARED_DATA / "facebook_pagepage" / "features.json", 22470, None
    else:
        c = name.split("-")[1].upper()
        path, width = SHARED_DATA / "twitch_musae" / c / f"musae_{c}_features.json", 3170
        n = pd.read_csv(path.with_name(f"musae_{c}_target.csv"))["new_id"].nunique()
    feats = json.loads(path.read_text())
    width = width or 1 + max(c for v in feats.values() for c in v)
    x = np.zeros((n, width), dtype=np.float32)
    for v, cols in feats.items():
        x[int(v), cols] = 1.0
    return torch.from_numpy(x)


@needs_shared
@pytest.mark.parametrize("name", BINARY)
def test_binary_datasets_are_csr_parsed_and_cached_with_the_dense_values(name):
    built = load_dataset(name, data_root=SHARED_DATA)
    cached = load_dataset(name, data_root=SHARED_DATA)
    assert not built.meta["from_cache"] and cached.meta["from_cache"]
    assert built.x.layout == cached.x.layout == torch.sparse_csr, "a multi-hot dataset must be CSR"
    assert_same_graph(built, cached)  # same layout and arrays: the same run either way
    assert torch.equal(built.x.to_dense(), _dense_parse(name))
    assert set(built.x.values().tolist()) == {1.0}
    assert built.stats()["sparse_features"]


# ------------------------------------------------- memory follows the nonzeros
_PEAK = textwrap.dedent("""
    import sys
    import scalegnn.datasets.musae as musae
    from scalegnn.datasets import load_dataset
    if sys.argv[2] == "plant":  # the regression this test must catch: the dense N x F matrix
        import numpy as np, torch
        build = musae.multihot_features
        def dense(rows, cols, shape, what):
            x = np.zeros(shape, dtype=np.float32)
            x[rows, cols] = 1.0
            return build(rows, cols, shape, what) if torch.from_numpy(x).sum() >= 0 else None
        musae.multihot_features = dense
    def peak():  # VmHWM: ru_maxrss would carry the parent's peak over the fork
        return int(next(l for l in open("/proc/self/status") if l.startswith("VmHWM")).split()[1]) * 1024
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak to the current size
    before = peak()
    g = load_dataset("twitch-de", data_root=sys.argv[1], cache=False)
    print(peak() - before, g.x.layout)
""")


def _twitch_like(root, n: int, per_row: int, width: int = 3170):
    """A Twitch DE folder of ``n`` vertices with ``per_row`` feature ids each and a path graph."""
    d = root / "twitch_musae" / "DE"
    d.mkdir(parents=True)
    rng = np.random.default_rng(0)
    feats = {str(v): rng.choice(width, per_row, replace=False).tolist() for v in range(n)}
    (d / "musae_DE_features.json").write_text(json.dumps(feats))
    pd.DataFrame({"from": np.arange(n - 1), "to": np.arange(1, n)}).to_csv(d / "musae_DE_edges.csv", index=False)
    pd.DataFrame({"id": np.arange(n), "mature": rng.random(n) < 0.5, "new_id": np.arange(n)}).to_csv(
        d / "musae_DE_target.csv", index=False)
    return n * width * 4


@pytest.mark.skipif(not os.access("/proc/self/clear_refs", os.W_OK), reason="needs Linux's /proc/self/clear_refs "
                    "to reset the peak memory count")
@pytest.mark.parametrize("plant", [False, True], ids=["csr", "planted-dense"])
def test_loading_never_makes_the_dense_matrix(tmp_path, plant):
    """Loading a Twitch-shaped graph (30,000 x 3,170: 380 MB dense, 0.3 % ones) raises the
    process's peak memory by well under half the dense matrix; a loader that makes the
    dense matrix (planted) is caught."""
    dense_bytes = _twitch_like(tmp_path, 30_000, 10)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", _PEAK, str(tmp_path), "plant" if plant else "-"], env=env,
                         capture_output=True, text=True, check=True, timeout=300).stdout.split()
    grew, layout = int(out[0]), out[1]
    assert layout == "torch.sparse_csr"
    if plant:
        assert grew > dense_bytes / 2, f"the planted dense loader went unseen: +{grew / 2**20:.0f} MiB"
    else:
        assert grew < dense_bytes / 2, (f"loading raised the peak by {grew / 2**20:.0f} MiB, the dense matrix is "
                                        f"{dense_bytes / 2**20:.0f} MiB: is it made?")


def test_a_dense_user_array_keeps_its_layout_through_the_cache(isolated_data):
    """The rule builds the loaders' features; it does not re-lay a user's dense array:
    that stays dense, parsed or cached (the cache stores it compressed, SPARSE as CSR)."""
    x = sp.random(50, 40, density=0.02, format="csr", random_state=0, dtype=np.float32).toarray()
    np.savez(isolated_data / "u.npz", edge_index=np.array([[0, 1], [1, 2]]), y=np.zeros(50, dtype=np.int64), x=x)
    built, cached = (load_dataset(f"npz:{isolated_data / 'u.npz'}") for _ in range(2))
    assert cached.meta["from_cache"] and built.x.layout == cached.x.layout == torch.strided
    assert torch.equal(cached.x, torch.from_numpy(x))
