"""The benchmarks (benchmarks/): ``scalegnn bench`` runs, writes JSON + Markdown, and
reports every peer (a missing one as missing, never with a made-up number); the scripts
measuring one thing each run at toy sizes. Tiny sizes; timings are not asserted."""

from __future__ import annotations

import json

import pytest
import torch

from scalegnn import _elementwise as ew
from scalegnn.benchmarks.bench_command import (markdown_table, permutation_bench, random_csr, sampler_bench,
                                               scaling_bench)
from scalegnn.cli import main


def test_random_csr_is_sorted_and_unique_per_row():
    indptr, indices, values = random_csr(500, 5000, seed=1)
    assert int(indptr[-1]) == indices.numel() == values.numel() > 4900
    for r in range(0, 500, 50):
        row = indices[indptr[r]:indptr[r + 1]]
        assert bool((row[1:] > row[:-1]).all())


def test_sampler_bench_reports_ratio_against_every_peer(tmp_path):
    pytest.importorskip("torch_geometric")
    payload, md = sampler_bench(n=3000, nnz=30000, batch=300, reps=2, threads=1,
                                peers=("pyg_subgraph", "saint_subgraph", "graphsaint", "dgl"),
                                dgl_python=str(tmp_path / "no-such-python"))
    assert payload["fastest_peer"] in payload["median_ms"]
    for peer in ("PyG utils.subgraph", "torch-sparse saint_subgraph", "PyG GraphSAINTNodeSampler (1 batch)"):
        assert peer in payload["median_ms"] and peer in md
    assert "DGL node_subgraph" not in payload["median_ms"]  # not faked
    assert "not measured: no DGL environment" in md
    assert payload["ratio_vs_fastest_peer"] == pytest.approx(payload["ours_ms"] / payload["goal_ms"] / 2)


def test_bench_cli_writes_json_and_markdown(tmp_path):
    out = tmp_path / "bench"
    assert main(["bench", "--out", str(out), "permutation", "--scale", "9", "--datasets", "power-law"]) == 0
    data = json.loads((out / "permutation.json").read_text())
    assert set(data["results"]["power-law"]) >= {"original", "single", "double"}
    assert data["command"].startswith("scalegnn bench") and (out / "permutation.md").read_text().startswith("Load")


def test_scaling_and_permutation_tables():
    payload, md = scaling_bench(nnzs=(20000, 80000), reps=2, hidden=8, features=4)
    assert len(payload["results"]) == 2 and "slope" in md
    payload, md = permutation_bench(scale=8, datasets=("power-law", "no-such-dataset"))
    assert "not available" in md
    assert markdown_table(["a", "b"], [[1, 2.5]]).splitlines()[2] == "| 1 | 2.5 |"


def test_gpu_benchmark_runs_end_to_end_on_a_small_graph(tmp_path, monkeypatch):
    """``python -m scalegnn.benchmarks.gpu`` at toy sizes on the CPU (the real run is on a GPU: see
    docs/gpu.md): every section runs, identical sampler blocks, the JSON and Markdown land,
    and both systems are compared on the same target; the step's roofline table is there
    (this CPU given an H200's spec: a CPU has none). Times are not asserted."""
    from scalegnn.benchmarks import gpu, roofline

    monkeypatch.setattr(roofline, "device_spec", lambda name: roofline.DEVICE_SPECS[0][1])

    out = tmp_path / "gpu"
    assert gpu.main(["--device", "cpu", "--nodes", "3000", "--avg-degree", "20", "--max-epochs", "2",
                     "--max-seconds", "30", "--sampler-size", "20000,200000,2000", "--no-compile",
                     "--skip", "pyg_sage", "--target", "0.5", "--out", str(out)]) == 0
    res = json.loads((out / "gpu.json").read_text())
    assert res["sampler"]["identical_blocks"] is True and res["sampler"]["met"] is None  # not the target's size
    assert res["graph"]["num_nodes"] == 3000 and res["device"]["type"] == "cpu"
    for key in ("scalegnn", "pyg_gcn"):
        assert res[key]["status"] == "ok" and res[key]["epochs"] >= 1 and res[key]["curve"]
    assert set(res["scalegnn"]["breakdown_s"]) == {"sampling", "spmm", "gemm", "comm", "other"}
    md = (out / "gpu.md").read_text()
    assert "Time to target" in md and "PyG full-batch GCN" in md and "ScaleGNN epoch breakdown" in md
    roof = res["scalegnn"]["roofline"]
    assert roof["status"] == "ok" and [r[0] for r in roof["rows"]][-1] == "step" and roof["precision"] == "fp32"
    assert "ScaleGNN step against its roofline" in md and "Dense GEMMs of every system in FP32" in md
    # fair: each system warmed up untimed, two rounds in alternating order, the paper settings said
    assert set(res["warmup_s"]) == {"scalegnn", "pyg_gcn"}
    assert all(isinstance(v, float) for v in res["warmup_s"].values())
    assert res["order"] == [["scalegnn", "pyg_gcn"], ["pyg_gcn", "scalegnn"]]
    for key in ("scalegnn", "pyg_gcn"):
        assert res[key]["rounds"] == 2 and len(res[key]["time_to_target_s_rounds"]) == 2
    assert res["scalegnn"]["lr"] == 0.001 and res["scalegnn"]["dropout"] == 0.3
    assert "(paper settings)" in md and "median over the rounds" in md


