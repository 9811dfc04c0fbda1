"""Analysis (analysis/): figures and tables on synthetic records, their content (series,
labels, annotated values); the tables of the compared systems over seeds; records that
cannot be read are reported and skipped."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from scalegnn import records
from scalegnn.analysis import figures as F
from scalegnn.analysis import load_epochs, load_runs
from scalegnn.analysis import tables as T
from scalegnn.analysis.load import runs_from_records
from scalegnn.analysis.report import write_report
from tests.files import minimal_record


_counter = [0]


@pytest.fixture(autouse=True)
def _close_figures():
    """Every figure a test drew is closed after it (pyplot keeps them open otherwise)."""
    yield
    import matplotlib.pyplot as plt

    plt.close("all")


def make_record(system="scalegnn", dataset="reddit", grid=(1, 1, 1, 1), epoch_s=(0.1, 0.1, 0.1), test=None,
                target=None, components=None, eval_s=0.05, status="ok", seed=0, host="nid001"):
    """A valid run record with per-epoch times ``epoch_s`` and test accuracies ``test``."""
    _counter[0] += 1
    test = list(test) if test is not None else [0.5] * len(epoch_s)
    t, rows = 0.0, []
    for i, (dt, acc) in enumerate(zip(epoch_s, test), 1):
        t += dt
        rows.append({"epoch": i, "train_time_s": t, "loss": 1.0 / i, "train_acc": acc, "val_acc": acc,
                     "test_acc": acc, "eval_time_s": eval_s, "components": dict(components or {}),
                     "comm_bytes": {}})
    world = int(np.prod(grid))
    rec = {
        "schema_version": records.SCHEMA_VERSION, "run_id": f"2026-{system}-{_counter[0]:04d}", "system": system,
        "dataset": dataset, "config": {"model": {"hidden": 16, "layers": 2}}, "seed": seed,
        "grid": dict(zip(("dp", "x", "y", "z"), grid)), "world_size": world,
        "env": {"hostname": host, "device": "A100", "backend": "nccl", "torch": "2.6", "python": "3.11",
                "git_commit": "abcdef1234567890", "libraries": {"torch": "2.6"}},
        "graph": {"num_nodes": 1000, "num_edges": 5000, "adjacency_nnz": 6000, "num_features": 8, "num_classes": 4},
        "batch_size": 100, "steps_per_epoch": 10, "epochs": rows, "target_acc": target,
        "time_to_target_s": records.time_to_target(rows, target), "peak_memory_bytes": 1,
        "status": status, "error": None if status == "ok" else "RuntimeError: boom\ntraceback",
    }
    return records.validate_record(rec)


def manifest(spec, cluster, recs_and_variants, figure=None, reference=None):
    """A sweep manifest tagging ``records`` (their run_key = folder name)."""
    runs = []
    for rec, variant in recs_and_variants:
        rec["record_file"] = f"/r/{spec}/runs/{rec['run_id']}/x.json"
        g = rec["grid"]
        runs.append({"key": rec["run_id"], "system": rec["system"], "dataset": rec["dataset"],
                     "grid": "x".join(str(g[a]) for a in ("dp", "x", "y", "z")), "variant": variant,
                     "paper_dataset": rec["dataset"]})
    return {"spec": spec, "figure": figure or spec, "cluster": cluster, "runs": runs, "reference": reference or {}}


def texts(fig):
    return [t.get_text() for ax in fig.axes for t in ax.texts]


# ---------------------------------------------------------------------------- Fig. 6
def test_fig6_series_markers_and_speedup_annotation():
    recs = [
        make_record("scalegnn", grid=(1, 2, 2, 1), epoch_s=[1.0, 1.0], test=[0.9, 0.96], target=0.95),
        make_record("scalegnn", grid=(4, 2, 2, 1), epoch_s=[0.25, 0.25], test=[0.9, 0.96], target=0.95),
        make_record("salient", grid=(4, 1, 1, 1), epoch_s=[1.0, 1.0], test=[0.9, 0.951], target=0.95),
        make_record("salient", grid=(16, 1, 1, 1), epoch_s=[2.0, 2.0], test=[0.93, 0.92], target=0.95),
        make_record("bns-gcn", grid=(16, 1, 1, 1), epoch_s=[3.0, 3.0], test=[0.94, 0.96], target=0.95),
    ]
    m = manifest("fig6", "perlmutter", [(r, "") for r in recs], reference={"perlmutter": "salient"})
    runs = runs_from_records(recs, [m])
    fig = F.fig6_time_to_target(runs, reference={"perlmutter": "salient"})
    ax = fig.axes[0]
    lines = {ln.get_label(): ln for ln in ax.get_lines() if not ln.get_label().startswith("_")}
    assert set(lines) == {"ScaleGNN", "SALIENT++", "BNS-GCN", "ScaleGNN (paper)", "SALIENT++ (paper)",
                          "BNS-GCN (paper)"}
    # the same experiment as the paper's (perlmutter, reddit, same system and GPU count): its points on
    # these axes, hollow markers and no line (only these counts are published); BNS-GCN only at 16 GPUs,
    # the one count it was measured at here
    paper = {k: (list(v.get_xdata()), list(v.get_ydata())) for k, v in lines.items() if k.endswith("(paper)")}
    assert paper == {"ScaleGNN (paper)": ([4, 16], [1.33, 0.98]), "SALIENT++ (paper)": ([4, 16], [1.83, 3.13]),
                     "BNS-GCN (paper)": ([16], [11.7])}
    assert all(lines[k].get_markerfacecolor() == "none" and lines[k].get_linestyle() == "None" for k in paper)
    assert "paper, same experiment (published points only)" in [t.get_text() for t in fig.legends[0].get_texts()]
    with pytest.raises(F.NoData, match="drawn on the measured axes"):
        F.fig6_paper_vs_here(runs)
    assert list(lines["ScaleGNN"].get_xdata()) == [4, 16] and list(lines["ScaleGNN"].get_ydata()) == [2.0, 0.5]
    assert list(lines["SALIENT++"].get_xdata()) == [4]  # no line runs into its missed point at 16
    # SALIENT++ at 16: not reached -> an x at the time to its best accuracy (93% after epoch 1, 2 s)
    xs = [ln for ln in ax.get_lines() if ln.get_marker() == "x"]
    assert len(xs) == 1 and list(xs[0].get_xdata()) == [16] and list(xs[0].get_ydata()) == [2.0]
    assert "best 93.0%" in texts(fig)
    # speedup at 16 GPUs against the reference only: 2.0 s / 0.5 s, a lower bound (SALIENT++ missed the target)
    assert "4.0x vs SALIENT++ at 16 GPUs or more (SALIENT++ did not reach the target)" in texts(fig)
    assert ax.get_yscale() == "log" and "95% test accuracy" in ax.get_ylabel()
    assert "reddit, perlmutter" in ax.get_title()


def test_fig6_compares_equal_rank_counts_only():
    """ScaleGNN at 2 ranks and GraphSAGE at 1 (the old demo): no speedup is drawn, since
    it would compare 2 ranks with 1; with GraphSAGE at 2 ranks as well, it is."""
    recs = [make_record("scalegnn", grid=(1, 2, 1, 1), epoch_s=[1.0, 1.0], test=[0.9, 0.96], target=0.95),
            make_record("graphsage", grid=(1, 1, 1, 1), epoch_s=[0.5, 0.5], test=[0.9, 0.96], target=0.95)]
    runs = runs_from_records(recs, [manifest("fig6", "local", [(r, "") for r in recs])])
    assert not [t for t in texts(F.fig6_time_to_target(runs)) if "x vs" in t]
    recs.append(make_record("graphsage", grid=(2, 1, 1, 1), epoch_s=[3.0, 3.0], test=[0.9, 0.96], target=0.95))
    runs = runs_from_records(recs, [manifest("fig6", "local", [(r, "") for r in recs])])
    assert "3.0x vs GraphSAGE at 2 GPUs" in texts(F.fig6_time_to_target(runs))
    recs[-1] = make_record("graphsage", grid=(2, 1, 1, 1), epoch_s=[0.25, 0.25], test=[0.9, 0.96], target=0.95)
    runs = runs_from_records(recs, [manifest("fig6", "local", [(r, "") for r in recs])])
    assert "4.0x slower than GraphSAGE at 2 GPUs" in texts(F.fig6_time_to_target(runs))  # never "0.2x vs"


def test_mixed_devices_are_flagged_and_never_turned_into_a_speedup():
    """A GPU ScaleGNN run against a CPU baseline: the report warns, the tables say the
    device of every row, and Fig. 6 writes "not comparable" instead of a speedup."""
    recs = [make_record("scalegnn", "reddit", test=[0.9] * 3, target=0.8),
            make_record("graphsage", "reddit", test=[0.9] * 3, target=0.8)]
    recs[1]["env"]["device"] = "cpu (x86_64, 64 cores)"  # a record from before device_type: the CPU
    m = manifest("fig6", "perlmutter", [(r, "") for r in recs])
    runs = runs_from_records(recs, [m])
    assert dict(zip(runs["system"], runs["device_kind"])) == {"scalegnn": "gpu", "graphsage": "cpu"}
    (warning,) = T.mixed_devices(runs, "fig6")
    assert "graphsage on cpu" in warning and "scalegnn on gpu" in warning and "not a fair comparison" in warning
    tab = T.fig6_times(runs)
    assert dict(zip(tab.loc[tab["measured"].notna(), "system"], tab.loc[tab["measured"].notna(), "device"])) == \
        {"scalegnn": "gpu", "graphsage": "cpu"}
    notes = texts(F.fig6_time_to_target(runs))
    assert any("vs GraphSAGE at 1 rank: not comparable (gpu vs cpu)" in t for t in notes)
    assert not any("x vs" in t for t in notes)
    recs[1]["env"].update(device="A100", device_type="cuda")  # both on GPUs: a speedup again, no warning
    runs = runs_from_records(recs, [m])
    assert T.mixed_devices(runs, "fig6") == []
    assert any("1.0x vs GraphSAGE" in t for t in texts(F.fig6_time_to_target(runs)))


def test_the_report_says_which_runs_took_tuned_settings(tmp_path):
    """Fig. 6 and Table I say where their runs' settings came from: none tuned, some
    (named by system), or every system tuned; the record's config.tuned_from decides."""
    recs = [make_record("scalegnn", "reddit", test=[0.9] * 3, target=0.8),
            make_record("graphsage", "reddit", test=[0.9] * 3, target=0.8)]
    runs = runs_from_records(recs, [])
    assert "none chosen by `scalegnn tune`" in T.tuned_settings(runs, "fig6")
    recs[0]["config"]["tuned_from"] = "search/scalegnn/tune.json"
    line = T.tuned_settings(runs_from_records(recs, []), "fig6")
    assert "1 of 2 runs at the settings `scalegnn tune` chose (scalegnn" in line
    assert "1 at their own settings (graphsage)" in line
    recs[1]["config"]["tuned_from"] = "search/graphsage/tune.json"
    assert "every system tuned under the same budget" in T.tuned_settings(runs_from_records(recs, []), "table1")
    for r in recs:
        records.write_record(r, tmp_path / "runs" / r["run_id"])
    text = write_report(tmp_path, tmp_path / "report").read_text()
    assert text.count("2 of 2 runs at the settings `scalegnn tune` chose") == 2  # Fig. 6 and Table I


