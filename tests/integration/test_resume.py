"""Runs that checkpoint and resume (scalegnn/checkpoint.py, scalegnn/trainer.py): the
property that matters is that a run interrupted at a random step and resumed produces
exactly (float ==) the loss sequence of an uninterrupted run, serial and 4D parallel
(CPU, deterministic: the sample is a function of (seed, step), dropout of (seed, step,
layer), and everything else is in the checkpoint). A finished run continues to more
epochs exactly; a preemption request saves at the next step; a resume is a run of its
own (a new run id, a record naming its parent, its own model file) and leaves its
parent's record and model file byte for byte as they were; a resume with other
settings is refused by name.

A resume used to rewrite its parent: the same run id, so ``<id>.json`` and
``<id>.model.pt`` were replaced, the 4-epoch record was lost, and the first run's
``result.model`` loaded the 6-epoch model.

Bad checkpoints: a checkpoint file of random bytes (or a crafted pickle) gave torch's
six-line message suggesting ``weights_only=False`` (an empty one already gave one line);
now ``<file>: cannot be read (UnpicklingError: ...); it is truncated, corrupt or not
written by scalegnn. Remove this checkpoint folder to resume from an older one``. A
corrupt newest ``meta.json`` made ``--resume`` fall back to an older checkpoint without a
word; now ``scalegnn: warning: <meta.json>: not valid JSON (...); this checkpoint is ignored;
resuming from the older <folder> (remove <folder> to silence this warning)``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import random
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from scalegnn import checkpoint as ck
from scalegnn.checkpoint import CheckpointConfig, CheckpointError
from scalegnn.cli import main
from scalegnn.config import RunConfig, make_config
from scalegnn.launch import launch
from scalegnn.model import ModelConfig
from scalegnn.optim import OptimConfig
from scalegnn.parallel.engine import ParallelEngine
from scalegnn.perf import PerfConfig
from scalegnn.records import SCHEMA_VERSION
from tests.files import REPO, RunsCode, schema_2_config
from tests.runs import SMALL, epoch_rows, one_line_error


def config(tmp_path, **over):
    fields = dict(dataset=SMALL, batch_ratio=0.2, epochs=4, out_dir=str(tmp_path / "runs"), progress=False,
                  data_root=str(tmp_path / "data"), model=ModelConfig(hidden=16, layers=2, dropout=0.3),
                  optim=OptimConfig(lr=1e-2, schedule="cosine", grad_clip=1.0, weight_decay=1e-4))
    fields.update(over)
    return make_config(**fields)


class StepLog:
    """Wraps ParallelEngine.train_step: records (step, loss) and can crash at one step."""

    def __init__(self, monkeypatch, crash_at=None):
        self.losses, self.crash_at = [], crash_at
        real = ParallelEngine.train_step

        def step(engine, s):
            if s == self.crash_at:
                raise RuntimeError(f"simulated crash at step {s}")
            res = real(engine, s)
            self.losses.append((s, res.loss))
            self.engine = engine
            return res

        monkeypatch.setattr(ParallelEngine, "train_step", step)


# ----------------------------------------------------------------------------- serial resume
@pytest.mark.parametrize("where", ["random", "epoch boundary"])
def test_resumed_serial_run_equals_the_uninterrupted_one(tmp_path, monkeypatch, where):
    """Interrupt at a random step (seeded, printed on failure) and resume: the per-step
    loss sequence, the per-epoch rows and the final weights are exactly equal."""
    log = StepLog(monkeypatch)
    ref = launch(config(tmp_path))
    ref_losses, ref_weights = list(log.losses), {k: v.clone() for k, v in log.engine.model.state_dict().items()}
    spe, total = ref["steps_per_epoch"], ref["steps_per_epoch"] * 4
    seed = random.randrange(1 << 30)
    crash = random.Random(seed).randrange(2, total) if where == "random" else 2 * spe + 1
    log.losses, log.crash_at = [], crash
    ckpt = CheckpointConfig(dir=str(tmp_path / "ck"), every="2", resume=True)
    first = launch(config(tmp_path, checkpoint=ckpt))
    assert first["status"] == "failed" and f"simulated crash at step {crash}" in first["error"]
    done = dict(log.losses)
    log.losses, log.crash_at = [], None
    second = launch(config(tmp_path, checkpoint=ckpt))
    resumed_from = second["resumed"][0]["step"]
    assert resumed_from == crash - crash % 2 and resumed_from <= crash, seed  # the newest save before the crash
    assert log.losses[0][0] == resumed_from
    done.update(dict(log.losses))
    assert [done[s] for s in range(total)] == [loss for _, loss in ref_losses], seed  # float ==
    assert epoch_rows(second) == epoch_rows(ref), seed
    for name, value in log.engine.model.state_dict().items():
        assert torch.equal(value, ref_weights[name]), (name, seed)
    # a run of its own: the failed attempt's record stays, the resumed one names it
    assert second["status"] == "ok" and second["run_id"] != first["run_id"]
    assert second["resumed_from"] == first["run_id"]
    on_disk = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert on_disk == sorted(f"{r['run_id']}.json" for r in (ref, first, second))
    assert json.loads((tmp_path / "runs" / f"{first['run_id']}.json").read_text())["status"] == "failed"


def test_resume_without_a_checkpoint_starts_fresh_and_mismatches_are_refused(tmp_path):
    ckpt = CheckpointConfig(dir=str(tmp_path / "ck"), every="5", resume=True)
    rec = launch(config(tmp_path, epochs=2, checkpoint=ckpt))  # --resume on the first submission
    assert rec["status"] == "ok" and "resumed" not in rec
    assert ck.latest(tmp_path / "ck") is not None
    with pytest.raises(CheckpointError, match=r"another config \(model.hidden: checkpoint 16, now 32"):
        launch(config(tmp_path, epochs=2, checkpoint=ckpt, model=ModelConfig(hidden=32, layers=2, dropout=0.3)))
    # resuming a finished run re-runs nothing after the last checkpoint but the tail, identically
    again = launch(config(tmp_path, epochs=2, checkpoint=ckpt))
    assert again["resumed_from"] == rec["run_id"] and epoch_rows(again) == epoch_rows(rec)


def test_a_run_checkpointed_before_the_numerics_section_resumes_exactly(tmp_path, monkeypatch):
    """A run whose checkpoints were written with schema 2's config layout (their meta's
    config and record rewritten so here) resumes from them and ends as the
    uninterrupted run; a resumption with another --permute is refused."""
    log = StepLog(monkeypatch)
    ref = launch(config(tmp_path, epochs=2, permute="single"))
    ref_losses = [loss for _, loss in log.losses]
    crash = ref["steps_per_epoch"] + 1
    log.losses, log.crash_at = [], crash
    ckpt = CheckpointConfig(dir=str(tmp_path / "ck"), every="2", resume=True)
    first = launch(config(tmp_path, epochs=2, permute="single", checkpoint=ckpt))
    assert first["status"] == "failed"
    done = dict(log.losses)
    metas = sorted((tmp_path / "ck").glob("step-*/meta.json"))
    assert metas
    for path in metas:  # as the code before schema 3 wrote them
        meta = json.loads(path.read_text())
        assert meta["config"]["numerics"]["permute"] == "single"
        meta["config"] = schema_2_config(meta["config"])
        meta["record"] = {**meta["record"], "schema_version": 2, "config": schema_2_config(meta["record"]["config"])}
        path.write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match=r"numerics.permute: checkpoint 'single', now 'none'"):
        launch(config(tmp_path, epochs=2, checkpoint=ckpt))
    log.losses, log.crash_at = [], None
    second = launch(config(tmp_path, epochs=2, permute="single", checkpoint=ckpt))
    assert second["status"] == "ok" and second["resumed_from"] == first["run_id"] and second["resumed"]
    assert second["schema_version"] == SCHEMA_VERSION and second["config"]["numerics"]["permute"] == "single"
    done.update(dict(log.losses))
    assert [done[s] for s in range(len(ref_losses))] == ref_losses  # float ==
    assert epoch_rows(second) == epoch_rows(ref)


def test_time_based_checkpoints(tmp_path):
    ckpt = CheckpointConfig(dir=str(tmp_path / "ck"), every="0.001s")
    rec = launch(config(tmp_path, epochs=1, checkpoint=ckpt))
    assert rec["checkpoint"]["saves"] == rec["steps_per_epoch"]  # due after every step
    assert ck.read_meta(ck.latest(tmp_path / "ck"))["step"] == rec["steps_per_epoch"]


# ----------------------------------------------------------------------------- parallel resume
def _losses_worker(rank, world, cfg, graph, run_id, backend, kill_at=None):
    """A spawned rank that records (step, loss) and can SIGKILL itself at one step."""
    from scalegnn.launch import local_rank
    from scalegnn.parallel.engine import ParallelEngine

    losses = []
    real = ParallelEngine.train_step

    def step(engine, s):
        if kill_at is not None and rank == 1 and s == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        res = real(engine, s)
        losses.append((s, res.loss))
        return res

    ParallelEngine.train_step = step
    record = local_rank(rank, world, cfg, graph, run_id, backend)
    return {"record": record, "losses": losses} if rank == 0 else None


def _run(cfg, kill_at=None):
    import functools

    from scalegnn.launch import launch

    worker = functools.partial(_losses_worker, kill_at=kill_at)
    cfg = dataclasses.replace(cfg, parallel=dataclasses.replace(cfg.parallel, nproc=cfg.world_size))
    return launch(cfg, timeout_s=150, rank_main=worker)


@pytest.mark.distributed
def test_resumed_4d_parallel_run_equals_the_uninterrupted_one(tmp_path):
    """Grid 2x1x1x2 (data parallel x z): rank 1 is SIGKILLed at a random step; the run
    is recorded as failed; resuming from the per-rank checkpoint files (with the
    prefetch thread on, this time) gives exactly the uninterrupted run's losses,
    step by step."""
    cfg = config(tmp_path, grid=(2, 1, 1, 2), epochs=3, batch_ratio=0.25)
    ref = _run(cfg)
    ref_losses = dict(ref["losses"])
    total = ref["record"]["steps_per_epoch"] * 3
    seed = random.randrange(1 << 30)
    kill_at = random.Random(seed).randrange(2, total)
    ckpt = CheckpointConfig(dir=str(tmp_path / "ck"), every="2", resume=True)
    cfg_ck = config(tmp_path, grid=(2, 1, 1, 2), epochs=3, batch_ratio=0.25, checkpoint=ckpt)
    failed = _run(cfg_ck, kill_at=kill_at)
    assert failed["status"] == "failed" and failed["error"].startswith("rank 1: was killed by SIGKILL"), seed
    assert sorted(p.name for p in ck.latest(tmp_path / "ck").iterdir()) == [
        "meta.json", "rank-00000.pt", "rank-00001.pt", "rank-00002.pt", "rank-00003.pt"]
    resumed = _run(config(tmp_path, grid=(2, 1, 1, 2), epochs=3, batch_ratio=0.25, checkpoint=ckpt,
                          perf=PerfConfig(prefetch=True)))  # prefetching changes nothing
    start = resumed["record"]["resumed"][0]["step"]
    assert start == kill_at - kill_at % 2, seed
    assert resumed["losses"] == [(s, ref_losses[s]) for s in range(start, total)], seed  # float ==
    assert epoch_rows(resumed["record"]) == epoch_rows(ref["record"]), seed
    assert resumed["record"]["resumed_from"] == failed["run_id"] != resumed["record"]["run_id"]


# ----------------------------------------------------------------------------- continuing to more epochs
def _constant(tmp_path, **over):
    return config(tmp_path, optim=OptimConfig(lr=1e-2, schedule="constant", grad_clip=1.0, weight_decay=1e-4), **over)


def test_a_finished_run_continues_to_more_epochs_exactly(tmp_path, monkeypatch):
    """Train 2 epochs, look, continue with --resume --epochs 4: with the constant
    schedule every step's loss and every epoch row equal (==) an uninterrupted
    4-epoch run's; the record says what changed. Going below the epochs already done
    is refused by name."""
    log = StepLog(monkeypatch)
    ref = launch(_constant(tmp_path, epochs=4))
    ref_losses, spe = list(log.losses), ref["steps_per_epoch"]
    ckpt = CheckpointConfig(dir=str(tmp_path / "ck"), every=str(spe), resume=True)
    first = launch(_constant(tmp_path, epochs=2, checkpoint=ckpt))
    assert first["status"] == "ok" and len(first["epochs"]) == 2
    log.losses = []
    more = launch(_constant(tmp_path, epochs=4, checkpoint=ckpt))
    assert more["status"] == "ok" and more["resumed_from"] == first["run_id"]
    assert more["resumed"][-1]["step"] == 2 * spe and more["resumed"][-1]["changed"] == {"epochs": [2, 4]}
    assert log.losses == ref_losses[2 * spe:]  # float ==
    assert epoch_rows(more) == epoch_rows(ref)
    with pytest.raises(CheckpointError, match=r"is at epoch 4, past --epochs 3; pass --epochs 4 or more"):
        launch(_constant(tmp_path, epochs=3, checkpoint=ckpt))


def test_continuing_a_cosine_run_restretches_the_schedule_and_says_so(tmp_path, monkeypatch):
    """The cosine schedule's length depends on --epochs: continuing re-plans it over the
    new total. From the resumed step S on, the LR is the cosine over 4 epochs of steps
    (the steps before S ran on the 2-epoch one), and the record says so."""
    import math

    ckpt = CheckpointConfig(dir=str(tmp_path / "ck"), every="5", resume=True)
    first = launch(config(tmp_path, epochs=2, checkpoint=ckpt))
    spe = first["steps_per_epoch"]
    lrs = []
    real = ParallelEngine.train_step

    def step(engine, s):
        lrs.append((s, engine.optimizer.param_groups[0]["lr"]))
        return real(engine, s)

    monkeypatch.setattr(ParallelEngine, "train_step", step)
    more = launch(config(tmp_path, epochs=4, checkpoint=ckpt))
    entry = more["resumed"][-1]
    assert more["status"] == "ok" and len(more["epochs"]) == 4
    assert entry["changed"] == {"epochs": [2, 4]} and "cosine" in entry["note"] and "stretched" in entry["note"]
    total = 4 * spe
    assert lrs == [(s, 1e-2 * 0.5 * (1 + math.cos(math.pi * s / total))) for s in range(entry["step"], total)]


@pytest.mark.distributed
def test_a_4_rank_run_continues_to_more_epochs_exactly(tmp_path):
    """Grid 1x2x2x1: 2 epochs with checkpoints, then --resume --epochs 4, equals the
    uninterrupted 4-epoch run step by step (float ==)."""
    cfg = dict(grid=(1, 2, 2, 1), batch_ratio=0.25)
    ref = _run(_constant(tmp_path, epochs=4, **cfg))
    spe = ref["record"]["steps_per_epoch"]
    ckpt = CheckpointConfig(dir=str(tmp_path / "ck"), every=str(spe), resume=True)
    first = _run(_constant(tmp_path, epochs=2, checkpoint=ckpt, **cfg))
    assert first["record"]["status"] == "ok" and len(first["record"]["epochs"]) == 2
    more = _run(_constant(tmp_path, epochs=4, checkpoint=ckpt, **cfg))
    rec = more["record"]
    assert rec["status"] == "ok" and rec["resumed_from"] == first["record"]["run_id"]
    assert rec["resumed"][-1]["step"] == 2 * spe and rec["resumed"][-1]["changed"] == {"epochs": [2, 4]}
    assert more["losses"] == ref["losses"][2 * spe:]  # float ==
    assert epoch_rows(rec) == epoch_rows(ref["record"])


# ----------------------------------------------------------------------------- preemption
def test_preemption_request_saves_at_the_next_step_and_resumes_exactly(tmp_path, monkeypatch):
    """USR2 (SLURM's warning before a time limit / preemption) arrives during step 5:
    the loop saves at step 6, off its checkpoint period, raises Preempted and records
    the run as still running; resuming reproduces the uninterrupted losses."""
    log = StepLog(monkeypatch)
    ref = launch(config(tmp_path))
    ref_losses = list(log.losses)
    real = ParallelEngine.train_step

    def step(engine, s):
        res = real(engine, s)
        if s == 5:
            os.kill(os.getpid(), signal.SIGUSR2)  # the handler only sets the request
        return res

    monkeypatch.setattr(ParallelEngine, "train_step", step)
    previous = signal.signal(signal.SIGUSR2, lambda sig, frame: ck.PREEMPTION.request(sig))
    ck.PREEMPTION.arm()
    ckpt = CheckpointConfig(dir=str(tmp_path / "ck"), every="1000", resume=True)
    try:
        with pytest.raises(ck.Preempted, match=r"preempted \(SIGUSR2\): checkpoint saved at step 6"):
            launch(config(tmp_path, checkpoint=ckpt))
    finally:
        ck.PREEMPTION.disarm()
        signal.signal(signal.SIGUSR2, previous)
    assert ck.read_meta(ck.latest(tmp_path / "ck"))["step"] == 6
    (path,) = [p for p in (tmp_path / "runs").iterdir() if p.name != f"{ref['run_id']}.json"]
    assert json.loads(path.read_text())["status"] == "running"
    log = StepLog(monkeypatch)
    resumed = launch(config(tmp_path, checkpoint=ckpt))
    assert resumed["status"] == "ok" and resumed["resumed"][0]["step"] == 6
    assert log.losses == ref_losses[6:] and epoch_rows(resumed) == epoch_rows(ref)  # float ==


def _preempt_worker(rank, world, cfg):
    """Rank 1 alone gets the request (after step 3); every rank must stop at one step."""
    from scalegnn.launch import train_rank
    from scalegnn.launch.environment import local_rank_env
    from scalegnn.parallel.engine import ParallelEngine

    real = ParallelEngine.train_step

    def step(engine, s):
        res = real(engine, s)
        if rank == 1 and s == 3:
            ck.PREEMPTION.request(signal.SIGUSR2)
        return res

    ParallelEngine.train_step = step
    ck.PREEMPTION.arm()
    try:
        train_rank(cfg, None, local_rank_env(rank, world, cfg.parallel, "gloo"), run_id="preempt-test-000000000000",
                   failures="raise")
    except ck.Preempted as exc:
        return exc.step
    return None


@pytest.mark.distributed
def test_ranks_agree_on_the_preemption_step(tmp_path):
    from scalegnn.launch.job import spawn

    ckpt = CheckpointConfig(dir=str(tmp_path / "ck"), every="1000")
    cfg = config(tmp_path, grid=(1, 2, 1, 1), epochs=2, checkpoint=ckpt)
    assert spawn(_preempt_worker, 2, cfg, timeout_s=120) == [4, 4]
    saved = ck.latest(tmp_path / "ck")
    assert ck.read_meta(saved)["step"] == 4 and (saved / "rank-00001.pt").exists()


def test_resume_with_other_settings_is_refused_by_name(tmp_path, capsys):
    base = ["train", "--dataset", SMALL, "--data-root", str(tmp_path / "data"), "--out", str(tmp_path / "runs"),
            "--quiet", "--layers", "2", "--epochs", "1", "--checkpoint-every", "5", "--checkpoint-dir",
            str(tmp_path / "ck"), "--resume"]
    assert main(base + ["--hidden", "16"]) == 0
    capsys.readouterr()
    assert main(base + ["--hidden", "32"]) == 2
    err = capsys.readouterr().err
    assert "was written by a run with another config (model.hidden: checkpoint 16, now 32)" in err


def test_a_resumed_run_has_its_own_run_id_and_the_record_names_its_parent(tmp_path):
    from scalegnn.checkpoint import CheckpointConfig

    ck = CheckpointConfig(dir=str(tmp_path / "ck"), every="4", resume=True)
    cfg = make_config(dataset=SMALL, data_root=str(tmp_path / "d"), out_dir=str(tmp_path / "r"), epochs=1,
                    progress=False, model=ModelConfig(hidden=16, layers=2), checkpoint=ck)
    first = launch(cfg)
    again = launch(RunConfig.from_dict(cfg.to_dict()))
    assert first["resumed_from"] is None and again["resumed"][0]["step"] == 8
    assert again["run_id"] != first["run_id"] and again["resumed_from"] == first["run_id"]
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == sorted(f"{r['run_id']}.json" for r in (first, again))


# ----------------------------------------------------------------------------- one record per call
def _files(folder) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in Path(folder).iterdir() if p.is_file()}


def _unchanged(before: dict[str, bytes], after: dict[str, bytes]) -> None:
    rewritten = sorted(name for name in before if after.get(name) != before[name])
    assert not rewritten, f"the resume rewrote its parent's {rewritten}"


def _parent_and_child(parent: dict, child: dict, before: dict[str, bytes], after: dict[str, bytes]) -> None:
    """The resume left every file of its parent byte for byte as it was, and wrote its own record
    (a new id, naming the parent, holding the parent's 4 epochs before its 2) and its own model."""
    _unchanged(before, after)
    assert set(after) - set(before) == {f"{child['run_id']}.json", f"{child['run_id']}.model.pt"}
    assert parent["resumed_from"] is None and len(parent["epochs"]) == 4
    assert child["run_id"] != parent["run_id"] and child["resumed_from"] == parent["run_id"]
    assert child["status"] == "ok" and epoch_rows(child)[:4] == epoch_rows(parent) and len(child["epochs"]) == 6
    assert child["resumed"][-1]["step"] == 4 * parent["steps_per_epoch"]
    for rec in (parent, child):
        path = Path(rec["model_file"])
        assert path.is_absolute() and path.name == f"{rec['run_id']}.model.pt" and path.is_file()


def test_a_resume_through_the_api_leaves_its_parent_as_written(tmp_path, monkeypatch):
    """scalegnn.train 4 epochs with checkpoints, then resume=True to 6: the first record and
    model file are byte-identical before and after, the first result's ``.model`` still
    loads the 4-epoch model, and the model paths hold from another working directory."""
    import scalegnn

    monkeypatch.chdir(tmp_path)
    settings = dict(dataset=SMALL, data_root="data", out_dir="runs", batch_ratio=0.25, hidden=16, layers=2,
                    progress=False, checkpoint_dir="ck", checkpoint_every="4")
    first = scalegnn.train(epochs=4, **settings)
    assert first["steps_per_epoch"] == 4
    before = _files(tmp_path / "runs")
    more = scalegnn.train(epochs=6, resume=True, **settings)
    _parent_and_child(json.loads(before[f"{first['run_id']}.json"]), more.record, before, _files(tmp_path / "runs"))
    monkeypatch.chdir(tmp_path / "ck")  # the record's model paths do not depend on where the caller stands
    assert first.model.about["run_id"] == first["run_id"] and first.model.about["epoch"] == 4
    assert more.model.about["run_id"] == more["run_id"] and more.model.about["epoch"] == 6
    assert not all(torch.equal(a, b) for a, b in zip(first.model.parameters(), more.model.parameters()))


def test_a_resume_from_the_command_line_leaves_its_parent_as_written(tmp_path, capsys):
    """``scalegnn train ... --checkpoint-dir D --resume``: as through the API, and the model
    each record names is that run's (4 epochs, then 6)."""
    from scalegnn.trained import load_model

    out = tmp_path / "runs"
    argv = ["train", "--dataset", SMALL, "--data-root", str(tmp_path / "data"), "--out", str(out), "--quiet",
            "--batch-ratio", "0.25", "--hidden", "16", "--layers", "2", "--save-model",
            "--checkpoint-dir", str(tmp_path / "ck"), "--checkpoint-every", "4"]
    assert main(argv + ["--epochs", "4"]) == 0
    before = _files(out)
    (name,) = [n for n in before if n.endswith(".json")]
    assert main(argv + ["--epochs", "6", "--resume"]) == 0
    after = _files(out)
    _unchanged(before, after)
    (child,) = [json.loads(after[n]) for n in after if n.endswith(".json") and n != name]
    parent = json.loads(before[name])
    _parent_and_child(parent, child, before, after)
    assert load_model(parent["model_file"]).about["epoch"] == 4 and load_model(child["model_file"]).about["epoch"] == 6


# ----------------------------------------------------------------------------- bad checkpoints
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
    (older, _, _), (_, path, _) = ck.list_checkpoints(tmp_path / "ck")
    meta = path / "meta.json"
    meta.write_text('{"format": 1, "st')
    with pytest.warns(UserWarning, match=rf"{meta}: .*not valid JSON.*ignored; resuming from the older"):
        assert ck.latest(tmp_path / "ck").name == f"step-{older:09d}"
    cli = subprocess.run([sys.executable, "-m", "scalegnn", *_train_argv(tmp_path)], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=str(REPO), timeout=120)
    assert cli.returncode == 0 and f"scalegnn: warning: {meta}: not valid JSON" in cli.stderr, cli.stderr
    (rec,) = [json.loads(text) for text in _records(tmp_path).values() if json.loads(text)["resumed_from"]]
    assert rec["status"] == "ok" and rec["resumed"][-1]["step"] == older
