"""No code runs from data (scalegnn/datasets/safe_pickle.py): a crafted Planetoid ``ind.*``
pickle, a crafted LINKX ``.npy`` and a crafted ogb ``processed/data_processed`` ran code
when loaded (``pickle.load``, ``np.load(allow_pickle=True)``,
``torch.load(weights_only=False)``); now each is refused in one line naming the file and
the fix, while ogb's own files still load through the restricted reader.

Every test runs with its own cache folder and with ``SCALEGNN_OFFLINE=1`` (conftest.py).

==============================================  =====================================================
input                                           message (one line; exit 2 for the CLI)
==============================================  =====================================================
crafted ``ind.cora.graph`` (os.system)          <file>: refusing to load it: it holds a pickled
                                                reference to posix.system, which a Planetoid ind.* file
                                                never contains, and unpickling it could run code;
                                                replace it with the original from <source>
crafted LINKX split ``.npy``                    same, "a LINKX split file", replace it with <source>
crafted ogb ``processed/data_processed``        same, "delete the processed folder next to it (ogb
                                                rebuilds it from raw/)"
==============================================  =====================================================
"""

from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from scalegnn.datasets import DatasetError, load_dataset
from tests.files import REPO, RunsCode
from tests.runs import one_line_error


SHARED = REPO.parent / "shared" / "data"


if not SHARED.is_dir():  # a worktree next to the main checkout
    SHARED = Path("/work/shared/data")


needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason=f"shared data folder {SHARED} is absent")


SYSTEM = f"{os.system.__module__}.system"  # how a pickle names os.system (posix.system on Linux)


# ----------------------------------------------------------------------------- no code runs from data
def load_through_cli(capsys, tmp_path, command: str, dataset: str, root: Path) -> str:
    """``scalegnn data info`` or ``scalegnn train`` on ``dataset``: one error line, no record."""
    out = tmp_path / "runs"
    argv = ["data", "info", dataset, "--data-root", str(root)] if command == "data info" else \
        ["train", "--dataset", dataset, "--data-root", str(root), "--epochs", "1", "--out", str(out), "--quiet"]
    err = one_line_error(capsys, argv)
    assert not out.exists()  # no record for a bad file
    return err


@needs_shared
@pytest.mark.parametrize("command", ["data info", "train"])
@pytest.mark.parametrize("part", ["graph", "allx", "ty"])
def test_a_crafted_planetoid_pickle_runs_no_code(tmp_path, capsys, monkeypatch, part, command):
    monkeypatch.setenv("SCALEGNN_CACHE_DIR", str(tmp_path / "cache"))
    root = tmp_path / "root"
    shutil.copytree(SHARED / "planetoid_cora", root / "planetoid_cora")
    marker = tmp_path / "pwned"
    bad = root / "planetoid_cora" / f"ind.cora.{part}"
    bad.write_bytes(pickle.dumps(RunsCode(marker), protocol=2))
    err = load_through_cli(capsys, tmp_path, command, "cora", root)
    assert not marker.exists(), "the crafted pickle ran code"
    assert str(bad) in err and SYSTEM in err and "could run code" in err, err
    assert "kimiyoung/planetoid" in err, err  # the fix: the original files


@needs_shared
@pytest.mark.parametrize("command", ["data info", "train"])
def test_a_crafted_linkx_split_file_runs_no_code(tmp_path, capsys, monkeypatch, command):
    monkeypatch.setenv("SCALEGNN_CACHE_DIR", str(tmp_path / "cache"))
    root = tmp_path / "root"
    shutil.copytree(SHARED / "twitch_musae" / "DE", root / "twitch_musae" / "DE")
    marker = tmp_path / "pwned"
    bad = root / "twitch_musae" / "linkx_splits" / "twitch-e-DE-splits.npy"
    bad.parent.mkdir(parents=True)
    np.save(bad, np.array([{"train": RunsCode(marker)}], dtype=object), allow_pickle=True)
    err = load_through_cli(capsys, tmp_path, command, "twitch-de", root)
    assert not marker.exists(), "the crafted .npy ran code"
    assert str(bad) in err and SYSTEM in err and "could run code" in err, err
    assert "Non-Homophily-Large-Scale" in err, err  # the fix: LINKX's original file


@pytest.mark.parametrize("command", ["data info", "train"])
def test_a_crafted_ogb_processed_file_runs_no_code(tmp_path, capsys, monkeypatch, command):
    pytest.importorskip("ogb")
    from tests.files import fake_ogbn_arxiv

    monkeypatch.setenv("SCALEGNN_CACHE_DIR", str(tmp_path / "cache"))
    fake_ogbn_arxiv(tmp_path)
    processed = tmp_path / "ogbn_arxiv" / "processed" / "data_processed"
    marker = tmp_path / "pwned"
    processed.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"graph": RunsCode(marker), "labels": None}, processed, pickle_protocol=4)  # as ogb saves it
    err = load_through_cli(capsys, tmp_path, command, "ogbn-arxiv", tmp_path)
    assert not marker.exists(), "the crafted ogb file ran code"
    assert str(processed) in err and SYSTEM in err and "could run code" in err, err
    assert "delete the processed folder" in err  # the fix: ogb rebuilds it from raw/


def test_ogb_files_still_load_through_the_restricted_reader(tmp_path):
    """ogb's own files pass: the binary layout's processed pickle (protocol 4, numpy
    int scalars for num_nodes) and a split_dict.pt of tensors (torch's weights-only
    loader); a crafted split_dict.pt is refused like the processed file."""
    pytest.importorskip("ogb")
    from tests.files import assert_same_graph, fake_ogbn_papers

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
