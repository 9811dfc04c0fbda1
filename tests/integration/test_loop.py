"""The epoch loop (scalegnn/loop.py) in ScaleGNN's runs: repeatability, the record's fields
and the meaning of its times, early stop at the target, divergence."""

from __future__ import annotations

from scalegnn import records
from scalegnn.config import make_config
from scalegnn.launch import launch
from scalegnn.parallel.engine import COMPONENTS
from tests.runs import SMALL


def small_config(tmp_path, **over):
    fields = dict(dataset=SMALL, batch_ratio=0.2, epochs=3, out_dir=str(tmp_path), progress=False,
                  hidden=16, layers=2, dropout=0.2, data_root=str(tmp_path / "data"))
    fields.update(over)
    return make_config(**fields)


def test_same_seed_gives_the_same_loss_curve(tmp_path):
    a = launch(small_config(tmp_path))
    b = launch(small_config(tmp_path))
    c = launch(small_config(tmp_path, seed=1))
    losses = lambda r: [row["loss"] for row in r["epochs"]]  # noqa: E731
    assert losses(a) == losses(b)
    assert losses(a) != losses(c)
    assert a["status"] == "ok" and a["run_id"] != b["run_id"]


def test_record_fields_and_timing_semantics(tmp_path):
    rec = launch(small_config(tmp_path, epochs=4, eval_every=2, target_acc=0.05))
    on_disk = records.read_record(rec["path"])
    assert on_disk["system"] == "scalegnn" and on_disk["world_size"] == 1
    assert on_disk["grid"] == {"dp": 1, "x": 1, "y": 1, "z": 1}
    assert on_disk["config"]["model"]["hidden"] == 16
    assert on_disk["env"]["torch"] and on_disk["env"]["python"]
    rows = on_disk["epochs"]
    assert [r["epoch"] for r in rows] == [1, 2, 3, 4]
    assert rows[0]["test_acc"] is None and rows[1]["test_acc"] is not None  # eval every 2 epochs
    times = [r["train_time_s"] for r in rows]
    assert times == sorted(times) and times[0] > 0  # cumulative
    assert set(rows[0]["components"]) == set(COMPONENTS)  # the one engine's breakdown, a single process too
    # training time excludes evaluation: the components are the step's own parts
    assert sum(rows[0]["components"].values()) <= rows[0]["train_time_s"] + 1e-6
    assert on_disk["time_to_target_s"] == rows[1]["train_time_s"]  # 0.05 is reached at the first eval
    assert on_disk["peak_memory_bytes"] > 0
    assert on_disk["summary"]["best_epoch"] in (2, 4)


def test_stop_at_target_and_full_graph_label(tmp_path):
    rec = launch(small_config(tmp_path, epochs=20, target_acc=0.05, stop_at_target=True, batch_ratio=1.0))
    assert len(rec["epochs"]) == 1
    assert rec["system"] == "fullgraph-3d" and rec["steps_per_epoch"] == 1


def test_divergence_is_recorded(tmp_path):
    rec = launch(small_config(tmp_path, lr=1e30, epochs=5))
    assert rec["status"] == "diverged" and "loss became" in rec["error"]
    assert records.read_record(rec["path"])["status"] == "diverged"
