"""Run records: atomic writes, validation, loading into pandas."""

import json
import os

import pytest

from analysis import load_epochs, load_runs
from scalegnn import records


def minimal_record(**over):
    rec = {
        "schema_version": records.SCHEMA_VERSION, "run_id": records.new_run_id("scalegnn", "toy"),
        "system": "scalegnn", "dataset": "toy", "config": {"epochs": 2, "model": {"hidden": 8}},
        "grid": {"dp": 1, "x": 1, "y": 1, "z": 1}, "world_size": 1, "seed": 0,
        "env": records.environment_info(), "target_acc": 0.5, "time_to_target_s": None,
        "peak_memory_bytes": 1, "status": "ok", "error": None,
        "epochs": [
            {"epoch": e, "train_time_s": 0.5 * e, "loss": 1.0 / e, "train_acc": 0.4 * e, "val_acc": 0.3 * e,
             "test_acc": 0.3 * e, "eval_time_s": 0.1, "components": {"sampling": 0.1}, "comm_bytes": {"dp": 8}}
            for e in (1, 2)
        ],
    }
    rec.update(over)
    return rec


def test_write_then_read_round_trip(tmp_path):
    rec = minimal_record()
    path = records.write_record(rec, tmp_path)
    assert path.name == f"{rec['run_id']}.json"
    assert records.read_record(path)["epochs"] == rec["epochs"]
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temp file left


def test_interrupted_write_leaves_no_file(tmp_path, monkeypatch):
    rec = minimal_record()
    real_dump = json.dump

    def dump_half_then_die(obj, f, **kw):
        f.write(json.dumps(obj, **{k: v for k, v in kw.items() if k != "default"}, default=str)[:50])
        raise KeyboardInterrupt("killed mid-write")

    monkeypatch.setattr(json, "dump", dump_half_then_die)
    with pytest.raises(KeyboardInterrupt):
        records.write_record(rec, tmp_path)
    monkeypatch.setattr(json, "dump", real_dump)
    assert list(tmp_path.iterdir()) == []
    # a failure in the rename step also leaves nothing
    monkeypatch.setattr(os, "replace", lambda *a: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError):
        records.write_record(rec, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_validation_errors():
    with pytest.raises(records.RecordError, match="missing fields"):
        records.validate_record({"schema_version": 1})
    with pytest.raises(records.RecordError, match="newer than this scalegnn"):
        records.validate_record(minimal_record(schema_version=records.SCHEMA_VERSION + 1))
    with pytest.raises(records.RecordError, match="status"):
        records.validate_record(minimal_record(status="great"))


def test_run_ids_are_unique():
    ids = {records.new_run_id("scalegnn", "x") for _ in range(2000)}
    assert len(ids) == 2000


def test_time_to_target():
    rows = minimal_record()["epochs"]
    assert records.time_to_target(rows, 0.5) == 1.0  # epoch 2 reaches 0.6
    assert records.time_to_target(rows, 0.9) is None
    assert records.time_to_target(rows, None) is None


def test_load_into_pandas_reports_corrupt_files(tmp_path):
    records.write_record(minimal_record(), tmp_path)
    records.write_record(minimal_record(system="graphsage"), tmp_path)
    bad = tmp_path / "truncated.json"
    bad.write_text('{"schema_version": 1, "run_id": "x", "epo')
    with pytest.warns(UserWarning, match="truncated.json"):
        runs = load_runs(tmp_path)
    assert sorted(runs["system"]) == ["graphsage", "scalegnn"]
    assert runs["config.model.hidden"].tolist() == [8, 8]
    assert runs.attrs["skipped"][0][0] == str(bad)
    with pytest.warns(UserWarning):
        epochs = load_epochs(tmp_path)
    assert len(epochs) == 4 and epochs["time.sampling"].tolist() == [0.1] * 4
    assert set(epochs["bytes.dp"]) == {8}


def test_a_cancelled_run_is_a_valid_status():
    assert records.validate_record(minimal_record(status="cancelled", error="SLURM job 7 was cancelled"))


def test_a_sweep_folders_bookkeeping_is_not_read_as_records(tmp_path):
    """Checkpoint meta.json, staged shards' manifest.json, Flux task files and
    submitted.json sit next to the records of a sweep: they are neither records nor
    skipped (broken) records; a broken record among them still is reported."""
    run = tmp_path / "runs" / "k"
    records.write_record(minimal_record(), run)
    for path in (run / "submitted.json", run / "checkpoint" / "step-000000004" / "meta.json",
                 tmp_path / "shards" / "s" / "manifest.json", tmp_path / ".flux" / "tasks" / "k.json"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text('{"not": "a record"}')
    (run / "broken.json").write_text('{"schema_version": 1')
    with pytest.warns(UserWarning, match="broken.json"):
        runs = load_runs(tmp_path)
    assert len(runs) == 1 and [p for p, _ in runs.attrs["skipped"]] == [str(run / "broken.json")]
