"""Checkpoints verified whole (scalegnn/checkpoint.py, issue X item 2): meta.json lists
every rank file with its size, SHA-256 and step, and a resume or an export reads only
the bytes that were saved; what meta.json says is bounded before it sizes anything.

Before: a rank file edited in place (the same size) or copied from another step was
loaded and resumed without a word; one without its ``rng`` entry was a KeyError
traceback at ``set_rng_state``; ``"world_size": 1000000000`` in meta.json made
``--resume`` build a list of 10**9 file names (the process grew to 7 GB, then was
killed); a full disk at the folder's ``.lock`` was an OSError traceback. Now each is
one line naming the file and the fix (the world size: a warning, and the older
checkpoint resumed, as for any rank file missing)."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import resource
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from scalegnn import checkpoint as ck
from scalegnn.checkpoint import CheckpointConfig, CheckpointError
from scalegnn.cli import main
from tests.files import REPO
from tests.runs import TINY, one_line_error

# What the trainer saves beside the step (scalegnn.trainer), mid-epoch 0 of 100 steps.
META = {"record": {"run_id": "r", "epochs": []}, "epoch": 0, "steps_per_epoch": 100, "config": {},
        "loop": {"train_time": 0.0, "loss_sum": 0.0, "loss_n": 0, "correct": 0.0, "count": 0, "components": {},
                 "comm_bytes": 0}}
MARK = 7.25  # a value to find in a rank file's bytes


@contextmanager
def within(seconds: int):
    """Fail (instead of hanging, or growing for minutes) past ``seconds``."""
    def stop(signum, frame):
        raise TimeoutError(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, stop)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _saved(tmp_path, steps=(1,), keep=2) -> list[Path]:
    saver = ck.Checkpointer(CheckpointConfig(dir=str(tmp_path / "ck"), every="1", keep=keep))
    return [saver.save(step, {"w": torch.full((16,), MARK), "step": torch.tensor(float(step))}, META)
            for step in steps]


def _meta(ckpt: Path) -> dict:
    return json.loads((ckpt / "meta.json").read_text())


def _edit_meta(ckpt: Path, **changes) -> None:
    meta = {**_meta(ckpt), **changes}
    (ckpt / "meta.json").write_text(json.dumps({k: v for k, v in meta.items() if v is not None}))


# ----------------------------------------------------------------------------- the list of rank files
def test_meta_json_lists_every_rank_file_with_its_size_sha256_and_step(tmp_path):
    (ckpt,) = _saved(tmp_path, steps=(3,))
    data = (ckpt / "rank-00000.pt").read_bytes()
    assert _meta(ckpt)["files"] == {"rank-00000.pt": {"sha256": hashlib.sha256(data).hexdigest(),
                                                      "bytes": len(data), "step": 3}}
    assert ck.load_rank_state(ckpt, 0)["step"] == 3  # verified against the list, then loaded


def test_a_rank_file_edited_in_place_is_refused_naming_it_and_the_fix(tmp_path):
    """A tensor's bytes changed, the size kept: torch loads it; its SHA-256 is not the listed one."""
    (ckpt,) = _saved(tmp_path)
    rank_file = ckpt / "rank-00000.pt"
    data = rank_file.read_bytes()
    mark = torch.tensor([MARK]).numpy().tobytes()
    assert mark in data
    rank_file.write_bytes(data.replace(mark, torch.tensor([MARK + 1]).numpy().tobytes(), 1))
    assert torch.load(rank_file, weights_only=True)["engine"]["w"][0] == MARK + 1  # a loadable file
    with pytest.raises(CheckpointError) as err:
        ck.load_rank_state(ckpt, 0)
    text = str(err.value)
    assert text.startswith(f"{rank_file}: cannot be read (its SHA-256 is not the one meta.json lists)"), text
    assert "Remove this checkpoint folder to resume from an older one" in text and "\n" not in text


