"""BNS-GCN (baselines/bns_gcn.py): at boundary rate one, two processes train as one."""

from __future__ import annotations

import warnings

import pytest

from scalegnn.launch import launch
from tests.runs import cfg_for

pytest.importorskip("torch_geometric")
pytest.importorskip("torch_sparse")

warnings.filterwarnings("ignore", message=".*pyg-lib.*")


def test_bns_gcn_at_rate_one_matches_the_single_process_run(data_root, tmp_path):
    """p = 1: partition-parallel training with the all_to_all exchange (forward and
    backward) is exactly full-graph training: the same losses epoch after epoch."""
    one = launch(cfg_for("bns-gcn", data_root, tmp_path, epochs=3, boundary_rate=1.0))
    two = launch(cfg_for("bns-gcn", data_root, tmp_path, epochs=3, nproc=2, boundary_rate=1.0))
    assert two["status"] == "ok" and two["epochs"][0]["comm_bytes"]["boundary"] > 0
    la = [r["loss"] for r in one["epochs"]]
    lb = [r["loss"] for r in two["epochs"]]
    assert la == pytest.approx(lb, rel=1e-4)
    assert two["epochs"][0]["boundary_sampled_fraction"] == 1.0
