"""``scalegnn report RESULTS_DIR --out DIR``: every figure (PNG and PDF) and a Markdown report.

The report holds, for whatever the results folder contains: the paper's Fig. 5-8
and Tables I-II with "paper" next to "measured here" where the same experiment
exists, the performance model's validation (Plexus Fig. 5) and load balance
(Plexus Table 3), the provenance of every run (host, device, versions, commit) and
the list of failed or missing runs. A figure without runs is listed with the sweep
that would produce it, never silently left out.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import os
from pathlib import Path

import pandas as pd

from scalegnn.records import git_commit

from . import figures as F
from . import tables as T
from .load import read_manifests, read_records, runs_from_records
from .paper import paper_numbers
from .verdict import result_lines

__all__ = ["write_report"]

FIGURES = [  # (file stem, title, function, sweep that feeds it)
    ("fig5_ablation", "Fig. 5: cumulative optimization breakdown", "fig5", "fig5"),
    ("fig6_time_to_target", "Fig. 6: training time to target accuracy", "fig6", "fig6 (or demo)"),
    ("fig7_strong_scaling", "Fig. 7: strong scaling", "fig7", "fig7 (or demo)"),
    ("fig8_epoch_breakdown", "Fig. 8: epoch time breakdown vs Gd", "fig8", "fig8 (or demo)"),
]


def _save(fig, out: Path, stem: str) -> list[str]:
    import matplotlib.pyplot as plt

    names = []
    for ext in ("png", "pdf"):
        path = out / f"{stem}.{ext}"
        fig.savefig(path, dpi=130 if ext == "png" else None, metadata={"CreationDate": None} if ext == "pdf" else None)
        names.append(path.name)
    plt.close(fig)
    return names


def _balances(runs: pd.DataFrame, data_root: str | None, limit: int = 3, max_nodes: int = 2_000_000) -> dict:
    """Load balance of up to ``limit`` datasets of the runs that load offline and are small."""
    from scalegnn.datasets import load_dataset

    from scalegnn.permutation import power_law_graph

    # A graph whose stored order has locality (R-MAT in generation order: hubs at low
    # ids), the situation Plexus' table is about; our generated datasets are shuffled.
    out = {"rmat:scale=14 in generation order (hubs first)": T.load_balance(power_law_graph(14, 16, 0))}
    if runs.empty:
        return out
    sizes = runs.groupby("dataset")["graph.num_nodes"].max() if "graph.num_nodes" in runs else pd.Series(dtype=float)
    old = os.environ.get("SCALEGNN_OFFLINE")
    os.environ["SCALEGNN_OFFLINE"] = "1"
    try:
        for ds, n in sizes.sort_values().items():
            if len(out) > limit or not n or n > max_nodes:
                continue
            try:
                out[ds] = T.load_balance(load_dataset(ds, data_root=data_root))
            except Exception:  # noqa: BLE001 - a dataset that is not here is simply not measured
                continue
    finally:
        if old is None:
            os.environ.pop("SCALEGNN_OFFLINE", None)
        else:
            os.environ["SCALEGNN_OFFLINE"] = old
    return out


def _fmt_acc(frame: pd.DataFrame) -> pd.DataFrame:
    f = frame.copy()
    f["measured here (%)"] = [
        "" if pd.isna(m) else (f"{m:.1f} ± {s:.1f} ({int(n)} runs)" if n and n > 1 else f"{m:.1f}")
        for m, s, n in zip(f["measured"], f["spread"], f["runs"])]
    return f


def write_report(results_dir, out_dir, *, data_root: str | None = None, title: str | None = None,
                 paper_machines: dict | None = None) -> Path:
    """Write ``out_dir/report.md`` and the figures; returns the report's path. ``paper_machines``
    ({cluster: Machine} of Perlmutter, Frontier and Tuolumne, from their profiles) adds the
    performance model against the paper's Fig. 5/7/8 numbers (``analysis.paper_model``)."""
    results_dir, out = Path(results_dir), Path(out_dir)
    records, skipped = read_records(results_dir)  # first: a missing folder is an error, not made by mkdir below
    with _writing(out):
        return _write_report(results_dir, out, records, skipped, data_root, title, paper_machines)


