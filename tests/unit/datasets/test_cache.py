"""The dataset cache (scalegnn/datasets/cache.py): its layout, corrupt and stale entries,
and sparse features kept CSR through it.

Every test runs with its own cache folder and with ``SCALEGNN_OFFLINE=1`` (conftest.py)."""

from __future__ import annotations

import re
import warnings

import pytest
import torch

from scalegnn.datasets import CACHE_FORMAT_VERSION, load_dataset
from tests.files import assert_same_graph, sparse_npz


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


def test_cache_round_trip_keeps_csr_and_the_dense_stay_dense(isolated_data):
    s, d = sparse_npz(isolated_data / "s.npz"), sparse_npz(isolated_data / "d.npz", dense=True)
    for path, layout in ((s, torch.sparse_csr), (d, torch.strided)):
        built, cached = (load_dataset(f"npz:{path}") for _ in range(2))
        assert not built.meta["from_cache"] and cached.meta["from_cache"]
        assert built.x.layout == cached.x.layout == layout
        assert torch.equal(built.x.to_dense(), cached.x.to_dense())
