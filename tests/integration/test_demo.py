"""`scalegnn demo`: its sweep compares systems at equal process counts on a dense and a
sparse graph, and it ends with the result line computed from the records."""

import types
from collections import defaultdict

from scalegnn import records
from scalegnn.sweeps.spec import expand, load_spec


def _counts(runs):
    by = defaultdict(lambda: defaultdict(set))
    for r in runs:
        by[r.dataset][r.system].add(r.world_size)
    return by


def test_demo_spec_dense_and_sparse_graphs_at_equal_process_counts():
    """The dense graph is as dense as ogbn-products (average degree >= 50) and every
    system that ScaleGNN is compared with there runs at ScaleGNN's process counts; the
    sparse graph (the caveat) has ScaleGNN and GraphSAGE at 1 process; every run has a
    target accuracy and stops at it."""
    runs = expand(load_spec("demo"), "local")
    by = _counts(runs)
    degree = {ds: float(dict(p.split("=") for p in ds.split(":", 1)[1].split(","))["avg_degree"]) for ds in by}
    dense, sparse = max(degree, key=degree.get), min(degree, key=degree.get)
    assert degree[dense] >= 50 and degree[sparse] <= 12
    assert by[dense]["scalegnn"] == {1, 2}
    for system in ("graphsage", "graphsaint"):
        assert by[dense][system] == by[dense]["scalegnn"]
    assert by[dense]["fullgraph-3d"] <= by[dense]["scalegnn"]
    assert by[sparse]["scalegnn"] == {1} and by[sparse]["graphsage"] == {1}
    for r in runs:
        opts = dict(r.options)
        assert r.target_acc and opts.get("stop-at-target") is True and opts.get("eval-every") == 1
    grids = {r.grid for r in runs if r.system == "scalegnn" and r.dataset == dense}
    assert grids == {(1, 1, 1, 1), (2, 1, 1, 1), (1, 2, 1, 1)}
    assert {r.grid for r in runs if r.system != "scalegnn" and r.world_size == 2} == {(2, 1, 1, 1)}


def _record(system, dataset, grid, epoch_s, test, entries, out):
    """A valid ok record: per-epoch times ``epoch_s`` and test accuracies ``test``, target 95 %."""
    t, rows = 0.0, []
    for i, (dt, acc) in enumerate(zip(epoch_s, test), 1):
        t += dt
        rows.append({"epoch": i, "train_time_s": t, "loss": 1.0 / i, "train_acc": acc, "val_acc": acc,
                     "test_acc": acc, "eval_time_s": 0.01, "components": {}, "comm_bytes": {}})
    world = grid[0] * grid[1] * grid[2] * grid[3]
    rec = records.validate_record({
        "schema_version": records.SCHEMA_VERSION, "run_id": records.new_run_id(system, dataset), "system": system,
        "dataset": dataset, "config": {"sampling": {"batch_ratio": 0.1}, "model": {"hidden": 8}}, "seed": 0,
        "grid": dict(zip(("dp", "x", "y", "z"), grid)), "world_size": world,
        "env": {"hostname": "vm", "device": "cpu (x86_64, 2 cores)", "device_type": "cpu", "backend": "gloo",
                "torch": "2.6", "python": "3.11", "git_commit": "abcdef1234567890", "libraries": {}},
        "graph": {"num_nodes": 1000, "num_edges": entries, "adjacency_nnz": entries + 1000, "num_features": 8,
                  "num_classes": 4},
        "epochs": rows, "target_acc": 0.95, "time_to_target_s": records.time_to_target(rows, 0.95),
        "peak_memory_bytes": 1, "status": "ok", "error": None})
    records.write_record(rec, out / "runs" / rec["run_id"])


def test_demo_ends_with_the_result_line(tmp_path, monkeypatch, capsys):
    """The demo's last printed line is the result computed from its records (the dense
    graph), after the line that says where the claim does not hold (the sparse one)."""
    from scalegnn.demo import run_demo

    dense, sparse = "csbm:n=1000,avg_degree=50,classes=8,feature_dim=32", "csbm:n=1000,avg_degree=10,classes=8"

    def fake_sweep(spec, cluster, out, **kw):
        assert (spec, cluster) == ("demo", "local")
        _record("scalegnn", dense, (1, 1, 1, 1), [0.2, 0.2], [0.9, 0.96], 50_000, out)
        _record("graphsage", dense, (1, 1, 1, 1), [1.0, 1.0], [0.9, 0.96], 50_000, out)
        _record("scalegnn", sparse, (1, 1, 1, 1), [0.2, 0.2], [0.3, 0.4], 10_000, out)
        _record("graphsage", sparse, (1, 1, 1, 1), [1.0, 1.0], [0.9, 0.96], 10_000, out)
        return types.SimpleNamespace(failed=[])

    monkeypatch.setattr("scalegnn.sweeps.launcher.sweep", fake_sweep)
    assert run_demo(str(tmp_path / "demo")) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1].startswith("Result: ScaleGNN reached 95 % test accuracy in 0.40 s at 1 process: 5.0x faster "
                                "than GraphSAGE (2.00 s) (csbm n=1000 avg_degree=50; average degree 50;")
    assert lines[-2].startswith("Where it does not hold: ScaleGNN did not reach 95 % test accuracy at 1 process "
                                "(best 40.0 %): GraphSAGE reached it in 2.00 s (csbm n=1000 avg_degree=10;")
    report = (tmp_path / "demo" / "report" / "report.md").read_text().splitlines()
    assert report[2] == "**Result:** " + lines[-1][len("Result: "):]
    assert report[4] == lines[-2]