def test_a_truncated_rank_file_is_refused_by_read_meta_before_any_is_loaded(tmp_path):
    (ckpt,) = _saved(tmp_path)
    rank_file = ckpt / "rank-00000.pt"
    size = rank_file.stat().st_size
    rank_file.write_bytes(rank_file.read_bytes()[:-10])
    with pytest.raises(CheckpointError, match=rf"rank-00000.pt: cannot be read \({size - 10} bytes where meta.json "
                                              rf"lists {size}\); .*Remove this checkpoint folder"):
        ck.read_meta(ckpt)


@pytest.mark.parametrize("listed", [True, False], ids=["listed", "before-the-list"])
def test_a_rank_file_of_another_step_is_refused_in_one_line(tmp_path, listed):
    """Copied from the step before: its bytes are not the listed ones, and (in a checkpoint
    written before the list) the step it holds is not meta.json's."""
    first, second = _saved(tmp_path, steps=(1, 2))
    (second / "rank-00000.pt").write_bytes((first / "rank-00000.pt").read_bytes())
    if not listed:
        _edit_meta(second, files=None)
    with pytest.raises(CheckpointError) as err:
        ck.load_rank_state(second, 0)
    text = str(err.value)
    want = "its SHA-256 is not the one meta.json lists" if listed else \
        "holds step 1, not the step 2 of its meta.json (a rank file of another checkpoint)"
    assert text.startswith(f"{second / 'rank-00000.pt'}: ") and want in text, text
    assert "Remove this checkpoint folder" in text and "\n" not in text


def test_a_checkpoint_written_before_the_list_is_still_read(tmp_path):
    (ckpt,) = _saved(tmp_path, steps=(4,))
    _edit_meta(ckpt, files=None)
    assert "files" not in ck.read_meta(ckpt) and ck.latest(tmp_path / "ck") == ckpt
    assert torch.equal(ck.load_rank_state(ckpt, 0)["engine"]["w"], torch.full((16,), MARK))


def _drop(*path):
    def change(state):
        parent = state
        for key in path[:-1]:
            parent = parent[key]
        del parent[path[-1]]
    return change


def _set(value, *path):
    def change(state):
        parent = state
        for key in path[:-1]:
            parent = parent[key]
        parent[path[-1]] = value
    return change


@pytest.mark.parametrize("change, says", [
    (_drop("rng"), "no 'rng' with its parts"),
    (_drop("rng", "numpy"), "no 'rng' with its parts"),
    (_set([1, 2], "rng", "torch"), "no 'rng' with its parts"),
    (_set(torch.zeros(3, dtype=torch.uint8), "rng", "torch"), "'rng' torch state is not a generator state"),
    (_set(9999, "rng", "numpy", "pos"), "'rng' numpy state"),
    (_set([1, 2], "rng", "python", "internal"), "'rng' python state"),
    (_set("x", "engine"), "no 'engine' state"),
    (_drop("step"), "holds step None, not the step 1"),
    (_set(3, "world_size"), "its world_size 3 is not the 1 of its meta.json"),
], ids=["no-rng", "no-rng-numpy", "rng-torch-a-list", "rng-torch-short", "numpy-pos", "python-internal",
        "engine-a-string", "no-step", "world-size"])
def test_a_rank_file_without_what_a_resume_reads_is_one_line(tmp_path, change, says):
    """Rewritten by hand, with the list updated to match (or written before it): what
    set_rng_state and the engine read is checked by type, not met as a KeyError."""
    (ckpt,) = _saved(tmp_path)
    rank_file = ckpt / "rank-00000.pt"
    state = torch.load(rank_file, weights_only=True)
    change(state)
    torch.save(state, rank_file)
    data = rank_file.read_bytes()
    _edit_meta(ckpt, files={"rank-00000.pt": {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data),
                                              "step": 1}})
    with pytest.raises(CheckpointError) as err:
        ck.load_rank_state(ckpt, 0)
    text = str(err.value)
    assert text.startswith(f"{rank_file}: ") and says in text and "Remove this checkpoint folder" in text, text


