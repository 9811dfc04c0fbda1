"""What the data-parallel compared systems share (baselines/common.py): records end to end
through the command line, validated flags, several processes, and the graph a run reads
(CSR features, the --split split)."""

from __future__ import annotations

import warnings

import pytest
import torch

from scalegnn import records
from scalegnn.cli import main
from scalegnn.launch import launch
from tests.files import sparse_npz
from tests.runs import BASELINE_TINY as TINY
from tests.runs import cfg_for

pytest.importorskip("torch_geometric")
pytest.importorskip("torch_sparse")

warnings.filterwarnings("ignore", message=".*pyg-lib.*")


# ----------------------------------------------------------------------------- records end to end
@pytest.mark.parametrize("system,extra", [
    ("graphsage", ["--batch-size", "64"]),
    ("graphsage", ["--batch-size", "64", "--conv", "gcn", "--eval-mode", "layerwise"]),
    ("graphsaint", ["--node-budget", "100", "--sample-coverage", "5"]),
    ("salient", ["--batch-size", "64"]),
    ("bns-gcn", []),
    ("fullgraph-3d", []),
])
def test_cli_run_writes_a_valid_record(system, extra, data_root, tmp_path, capsys):
    rc = main(["train", "--system", system, "--dataset", TINY, "--data-root", data_root, "--epochs", "2",
               "--hidden", "16", "--layers", "2", "--out", str(tmp_path), "--quiet", "--target-acc", "0.05",
               *extra])
    assert rc == 0, capsys.readouterr()
    [path] = list(tmp_path.glob("*.json"))
    rec = records.read_record(path)
    assert rec["system"] == system and rec["status"] == "ok" and rec["dataset"] == TINY
    assert len(rec["epochs"]) == 2 and rec["epochs"][-1]["test_acc"] is not None
    assert rec["epochs"][-1]["eval_time_s"] is not None
    assert rec["time_to_target_s"] == rec["epochs"][0]["train_time_s"]
    assert rec["summary"]["epochs_run"] == 2
    # every system says where it computed (auto: a GPU where one is visible) and both memory peaks
    assert rec["env"]["device_type"] == ("cuda" if torch.cuda.is_available() else "cpu")
    assert rec["peak_rss_bytes_per_rank"][0] > 0
    cfg = rec["config"]
    assert cfg["model"]["hidden"] == 16 and cfg["optim"]["lr"] == 1e-3
    if system == "graphsage":
        assert cfg["options"]["fanouts"] == [15, 10] and cfg["options"]["batch_size"] == 64
    if system == "graphsaint":
        assert cfg["options"]["node_budget"] == 100 and cfg["options"]["sample_coverage"] == 5
    if system == "bns-gcn":
        assert cfg["options"]["boundary_rate"] == 0.1
    if system == "fullgraph-3d":
        assert rec["batch_size"] == rec["graph"]["num_nodes"]


def test_baseline_flags_are_validated(data_root, tmp_path, capsys):
    rc = main(["train", "--system", "graphsage", "--dataset", TINY, "--data-root", data_root,
               "--fanouts", "5,5,5", "--layers", "2", "--out", str(tmp_path)])
    assert rc == 2 and "--layers is 2" in capsys.readouterr().err
    rc = main(["train", "--system", "salient", "--dataset", TINY, "--grid", "1x2x1x1", "--out", str(tmp_path)])
    assert rc == 2 and "data parallel only" in capsys.readouterr().err


def test_salient_and_graphsage_two_processes_write_records(data_root, tmp_path):
    rec = launch(cfg_for("salient", data_root, tmp_path, nproc=2, epochs=2, batch_size=64))
    assert rec["status"] == "ok" and rec["world_size"] == 2 and rec["grid"]["dp"] == 2
    assert 0 <= rec["cache_hit_rate"] <= 1 and rec["epochs"][0]["cache"]["hits"] >= 0
    assert len(rec["peak_memory_bytes_per_rank"]) == 2
    records.read_record(rec["path"])


@pytest.mark.parametrize("system", ["graphsage", "bns-gcn"])
def test_compared_systems_take_sparse_features_and_the_split(isolated_data, system):
    """The baselines read the same graph: CSR features (rows selected per batch), the
    --split split, both in their record."""
    import scalegnn

    path = sparse_npz(isolated_data / "g.npz")
    rec = scalegnn.train(system=system, dataset=f"npz:{path}", split="random:0.6,0.2,0.2", epochs=1, hidden=8,
                         progress=False, out_dir=str(isolated_data / "runs"))
    assert rec["status"] == "ok", rec.get("error")
    assert rec["graph"]["sparse_features"] and rec["graph"]["split"].startswith("random 60/20/20 seed 0 (--split")