def test_fig6_without_targets_is_no_data():
    runs = runs_from_records([make_record()], [])
    with pytest.raises(F.NoData):
        F.fig6_time_to_target(runs)


# ---------------------------------------------------------------------------- Fig. 7 and 8
def _scaling_records():
    comps = lambda s, dp: {"sampling": 0.1 * s, "pmm_comm": 0.5 * s, "spmm": 0.2 * s, "dp_comm": dp}  # noqa: E731
    return [
        make_record("scalegnn", "products-14m", (1, 4, 4, 2), [0.2, 0.1, 0.1], components=comps(0.1, 0.0)),
        make_record("scalegnn", "products-14m", (2, 4, 4, 2), [0.1, 0.06, 0.06], components=comps(0.05, 0.004)),
        make_record("scalegnn", "products-14m", (4, 4, 4, 2), [0.1, 0.04, 0.04], components=comps(0.025, 0.01)),
    ]


def test_fig7_curve_ideal_line_and_speedup():
    recs = _scaling_records()
    runs = runs_from_records(recs, [manifest("fig7", "perlmutter", [(r, "") for r in recs])])
    fig = F.fig7_strong_scaling(runs)
    ax = fig.axes[0]
    data = [ln for ln in ax.get_lines() if ln.get_label() == "products-14m"][0]
    assert list(data.get_xdata()) == [32, 64, 128]
    assert np.allclose(data.get_ydata(), [100, 60, 40])  # ms, first epoch excluded
    ideal = [ln for ln in ax.get_lines() if ln.get_linestyle() == "--" and len(ln.get_xdata()) == 3][0]
    assert np.allclose(ideal.get_ydata(), [100, 50, 25])
    assert "2.5x (62% of ideal 4x)" in texts(fig)
    assert ax.get_title() == "perlmutter" and "ideal scaling" in [t.get_text() for t in fig.legends[0].get_texts()]


def test_fig7_of_runs_at_one_gpu_count_is_no_data():
    """One point per curve is not a scaling curve: the report says so instead."""
    recs = _scaling_records()[:1]
    runs = runs_from_records(recs, [manifest("fig7", "perlmutter", [(r, "") for r in recs])])
    with pytest.raises(F.NoData, match="two or more rank counts"):
        F.fig7_strong_scaling(runs)


def test_fig8_stacks_components_per_gd():
    recs = _scaling_records()
    runs = runs_from_records(recs, [manifest("fig8", "perlmutter", [(r, "") for r in recs])])
    fig = F.fig8_epoch_breakdown(runs)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["Gd=1\n32 ranks", "Gd=2\n64 ranks", "Gd=4\n128 ranks"]
    # the bars of each Gd add up to the measured epoch time (the remainder is "other")
    tops = {}
    for p in ax.patches:
        x = round(p.get_x() + p.get_width() / 2)
        tops[x] = max(tops.get(x, 0), p.get_y() + p.get_height())
    assert np.allclose([tops[0], tops[1], tops[2]], [100, 60, 40])
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend[:4] == ["sampling", "3D-PMM all-reduce", "DP all-reduce", "SpMM"] and "other" in legend
    from matplotlib.colors import to_rgb

    dp = [p for p in ax.patches if p.get_facecolor()[:3] == pytest.approx(to_rgb("#7570b3"))]
    assert [round(p.get_height(), 6) for p in dp] == [0.0, 4.0, 10.0]  # ms per epoch, absent at Gd = 1