# ----------------------------------------------------------------------------- meta.json bounded
def test_a_world_size_beyond_the_rank_files_is_one_line_at_once(tmp_path):
    """world_size 10**9: latest() built a list of 10**9 rank-file names (minutes, 7 GB).
    More ranks than any job has is a damaged meta.json (refused by read_meta, naming the
    field); fewer, but more than the rank files present, are rank files missing: the
    checkpoint is skipped with a warning, as before."""
    first, second = _saved(tmp_path, steps=(1, 2))
    meta = second / "meta.json"
    _edit_meta(second, world_size=10 ** 9)
    with within(10):
        assert ck.latest(tmp_path / "ck") == second
        with pytest.raises(CheckpointError, match=rf"{meta}: 'world_size' must be an integer from 1 to 1048576, "
                                                  "got 1000000000; .* to resume from an older checkpoint"):
            ck.read_meta(second)
    _edit_meta(second, world_size=2 ** 20)
    with within(10):
        with pytest.warns(UserWarning, match=rf"{meta}: 'world_size' is 1048576 but the folder holds 1 rank files "
                                             r"\(rank-00001.pt, rank-00002.pt, rank-00003.pt ... missing\); this "
                                             "checkpoint is ignored; resuming from the older"):
            assert ck.latest(tmp_path / "ck") == first
        with pytest.raises(CheckpointError, match=rf"{meta}: 'world_size' is 1048576 but .* holds 1 rank files"):
            ck.read_meta(second)


@pytest.mark.parametrize("changes, says", [
    ({"step": 10 ** 15}, "'epoch' 0 does not fit 'step' 1000000000000000 at 100 'steps_per_epoch'"),
    ({"step": 2 ** 60, "epoch": 2 ** 60 // 100}, "'step' must be an integer from 0 to 9007199254740992"),
    ({"steps_per_epoch": 10 ** 30}, "'steps_per_epoch' must be an integer from 1 to"),
    ({"epoch": 5}, "'epoch' 5 does not fit 'step' 1"),
    ({"loop": {"step": 1}}, "'loop' needs a numeric train_time"),
    ({"loop": {"train_time": 0.0, "step": 10 ** 12}}, "'loop' needs a numeric train_time (and its step, if any, 1)"),
    ({"loop": {"train_time": 0.0}}, "'loop' of a checkpoint mid-epoch needs the epoch's sums"),
    ({"files": []}, "'files' must list the 1 rank files"),
    ({"files": {"rank-00000.pt": {"sha256": "x", "bytes": 1, "step": 1}}}, "'files' has no valid entry for rank-00000"),
], ids=["step-huge", "step-past-json", "spe-huge", "epoch", "loop-no-time", "loop-step", "loop-no-sums",
        "files-a-list", "files-bad-digest"])
def test_meta_json_fields_are_bounded_and_agree(tmp_path, changes, says):
    (ckpt,) = _saved(tmp_path)
    _edit_meta(ckpt, **changes)
    with pytest.raises(CheckpointError) as err:
        ck.read_meta(ckpt)
    text = str(err.value)
    assert text.startswith(f"{ckpt / 'meta.json'}: ") and says in text and "\n" not in text, text


# ----------------------------------------------------------------------------- real runs: resume and export
@pytest.fixture
def trained(tmp_path):
    """A finished tiny run that checkpointed at steps 8 and 10 (10 steps an epoch)."""
    argv = ["train", "--dataset", TINY, "--data-root", str(tmp_path / "data"), "--epochs", "1", "--hidden", "8",
            "--layers", "2", "--quiet", "--out", str(tmp_path / "runs"), "--checkpoint-dir", str(tmp_path / "ck"),
            "--checkpoint-every", "2"]
    assert main(argv) == 0
    return argv, [path for _, path, _ in ck.list_checkpoints(tmp_path / "ck")]


def _no_more_than(gib: int):
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (gib << 30, gib << 30))
    return limit


def test_resume_with_a_world_size_of_a_billion_is_one_line_at_once(tmp_path, trained):
    """The hang: --resume with meta.json's world_size 10**9 grew for minutes (killed at 7 GB)."""
    argv, (_, newest) = trained
    _edit_meta(newest, world_size=10 ** 9)
    t0 = time.monotonic()
    cli = subprocess.run([sys.executable, "-m", "scalegnn", *argv, "--resume"], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}, cwd=str(REPO),
                         timeout=120, preexec_fn=_no_more_than(4))
    assert cli.returncode == 2 and time.monotonic() - t0 < 60, cli.stderr[-2000:]
    assert cli.stderr.count("\n") == 1 and cli.stderr.startswith(
        f"scalegnn: error: {newest / 'meta.json'}: 'world_size' must be an integer from 1 to 1048576, got "
        "1000000000;"), cli.stderr[-2000:]