# What the checks before the work (scalegnn.fileio.check_output_folder) cannot rule out:
# a disk that fills while the figures are written, a path the file system finds too long.
_WRITE_FIXES = {errno.ENOSPC: "free space there or pass --out on another disk",
                errno.EDQUOT: "free some of your quota there or pass --out elsewhere",
                errno.ENAMETOOLONG: "pass a shorter --out"}


@contextlib.contextmanager
def _writing(out: Path):
    """Writing the report into ``out``: an error of :data:`_WRITE_FIXES` is one line
    (``ValueError``) naming the file and the fix."""
    try:
        yield
    except OSError as exc:
        if exc.errno not in _WRITE_FIXES:
            raise
        raise ValueError(f"report folder {out}: cannot write {exc.filename or out} ({exc.strerror}); "
                         f"{_WRITE_FIXES[exc.errno]}") from None


def _write_report(results_dir: Path, out: Path, records: list[dict], skipped: list, data_root, title,
                  paper_machines) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    manifests = read_manifests(results_dir)
    runs = runs_from_records(records, manifests)
    paper = paper_numbers()
    ok = int((runs["status"] == "ok").sum()) if not runs.empty else 0
    md: list[str] = []
    add = md.append
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    add(f"# {title or 'ScaleGNN harness report'}\n")
    # the result first, in one line per graph (analysis.verdict): ScaleGNN against every
    # system at the same process count, densest graph first, then where it does not hold
    for i, text in enumerate(result_lines(runs) if not runs.empty else []):
        add(f"{'**Result:** ' if i == 0 else ''}{text}\n")
    commit = git_commit(short=12) or "unknown"
    add(f"Generated {now} by `scalegnn report {results_dir}` (scalegnn commit `{commit}`).\n")
    continued = len(runs.attrs.get("continued", []))  # resumed later: counted in the run that continued them
    add(f"- {len(records)} run records ({ok} ok, {len(records) - continued - ok} not ok"
        + (f", {continued} continued by a resume" if continued else "") + f"), "
        f"{len(skipped)} unreadable files skipped")
    specs = sorted({f"`{m['spec']}` on `{m['cluster']}`" for m in manifests})
    add(f"- sweeps: {', '.join(specs) if specs else 'none (records not launched by `scalegnn sweep`)'}")
    if not runs.empty:
        hosts = runs.groupby(["env.hostname", "env.device"]).size()
        add("- machines: " + "; ".join(f"{h} ({d}): {n} runs" for (h, d), n in hosts.items()))
    add("\nPaper numbers come from `analysis/paper_numbers.toml` (the papers' tables and text). "
        "They sit next to a measured number only for the same experiment: same system and dataset "
        "(never a generated stand-in), and for timings the same cluster and GPU count. In the figures the "
        "paper's points are drawn on the measured axes (hollow markers with no line: only the published points "
        "are known, the paper's Fig. 7 text gives the first and last GPU count of each curve) only for such an "
        "experiment; where there is none, a \"paper vs here\" figure shows both, each on its own axes.\n")

    # ------------------------------------------------------------------ figures
    for stem, heading, kind, sweep in FIGURES:
        add(f"\n## {heading}\n")
        fn = {"fig5": F.fig5_ablation, "fig6": lambda r: F.fig6_time_to_target(r, _references(manifests)),
              "fig7": F.fig7_strong_scaling, "fig8": F.fig8_epoch_breakdown}[kind]
        try:
            if runs.empty:
                raise F.NoData("no runs")
            fig = fn(runs)
        except F.NoData as exc:
            add(f"_No data: {exc}. Produce it with `scalegnn sweep {sweep.split()[0]} --cluster NAME`._\n")
            fig = None
        if fig is not None:
            png, pdf = _save(fig, out, stem)
            add(f"![{heading}]({png})\n\n[PDF]({pdf})\n")
            _paper_vs_here(kind, runs, manifests, paper, out, add)
        if kind == "fig5":
            tab = T.fig5_reductions(runs, paper) if not runs.empty else pd.DataFrame()
            if not tab.empty:
                add(T.markdown(tab, {"epoch_ms": ".1f", "reduction": ".1%", "speedup_vs_first": ".2f",
                                     "paper_reduction": ".0%"},
                               {"cluster": "cluster", "dataset": "dataset", "Gd": "Gd", "variant": "variant",
                                "epoch_ms": "epoch (ms)", "reduction": "reduction vs previous",
                                "speedup_vs_first": "speedup vs baseline", "paper_reduction": "paper reduction",
                                "note": "note"}))
            p5 = paper.get("fig5", {})
            cum = p5.get("cumulative_speedup", {})
            add(f"Paper (Perlmutter, ogbn-products, 2x2x2 per DP group): cumulative speedup "
                f"{cum.get('DP1')}x (DP1) and {cum.get('DP4')}x "
                f"(DP4); per step: prefetch -24%, BF16 communication -17%/-16%, kernel fusion -6%/-4%, "
                f"communication overlap -3%/-2%.\n")
        if kind == "fig6":
            tab = T.fig6_times(runs, paper)
            add("Time to target (s), paper (ScaleGNN Section VII-B) and measured here (where several grids ran "
                "at one GPU count, the fastest); for runs that did not reach the target, the time to their best "
                "accuracy (`best acc`).\n")
            for line in T.mixed_devices(runs, "fig6") if not runs.empty else []:
                add(line + "\n")
            if not runs.empty and (line := T.tuned_settings(runs, "fig6")):
                add(line + "\n")
            add(T.markdown(tab, {"paper": ".2f", "measured": ".2f", "target": ".0f", "best_acc": ".1f"},
                           {"cluster": "cluster", "dataset": "dataset", "system": "system", "gpus": "GPUs",
                            "paper": "paper (s)", "measured": "measured (s)", "grid": "grid", "reached": "reached",
                            "target": "target (%)", "best_acc": "best acc (%)", "device": "device",
                            "note": "note"}))
        if kind == "fig7":
            tab = T.fig7_speedups(runs, paper)
            add(T.markdown(tab, {"paper_speedup": ".1f", "measured_speedup": ".2f", "ideal": ".0f"},
                           {"cluster": "cluster", "dataset": "dataset", "gpus": "GPUs (paper)",
                            "paper_epoch_ms": "paper epoch (ms)", "paper_speedup": "paper speedup",
                            "measured_gpus": "GPUs (here)", "grid3d": "3D grid", "measured_epoch_ms": "epoch (ms)",
                            "measured_speedup": "speedup", "ideal": "ideal", "note": "note"}))

    # ------------------------------------------------------------------ tables
    add("\n## Table I: test accuracy\n")
    add("Best test accuracy over the run's evaluations (the paper's Table I metric); "
        "mean ± standard deviation over seeds when there are several.\n")
    if not runs.empty and (line := T.tuned_settings(runs, "table1")):
        add(line + "\n")
    t1 = _fmt_acc(T.table1_accuracy(runs, paper))
    add(T.markdown(t1, {"paper": ".1f"}, {"dataset": "dataset", "system": "system", "paper": "paper (%)",
                                          "measured here (%)": "measured here (%)", "gpus": "GPUs", "note": "note"}))
    add("\n## Table II: time per evaluation round\n")
    add("Median wall time of one evaluation round (full-graph inference for ScaleGNN). "
        "The paper's numbers are Perlmutter's.\n")
    for line in T.mixed_devices(runs, "table2") if not runs.empty else []:
        add(line + "\n")
    add(T.markdown(T.table2_eval_time(runs, paper), {"paper": ".2f", "measured": ".3f", "runs": ".0f"},
                   {"cluster": "cluster", "dataset": "dataset", "gpus": "GPUs", "system": "system",
                    "paper": "paper (s)", "measured": "measured (s)", "runs": "runs", "device": "device",
                    "note": "note"}))

    # ------------------------------------------------------------------ performance model
    add("\n## Performance model: predicted vs observed (Plexus Section 4, Fig. 5)\n")
    _perfmodel_section(runs, manifests, out, add)
    if paper_machines:
        add("\n## Performance model at the paper's scale (Fig. 5, 7, 8)\n")
        _paper_model_section(paper_machines, out, add)

    add("\n## Load balance (Plexus Table 3)\n")
    add("max / mean stored entries over 8 x 8 blocks of the adjacency (self loops included): original vertex "
        "order, one random permutation P A P^T, and Plexus' double permutation P_r A P_c^T. "
        "The paper's row is europe_osm; ours are an R-MAT graph kept in generation order and the datasets of "
        "these runs that load offline (computed by `scalegnn.permutation.load_balance`).\n")
    add(T.markdown(T.plexus_table3(_balances(runs, data_root), paper),
                   {"original": ".3f", "single": ".3f", "double": ".3f"}))

    # ------------------------------------------------------------------ datasets, provenance, failures
    add("\n## Datasets\n")
    if not runs.empty:
        stats = {"nodes": "graph.num_nodes", "entries": "graph.adjacency_nnz", "features": "graph.num_features",
                 "classes": "graph.num_classes"}  # a record may hold no graph statistics (the schema allows it)
        ds = runs.groupby("dataset").agg(**{k: (c, "max") for k, c in stats.items() if c in runs},
                                         runs=("run_id", "count")).reset_index()
        add(T.markdown(ds, {"nodes": ",.0f", "entries": ",.0f", "features": ".0f", "classes": ".0f"},
                       {"dataset": "dataset (full name)", "nodes": "vertices", "entries": "adjacency entries",
                        "features": "features", "classes": "classes", "runs": "runs"}))
    add("\n## Provenance of every run\n")
    prov = T.provenance(runs)
    if prov.attrs.get("libraries"):
        add(f"Every run had the same other libraries: {prov.attrs['libraries']}.\n")
    add(T.markdown(prov))
    add("\n## Failed or missing runs\n")
    fails = T.failures(manifests, runs)
    if skipped:
        fails = pd.concat([fails, pd.DataFrame([{"sweep": "", "system": "", "dataset": "", "grid": "",
                                                 "state": "unreadable", "detail": reason, "key": path}
                                                for path, reason in skipped])], ignore_index=True)
    add("None: every run of every sweep manifest has an ok record.\n" if fails.empty else T.markdown(fails))
    path = out / "report.md"
    try:
        path.write_text("\n".join(md))
    except OSError as exc:  # a full disk tells at the close, which names no file
        exc.filename = exc.filename or str(path)
        raise
    return path