# ---------------------------------------------------------------------------- Fig. 5
def test_fig5_bars_in_variant_order_with_speedups():
    comps = {"sampling": 0.03, "pmm_comm": 0.05}
    recs = [
        (make_record(grid=(1, 2, 2, 2), epoch_s=[0.2, 0.1, 0.1], components=comps), "baseline"),
        (make_record(grid=(1, 2, 2, 2), epoch_s=[0.2, 0.08, 0.08], components={"pmm_comm": 0.05}), "+prefetch"),
        (make_record(grid=(4, 2, 2, 2), epoch_s=[0.2, 0.12, 0.12], components=comps), "baseline"),
        (make_record(grid=(4, 2, 2, 2), epoch_s=[0.2, 0.1, 0.1], components={"pmm_comm": 0.05}), "+prefetch"),
    ]
    runs = runs_from_records([r for r, _ in recs], [manifest("fig5", "perlmutter", recs)])
    fig = F.fig5_ablation(runs)
    a1, a2 = fig.axes
    assert [t.get_text() for t in a1.get_xticklabels()] == ["baseline", "+prefetch"]
    assert a1.get_title().startswith("DP1: 8 ranks") and a2.get_title().startswith("DP4: 32 ranks")
    assert "100 ms\n1.00x" in [t.get_text() for t in a1.texts]
    assert "80 ms\n1.25x" in [t.get_text() for t in a1.texts]
    assert "100 ms\n1.20x" in [t.get_text() for t in a2.texts]
    tab = T.fig5_reductions(runs)
    assert list(tab["variant"]) == ["baseline", "+prefetch"] * 2
    assert tab["reduction"].iloc[1] == pytest.approx(0.2)


# ---------------------------------------------------------------------------- tables
def test_table1_paper_next_to_measured_only_for_the_same_experiment():
    recs = [make_record("scalegnn", "reddit", test=[0.95, 0.96 + s / 100], seed=s, epoch_s=[1, 1]) for s in range(3)]
    stand_in = make_record("graphsage", "csbm:n=20000,avg_degree=12", test=[0.7, 0.8], epoch_s=[1, 1])
    m = manifest("table1", "local", [(r, "") for r in recs + [stand_in]])
    m["runs"][-1]["paper_dataset"] = "reddit"
    runs = runs_from_records(recs + [stand_in], [m])
    tab = T.table1_accuracy(runs)
    sg = tab[(tab["dataset"] == "reddit") & (tab["system"] == "scalegnn")].iloc[0]
    assert sg["paper"] == 96.3 and sg["measured"] == pytest.approx(97.0) and sg["runs"] == 3
    assert sg["spread"] == pytest.approx(np.std([96, 97, 98]))
    sage = tab[(tab["dataset"] == "reddit") & (tab["system"] == "graphsage")].iloc[0]
    assert sage["paper"] == 95.4 and pd.isna(sage["measured"])  # the stand-in is not reddit
    stand = tab[tab["note"] == "stand-in for reddit"].iloc[0]
    # a run that stopped once it reached its target: its best accuracy is a lower bound, and the table says so
    stopped = make_record("graphsaint", "reddit", test=[0.9, 0.951], epoch_s=[1, 1], target=0.95)
    stopped["config"]["loop"] = {"stop_at_target": True}
    tab = T.table1_accuracy(runs_from_records([stopped], [manifest("table1", "local", [(stopped, "")])]))
    row = tab[(tab["dataset"] == "reddit") & (tab["system"] == "graphsaint")].iloc[0]
    assert row["measured"] == pytest.approx(95.1) and row["note"] == "stopped at the target accuracy: a lower bound"
    assert stand["dataset"] == "csbm n=20000 avg_degree=12" and pd.isna(stand["paper"])
    assert stand["measured"] == pytest.approx(80)


def test_table2_and_fig6_times_match_cluster_and_gpus():
    a = make_record("scalegnn", "reddit", grid=(1, 2, 2, 1), eval_s=0.07, target=0.95, test=[0.96], epoch_s=[1.5])
    b = make_record("scalegnn", "reddit", grid=(1, 2, 2, 1), eval_s=0.07, host="laptop", target=0.95, test=[0.96],
                    epoch_s=[1.5])
    runs = runs_from_records([a, b], [manifest("demo", "perlmutter", [(a, "")])])  # demo feeds both
    t2 = T.table2_eval_time(runs)
    same = t2[(t2["cluster"] == "perlmutter") & (t2["dataset"] == "reddit") & (t2["system"] == "scalegnn")].iloc[0]
    assert same["paper"] == 0.05 and same["measured"] == pytest.approx(0.07) and same["gpus"] == 4
    other = t2[t2["cluster"] == "laptop"].iloc[0]
    assert pd.isna(other["paper"]) and other["measured"] == pytest.approx(0.07)
    f6 = T.fig6_times(runs)
    row = f6[(f6["cluster"] == "perlmutter") & (f6["system"] == "scalegnn") & (f6["gpus"] == 4)].iloc[0]
    assert row["paper"] == 1.33 and row["measured"] == pytest.approx(1.5) and bool(row["reached"])


def test_fig7_speedups_table():
    recs = _scaling_records()
    runs = runs_from_records(recs, [manifest("fig7", "perlmutter", [(r, "") for r in recs])])
    tab = T.fig7_speedups(runs)
    row = tab[(tab["cluster"] == "perlmutter") & (tab["dataset"] == "products-14m")].iloc[0]
    assert row["paper_speedup"] == 19.8 and row["measured_speedup"] == pytest.approx(2.5)
    assert row["measured_gpus"] == "32 -> 128" and row["grid3d"] == "4x4x2"


def test_failures_provenance_and_load_balance():
    ok = make_record()
    bad = make_record(status="failed")
    m = manifest("fig7", "local", [(ok, ""), (bad, "")])
    m["runs"].append({"key": "never-ran", "system": "scalegnn", "dataset": "reddit", "grid": "1x1x1x1"})
    m["unsupported"] = [{"key": "mg", "system": "massivegnn", "dataset": "reddit", "grid": "4x1x1x1"}]
    runs = runs_from_records([ok, bad], [m])
    fails = T.failures([m], runs)
    assert list(fails["state"]) == ["failed", "missing", "not run"]
    assert fails["detail"].iloc[0] == "RuntimeError: boom"
    prov = T.provenance(runs)
    assert set(prov["commit"]) == {"abcdef123456"} and set(prov["host"]) == {"nid001"}
    from scalegnn.datasets import load_dataset

    lb = T.load_balance(load_dataset("csbm:n=600,avg_degree=8,classes=4,feature_dim=16", cache=False))
    assert set(lb) == {"original", "single", "double"} and all(v >= 1.0 for v in lb.values())
    tab = T.plexus_table3({"csbm:n=600": lb})
    assert list(tab["source"])[0] == "paper" and tab["double"].iloc[0] == 1.001