def test_export_of_a_damaged_checkpoint_is_one_line(tmp_path, trained, capsys):
    _, (_, newest) = trained
    out = ["export", str(newest), "--out", str(tmp_path / "m.pt")]
    meta = _meta(newest)
    rank_file = newest / "rank-00000.pt"
    good = rank_file.read_bytes()
    # an edited parameter: the first weight of w_in one bit off, the file's size kept
    w_in = torch.load(rank_file, weights_only=True)["engine"]["model"]["w_in"]
    first = w_in.reshape(-1)[:4].numpy().tobytes()
    assert good.count(first) == 1
    rank_file.write_bytes(good.replace(first, bytes([first[0] ^ 1]) + first[1:]))
    err = one_line_error(capsys, out)
    assert f"{rank_file}: cannot be read (its SHA-256 is not the one meta.json lists)" in err, err
    rank_file.write_bytes(good)
    for changes, says in (({"world_size": 10 ** 9}, "'world_size' must be an integer from 1 to 1048576"),
                          ({"config": {**meta["config"], "parallel": {**meta["config"]["parallel"],
                                                                       "grid": [1, 1, 1, 10 ** 12]}}},
                           "its config's grid (1, 1, 1, 1000000000000) does not have its 'world_size' 1 ranks"),
                          ({"record": {**meta["record"], "graph": {**meta["record"]["graph"],
                                                                    "num_features": 10 ** 12}}},
                           "are larger than its rank files hold")):
        _edit_meta(newest, **changes)
        with within(20):
            err = one_line_error(capsys, out)
        assert f"{newest / 'meta.json'}: " in err and says in err, err
        _edit_meta(newest, **meta)
    assert main(out) == 0


def test_resume_from_a_rank_file_without_rng_is_one_line(tmp_path, trained, capsys):
    """Without its 'rng' entry (a checkpoint written before the list): a KeyError traceback at set_rng_state."""
    argv, (_, newest) = trained
    rank_file = newest / "rank-00000.pt"
    state = torch.load(rank_file, weights_only=True)
    del state["rng"]
    torch.save(state, rank_file)
    _edit_meta(newest, files=None)
    err = one_line_error(capsys, [*argv, "--resume"])
    assert f"{rank_file}: no 'rng' with its parts" in err and "Remove this checkpoint folder" in err, err


# ----------------------------------------------------------------------------- the folder's lock
@pytest.mark.parametrize("call", ["open", "write"])
def test_a_full_disk_at_the_folder_lock_is_one_line(tmp_path, monkeypatch, call):
    real = getattr(os, call)

    def full(*args, **kwargs):
        if call == "write" or str(args[0]).endswith(".lock"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(*args, **kwargs)

    monkeypatch.setattr(os, call, full)
    with pytest.raises(CheckpointError) as err:
        ck.FolderLock(tmp_path / "ck").acquire("r")
    monkeypatch.undo()
    text = str(err.value)
    assert text == (f"{tmp_path / 'ck' / '.lock'}: cannot be written (No space left on device); free space in (or "
                    f"make writable) {tmp_path / 'ck'}, or give this run another --checkpoint-dir"), text
    ck.FolderLock(tmp_path / "ck").acquire("r").release()  # nothing was left held
