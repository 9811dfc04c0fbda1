"""Hostile and careless files (issue K): no code runs from data, bad data is refused
before any work with one line naming the file, the problem and the fix, and no
record, shard or checkpoint is left half-written.

Each case below failed before its fix (see the commit that added it):

- a crafted Planetoid ``ind.*`` pickle, a crafted LINKX ``.npy`` and a crafted ogb
  ``processed/data_processed`` ran code when loaded (``pickle.load``,
  ``np.load(allow_pickle=True)``, ``torch.load(weights_only=False)``);
"""

from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from scalegnn.cli import main
from scalegnn.datasets import DatasetError, load_dataset

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"
if not SHARED.is_dir():  # a worktree next to the main checkout
    SHARED = Path("/work/shared/data")
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason=f"shared data folder {SHARED} is absent")


class RunsCode:
    """Unpickling this calls ``os.system("touch <marker>")``: the marker file exists
    afterwards exactly when a loader ran code from the file."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def one_line_error(capsys, argv) -> str:
    """Run the CLI, expect the user-error exit (2) and exactly one stderr line."""
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("scalegnn: error: "), (code, err)
    return err


# ----------------------------------------------------------------------------- no code runs from data
@needs_shared
@pytest.mark.parametrize("part", ["graph", "allx", "ty"])
def test_a_crafted_planetoid_pickle_runs_no_code(tmp_path, capsys, monkeypatch, part):
    monkeypatch.setenv("SCALEGNN_CACHE_DIR", str(tmp_path / "cache"))
    root = tmp_path / "root"
    shutil.copytree(SHARED / "planetoid_cora", root / "planetoid_cora")
    marker = tmp_path / "pwned"
    bad = root / "planetoid_cora" / f"ind.cora.{part}"
    bad.write_bytes(pickle.dumps(RunsCode(marker), protocol=2))
    err = one_line_error(capsys, ["data", "info", "cora", "--data-root", str(root)])
    assert not marker.exists(), "the crafted pickle ran code"
    assert str(bad) in err and "posix.system" in err and "could run code" in err, err
    assert "kimiyoung/planetoid" in err, err  # the fix: the original files


@needs_shared
def test_a_crafted_linkx_split_file_runs_no_code(tmp_path, monkeypatch):
    monkeypatch.setenv("SCALEGNN_CACHE_DIR", str(tmp_path / "cache"))
    root = tmp_path / "root"
    shutil.copytree(SHARED / "twitch_musae" / "DE", root / "twitch_musae" / "DE")
    marker = tmp_path / "pwned"
    bad = root / "twitch_musae" / "linkx_splits" / "twitch-e-DE-splits.npy"
    bad.parent.mkdir(parents=True)
    np.save(bad, np.array([{"train": RunsCode(marker)}], dtype=object), allow_pickle=True)
    with pytest.raises(DatasetError) as info:
        load_dataset("twitch-de", data_root=root)
    assert not marker.exists(), "the crafted .npy ran code"
    msg = str(info.value)
    assert "\n" not in msg and str(bad) in msg and "posix.system" in msg and "could run code" in msg, msg


def test_a_crafted_ogb_processed_file_runs_no_code(tmp_path, monkeypatch):
    pytest.importorskip("ogb")
    from tests.test_datasets import fake_ogbn_arxiv

    fake_ogbn_arxiv(tmp_path)
    processed = tmp_path / "ogbn_arxiv" / "processed" / "data_processed"
    marker = tmp_path / "pwned"
    processed.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"graph": RunsCode(marker), "labels": None}, processed, pickle_protocol=4)  # as ogb saves it
    with pytest.raises(DatasetError) as info:
        load_dataset("ogbn-arxiv", data_root=tmp_path, cache=False)
    assert not marker.exists(), "the crafted ogb file ran code"
    msg = str(info.value)
    assert "\n" not in msg and str(processed) in msg and "posix.system" in msg and "could run code" in msg, msg
    assert "delete" in msg and "processed" in msg  # the fix: ogb rebuilds it from raw/


def test_ogb_files_still_load_through_the_restricted_reader(tmp_path):
    """ogb's own files pass: the binary layout's processed pickle (protocol 4, numpy
    int scalars for num_nodes) and a split_dict.pt of tensors (torch's weights-only
    loader); a crafted split_dict.pt is refused like the processed file."""
    pytest.importorskip("ogb")
    from tests.test_datasets import assert_same_graph, fake_ogbn_papers

    fake_ogbn_papers(tmp_path)
    first = load_dataset("ogbn-papers100M", data_root=tmp_path, cache=False)  # parses raw/, writes processed/
    assert (tmp_path / "ogbn_papers100M" / "processed" / "data_processed").is_file()
    assert_same_graph(first, load_dataset("ogbn-papers100M", data_root=tmp_path, cache=False))
    split = tmp_path / "ogbn_papers100M" / "split" / "time" / "split_dict.pt"
    torch.save({"train": torch.tensor([0, 1]), "valid": torch.tensor([2]), "test": torch.tensor([3, 4])}, split)
    g = load_dataset("ogbn-papers100M", data_root=tmp_path, cache=False)
    assert [g.train_idx.tolist(), g.val_idx.tolist(), g.test_idx.tolist()] == [[0, 1], [2], [3, 4]]
    marker = tmp_path / "pwned"
    torch.save({"train": RunsCode(marker)}, split)
    with pytest.raises(DatasetError, match=r"split_dict.pt: refusing to load it: .*could run code; re-download"):
        load_dataset("ogbn-papers100M", data_root=tmp_path, cache=False)
    assert not marker.exists()