def test_an_interrupted_run_is_reported_like_the_other_unfinished_ones():
    """A run stopped by SIGINT/SIGTERM (status interrupted) is listed among the runs
    without an ok record, with its state, like failed or cancelled ones."""
    ok = make_record(test=[0.5, 0.6, 0.7])
    stopped = make_record(epoch_s=(0.1,), status="interrupted")
    m = manifest("fig7", "local", [(ok, ""), (stopped, "")])
    runs = runs_from_records([ok, stopped], [m])
    fails = T.failures([m], runs)
    assert list(fails["state"]) == ["interrupted"] and list(fails["key"]) == [stopped["run_id"]]


def test_plexus_fig5_model_figure():
    v = pd.DataFrame({"grid": ["1x1x1x1", "1x2x1x1", "2x1x1x1"], "observed_s": [1.0, 0.6, 0.5],
                      "predicted_s": [1.1, 0.55, 0.5], "loo_s": [1.2, 0.5, 0.45], "dataset": ["d"] * 3,
                      "cluster": ["local"] * 3})
    fig = F.plexus_fig5_model(v)
    a1, a2 = fig.axes[:2]
    assert a1.get_title() == "mean |error|: 6% fitted, 16% leave-one-out"
    assert [t.get_text() for t in a2.get_xticklabels()] == ["2x1x1x1", "1x2x1x1", "1x1x1x1"]
    assert "fastest observed 2x1x1x1" in a2.get_title()


def test_report_from_records_on_disk(tmp_path):
    recs = _scaling_records() + [make_record(status="failed")]
    for r in recs:
        records.write_record(r, tmp_path / "runs" / r["run_id"])
    runs = load_runs(tmp_path)
    assert len(runs) == 4 and set(runs["run_key"]) == {r["run_id"] for r in recs}
    path = write_report(tmp_path, tmp_path / "report")
    text = path.read_text()
    assert (tmp_path / "report" / "fig7_strong_scaling.png").exists()
    assert (tmp_path / "report" / "fig8_epoch_breakdown.pdf").exists()
    assert "_No data: no runs with a sweep variant" in text  # Fig. 5 is listed, not dropped
    assert "| 96.3 |" in text  # the paper's Table I is shown even with nothing measured
    assert "RuntimeError: boom" in text and "## Provenance of every run" in text


# ---------------------------------------------------------------------------- the result line
def _graph_rec(rec, nodes=1000, entries=50_000, ratio=0.1):
    """Give a synthetic record a graph density (stored entries / vertices) and a batch ratio."""
    rec["graph"].update(num_nodes=nodes, num_edges=entries, adjacency_nnz=entries + nodes)
    rec["config"]["sampling"] = {"batch_ratio": ratio}
    return rec


def test_result_line_faster_slower_equal_and_missed_at_equal_rank_counts():
    """At 1 process: faster than GraphSAGE, slower than GraphSAINT, as fast as full-graph 3D
    (within 5 %); at 2: GraphSAGE missed the target; ScaleGNN's fastest 2-process grid is
    named; nothing is compared across rank counts (GraphSAINT ran at 1 only)."""
    from scalegnn.analysis.verdict import result_lines, verdicts

    recs = [_graph_rec(r) for r in [
        make_record("scalegnn", grid=(1, 1, 1, 1), epoch_s=[0.5, 0.5], test=[0.9, 0.96], target=0.95),
        make_record("graphsage", grid=(1, 1, 1, 1), epoch_s=[1.0, 2.0], test=[0.9, 0.96], target=0.95),
        make_record("graphsaint", grid=(1, 1, 1, 1), epoch_s=[0.25, 0.25], test=[0.9, 0.96], target=0.95),
        make_record("fullgraph-3d", grid=(1, 1, 1, 1), epoch_s=[1.02], test=[0.96], target=0.95),
        make_record("scalegnn", grid=(2, 1, 1, 1), epoch_s=[0.4, 0.4], test=[0.9, 0.96], target=0.95),
        make_record("scalegnn", grid=(1, 2, 1, 1), epoch_s=[0.5, 0.5], test=[0.9, 0.96], target=0.95),
        make_record("graphsage", grid=(2, 1, 1, 1), epoch_s=[1.0, 1.0], test=[0.9, 0.931], target=0.95),
    ]]
    for r in recs:
        r["env"].update(device="cpu (x86_64, 2 cores)", device_type="cpu")
    runs = runs_from_records(recs, [manifest("demo", "local", [(r, "") for r in recs])])
    (line,) = result_lines(runs)
    assert line == (
        "ScaleGNN reached 95 % test accuracy in 1.00 s at 1 process: 2.0x slower than GraphSAINT (0.50 s), "
        "3.0x faster than GraphSAGE (3.00 s), as fast as full-graph 3D (1.02 s); "
        "at 2 processes, grid 2x1x1x1 in 0.80 s: GraphSAGE did not reach it (best 93.1 %) "
        "(reddit; average degree 50; a 10 % vertex sample keeps about 5.0 neighbors per vertex; cpu, local).")
    (v,) = verdicts(runs)
    assert v.counts() == [1, 2] and not v.holds  # slower than GraphSAINT at 1 process
    # Fig. 6 and its table show the same fastest grid at 2 processes (0.8 s, not the median 0.9 s)
    (sg,) = [ln for ln in F.fig6_time_to_target(runs).axes[0].get_lines() if ln.get_label() == "ScaleGNN"]
    assert list(sg.get_xdata()) == [1, 2] and list(sg.get_ydata()) == pytest.approx([1.0, 0.8])
    tab = T.fig6_times(runs)
    row = tab[(tab["system"] == "scalegnn") & (tab["gpus"] == 2)].iloc[0]
    assert row["measured"] == pytest.approx(0.8) and row["grid"] == "2x1x1x1"
    # without GraphSAINT it holds: faster or as fast everywhere, and a miss by the other counts for it
    keep = [r for r in recs if r["system"] != "graphsaint"]
    runs = runs_from_records(keep, [manifest("demo", "local", [(r, "") for r in keep])])
    assert verdicts(runs)[0].holds


def test_result_lines_densest_first_and_the_sparse_caveat():
    """Two graphs: the dense one first; on the sparse one ScaleGNN missed the target that
    GraphSAGE reached, so its line says where the claim does not hold, with the numbers."""
    from scalegnn.analysis.verdict import result_lines

    dense = [_graph_rec(make_record(s, "csbm:n=1000,avg_degree=50,classes=8,feature_dim=32", epoch_s=[t, t],
                                    test=[0.9, 0.96], target=0.95), entries=50_000)
             for s, t in (("scalegnn", 0.5), ("graphsage", 2.0))]
    sparse = [_graph_rec(make_record("scalegnn", "csbm:n=1000,avg_degree=10,classes=8,feature_dim=32",
                                     epoch_s=[0.5, 0.5], test=[0.38, 0.391], target=0.95), entries=10_000),
              _graph_rec(make_record("graphsage", "csbm:n=1000,avg_degree=10,classes=8,feature_dim=32",
                                     epoch_s=[2.0, 2.46], test=[0.9, 0.96], target=0.95), entries=10_000),
              _graph_rec(make_record("graphsaint", "csbm:n=1000,avg_degree=10,classes=8,feature_dim=32",
                                     epoch_s=[0.5, 0.5], test=[0.2, 0.293], target=0.95), entries=10_000)]
    recs = sparse + dense
    runs = runs_from_records(recs, [manifest("demo", "local", [(r, "") for r in recs])])
    first, caveat = result_lines(runs)
    assert first.startswith("ScaleGNN reached 95 % test accuracy in 1.00 s at 1 GPU: 4.0x faster than GraphSAGE "
                            "(4.00 s) (csbm n=1000 avg_degree=50; average degree 50; a 10 % vertex sample keeps "
                            "about 5.0 ")
    assert caveat == (
        "Where it does not hold: ScaleGNN did not reach 95 % test accuracy at 1 GPU (best 39.1 %): GraphSAINT did "
        "not either (best 29.3 %), GraphSAGE reached it in 4.46 s (csbm n=1000 avg_degree=10; average degree 10; "
        "a 10 % vertex sample keeps about 1.0 neighbor per vertex; gpu, local).")


