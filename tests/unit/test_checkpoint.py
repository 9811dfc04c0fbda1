"""Checkpoint files (scalegnn/checkpoint.py): the ``--checkpoint-every`` setting, atomic
per-rank files, weights_only loading, pruning, what is refused with its path, and a
configuration saved by an older schema. Runs that checkpoint and resume are in
tests/integration/test_resume.py."""

from __future__ import annotations

import json
import os

import pytest
import torch

from scalegnn import checkpoint as ck
from scalegnn.checkpoint import CheckpointConfig, CheckpointError
from scalegnn.config import RunConfig, make_config
from tests.files import schema_2_config
from tests.runs import SMALL

# What the trainer saves beside the step (scalegnn.trainer), the fields read_meta checks.
# (Mid-epoch 0 of 100 steps: read_meta checks that the epochs done fit the step, and the epoch's sums.)
META = {"record": {"run_id": "r", "epochs": []}, "epoch": 0, "steps_per_epoch": 100, "config": {},
        "loop": {"train_time": 0.0, "loss_sum": 0.0, "loss_n": 0, "correct": 0.0, "count": 0, "components": {},
                 "comm_bytes": 0}}


# ----------------------------------------------------------------------------- config
def test_checkpoint_every_accepts_steps_and_durations():
    assert ck.parse_every("500") == (500, None)
    assert ck.parse_every("20 steps") == (20, None)
    assert ck.parse_every("30m") == (None, 1800.0)
    assert ck.parse_every("90s") == (None, 90.0)
    assert ck.parse_every("1.5h") == (None, 5400.0)
    for bad in ("0", "2.5", "ten", "5x", "-3", ""):
        with pytest.raises(ValueError, match="--checkpoint-every"):
            ck.parse_every(bad)
    with pytest.raises(ValueError, match="--checkpoint-every needs --checkpoint-dir"):
        CheckpointConfig(every="10")
    with pytest.raises(ValueError, match="--resume needs --checkpoint-dir"):
        CheckpointConfig(resume=True)
    with pytest.raises(ValueError, match="--keep-checkpoints"):
        CheckpointConfig(dir="x", keep=0)
    # serialized whole into the run record and back
    cfg = RunConfig(checkpoint=CheckpointConfig(dir="d", every="30m", resume=True))
    assert RunConfig(**json.loads(json.dumps(cfg.to_dict()))).checkpoint == cfg.checkpoint


# ----------------------------------------------------------------------------- files
def test_atomic_save_layout_weights_only_and_pruning(tmp_path):
    saver = ck.Checkpointer(CheckpointConfig(dir=str(tmp_path), every="1", keep=2))
    state = {"w": torch.arange(4.0), "opt": {"step": torch.tensor(3.0), "lr": [1e-3], "betas": (0.9, 0.99)}}
    for step in (1, 2, 3):
        saver.save(step, state, META)
    assert [p.name for p in sorted(tmp_path.iterdir())] == ["step-000000002", "step-000000003"]  # keep=2
    latest = ck.latest(tmp_path)
    assert latest.name == "step-000000003"
    assert sorted(p.name for p in latest.iterdir()) == ["meta.json", "rank-00000.pt"]  # no temp files
    loaded = ck.load_rank_state(latest, 0)  # weights_only=True inside
    assert torch.equal(loaded["engine"]["w"], state["w"]) and loaded["engine"]["opt"]["betas"] == (0.9, 0.99)
    assert set(loaded["rng"]) >= {"torch", "numpy", "python"}
    assert ck.read_meta(latest)["step"] == 3 and ck.resume_run_id(tmp_path) == "r"
    # an interrupted save (rank file, no meta.json) is skipped, then removed by the next save
    (tmp_path / "step-000000004").mkdir()
    torch.save({}, tmp_path / "step-000000004" / "rank-00000.pt")
    assert ck.latest(tmp_path).name == "step-000000003"
    saver.save(5, state, META)
    assert [p.name for p in sorted(tmp_path.iterdir())] == ["step-000000003", "step-000000005"]
    assert ck.latest(tmp_path / "missing") is None


def test_interrupted_write_leaves_the_previous_file(tmp_path, monkeypatch):
    target = tmp_path / "rank-00000.pt"
    ck.atomic_torch_save({"v": torch.ones(2)}, target)

    def die(obj, f, *a, **k):
        f.write(b"partial")
        raise KeyboardInterrupt("killed mid-write")

    monkeypatch.setattr(torch, "save", die)
    with pytest.raises(KeyboardInterrupt):
        ck.atomic_torch_save({"v": torch.zeros(2)}, target)
    assert [p.name for p in tmp_path.iterdir()] == ["rank-00000.pt"]
    monkeypatch.undo()
    assert torch.equal(torch.load(target, weights_only=True)["v"], torch.ones(2))


def test_corrupt_foreign_and_newer_checkpoints_are_refused_with_their_path(tmp_path):
    saver = ck.Checkpointer(CheckpointConfig(dir=str(tmp_path), every="1"))
    path = saver.save(1, {"w": torch.ones(1)}, META)
    rank_file = path / "rank-00000.pt"
    rank_file.write_bytes(rank_file.read_bytes()[:40])  # truncated
    with pytest.raises(CheckpointError, match=r"rank-00000.pt: cannot be read .*truncated, corrupt"):
        ck.load_rank_state(path, 0)

    class Evil:  # a pickle that would run code: weights_only refuses it
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    torch.save({"format": 1, "rank": 0, "engine": Evil()}, rank_file)
    with pytest.raises(CheckpointError, match="not written by scalegnn"):
        ck.load_rank_state(path, 0)
    meta = json.loads((path / "meta.json").read_text())
    (path / "meta.json").write_text(json.dumps({**meta, "format": ck.CHECKPOINT_FORMAT + 1}))
    with pytest.raises(CheckpointError, match="newer than this scalegnn"):
        ck.read_meta(path)
    (path / "meta.json").write_text('{"format": 1, "st')
    with pytest.raises(CheckpointError, match="meta.json: not valid JSON"):
        ck.read_meta(path)


def test_a_schema_2_checkpoint_config_is_read_in_the_numerics_layout():
    """A checkpoint saved before schema 3 holds comm_dtype, gemm_dtype and permute in
    perf: read through records.upgrade, the same settings match, and another value of
    one of them is still refused, by its new name."""
    now = make_config(dataset=SMALL, permute="single", comm_dtype="bf16", prefetch=True).to_dict()
    saved = schema_2_config(now)
    assert ck.config_mismatch(saved, now) == []
    assert ck.config_mismatch(saved, make_config(dataset=SMALL, permute="single", comm_dtype="bf16").to_dict()) \
        == []  # prefetch may change on resume (RESUMABLE_DIFFERENCES)
    assert ck.config_mismatch(saved, make_config(dataset=SMALL, comm_dtype="bf16", prefetch=True).to_dict()) == \
        ["numerics.permute: checkpoint 'single', now 'none'"]
    assert ck.config_mismatch(now, now) == []  # a checkpoint of this schema, as it is
