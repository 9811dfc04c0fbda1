"""The trained model: consolidated from the ranks of any grid (at a run's end and from a
checkpoint folder), loaded without ``torch.distributed``, run on a graph; and a
checkpoint resumed on another grid.

Tolerance of a resume on another grid with the same Gd: the steps sample and drop out
the same vertices, so only the collectives' summation order differs; every epoch's loss
is held to a relative 1e-5 of the same-grid resume (the observed difference is ~1e-7)
and the accuracies to one vertex of the split."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import scalegnn
from scalegnn.checkpoint import CheckpointError
from scalegnn.cli import main
from scalegnn.graph import Graph
from scalegnn.model import ScaleGNN
from scalegnn.trained import ModelFileError, TrainResult, export_checkpoint, load_model, predict
from tests.files import REPO
from tests.graphs import random_graph

pytestmark = pytest.mark.distributed

COMMON = dict(batch_ratio=0.25, layers=2, hidden=16, progress=False)  # 4 steps per epoch on the graph below


@pytest.fixture(scope="module")
def graph() -> Graph:
    g = random_graph(n=160, m=900, seed=5)
    return Graph.from_edge_index(torch.stack([g.row_ids(), g.indices]), g.x, g.y, name="in-memory")


def _losses(record) -> list[float]:
    return [e["loss"] for e in record["epochs"]]


def test_the_result_holds_the_model_that_the_run_evaluated(graph, tmp_path):
    """On 2 ranks: the result reads as the record, ``result.model`` is a plain serial
    ScaleGNN whose full-graph predictions give the last epoch's accuracies exactly, and
    equal (to float order) the one-process run's model."""
    result = scalegnn.train(graph, nproc=2, grid="1x1x2x1", epochs=3, out_dir=str(tmp_path), dropout=0.0, **COMMON)
    assert isinstance(result, TrainResult) and result["status"] == "ok" and result.record["run_id"] in repr(result)
    assert dict(result) == result.record and Path(result["model_file"]).name == f"{result['run_id']}.model.pt"
    model = result.model
    assert type(model) is ScaleGNN and not model.training
    assert model.about["grid"] == "1x1x2x1" and model.about["epoch"] == 3
    logits = result.predict(graph)
    assert logits.shape == (graph.num_nodes, graph.num_classes)
    last = result["epochs"][-1]
    for split in ("train", "val", "test"):
        idx = getattr(graph, f"{split}_idx")
        acc = int((logits[idx].argmax(1) == graph.y[idx]).sum()) / len(idx)
        assert acc == pytest.approx(last[f"{split}_acc"], abs=1e-9), split
    serial = scalegnn.train(graph, epochs=3, out_dir=str(tmp_path), dropout=0.0, **COMMON)
    for a, b in zip(serial.model.parameters(), model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    # the PyG form of the same graph predicts the same logits
    torch.testing.assert_close(predict(model, graph.to_pyg()), logits)


def test_the_best_validation_epochs_model_is_kept_beside_the_last_epochs(graph, tmp_path):
    """On 2 ranks, lr 0.05 (validation accuracy peaks at epoch 2 of 8): result.model is the
    last epoch's, result.best_model the summary's best epoch's, each giving its epoch's
    accuracies exactly; the result is the record itself (json.dumps works). Training 2
    epochs, the last is the best: one file, named twice."""
    import json

    result = scalegnn.train(graph, nproc=2, grid="1x1x2x1", epochs=8, out_dir=str(tmp_path), dropout=0.0, lr=0.05,
                            **COMMON)
    best = result["summary"]["best_epoch"]
    assert best == 2 and result["best_model_file"].endswith(".best.model.pt")
    assert Path(result["best_model_file"]).is_absolute()
    assert result.model.about["epoch"] == 8 and result.best_model.about["epoch"] == best
    for model, row in ((result.model, result["epochs"][-1]), (result.best_model, result["epochs"][best - 1])):
        logits = predict(model, graph)
        for split in ("train", "val", "test"):
            idx = getattr(graph, f"{split}_idx")
            assert int((logits[idx].argmax(1) == graph.y[idx]).sum()) / len(idx) == pytest.approx(row[f"{split}_acc"],
                                                                                                abs=1e-9), split
    assert json.loads(json.dumps(result))["run_id"] == result["run_id"] and result.record is result
    short = scalegnn.train(graph, epochs=1, out_dir=str(tmp_path), **COMMON)
    assert short["best_model_file"] == short["model_file"]


@pytest.mark.parametrize("system, options", [("graphsage", {"eval_mode": "layerwise"}), ("graphsaint", {}),
                                             ("pyg-gcn", {}), ("bns-gcn", {}), ("salient", {}),
                                             ("cagnet-1.5d", {"nproc": 2})])
def test_a_compared_systems_run_returns_its_model_and_predicts(graph, tmp_path, system, options):
    """The compared systems save their own model too (the last epoch's and the best
    validation epoch's), loaded by scalegnn.load_model without their trainer, and
    predict on a whole graph: where their evaluation is exact full-graph inference, the
    predictions give the record's accuracies exactly (SALIENT++ evaluates by neighbour
    sampling: its full-graph predictions are the model's, not its evaluation's)."""
    result = scalegnn.train(graph, system=system, epochs=3, out_dir=str(tmp_path), layers=2, hidden=16,
                            dropout=0.0, progress=False, **options)
    assert result["status"] == "ok" and Path(result["model_file"]).is_file() and result["best_model_file"]
    model = load_model(result["model_file"])
    assert model.about["run_id"] == result["run_id"] and model.about["epoch"] == 3
    logits = predict(model, graph.to_pyg())
    torch.testing.assert_close(logits, result.predict(graph))
    assert logits.shape == (graph.num_nodes, graph.num_classes)
    assert result.best_model.about["epoch"] == result["summary"]["best_epoch"]
    if system != "salient":
        last = result["epochs"][-1]
        for split in ("train", "val", "test"):
            idx = getattr(graph, f"{split}_idx")
            assert int((logits[idx].argmax(1) == graph.y[idx]).sum()) / len(idx) == pytest.approx(last[f"{split}_acc"],
                                                                                                 abs=1e-9), split


def test_a_result_without_a_model_says_why(graph, tmp_path):
    off = scalegnn.train(graph, epochs=1, out_dir=str(tmp_path), save_model=False, **COMMON)
    assert "model_file" not in off.record
    with pytest.raises(ModelFileError, match="wrote no such model .*save_model=False"):
        off.model
    sage = TrainResult({"system": "distdgl", "run_id": "r", "status": "ok"})
    with pytest.raises(ModelFileError, match="a distdgl run saves no model .systems that do: graphsaint, .*scalegnn"):
        sage.model


def test_export_consolidates_a_checkpoint_of_any_grid_into_the_runs_model(graph, tmp_path, capsys):
    """A 4-rank checkpoint (1x2x1x2: W's rows and columns both split) at the run's last
    step exports to exactly the parameters the run itself consolidated; the command line
    says what it wrote; a folder without a checkpoint is one line."""
    ck = tmp_path / "ck"
    result = scalegnn.train(graph, nproc=4, grid="1x2x1x2", epochs=2, out_dir=str(tmp_path), checkpoint_dir=str(ck),
                            checkpoint_every="4", **COMMON)
    assert main(["export", str(ck), "--out", str(tmp_path / "model.pt")]) == 0
    assert re.search(r"wrote .*model\.pt: the model of run \S+ at step 8 \(epoch 2\), consolidated from the grid "
                     r"1x2x1x2", capsys.readouterr().out)
    exported = load_model(tmp_path / "model.pt")
    for (name, a), (_, b) in zip(exported.named_parameters(), result.model.named_parameters()):
        assert torch.equal(a, b), name
    step4 = export_checkpoint(ck / "step-000000004", tmp_path / "four.pt")  # one step folder, by name
    assert load_model(step4).about["step"] == 4
    assert main(["export", str(tmp_path / "nothing"), "--out", str(tmp_path / "x.pt")]) == 2
    assert capsys.readouterr().err.strip().count("\n") == 0


def test_a_model_file_that_is_no_model_is_one_line_and_runs_nothing(tmp_path):
    import pickle

    class Boom:
        def __reduce__(self):
            return (Path.touch, (tmp_path / "ran",))

    (tmp_path / "evil.pt").write_bytes(pickle.dumps({"kind": "scalegnn-model", "x": Boom()}))
    with pytest.raises(ModelFileError, match="cannot be read as a model file") as err:
        load_model(tmp_path / "evil.pt")
    assert "\n" not in str(err.value) and not (tmp_path / "ran").exists()
    torch.save({"weights": torch.zeros(2)}, tmp_path / "other.pt")
    with pytest.raises(ModelFileError, match="not a scalegnn model file"):
        load_model(tmp_path / "other.pt")
    with pytest.raises(ModelFileError, match="no such model file"):
        load_model(tmp_path / "absent.pt")
    (tmp_path / "run.json").write_text('{"schema_version": 4, "run_id": "r"}')  # the record, not its model
    with pytest.raises(ModelFileError, match=r"a run record \(JSON\), not a model file; the record's model_file"):
        load_model(tmp_path / "run.json")


def _checkpointed(graph, tmp_path, name: str, grid: str, nproc: int, every: str) -> Path:
    ck = tmp_path / name
    scalegnn.train(graph, nproc=nproc, grid=grid, epochs=2, out_dir=str(tmp_path), checkpoint_dir=str(ck),
                   checkpoint_every=every, save_model=False, **COMMON)
    return ck


def test_a_checkpoint_resumes_on_another_3d_grid_as_on_its_own(graph, tmp_path):
    """Saved mid-epoch (step 5 of 4-step epochs) on 1x1x2x1, resumed to 4 epochs on its own
    grid, on 1x2x1x1 and on one process: the epochs after the checkpoint equal the
    same-grid resume to the stated tolerance, and the record names the change."""
    resumed = {}
    for grid, nproc in (("1x1x2x1", 2), ("1x2x1x1", 2), ("1x1x1x1", 1)):
        ck = _checkpointed(graph, tmp_path, f"ck-{grid}", "1x1x2x1", 2, every="5")
        assert sorted(p.name for p in ck.iterdir())[-1] == "step-000000005"
        resumed[grid] = scalegnn.train(graph, nproc=nproc, grid=grid, epochs=4, out_dir=str(tmp_path),
                                       checkpoint_dir=str(ck), checkpoint_every="5", resume=True,
                                       save_model=False, **COMMON)
    same = resumed["1x1x2x1"]
    n_val, n_test = len(graph.val_idx), len(graph.test_idx)
    for grid in ("1x2x1x1", "1x1x1x1"):
        other = resumed[grid]
        assert other["status"] == "ok" and len(other["epochs"]) == 4
        assert _losses(other) == pytest.approx(_losses(same), rel=1e-5)
        for mine, theirs in zip(other["epochs"], same["epochs"]):
            assert abs(mine["val_acc"] - theirs["val_acc"]) <= 1 / n_val + 1e-12
            assert abs(mine["test_acc"] - theirs["test_acc"]) <= 1 / n_test + 1e-12
        entry = other["resumed"][-1]
        assert entry["step"] == 5 and entry["changed"] == {"epochs": [2, 4], "grid": ["1x1x2x1", grid]}
        assert "summation order" in entry["note"]
    assert "grid" not in same["resumed"][-1].get("changed", {})


def test_another_data_parallel_size_resumes_at_an_epochs_end_only(graph, tmp_path):
    """1x1x2x1 -> 2x1x1x1 (Gd 1 -> 2: 2 steps per epoch instead of 4): from an epoch's
    end the run continues at step epochs x 2 with the model and AdamW's state; from the
    middle of an epoch it is refused in one line that says how to get there."""
    ck = _checkpointed(graph, tmp_path, "ck-end", "1x1x2x1", 2, every="4")
    more = scalegnn.train(graph, nproc=2, grid="2x1x1x1", epochs=3, out_dir=str(tmp_path), checkpoint_dir=str(ck),
                          resume=True, checkpoint_every="4", save_model=False, **COMMON)
    assert more["status"] == "ok" and [e["epoch"] for e in more["epochs"]] == [1, 2, 3]
    assert more["steps_per_epoch"] == 2 and more["resumed"][-1]["changed"]["grid"] == ["1x1x2x1", "2x1x1x1"]
    assert "another data-parallel size" in more["resumed"][-1]["note"]
    mid = _checkpointed(graph, tmp_path, "ck-mid", "1x1x2x1", 2, every="5")
    with pytest.raises(ValueError, match=r"in the middle of epoch 2 \(step 1 of 4\).*--epochs 2 first") as err:
        scalegnn.train(graph, nproc=2, grid="2x1x1x1", epochs=3, out_dir=str(tmp_path), checkpoint_dir=str(mid),
                       resume=True, save_model=False, **COMMON)
    assert "\n" not in str(err.value)


def test_a_regridded_step_is_the_epochs_first_on_the_new_grid():
    from scalegnn.checkpoint import regridded_step

    meta = {"step": 8, "epoch": 2, "steps_per_epoch": 4, "config": {"parallel": {"grid": [1, 1, 2, 1]}}}
    assert regridded_step("ck", meta, 4) == 8 and regridded_step("ck", meta, 2) == 4
    with pytest.raises(CheckpointError, match="middle of epoch 3"):
        regridded_step("ck", {**meta, "step": 9}, 2)


def test_the_docs_worked_example_runs_as_written(tmp_path):
    """docs/getting-started.md's example: an in-memory PyG graph on 2 processes, the
    model and its predictions, the checkpoint exported and loaded, a resume on another
    grid; run as a script (its workers import it again)."""
    text = (REPO / "docs" / "getting-started.md").read_text()
    block = re.search(r"<!-- example: trained-model -->\s*```python\n(.*?)```", text, re.S)
    assert block, "docs/getting-started.md lost its trained-model example"
    (tmp_path / "example.py").write_text(block.group(1))
    out = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                         env={**__import__("os").environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [line for line in out.stdout.strip().splitlines() if " INFO scalegnn." not in line]  # the example's own
    assert lines[0].startswith("test accuracy") and "torch.Size([400, 3])" in lines[0]
    assert lines[-1] == "{'epochs': [4, 6], 'grid': ['1x1x2x1', '1x2x1x1']}"
    assert (tmp_path / "model.pt").is_file()