def _paper_vs_here(kind: str, runs: pd.DataFrame, manifests: list[dict], paper: dict, out: Path, add) -> None:
    """Where no run here is the paper's experiment, the paper's figure and ours side by
    side, each on its own axes (where one is, the paper's points are on the figure itself)."""
    fn = {"fig6": lambda: F.fig6_paper_vs_here(runs, _references(manifests), paper),
          "fig7": lambda: F.fig7_paper_vs_here(runs, paper)}.get(kind)
    if fn is None:
        return
    try:
        fig = fn()
    except F.NoData:
        return
    stem = f"{kind}_paper_vs_here"
    png, pdf = _save(fig, out, stem)
    add(f"Paper vs here (no experiment here is the paper's: same cluster, dataset and GPU count):\n\n"
        f"![{kind} paper vs here]({png})\n\n[PDF]({pdf})\n")


def _references(manifests: list[dict]) -> dict:
    ref = {}
    for m in manifests:
        ref.update(m.get("reference") or {})
    return ref


def _paper_model_section(machines: dict, out: Path, add) -> None:
    from .paper_model import fig7_model_curves, format_table, paper_table

    rows, net = paper_table(machines)
    png, pdf = _save(F.fig7_model_vs_paper(fig7_model_curves(machines, net)), out, "fig7_model_vs_paper")
    add(f"![Fig. 7: model vs paper]({png})\n\n[PDF]({pdf})\n")
    add("The model's prediction for every number the paper prints in Fig. 5 and 7 (and Fig. 8's claim), on the "
        "paper's grids, from the cluster profiles' hardware constants with one fitted multiplier per machine "
        "(`scalegnn plan --paper`; assumptions and sources: docs/performance.md).\n")
    add("```\n" + format_table(rows, net, machines["frontier"]) + "\n```\n")