def test_result_line_never_compares_across_rank_counts_or_devices():
    from scalegnn.analysis.verdict import result_lines

    recs = [make_record("scalegnn", grid=(1, 2, 1, 1), epoch_s=[1.0], test=[0.96], target=0.95),
            make_record("graphsage", grid=(1, 1, 1, 1), epoch_s=[3.0], test=[0.96], target=0.95)]
    runs = runs_from_records(recs, [manifest("demo", "local", [(r, "") for r in recs])])
    assert result_lines(runs) == ["ScaleGNN ran alone on reddit: nothing to compare at equal process counts."]
    recs[1]["grid"] = {"dp": 2, "x": 1, "y": 1, "z": 1}
    recs[1]["world_size"] = 2
    recs[1]["env"].update(device="cpu (x86_64, 64 cores)", device_type="cpu")
    runs = runs_from_records(recs, [manifest("demo", "local", [(r, "") for r in recs])])
    (line,) = result_lines(runs)
    assert "not comparable with GraphSAGE (gpu vs cpu)" in line and "faster" not in line


def test_result_lines_compare_times_to_one_target_only():
    """Runs of one graph to 90 % and to 95 % are two comparisons, each with its own target."""
    from scalegnn.analysis.verdict import result_lines

    recs = [make_record(s, epoch_s=[t, t], test=[0.96, 0.96], target=target)
            for target in (0.90, 0.95) for s, t in (("scalegnn", 1.0), ("graphsage", 4.0 if target == 0.9 else 2.0))]
    runs = runs_from_records(recs, [manifest("demo", "local", [(r, "") for r in recs])])
    lines = sorted(result_lines(runs))
    assert len(lines) == 2, lines
    assert lines[0].startswith("ScaleGNN reached 90 % test accuracy in 1.00 s at 1 GPU: 4.0x faster than GraphSAGE")
    assert lines[1].startswith("ScaleGNN reached 95 % test accuracy in 1.00 s at 1 GPU: 2.0x faster than GraphSAGE")


# ---------------------------------------------------------------------------- paper vs here
def test_paper_points_of_fig6_match_only_the_same_experiment():
    """A paper point matches a run of the same cluster, dataset (not a stand-in), system and
    GPU count; a generated stand-in for reddit matches nothing."""
    real = make_record("scalegnn", "reddit", grid=(1, 2, 2, 1), test=[0.96], epoch_s=[1.0], target=0.95)
    other_count = make_record("salient", "reddit", grid=(8, 1, 1, 1), test=[0.96], epoch_s=[1.0], target=0.95)
    stand_in = make_record("scalegnn", "csbm:n=20000,avg_degree=12", grid=(1, 2, 2, 1), test=[0.96],
                           epoch_s=[1.0], target=0.95)
    m = manifest("fig6", "perlmutter", [(r, "") for r in (real, other_count, stand_in)])
    m["runs"][2]["paper_dataset"] = "reddit"
    pp = F.paper_points_fig6(runs_from_records([real, other_count, stand_in], [m]))
    hit = pp[pp["matched"]]
    assert list(zip(hit["cluster"], hit["dataset"], hit["system"], hit["gpus"], hit["label"])) == \
        [("perlmutter", "reddit", "scalegnn", 4, "reddit")]
    assert len(pp) == 18 and pp["seconds"].notna().all()  # every Fig. 6 number of the paper, each once
    # The same run on CPUs, or to another target than the paper's 95 %, is another experiment.
    on_cpu = {**real, "env": {**real["env"], "device": "cpu (x86_64, 64 cores)", "device_type": "cpu"}}
    to_90 = {**real, "target_acc": 0.90}
    for other in (on_cpu, to_90):
        one = manifest("fig6", "perlmutter", [(other, "")])
        assert not F.paper_points_fig6(runs_from_records([other], [one]))["matched"].any()


def test_fig6_paper_vs_here_panel_when_no_experiment_matches():
    """Runs on a generated graph: Fig. 6 holds the measured points only, and the paper's
    panels (top row, hollow and dashed) sit beside the measured ones (bottom row)."""
    recs = [make_record(s, "csbm:n=10000,avg_degree=50,classes=8", grid=(g, 1, 1, 1), epoch_s=[t, t],
                        test=[0.9, 0.96], target=0.95) for s, g, t in
            (("scalegnn", 1, 0.5), ("graphsage", 1, 2.0), ("scalegnn", 2, 0.4), ("graphsage", 2, 1.5))]
    runs = runs_from_records(recs, [manifest("demo", "local", [(r, "") for r in recs])])
    fig = F.fig6_time_to_target(runs)
    assert not [ln for ax in fig.axes for ln in ax.get_lines() if "(paper)" in ln.get_label()]
    both = F.fig6_paper_vs_here(runs)
    titles = [ax.get_title() for ax in both.axes if ax.get_visible()]
    assert titles == ["paper: ogbn-products, perlmutter", "paper: reddit, perlmutter", "paper: ogbn-products, "
                      "frontier", "paper: reddit, frontier", "here: csbm n=10000 avg_degree=50, local"]
    top = both.axes[1]
    sg = [ln for ln in top.get_lines() if ln.get_label() == "ScaleGNN"][0]
    assert list(sg.get_xdata()) == [4, 16] and list(sg.get_ydata()) == [1.33, 0.98]
    assert sg.get_markerfacecolor() == "none" and sg.get_linestyle() == "None"  # the published points only
    assert "95% test acc" in top.get_ylabel()
    here = [ax for ax in both.axes if ax.get_title().startswith("here:")][0]
    mine = [ln for ln in here.get_lines() if ln.get_label() == "ScaleGNN"][0]
    assert list(mine.get_xdata()) == [1, 2] and list(mine.get_ydata()) == [1.0, 0.8]
    assert "3.8x vs GraphSAGE at 2 GPUs" in [t.get_text() for t in here.texts]


