"""Hostile and careless files (issue K): no code runs from data, bad data is refused
before any work with one line naming the file, the problem and the fix, and no
record, shard or checkpoint is left half-written.

Each case below failed before its fix (see the commit that added it):

- a crafted Planetoid ``ind.*`` pickle, a crafted LINKX ``.npy`` and a crafted ogb
  ``processed/data_processed`` ran code when loaded (``pickle.load``,
  ``np.load(allow_pickle=True)``, ``torch.load(weights_only=False)``);
- an empty graph npz crashed ("zero-size array to reduction operation maximum");
  fractional or NaN vertex ids (edges, CSR, splits) were truncated and training
  reported ``ok``;
- a checkpoint file of random bytes gave torch's six-line message suggesting
  ``weights_only=False``; a corrupt newest ``meta.json`` made ``--resume`` fall back to
  an older checkpoint without a word.

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
npz with 0 vertices                             <npz>: 'x' has 0 rows: the graph has no vertices; save
                                                x as an (N, F) array with N >= 1 rows, one per vertex
npz with ids 0.5 / NaN (edge_index, indices,    <npz>: 'edge_index' holds non-integer vertex ids
train_idx ...)                                  (first: 0.5); save it as an int64 array of the
                                                intended ids
checkpoint rank file of random bytes / empty /  <file>: cannot be read (UnpicklingError: Unsupported
a pickle that runs code                         operand 64); it is truncated, corrupt or not written by
                                                scalegnn. Remove this checkpoint folder to resume from
                                                an older one
corrupt newest ``meta.json``                    UserWarning: <meta.json>: not valid JSON (...); this
                                                checkpoint is ignored; resuming from the older <folder>
                                                (remove <folder> to silence this warning)
==============================================  =====================================================
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
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


# ----------------------------------------------------------------------------- bad data, refused before any work
def _byo(path: Path, n: int = 40, **over) -> Path:
    rng = np.random.default_rng(0)
    arrays = dict(x=rng.standard_normal((n, 8)).astype(np.float32), y=rng.integers(0, 3, n),
                  edge_index=rng.integers(0, max(n, 1), (2, 4 * n)), train_idx=np.arange(n // 2),
                  val_idx=np.arange(n // 2, 3 * n // 4), test_idx=np.arange(3 * n // 4, n))
    arrays.update(over)
    np.savez(path, **{k: v for k, v in arrays.items() if v is not None})
    return path


BAD_NPZ = {
    "empty graph": (dict(n=0), "'x' has 0 rows: the graph has no vertices"),
    "fractional edge ids": (dict(edge_index=np.array([[0.5, 1.0], [2.0, 3.0]])),
                            "'edge_index' holds non-integer vertex ids (first: 0.5)"),
    "NaN edge id": (dict(edge_index=np.array([[np.nan, 1.0], [2.0, 3.0]])),
                    "'edge_index' holds non-integer vertex ids (first: nan)"),
    "fractional CSR ids": (dict(edge_index=None, indptr=np.array([0] + [1] * 40), indices=np.array([2.5])),
                           "'indices' holds non-integer vertex ids (first: 2.5)"),
    "fractional split ids": (dict(train_idx=np.array([0.0, 1.25, 2.0])),
                             "'train_idx' holds non-integer vertex ids (first: 1.25)"),
}


@pytest.mark.parametrize("case", list(BAD_NPZ))
@pytest.mark.parametrize("command", ["train", "data shard"])
def test_bad_graph_npz_is_one_line_before_any_work(tmp_path, capsys, monkeypatch, case, command):
    """The empty npz crashed ('zero-size array to reduction operation maximum');
    fractional ids were truncated and the run reported ok."""
    monkeypatch.setenv("SCALEGNN_CACHE_DIR", str(tmp_path / "cache"))
    over, message = BAD_NPZ[case]
    npz = _byo(tmp_path / "g.npz", **over)
    out = tmp_path / "out"
    if command == "train":
        argv = ["train", "--dataset", f"npz:{npz}", "--epochs", "1", "--out", str(out), "--quiet"]
    else:
        argv = ["data", "shard", f"npz:{npz}", "--grid", "1x2x1x1", "--out", str(out)]
    err = one_line_error(capsys, argv)
    assert message in err and str(npz) in err, err
    assert "save" in err  # the fix: how to write the array
    assert not out.exists() or not any(out.iterdir())  # no record, no shard


def test_integral_float_ids_are_still_accepted(tmp_path, monkeypatch):
    """Arrays saved from float tensors (0.0, 1.0, ...) hold valid ids: not an error."""
    monkeypatch.setenv("SCALEGNN_CACHE_DIR", str(tmp_path / "cache"))
    a = _byo(tmp_path / "a.npz")
    with np.load(a) as z:
        arrays = dict(z)
    np.savez(tmp_path / "b.npz", **{**arrays, "edge_index": arrays["edge_index"].astype(np.float64),
                                    "train_idx": arrays["train_idx"].astype(np.float32)})
    ints, floats = load_dataset(f"npz:{a}"), load_dataset(f"npz:{tmp_path / 'b.npz'}")
    assert torch.equal(ints.indptr, floats.indptr) and torch.equal(ints.indices, floats.indices)
    assert torch.equal(ints.train_idx, floats.train_idx)


# ----------------------------------------------------------------------------- bad checkpoints
SMALL = "csbm:n=600,avg_degree=8,classes=4,feature_dim=16"


def _train_argv(tmp_path, *extra):
    return ["train", "--dataset", SMALL, "--data-root", str(tmp_path / "data"), "--out", str(tmp_path / "runs"),
            "--quiet", "--layers", "2", "--hidden", "16", "--epochs", "1", "--checkpoint-every", "4",
            "--checkpoint-dir", str(tmp_path / "ck"), "--resume", *extra]


def _records(tmp_path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in (tmp_path / "runs").glob("*.json")}


@pytest.mark.parametrize("content", [b"random", b"", b"pickle"])
def test_an_unreadable_checkpoint_file_is_one_line_naming_it_and_the_fix(tmp_path, capsys, content):
    """Random bytes gave torch's six-line message that suggests weights_only=False."""
    from scalegnn import checkpoint as ck

    assert main(_train_argv(tmp_path)) == 0
    capsys.readouterr()
    before = _records(tmp_path)
    rank_file = ck.latest(tmp_path / "ck") / "rank-00000.pt"
    data = {b"random": np.random.default_rng(0).bytes(4096), b"": b"",
            b"pickle": pickle.dumps(RunsCode(tmp_path / "pwned"), protocol=2)}[content]
    rank_file.write_bytes(data)
    err = one_line_error(capsys, _train_argv(tmp_path))
    assert str(rank_file) in err and "cannot be read" in err, err
    assert "Remove this checkpoint folder" in err and "weights_only" not in err, err
    assert _records(tmp_path) == before  # the finished run's record is untouched
    assert not (tmp_path / "pwned").exists()


def test_a_corrupt_newest_meta_json_warns_by_name_and_falls_back(tmp_path, capsys):
    """A corrupt newest meta.json made --resume fall back to an older checkpoint silently."""
    from scalegnn import checkpoint as ck

    assert main(_train_argv(tmp_path)) == 0  # 10 steps: the checkpoints of steps 4 and 8 are kept
    capsys.readouterr()
    (older, _, _), (newest, path, _) = ck.list_checkpoints(tmp_path / "ck")
    meta = path / "meta.json"
    meta.write_text('{"format": 1, "st')
    with pytest.warns(UserWarning, match=rf"{meta}: .*not valid JSON.*ignored; resuming from the older"):
        assert ck.latest(tmp_path / "ck").name == f"step-{older:09d}"
    cli = subprocess.run([sys.executable, "-m", "scalegnn", *_train_argv(tmp_path)], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=str(REPO), timeout=120)
    assert cli.returncode == 0 and f"UserWarning: {meta}: not valid JSON" in cli.stderr, cli.stderr
    (rec,) = [json.loads(text) for text in _records(tmp_path).values()]
    assert rec["status"] == "ok" and rec["resumed"][-1]["step"] == older