def _perfmodel_section(runs: pd.DataFrame, manifests: list[dict], out: Path, add) -> None:
    from .perfmodel import error_summary, machines_of, validation_frame, volume_check

    v = validation_frame(runs, machines_of(manifests)) if not runs.empty else pd.DataFrame()
    if v.empty:
        add("_No data: at least 8 runs of the `perfmodel` sweep are needed "
            "(`scalegnn sweep perfmodel --cluster local`)._\n")
        return
    png, pdf = _save(F.plexus_fig5_model(v), out, "plexus_fig5_perfmodel")
    add(f"![Predicted vs observed epoch time]({png})\n\n[PDF]({pdf})\n")
    s = error_summary(v)
    add(f"Fitted on {s['runs']} runs recorded here (non-negative least squares on relative error, "
        f"`scalegnn.perfmodel`). Mean absolute error **{100 * s['mape_fit']:.1f}%** in-sample "
        f"(max {100 * s['max_fit']:.1f}%), **{100 * s['mape_loo']:.1f}%** leave-one-out "
        f"(max {100 * s['max_loo']:.1f}%: each run predicted by a fit that did not see it). "
        f"Rank correlation (Spearman, leave-one-out) {s['spearman_loo']:.2f}; fastest grid observed "
        f"`{s['fastest_observed']}`, predicted `{s['fastest_predicted_loo']}`. "
        f"For comparison, Plexus reports R^2 0.89 (train) / 0.79 (test) for its SpMM-time regression.\n")
    for ex in v.attrs.get("excluded", []):
        add(f"Not in the fit: grid `{ex['grid']}` ({ex['reason']}): observed {ex['observed_s']:.3f} s, "
            f"the fitted model says {ex['predicted_s']:.3f} s ({100 * ex['error']:+.0f}%).\n")
    coefs = v.attrs.get("coefficients", {})
    for cluster, c in coefs.items():
        add(f"Coefficients on `{cluster}` (multipliers of the profile's constants): "
            + ", ".join(f"{k} {val:.3g}" for k, val in c.values.items()) + "\n")
    add(T.markdown(v.sort_values("observed_s"),
                   {"observed_s": ".3f", "predicted_s": ".3f", "loo_s": ".3f", "error": "+.1%", "loo_error": "+.1%"},
                   {"grid": "grid", "world_size": "ranks", "observed_s": "observed (s)", "predicted_s": "fit (s)",
                    "error": "fit error", "loo_s": "leave-one-out (s)", "loo_error": "LOO error"}))
    vol = volume_check(runs)
    if not vol.empty:
        agg = vol.groupby("kind").agg(runs=("grid", "count"), predicted=("predicted_bytes", "sum"),
                                      recorded=("recorded_bytes", "sum")).reset_index()
        agg["predicted / recorded"] = agg["predicted"] / agg["recorded"]
        add("\nCommunication volume, model vs record (bytes per epoch sent by rank 0, summed over these runs; "
            "the model uses even splits, the runs' sampled row blocks vary per step):\n")
        add(T.markdown(agg, {"predicted": ",.0f", "recorded": ",.0f", "predicted / recorded": ".3f"}))