def test_the_gpu_benchmark_reads_the_tuned_settings(tmp_path):
    """--tuned: each section takes its system's chosen flags; a section without a search
    keeps its paper settings and says so."""
    from scalegnn.benchmarks import gpu

    for system, flags in (("scalegnn", {"--lr": "0.0003", "--dropout": "0.5", "--batch-ratio": "0.25"}),
                          ("graphsage", {"--lr": "0.01", "--dropout": "0.3", "--fanouts": "5,5,5"})):
        doc = {"spec": {"system": system, "dataset": "csbm:n=600"}, "complete": True, "trials": [{"flags": flags}],
               "chosen": {"flags": flags}}
        (tmp_path / system).mkdir()
        (tmp_path / system / "tune.json").write_text(json.dumps(doc))
    got = gpu.tuned_settings(tmp_path)
    assert got["scalegnn"] == {"lr": 0.0003, "dropout": 0.5, "batch_ratio": 0.25, "tuned": True}
    assert got["pyg_sage"] == {"lr": 0.01, "dropout": 0.3, "fanouts": (5, 5, 5), "tuned": True}
    assert got["pyg_gcn"] == {**gpu.PAPER_SETTINGS["pyg_gcn"], "tuned": False}
    assert gpu.round_order(0) == gpu.ORDER and gpu.round_order(1) == tuple(reversed(gpu.ORDER))


def test_a_failed_gpu_benchmark_section_is_recorded_and_the_rest_runs(tmp_path, monkeypatch):
    """One section raising (a GPU error, a toolchain missing) no longer loses the sections
    after it: it is recorded as failed with its error, the PyG comparison still runs, the
    Markdown lists it, and the exit status says a section failed."""
    from scalegnn.benchmarks import gpu

    def broken(*args):
        raise RuntimeError("planted: the sampler section failed")

    monkeypatch.setattr(gpu, "sampler_section", broken)
    monkeypatch.setattr(gpu, "scalegnn_section", broken)
    out = tmp_path / "gpu"
    assert gpu.main(["--device", "cpu", "--nodes", "2000", "--avg-degree", "10", "--max-epochs", "1",
                     "--max-seconds", "10", "--skip", "pyg_sage", "--target", "0.3", "--out", str(out)]) == 1
    res = json.loads((out / "gpu.json").read_text())
    assert res["sampler"]["status"] == res["scalegnn"]["status"] == "failed"
    assert "planted" in res["sampler"]["error"] and "Traceback" in res["scalegnn"]["traceback"]
    assert res["pyg_gcn"]["status"] == "ok" and res["failed_sections"] == ["sampler", "scalegnn"]
    assert "- sampler: failed: RuntimeError: planted" in (out / "gpu.md").read_text()