def test_fig7_paper_points_on_the_axes_or_beside_them():
    """Frontier products-14m at the paper's GPU counts: the paper's stated epoch times on
    Fig. 7's axes (hollow markers at its two published endpoints, no line between them: the
    curve between is not published); a generated graph: the speedup panels side by side."""
    recs = [make_record("scalegnn", "products-14m", (d, 4, 4, 2), [1.0, 9.0, 9.0]) for d in (1, 32)]
    runs = runs_from_records(recs, [manifest("fig7", "frontier", [(r, "") for r in recs])])
    pp = F.paper_points_fig7(runs)
    assert list(pp.loc[pp["matched"], "gpus"]) == [32, 1024]
    fig = F.fig7_strong_scaling(runs)
    ax = fig.axes[0]
    (paper,) = [ln for ln in ax.get_lines() if ln.get_label() == "products-14m, paper (published endpoints)"]
    assert list(paper.get_xdata()) == [32, 1024] and list(paper.get_ydata()) == [8809, 394]
    assert paper.get_markerfacecolor() == "none" and paper.get_linestyle() == "None" and paper.get_marker() == "o"
    assert "products-14m, paper (published endpoints)" in [t.get_text() for t in fig.legends[0].get_texts()]
    with pytest.raises(F.NoData, match="drawn on the measured axes"):
        F.fig7_paper_vs_here(runs)
    recs = [make_record("scalegnn", "csbm:n=10000,avg_degree=50", (d, 1, 1, 1), [1.0, 0.4, 0.4]) for d in (1, 2)]
    runs = runs_from_records(recs, [manifest("demo", "local", [(r, "") for r in recs])])
    assert not F.paper_points_fig7(runs)["matched"].any()
    a1, a2 = F.fig7_paper_vs_here(runs).axes
    lines = {ln.get_label(): ln for ln in a1.get_lines()}
    endpoints = lines["products-14m, frontier (32 -> 1024 GPUs)"]
    assert list(endpoints.get_ydata()) == [1.0, 22.4] and list(endpoints.get_xdata()) == [1, 32]
    assert all(ln.get_linestyle() == "None" for k, ln in lines.items() if k != "ideal")  # markers, no line
    assert "published endpoints" in a1.get_title()
    (here,) = [ln for ln in a2.get_lines() if ln.get_label() != "ideal"]
    assert list(here.get_xdata()) == [1, 2] and here.get_ydata()[-1] == pytest.approx(1.0)
    with pytest.raises(F.NoData):  # one run: no scaling curve, no panel (the report skips both)
        F.fig7_paper_vs_here(runs_from_records(recs[:1], [manifest("demo", "local", [(recs[0], "")])]))


# ---------------------------------------------------------------------------- what a reviewer sees
def _figure_inputs():
    """Every figure the report draws, from synthetic records: name -> a function building it."""
    def tagged(spec, cluster, recs):
        return runs_from_records(recs, [manifest(spec, cluster, [(r, "") for r in recs])])

    generated = "csbm:n=10000,avg_degree=50,classes=8"
    fig5 = [(make_record(grid=(gd, 2, 2, 2), epoch_s=[0.2, t, t], components={"pmm_comm": 0.05}), v)
            for gd in (1, 4) for v, t in (("baseline", 0.1), ("+prefetch", 0.08))]
    fig6 = [make_record(s, "reddit", grid=(g // 4, 2, 2, 1) if s == "scalegnn" else (g, 1, 1, 1),
                        epoch_s=[t, t], test=[0.9, 0.96], target=0.95)
            for s, g, t in (("scalegnn", 4, 1.0), ("scalegnn", 16, 0.3), ("salient", 4, 1.2), ("salient", 16, 2.0))]
    mine = [make_record(s, generated, grid=(g, 1, 1, 1), epoch_s=[t, t], test=[0.9, 0.96], target=0.95)
            for s, g, t in (("scalegnn", 1, 0.5), ("graphsage", 1, 2.0), ("scalegnn", 2, 0.4), ("graphsage", 2, 1.5))]
    matched7 = [make_record("scalegnn", "products-14m", (d, 4, 4, 2), [1.0, t, t]) for d, t in ((1, 9.0), (32, 0.5))]
    here7 = [make_record("scalegnn", generated, (d, 1, 1, 1), [1.0, t, t]) for d, t in ((1, 0.5), (2, 0.3))]
    model = pd.DataFrame({"grid": ["1x1x1x1", "1x2x1x1", "2x1x1x1"], "observed_s": [1.0, 0.6, 0.5],
                          "predicted_s": [1.1, 0.55, 0.5], "loo_s": [1.2, 0.5, 0.45], "dataset": ["d"] * 3,
                          "cluster": ["local"] * 3})
    return {
        "fig5": lambda: F.fig5_ablation(runs_from_records([r for r, _ in fig5], [manifest("fig5", "local", fig5)])),
        "fig6": lambda: F.fig6_time_to_target(tagged("fig6", "perlmutter", fig6)),
        "fig6_paper_vs_here": lambda: F.fig6_paper_vs_here(tagged("demo", "local", mine)),
        "fig7": lambda: F.fig7_strong_scaling(tagged("fig7", "frontier", matched7)),
        "fig7_paper_vs_here": lambda: F.fig7_paper_vs_here(tagged("demo", "local", here7)),
        "fig8": lambda: F.fig8_epoch_breakdown(tagged("fig8", "perlmutter", _scaling_records())),
        "plexus_fig5": lambda: F.plexus_fig5_model(model),
    }


def _drawn(fig):
    fig.canvas.draw()
    return fig.canvas.get_renderer()


def legends_over_axes(fig) -> list[str]:
    """Every legend (the figure's, its subfigures', the axes') whose box overlaps the
    plotting area of some axes: "legend text -> axes title"."""
    renderer = _drawn(fig)
    legends = [lg for f in [fig, *fig.subfigs] for lg in f.legends]
    legends += [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
    assert legends, "the figure has no legend"
    return [f"{lg.get_texts()[0].get_text()} -> {ax.get_title()}" for lg in legends for ax in fig.axes
            if lg.get_window_extent(renderer).overlaps(ax.bbox)]


def band_under_title(fig) -> float:
    """Inches of empty figure between the bottom of the figure's title and the top of the
    highest panel title (or panel, where it has no title)."""
    renderer = _drawn(fig)
    sup = fig._suptitle.get_window_extent(renderer)  # noqa: SLF001 - the suptitle has no public artist getter
    tops = [ax.title.get_window_extent(renderer).y1 if ax.get_title() else ax.bbox.y1 for ax in fig.axes]
    return (sup.y0 - max(tops)) / fig.dpi


@pytest.mark.parametrize("name", list(_figure_inputs()))
def test_every_figure_keeps_its_legend_off_the_data_and_its_title_on_the_panels(name):
    """Legends sit outside every axes (never over a line, a point or a bar), and the
    figure's title sits right above the panels' titles: no blank band between them."""
    fig = _figure_inputs()[name]()
    assert legends_over_axes(fig) == []
    assert 0.0 <= band_under_title(fig) < 0.15, f"{band_under_title(fig):.2f} in of blank band"


def _on(device_type, rec):
    """``rec`` as run on ``device_type`` (``env.device_type``: "cpu" or "cuda")."""
    rec["env"].update(device="cpu (x86_64, 2 cores)" if device_type == "cpu" else "A100", device_type=device_type)
    return rec


@pytest.mark.parametrize("devices, label", [(("cuda", "cuda"), "GPUs (ranks)"),
                                            (("cpu", "cpu"), "CPU processes (ranks)"),
                                            (("cuda", "cpu"), "ranks (GPU and CPU runs mixed)")])
def test_rank_axes_say_what_the_ranks_ran_on(devices, label):
    """The x axis of Fig. 6 and 7 (and Fig. 7 paper vs here's measured side) names GPUs
    only when every run of the panel ran on GPUs (the records' env.device_type)."""
    scaling = [_on(dev, make_record("scalegnn", "csbm:n=10000,avg_degree=50", (d, 1, 1, 1), [1.0, t, t]))
               for dev, d, t in zip(devices, (1, 2), (0.5, 0.3))]
    runs = runs_from_records(scaling, [manifest("demo", "local", [(r, "") for r in scaling])])
    assert F.fig7_strong_scaling(runs).axes[0].get_xlabel() == f"{label}; Gd grows from the first point"
    paper_side, here_side = F.fig7_paper_vs_here(runs).axes
    assert paper_side.get_xlabel() == "GPUs / first GPU count"  # the paper's ranks are GPUs
    noun = label.split(" (")[0]
    assert here_side.get_xlabel() == (f"{noun} / first count" if "mixed" not in label else
                                      "ranks / first count (GPU and CPU runs mixed)")
    timed = [_on(dev, make_record(s, grid=(g, 1, 1, 1), epoch_s=[1.0], test=[0.96], target=0.95))
             for dev, (s, g) in zip(devices, (("scalegnn", 1), ("scalegnn", 2)))]
    runs = runs_from_records(timed, [manifest("demo", "local", [(r, "") for r in timed])])
    assert F.fig6_time_to_target(runs).axes[0].get_xlabel() == label


def spread_bars(ax) -> list[tuple[float, float, float]]:
    """(x, low, high) of every min-max bar over seeds drawn on ``ax``, by x."""
    return sorted((float(seg[0][0]), *sorted((float(seg[0][1]), float(seg[1][1]))))
                  for coll in ax.collections if coll.get_gid() == F.SPREAD for seg in coll.get_segments())


def legend_texts(fig) -> list[str]:
    return [t.get_text() for f in [fig, *fig.subfigs] for lg in f.legends for t in lg.get_texts()]


def test_points_of_several_seeds_show_their_mean_and_min_max():
    """Three seeds per point: Fig. 7 draws their mean and a bar from the fastest to the
    slowest, Fig. 8 the same bar on the stacked bars, Fig. 7 paper vs here the speedups'
    bar; a point of one run has no bar, and the legend says what the bar is only when one is drawn."""
    def tagged(spec, recs):
        return runs_from_records(recs, [manifest(spec, "perlmutter", [(r, "") for r in recs])])

    seeds = {1: (0.09, 0.10, 0.14), 2: (0.05, 0.06, 0.07)}  # s per epoch, by Gd
    recs = [make_record("scalegnn", "products-14m", (d, 4, 4, 2), [1.0, t, t], seed=s)
            for d, times in seeds.items() for s, t in enumerate(times)]
    fig = F.fig7_strong_scaling(tagged("fig7", recs))
    ax = fig.axes[0]
    (curve,) = [ln for ln in ax.get_lines() if ln.get_label() == "products-14m"]
    assert list(curve.get_xdata()) == [32, 64] and np.allclose(curve.get_ydata(), [110, 60])  # ms, the means
    assert np.allclose(spread_bars(ax), [(32, 90, 140), (64, 50, 70)])
    assert "bar: min-max over seeds (point: mean)" in legend_texts(fig)
    ax8 = F.fig8_epoch_breakdown(tagged("fig8", recs)).axes[0]
    assert np.allclose(spread_bars(ax8), [(0, 90, 140), (1, 50, 70)])  # bars at x = 0, 1
    ablation = [(make_record(grid=(1, 2, 2, 2), epoch_s=[0.2, t, t], seed=s), v)
                for v, times in (("baseline", (0.09, 0.11)), ("+prefetch", (0.08,))) for s, t in enumerate(times)]
    fig5 = F.fig5_ablation(runs_from_records([r for r, _ in ablation], [manifest("fig5", "local", ablation)]))
    assert np.allclose(spread_bars(fig5.axes[0]), [(0, 90, 110)])  # the baseline's two seeds; +prefetch ran once
    assert "bar: min-max over seeds (bar top: mean)" in legend_texts(fig5)
    one = [r for r in recs if r["seed"] == 0]  # one run per point: no bar, no legend entry
    fig = F.fig7_strong_scaling(tagged("fig7", one))
    assert spread_bars(fig.axes[0]) == [] and not [t for t in legend_texts(fig) if "min-max" in t]
    generated = [make_record("scalegnn", "csbm:n=10000,avg_degree=50", (d, 1, 1, 1), [1.0, t, t], seed=s)
                 for d, times in seeds.items() for s, t in enumerate(times)]
    fig = F.fig7_paper_vs_here(tagged("demo", generated))
    here = fig.axes[1]
    # speedups over the first count's mean (0.11 s): the bar at 2 spans 0.11 / 0.07 .. 0.11 / 0.05
    assert np.allclose(spread_bars(here)[-1], (2.0, 0.11 / 0.07, 0.11 / 0.05))
    assert "bar: min-max over seeds (point: mean)" in legend_texts(fig)


def test_fig6_seeds_bar_over_the_runs_that_reached_the_target():
    """Time to target of three seeds: the point is their median (as in the table), the
    bar their min-max; where one seed missed, the bar covers the two that reached it and
    the panel says "2 of 3 runs reached it"."""
    reach, miss = [0.9, 0.96], [0.9, 0.93]
    recs = [make_record("scalegnn", grid=(1, 2, 2, 1), epoch_s=[t, t], test=reach, target=0.95, seed=s)
            for s, t in enumerate((0.5, 0.6, 0.8))]
    recs += [make_record("scalegnn", grid=(4, 2, 2, 1), epoch_s=[t, t], test=acc, target=0.95, seed=s)
             for s, (t, acc) in enumerate(((0.2, reach), (0.3, reach), (0.1, miss)))]
    runs = runs_from_records(recs, [manifest("fig6", "local", [(r, "") for r in recs])])
    fig = F.fig6_time_to_target(runs)
    ax = fig.axes[0]
    (sg,) = [ln for ln in ax.get_lines() if ln.get_label() == "ScaleGNN"]
    assert list(sg.get_xdata()) == [4, 16] and list(sg.get_ydata()) == pytest.approx([1.2, 0.5])
    assert np.allclose(spread_bars(ax), [(4, 1.0, 1.6), (16, 0.4, 0.6)])
    assert "2 of 3 runs reached it" in texts(fig)
    assert "bar: min-max over seeds (point: median)" in legend_texts(fig)


def test_baseline_tables_aggregate_seeds_and_mark_missed_targets():
    from scalegnn.analysis.tables import accuracy_table, time_to_target_table

    def rec(system, seed, at_val, best, world=1, ttt=None, accs=(0.5, 0.93)):
        epochs = [{"epoch": i + 1, "test_acc": a, "train_time_s": 2.0 * (i + 1)} for i, a in enumerate(accs)]
        return {"system": system, "dataset": "facebook", "status": "ok", "world_size": world, "seed": seed,
                "target_acc": 0.92, "time_to_target_s": ttt, "epochs": epochs,
                "summary": {"test_acc_at_best_val": at_val, "best_test_acc": best}}

    recs = [rec("scalegnn", 0, 0.90, 0.92), rec("scalegnn", 1, 0.92, 0.94), rec("graphsage", 0, 0.80, 0.81)]
    table = accuracy_table(recs)
    assert "| scalegnn | 91.00 ± 1.41 (n=2) |" in table and "| graphsage | 80.00 (1 seed) |" in table
    assert "| scalegnn | 93.00 ± 1.41 (n=2) |" in accuracy_table(recs, "best_test_acc")
    ttt = time_to_target_table([rec("scalegnn", 0, 0.9, 0.93, ttt=4.0),
                                rec("graphsage", 0, 0.8, 0.81, world=2, accs=(0.7, 0.81))])
    assert "4.0 s (2 ep)" in ttt and "× 0.810 best, 4.0 s (2 ep)" in ttt
    # several seeds: mean ± std of the runs that reached the target, their epochs, and how many did
    seeds = [rec("cagnet-1d", 0, 0.9, 0.93, ttt=4.0), rec("cagnet-1d", 1, 0.9, 0.95, ttt=6.0, accs=(0.5, 0.6, 0.95)),
             rec("cagnet-1d", 2, 0.9, 0.91, accs=(0.5, 0.91))]
    assert "| cagnet-1d | 5.0 ± 1.4 s (2-3 ep, 2 of 3 reached it) |" in time_to_target_table(seeds)
    assert "| cagnet-1d | 5.0 ± 1.4 s (2-3 ep, n=2) |" in time_to_target_table(seeds[:2])
    assert "none of 2 reached it" in time_to_target_table([seeds[2], seeds[2]])


def test_analysis_reports_and_skips_every_kind_of_bad_record(tmp_path):
    good = records.write_record(minimal_record(), tmp_path)
    bad = {
        "truncated.json": '{"schema_version": 1, "run_id": "x", "epo',
        "empty.json": "",
        "binary.json": b"\x80\x81\xfe\xff",
        "newer.json": json.dumps(minimal_record(schema_version=records.SCHEMA_VERSION + 1)),
        "list.json": "[1, 2]",
        "row.json": json.dumps(minimal_record(epochs=[3])),
        "components.json": json.dumps(minimal_record(epochs=[{**minimal_record()["epochs"][0], "components": 5}])),
        "nofields.json": json.dumps({"schema_version": 1}),
    }
    for name, text in bad.items():
        (tmp_path / name).write_bytes(text if isinstance(text, bytes) else text.encode())
    (tmp_path / "folder.json").mkdir()  # unreadable as a file
    with pytest.warns(UserWarning) as warned:
        runs = load_runs(tmp_path)
    assert runs["run_id"].tolist() == [records.read_record(good)["run_id"]]
    skipped = dict(runs.attrs["skipped"])
    assert set(skipped) == {str(tmp_path / n) for n in [*bad, "folder.json"]}
    assert "newer than this scalegnn understands" in skipped[str(tmp_path / "newer.json")]
    assert "upgrade scalegnn" in skipped[str(tmp_path / "newer.json")]
    assert "truncated or corrupt" in skipped[str(tmp_path / "truncated.json")]
    assert "cannot be read" in skipped[str(tmp_path / "folder.json")]
    assert len(warned) >= len(skipped) and all(str(tmp_path) in str(w.message) for w in warned)
    with pytest.warns(UserWarning):
        assert len(load_epochs(tmp_path)) == 2


def test_a_resumed_chain_is_read_whole_and_counted_once(tmp_path):
    """A resume writes a record of its own that names its parent (``resumed_from``) and holds
    the parent's epochs before its own. Every record is read; the frames and tables keep the
    latest of a chain: a finished run continued to more epochs, a preempted run that a
    requeue finished, and a parent tried twice (a resume that failed before its first
    checkpoint, then one that finished) each count once, with no epoch counted twice."""
    from scalegnn.analysis import read_records

    def child(parent, epochs, status="ok"):
        rec = make_record(epoch_s=(0.1,) * epochs, test=[0.5 + 0.01 * i for i in range(epochs)], status=status)
        rec["epochs"][:len(parent["epochs"])] = parent["epochs"]
        return {**rec, "resumed_from": parent["run_id"]}

    finished = make_record(epoch_s=(0.1,) * 4, test=[0.5, 0.51, 0.52, 0.53])
    more = child(finished, 6)
    preempted = make_record(epoch_s=(0.1,) * 2, test=[0.5, 0.51], status="running")
    requeued = child(preempted, 3)
    tried = make_record(epoch_s=(0.1,) * 2, test=[0.5, 0.51], status="interrupted")
    failed, again = child(tried, 2, status="failed"), child(tried, 4)
    alone = make_record(epoch_s=(0.1,) * 3)
    recs = [finished, more, preempted, requeued, tried, failed, again, alone]
    for r in recs:
        records.summarize(r)
        records.write_record(r, tmp_path / "runs" / r["run_id"])
    assert len(read_records(tmp_path)[0]) == 8
    runs = load_runs(tmp_path)
    assert sorted(runs["run_id"]) == sorted(r["run_id"] for r in (more, requeued, again, alone))
    assert sorted(runs.attrs["continued"]) == sorted(r["run_id"] for r in (finished, preempted, tried, failed))
    assert set(runs["status"]) == {"ok"} and sorted(runs["epochs_run"]) == [3, 3, 4, 6]
    assert len(load_epochs(tmp_path)) == 3 + 3 + 4 + 6
    table = T.accuracy_table(T._records(tmp_path))
    assert "| scalegnn | " in table and "(n=4)" in table
    assert "8 run records (4 ok, 0 not ok, 4 continued by a resume)" in write_report(
        tmp_path, tmp_path / "report").read_text()


def test_load_runs_puts_the_comparison_fields_first_and_blanks_settings_a_system_ignores():
    """test_acc_at_best_val (the model selection: best validation, not best test), the
    batch in words per system, and config.sampling.batch_ratio blank for GraphSAGE, which
    does not read it, but kept for ScaleGNN."""
    ours = make_record(test=(0.5, 0.8, 0.7))
    ours["epochs"][1]["val_acc"], ours["epochs"][2]["val_acc"] = 0.6, 0.9  # best val at epoch 3, best test at 2
    ours["config"]["sampling"] = {"batch_ratio": 0.1}
    records.summarize(ours)
    sage = make_record(system="graphsage")
    sage["config"].update(sampling={"batch_ratio": 0.1}, options={"fanouts": [15, 10, 5]})
    records.summarize(sage)
    full = make_record(system="fullgraph-3d")
    frame = runs_from_records([ours, sage, full], [])
    assert list(frame.columns[:8]) == ["run_id", "system", "dataset", "world_size", "grid_str", "status",
                                       "test_acc_at_best_val", "best_test_acc"]
    runs = frame.set_index("system")
    assert runs.loc["scalegnn", "test_acc_at_best_val"] == 0.7 and runs.loc["scalegnn", "best_test_acc"] == 0.8
    assert runs.loc["scalegnn", "best_epoch"] == 3
    assert runs.loc["scalegnn", "batch"] == "100 vertices sampled uniformly (batch_ratio x N)"
    assert runs.loc["graphsage", "batch"] == "100 seed vertices, fan-outs 15,10,5"
    assert runs.loc["fullgraph-3d", "batch"] == "the whole graph (1,000 vertices)"
    assert runs.loc["scalegnn", "config.sampling.batch_ratio"] == 0.1
    assert pd.isna(runs.loc["graphsage", "config.sampling.batch_ratio"])