def test_the_gpu_report_without_a_gpu_reports_every_test_skipped(tmp_path):
    """`make gpu-report` on a machine without a GPU: the versions, the device's absence,
    every GPU test of the files as skipped with its reason, the benchmark skipped; exit 0."""
    from scalegnn.benchmarks import gpu_report

    out = tmp_path / "report.md"
    assert gpu_report.main(["--tests", "tests/unit/test_timing.py", "--out", str(out)]) == 0
    rep = json.loads(out.with_suffix(".json").read_text())
    assert rep["device"]["type"] is None and rep["versions"]["torch"] == torch.__version__
    cases = rep["tests"]["cases"]
    assert cases and {c["outcome"] for c in cases} == {"skipped"} and rep["tests"]["counts"]["failed"] == 0
    assert all("needs a CUDA or ROCm GPU" in c["message"] for c in cases)
    assert rep["benchmark"]["status"] == "skipped"
    md = out.read_text()
    assert "### GPU tests: 0 passed, 0 failed" in md and cases[0]["id"] in md


def test_the_gpu_report_reads_every_outcome(tmp_path):
    from scalegnn.benchmarks.gpu_report import test_outcomes

    junit = tmp_path / "j.xml"
    junit.write_text('<testsuites><testsuite><testcase classname="a" name="ok" time="1.5"/>'
                     '<testcase classname="a" name="bad"><failure message="assert 1 == 2">tb</failure></testcase>'
                     '<testcase classname="a" name="off"><skipped message="needs a GPU"/></testcase>'
                     '<testcase classname="a" name="boom"><error message="fixture broke"/></testcase>'
                     '</testsuite></testsuites>')
    assert [(c["id"], c["outcome"], c["message"]) for c in test_outcomes(junit)] == [
        ("a::ok", "passed", ""), ("a::bad", "failed", "assert 1 == 2"), ("a::off", "skipped", "needs a GPU"),
        ("a::boom", "error", "fixture broke")]


def test_the_micro_benchmark_runs_at_toy_size(capsys):
    """benchmarks/elementwise.py end to end on a tiny shape (its timings are not checked)."""
    from scalegnn.benchmarks.elementwise import main

    threads = torch.get_num_threads()
    try:
        main(["--rows", "9", "--hidden", "5", "--reps", "1"])
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    assert "mask before" in out and "unfused before (fwd+bwd)" in out and "load average" in out
    assert ("mask numba" in out) == ew.available()


# ----------------------------------------------------------------------------- scalegnn bench threads
def test_the_thread_bench_alternates_policies_compares_with_one_and_keeps_failures(monkeypatch):
    """The bookkeeping of ``scalegnn bench threads`` on made-up blocks (the bench itself
    runs minutes of training): ABBA order, means, ratios to ``one``, a failed run kept."""
    from scalegnn.benchmarks import thread_policy as bench

    order = []
    wall = {"default": 30.0, "one": 10.0, "auto": 10.0}

    def block(policy, argv, runs, load, env, default_threads, work):
        order.append(policy)
        rows = [{"wall_s": wall[policy] + i, "cpu_s": 5.0, "train_s": wall[policy] / 2, "test_acc": 0.9,
                 "intra_op": 1, "reason": "r", "busy_cores": None, "omp_wait_policy": None} for i in range(runs)]
        failed = [{"run": 9, "returncode": -9, "log_tail": "killed"}] if policy == "auto" else []
        return {"runs": rows, "failed": failed, "load_cpu_s": 4.0, "loadavg": [(1.0, 1.0, 1.0), (2.0, 1.0, 1.0)]}

    monkeypatch.setattr(bench, "_policy_block", block)
    monkeypatch.setattr(bench, "_default_threads", lambda env: 2)
    payload, md = bench.thread_bench("cora", None, epochs=1, runs=2, policies=("default", "one", "auto"), reps=2)
    assert order == ["default", "one", "auto", "auto", "one", "default"]
    p = payload["policies"]
    assert (p["default"]["wall_s"], p["default"]["wall_vs_one"], p["default"]["train_vs_one"]) == (30.5, 2.905, 3.0)
    assert len(p["auto"]["runs"]) == 4 and p["auto"]["failed"][0]["returncode"] == -9
    assert payload["auto_within_5pct_of_one"] is True and "| auto | 1,1,1,1 (2 failed) | runtime default |" in md
    with pytest.raises(ValueError, match="unknown policies"):
        bench.thread_bench("cora", policies=("two",))
