"""The paper's tables, "paper vs measured here", provenance and failures, from the runs frame.

Paper and measured numbers sit in one row only when they come from the same
experiment: the same system and dataset (a generated stand-in is never compared
with the dataset it stands in for), and for timings also the same cluster and GPU
count. Rows of the paper that were not measured here keep an empty "measured"
cell, and measured rows without a paper counterpart an empty "paper" cell.
"""

from __future__ import annotations

import statistics
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pandas as pd

from scalegnn import systems as registry

from .figures import _cluster, _variant, fastest_grid_time, select, short_dataset
from .paper import canonical_dataset, fig6_points, paper_numbers

__all__ = ["table1_accuracy", "table2_eval_time", "fig6_times", "fig7_speedups", "fig5_reductions", "mixed_devices",
           "tuned_settings",
           "load_balance", "plexus_table3", "provenance", "failures", "markdown", "accuracy_table",
           "time_to_target_table", "eval_time_table"]

def _sys_key(s: str) -> int:
    return registry.order_key(s)


def _real(frame: pd.DataFrame) -> pd.Series:
    """True where the run is on the dataset itself, not on a stand-in for another."""
    paper = frame["sweep.paper_dataset"] if "sweep.paper_dataset" in frame else pd.Series(index=frame.index)
    return paper.isna() | (paper == frame["dataset"])


def _note(row) -> str:
    p = row.get("sweep.paper_dataset")
    return f"stand-in for {p}" if isinstance(p, str) and p and p != row["dataset"] else ""


def _device(sub: pd.DataFrame) -> str:
    """The kinds of device the runs of ``sub`` computed on ("gpu", "cpu", "cpu/gpu")."""
    kinds = sorted(set(sub["device_kind"].dropna())) if "device_kind" in sub else []
    return "/".join(kinds)


def mixed_devices(runs: pd.DataFrame, figure: str) -> list[str]:
    """One warning per (cluster, dataset) of ``figure``'s runs whose systems computed on
    different kinds of device: a GPU run against a CPU one measures the hardware, not
    the method, and must never read as a fair comparison."""
    frame = select(runs, figure)
    if frame.empty or "device_kind" not in frame:
        return []
    out = []
    frame = frame.assign(_cluster=_cluster(frame))
    for (cl, ds), sub in frame.groupby(["_cluster", "dataset"]):
        kinds = sub.groupby("system")["device_kind"].agg(lambda k: "/".join(sorted(set(k))))
        if kinds.nunique() > 1:
            where = ", ".join(f"{system} on {kind}" for system, kind in kinds.items())
            out.append(f"**Mixed devices** ({_short(ds)}, {cl}): {where}. Times across devices compare the "
                       "hardware, not the systems: they are not a fair comparison.")
    return out


def tuned_settings(runs: pd.DataFrame, figure: str) -> str:
    """One line on where ``figure``'s runs took their settings: how many from a ``scalegnn
    tune`` search (their record's ``config.tuned_from``) and for which systems, the rest
    at their own (paper or default) settings; empty without runs."""
    frame = select(runs, figure)
    if frame.empty:
        return ""
    col = "config.tuned_from"
    tuned = frame[col].notna() if col in frame else pd.Series(False, index=frame.index)
    if not tuned.any():
        return ("**Settings**: every run at its own settings (paper or defaults), none chosen by `scalegnn tune`: "
                "no system was tuned for this comparison.")
    systems = ", ".join(sorted(frame.loc[tuned, "system"].unique()))
    untuned = sorted(frame.loc[~tuned, "system"].unique())
    rest = (f"; {int((~tuned).sum())} at their own settings ({', '.join(untuned)})" if untuned else
            "; every system tuned under the same budget")
    return (f"**Settings**: {int(tuned.sum())} of {len(frame)} runs at the settings `scalegnn tune` chose "
            f"({systems}: `config.tuned_from` names each search){rest}.")


def _short(ds: str) -> str:
    """``csbm:n=20000,avg_degree=12,...`` -> ``csbm n=20000 avg_degree=12``; other names unchanged."""
    return short_dataset(ds)


# ---------------------------------------------------------------------------- Table I
def table1_accuracy(runs: pd.DataFrame, paper: dict | None = None) -> pd.DataFrame:
    """Best test accuracy (%) per (dataset, system): paper Table I and measured here
    (mean, spread and count over seeds)."""
    paper = paper if paper is not None else paper_numbers()
    frame = select(runs, "table1")
    frame = frame[frame["best_test_acc"].notna()] if "best_test_acc" in frame else frame.iloc[0:0]
    rows = {}
    for ds, systems in paper.get("table1", {}).items():
        for system, acc in systems.items():
            rows[(ds, system)] = {"dataset": ds, "system": system, "paper": float(acc)}
    if not frame.empty:
        frame = frame.assign(_real=_real(frame), _note=frame.apply(_note, axis=1))
        for (ds, system, real, note), sub in frame.groupby(["dataset", "system", "_real", "_note"], dropna=False):
            key = (canonical_dataset(ds), system) if real else (ds, system)
            acc = 100 * sub["best_test_acc"].astype(float)
            row = rows.setdefault(key, {"dataset": _short(key[0] if real else ds), "system": system,
                                        "paper": np.nan})
            stopped = "config.loop.stop_at_target" in sub and sub["config.loop.stop_at_target"].eq(True).any()
            if stopped and sub["time_to_target_s"].notna().any():  # training ended at the target, not at its best
                note = "; ".join(n for n in (note, "stopped at the target accuracy: a lower bound") if n)
            row.update(measured=acc.mean(), spread=acc.std(ddof=0) if len(acc) > 1 else 0.0, runs=len(acc),
                       gpus=",".join(str(int(g)) for g in sorted(sub["world_size"].unique())), note=note)
    out = pd.DataFrame(list(rows.values()))
    for col in ("measured", "spread", "runs", "gpus", "note"):
        if col not in out:
            out[col] = np.nan if col in ("measured", "spread", "runs") else ""
    out["note"] = out["note"].fillna("")
    out["gpus"] = out["gpus"].fillna("")
    return out.sort_values(["dataset", "system"], key=lambda s: s.map(_sys_key) if s.name == "system" else s,
                           kind="stable").reset_index(drop=True)


# ---------------------------------------------------------------------------- Table II
def table2_eval_time(runs: pd.DataFrame, paper: dict | None = None) -> pd.DataFrame:
    """Seconds per evaluation round per (dataset, GPUs, system): paper Table II
    (Perlmutter) next to the median measured here on the same cluster and GPU count."""
    paper = paper if paper is not None else paper_numbers()
    t2 = dict(paper.get("table2", {}))
    gpus_of = t2.pop("gpus", {})
    rows = {}
    for ds, systems in t2.items():
        for system, secs in systems.items():
            g = int(gpus_of.get(ds, 0))
            rows[("perlmutter", ds, g, system)] = {"cluster": "perlmutter", "dataset": ds, "gpus": g,
                                                   "system": system, "paper": float(secs)}
    frame = select(runs, "table2")
    frame = frame[frame["eval_time_s"].notna()] if "eval_time_s" in frame else frame.iloc[0:0]
    if not frame.empty:
        frame = frame.assign(_cluster=_cluster(frame), _real=_real(frame), _note=frame.apply(_note, axis=1))
        for (cl, ds, g, system, real, note), sub in frame.groupby(
                ["_cluster", "dataset", "world_size", "system", "_real", "_note"], dropna=False):
            key = (cl, canonical_dataset(ds) if real else ds, int(g), system)
            row = rows.setdefault(key, {"cluster": cl, "dataset": _short(key[1] if real else ds), "gpus": int(g),
                                        "system": system, "paper": np.nan})
            row.update(measured=float(sub["eval_time_s"].median()), runs=len(sub), device=_device(sub), note=note)
    out = pd.DataFrame(list(rows.values()))
    for col in ("measured", "runs", "device", "note"):
        if col not in out:
            out[col] = np.nan if col not in ("note", "device") else ""
    out["note"] = out["note"].fillna("")
    out["device"] = out["device"].fillna("")
    return out.sort_values(["cluster", "dataset", "gpus", "system"],
                           key=lambda s: s.map(_sys_key) if s.name == "system" else s,
                           kind="stable").reset_index(drop=True)


# ---------------------------------------------------------------------------- Fig. 6 numbers
def fig6_times(runs: pd.DataFrame, paper: dict | None = None) -> pd.DataFrame:
    """Time to target (s) per (cluster, dataset, system, GPUs): the numbers quoted in
    the paper's text next to the median measured here (over seeds; where several grids
    ran at one count, the fastest grid, in ``grid``); ``reached`` False rows give the
    time to the best accuracy, which is in ``best_acc`` (%)."""
    paper = paper if paper is not None else paper_numbers()
    rows = {(cl, ds, system, g): {"cluster": cl, "dataset": ds, "system": system, "gpus": g, "paper": secs}
            for cl, ds, system, g, secs in fig6_points(paper)}
    frame = select(runs, "fig6")
    frame = frame[frame["target_acc"].notna()] if "target_acc" in frame else frame.iloc[0:0]
    if not frame.empty:
        frame = frame.assign(_cluster=_cluster(frame), _real=_real(frame), _note=frame.apply(_note, axis=1))
        for (cl, ds, system, g, real, note), sub in frame.groupby(
                ["_cluster", "dataset", "system", "world_size", "_real", "_note"], dropna=False):
            key = (cl, canonical_dataset(ds) if real else ds, system, int(g))
            row = rows.setdefault(key, {"cluster": cl, "dataset": _short(key[1] if real else ds), "system": system,
                                        "gpus": int(g), "paper": np.nan})
            reached = sub["time_to_target_s"].notna()
            row.update(target=100 * float(sub["target_acc"].iloc[0]), reached=bool(reached.any()),
                       grid=fastest_grid_time(sub)[1] if reached.any() else "/".join(sorted(set(sub["grid_str"]))),
                       measured=fastest_grid_time(sub)[0] if reached.any()
                       else float(sub["time_to_best_s"].median()),
                       best_acc=100 * float(sub["best_test_acc"].max()), runs=len(sub), device=_device(sub),
                       note=note)
    out = pd.DataFrame(list(rows.values()))
    for col in ("target", "reached", "measured", "grid", "best_acc", "runs", "device", "note"):
        if col not in out:
            out[col] = np.nan if col not in ("note", "reached", "device", "grid") else \
                ("" if col != "reached" else None)
    out["note"] = out["note"].fillna("")
    out["device"] = out["device"].fillna("")
    out["grid"] = out["grid"].fillna("")
    return out.sort_values(["cluster", "dataset", "system", "gpus"], kind="stable").reset_index(drop=True)


# ---------------------------------------------------------------------------- Fig. 7 numbers
def fig7_speedups(runs: pd.DataFrame, paper: dict | None = None) -> pd.DataFrame:
    """Strong-scaling speedup per (cluster, dataset): first and last GPU counts, epoch
    times and speedup, paper (Section VII-C) and measured (each 3D grid's curve)."""
    paper = paper if paper is not None else paper_numbers()
    rows = {}
    for cl, datasets in paper.get("fig7", {}).items():
        for ds, v in datasets.items():
            ems = v.get("epoch_ms", [np.nan, np.nan])
            rows[(cl, ds, "")] = {"cluster": cl, "dataset": ds, "gpus": f"{v['gpus'][0]} -> {v['gpus'][1]}",
                                  "paper_speedup": float(v["speedup"]), "paper_epoch_ms": f"{ems[0]} -> {ems[1]}"
                                  if not np.isnan(ems[0]) else ""}
    frame = select(runs, "fig7")
    if not frame.empty and "epoch_time_s" in frame:
        frame = frame[(frame["system"] == "scalegnn") & (_variant(frame) == "") & frame["epoch_time_s"].notna()]
    if not frame.empty:
        frame = frame.assign(_cluster=_cluster(frame), _real=_real(frame), _note=frame.apply(_note, axis=1))
        for (cl, ds, mp, real, note), sub in frame.groupby(["_cluster", "dataset", "mp_grid", "_real", "_note"]):
            pts = sub.groupby("world_size")["epoch_time_s"].mean().sort_index()
            if len(pts) < 2:
                continue
            cds = canonical_dataset(ds) if real else ds
            key = (cl, cds, "") if (cl, cds, "") in rows and real else (cl, cds, mp)
            row = rows.setdefault(key, {"cluster": cl, "dataset": _short(cds if real else ds),
                                        "paper_speedup": np.nan, "paper_epoch_ms": ""})
            g0, g1 = int(pts.index[0]), int(pts.index[-1])
            row.update(gpus=row.get("gpus") or f"{g0} -> {g1}", measured_gpus=f"{g0} -> {g1}", grid3d=mp,
                       measured_epoch_ms=f"{1e3 * pts.iloc[0]:.1f} -> {1e3 * pts.iloc[-1]:.1f}",
                       measured_speedup=float(pts.iloc[0] / pts.iloc[-1]), ideal=g1 / g0, note=note)
    out = pd.DataFrame(list(rows.values()))
    for col in ("measured_gpus", "grid3d", "measured_epoch_ms", "measured_speedup", "ideal", "note"):
        if col not in out:
            out[col] = np.nan if col in ("measured_speedup", "ideal") else ""
    out = out.fillna({"note": "", "measured_gpus": "", "grid3d": "", "measured_epoch_ms": ""})
    return out.sort_values(["cluster", "dataset"], kind="stable").reset_index(drop=True)


# ---------------------------------------------------------------------------- Fig. 5 numbers
def fig5_reductions(runs: pd.DataFrame, paper: dict | None = None) -> pd.DataFrame:
    """Per Gd and cumulative variant: epoch time and its reduction relative to the
    variant before (the paper's "reduces epoch time by 24%"), paper next to measured
    (paper numbers only on their own experiment: ogbn-products on Perlmutter)."""
    paper = paper if paper is not None else paper_numbers()
    p5 = paper.get("fig5", {})
    frame = select(runs, "fig5")
    frame = frame[_variant(frame) != ""] if not frame.empty else frame
    rows = []
    if not frame.empty:
        frame = frame.assign(_cluster=_cluster(frame), _real=_real(frame), _v=_variant(frame),
                             _order=frame["sweep.order"] if "sweep.order" in frame else 0)
        for (cl, ds, gd, real), sub in frame.groupby(["_cluster", "dataset", "grid.dp", "_real"]):
            same = real and cl == p5.get("cluster") and canonical_dataset(ds) == p5.get("dataset")
            order = sub.groupby("_v")["_order"].min().sort_values().index
            times = sub.groupby("_v")["epoch_time_s"].mean().loc[order]
            prev = None
            for v, t in times.items():
                red = None if prev is None else 1 - t / prev
                pv = p5.get("reduction", {}).get(f"DP{int(gd)}", {}).get(v) if same else None
                rows.append({"cluster": cl, "dataset": _short(ds), "Gd": int(gd), "variant": v, "epoch_ms": 1e3 * t,
                             "reduction": red, "speedup_vs_first": times.iloc[0] / t,
                             "paper_reduction": pv, "note": "" if real else _note(sub.iloc[0])})
                prev = t
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------- Plexus Table 3
def load_balance(graph, parts: int = 8, seed: int = 0) -> dict:
    """max/mean stored entries over ``parts x parts`` shards of A + I (what the 3D grid
    cuts) in the original order, after one permutation P A P^T, and after Plexus'
    double permutation P_r A P_c^T: :func:`scalegnn.permutation.load_balance`, the
    code the trainer's ``--permute`` uses."""
    from scalegnn.permutation import load_balance as shard_balance

    g = graph.gcn_normalize() if graph.meta.get("normalized") != "gcn" else graph
    return {m: v["max_over_mean"] for m, v in shard_balance(g, parts, parts, seed).items()}


def plexus_table3(balances: dict | None = None, paper: dict | None = None, parts: int = 8) -> pd.DataFrame:
    """Load balance (max/mean nonzeros over 8x8 shards): Plexus Table 3 (europe_osm)
    next to ``balances`` {dataset: load_balance(...)} measured here."""
    paper = paper if paper is not None else paper_numbers()
    rows = []
    for ds, v in paper.get("plexus_table3", {}).items():
        rows.append({"dataset": ds, "source": "paper", **{k: float(x) for k, x in v.items()}})
    for ds, v in (balances or {}).items():
        rows.append({"dataset": _short(ds), "source": f"measured here ({parts}x{parts})", **v})
    return pd.DataFrame(rows, columns=["dataset", "source", "original", "single", "double"])


# ---------------------------------------------------------------------------- provenance, failures
def provenance(runs: pd.DataFrame) -> pd.DataFrame:
    """Where and with what every run ran (one row per record). ``attrs["libraries"]``
    holds the other library versions when every run had the same ones (else a
    ``libraries`` column)."""
    if runs is None or runs.empty:
        return pd.DataFrame()

    def col(name):
        return runs[name] if name in runs else pd.Series([None] * len(runs), index=runs.index)

    libs = []
    for _, r in runs.iterrows():
        extra = [f"{k[len('env.libraries.'):]} {r[k]}" for k in runs.columns
                 if k.startswith("env.libraries.") and k not in ("env.libraries.torch", "env.libraries.numpy")
                 and isinstance(r[k], str)]
        libs.append(", ".join(extra))
    out = pd.DataFrame({
        "run_id": runs["run_id"], "sweep": col("sweep.spec").fillna(""), "system": runs["system"],
        "dataset": runs["dataset"].map(_short), "grid": col("grid_str"), "ranks": runs["world_size"],
        "status": runs["status"], "host": col("env.hostname"), "device": col("env.device"),
        "backend": col("env.backend").fillna("serial"), "torch": col("env.torch"), "python": col("env.python"),
        "commit": col("env.git_commit").map(lambda c: c[:12] if isinstance(c, str) else "unknown"),
        "libraries": libs,
    })
    out = out.sort_values(["sweep", "system", "ranks", "run_id"]).reset_index(drop=True)
    if out["libraries"].nunique() == 1:
        out.attrs["libraries"] = out["libraries"].iloc[0]
        out = out.drop(columns="libraries")
    return out


def failures(manifests: list[dict], runs: pd.DataFrame) -> pd.DataFrame:
    """Runs of the sweep manifests without an ok record (``missing`` when no record at
    all, else the latest record's status and first error line), runs a manifest
    skipped (system not available), and failed records outside any manifest."""
    rows = []
    by_key = {}
    if runs is not None and not runs.empty:
        for key, sub in runs.groupby("run_key"):
            by_key[key] = sub.sort_values("run_id")
    seen = set()
    for m in manifests:
        for run in m.get("runs", []):
            seen.add(run["key"])
            sub = by_key.get(run["key"])
            if sub is not None and (sub["status"] == "ok").any():
                continue
            if sub is None:
                state, err = "missing", "no record (not run yet, still running, or lost)"
            else:
                last = sub.iloc[-1]
                state = last["status"]
                err = (str(last.get("error") or "").strip().splitlines() or [""])[0]
            rows.append({"sweep": f"{m['spec']}@{m['cluster']}", "system": run["system"],
                         "dataset": _short(run["dataset"]), "grid": run["grid"], "state": state, "detail": err,
                         "key": run["key"]})
        for run in m.get("unsupported", []):
            rows.append({"sweep": f"{m['spec']}@{m['cluster']}", "system": run["system"],
                         "dataset": _short(run["dataset"]), "grid": run["grid"], "state": "not run",
                         "detail": f"`scalegnn train` has no --system {run['system']} here", "key": run["key"]})
    if runs is not None and not runs.empty:
        for _, r in runs[(runs["status"] != "ok") & ~runs["run_key"].isin(seen)].iterrows():
            rows.append({"sweep": "", "system": r["system"], "dataset": _short(r["dataset"]), "grid": r["grid_str"],
                         "state": r["status"], "detail": (str(r.get("error") or "").strip().splitlines() or [""])[0],
                         "key": r["record_file"]})
    return pd.DataFrame(rows, columns=["sweep", "system", "dataset", "grid", "state", "detail", "key"])


# ---------------------------------------------------------------------------- Markdown
def _cell(v, fmt: str | None) -> str:
    if v is None or (isinstance(v, float) and np.isnan(v)):
        return ""
    if isinstance(v, (bool, np.bool_)):
        return "yes" if v else "no"
    if fmt and isinstance(v, (int, float, np.integer, np.floating)):
        return format(v, fmt)
    return str(v).replace("|", "\\|").replace("\n", " ")


def markdown(frame: pd.DataFrame, formats: dict | None = None, columns: dict | None = None) -> str:
    """A GitHub Markdown table; ``formats`` {column: format spec}, ``columns`` {column: header}
    (and the order to show them in)."""
    if frame is None or frame.empty:
        return "_(none)_\n"
    formats = formats or {}
    cols = list(columns) if columns else list(frame.columns)
    heads = [columns.get(c, c) if columns else c for c in cols]
    lines = ["| " + " | ".join(heads) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for _, r in frame.iterrows():
        lines.append("| " + " | ".join(_cell(r.get(c), formats.get(c)) for c in cols) + " |")
    return "\n".join(lines) + "\n"


# ------------------------------------------------ seed tables (docs/results.md, "Baselines measured on 2 CPU cores")
def _records(folder) -> list[dict]:
    from .load import latest_of_chains, read_records

    good, skipped = read_records(folder)
    for _, why in skipped:
        print(f"skipped: {why}", file=sys.stderr)
    return latest_of_chains(good)[0]  # a resumed chain counts once, as its latest record


def _mean_spread(values: list[float]) -> str:
    if not values:
        return "—"
    if len(values) == 1:
        return f"{100 * values[0]:.2f} (1 seed)"
    return f"{100 * statistics.mean(values):.2f} ± {100 * statistics.stdev(values):.2f} (n={len(values)})"


def accuracy_table(recs: list[dict], metric: str = "test_acc_at_best_val") -> str:
    """Systems x datasets: ``metric`` of the records' summaries (in %), mean ± sample
    standard deviation over the seeds recorded. ``test_acc_at_best_val`` is the test
    accuracy of the epoch with the best validation accuracy (model selection);
    ``best_test_acc`` the best test accuracy of any evaluated epoch (Table I's)."""
    acc = defaultdict(list)
    datasets = []
    for r in recs:
        if r["status"] != "ok" or not r.get("summary") or r["summary"].get(metric) is None:
            continue
        acc[(r["system"], r["dataset"])].append(r["summary"][metric])
        if r["dataset"] not in datasets:
            datasets.append(r["dataset"])
    systems = sorted({s for s, _ in acc}, key=_sys_key)
    lines = ["| system | " + " | ".join(datasets) + " |", "|---|" + "---|" * len(datasets)]
    for s in systems:
        lines.append(f"| {s} | " + " | ".join(_mean_spread(acc.get((s, d), [])) for d in datasets) + " |")
    return "\n".join(lines)


def _system_by_procs(cell: dict, procs: set) -> str:
    """Markdown: one row per system, one column per process count, cells from ``cell[(system, procs)]``."""
    procs = sorted(procs)
    systems = sorted({s for s, _ in cell}, key=_sys_key)
    lines = ["| system | " + " | ".join(f"{n} proc" for n in procs) + " |", "|---|" + "---|" * len(procs)]
    for s in systems:
        lines.append(f"| {s} | " + " | ".join(cell.get((s, n), "—") for n in procs) + " |")
    return "\n".join(lines)


def _time_cell(runs: list[dict]) -> str:
    """One system at one process count: seconds to the target (and the epoch that
    reached it) of one run; over several seeds the mean ± sample std of the runs that
    reached it, the range of epochs, and how many reached it."""
    reached, missed = [], []
    for r in runs:
        if r["status"] != "ok":
            missed.append(r["status"])
        elif r["time_to_target_s"] is None:
            best = max((e for e in r["epochs"] if e["test_acc"] is not None), key=lambda e: e["test_acc"])
            missed.append(f"× {best['test_acc']:.3f} best, {best['train_time_s']:.1f} s ({len(r['epochs'])} ep)")
        else:
            hit = next(e for e in r["epochs"] if (e["test_acc"] or 0) >= r["target_acc"])
            reached.append((r["time_to_target_s"], hit["epoch"]))
    if len(runs) == 1:
        return missed[0] if missed else f"{reached[0][0]:.1f} s ({reached[0][1]} ep)"
    if not reached:
        return f"none of {len(runs)} reached it"
    times, eps = [t for t, _ in reached], [e for _, e in reached]
    spread = f" ± {statistics.stdev(times):.1f}" if len(times) > 1 else ""
    ep = f"{min(eps)}" if min(eps) == max(eps) else f"{min(eps)}-{max(eps)}"
    tail = f"n={len(reached)}" if not missed else f"{len(reached)} of {len(runs)} reached it"
    return f"{statistics.mean(times):.1f}{spread} s ({ep} ep, {tail})"


def _by_dataset(recs: list[dict]) -> dict:
    """{(dataset, target): [records]} in the order first seen."""
    out: dict = {}
    for r in recs:
        out.setdefault((r["dataset"], r.get("target_acc")), []).append(r)
    return out


def time_to_target_table(recs: list[dict]) -> str:
    """Systems x process counts: training time to the records' target (one dataset and
    target: see :func:`_by_dataset`), aggregated over the seeds recorded."""
    runs, procs = defaultdict(list), set()
    for r in recs:
        procs.add(r["world_size"])
        runs[(r["system"], r["world_size"])].append(r)
    return _system_by_procs({key: _time_cell(rs) for key, rs in runs.items()}, procs)


def eval_time_table(recs: list[dict]) -> str:
    """Systems x process counts: the median evaluation round and epoch over every
    evaluated epoch of the records (all seeds pooled)."""
    evals, epochs, procs = defaultdict(list), defaultdict(list), set()
    for r in recs:
        times = [e["eval_time_s"] for e in r["epochs"] if e.get("eval_time_s") is not None]
        if not times:
            continue
        key = (r["system"], r["world_size"])
        procs.add(r["world_size"])
        evals[key] += times
        epochs[key] += ([b["train_time_s"] - a["train_time_s"] for a, b in zip(r["epochs"], r["epochs"][1:])]
                        or [r["epochs"][0]["train_time_s"]])
    cell = {k: f"{statistics.median(evals[k]):.3f} s (epoch {statistics.median(epochs[k]):.2f} s)" for k in evals}
    return _system_by_procs(cell, procs)


def main(argv=None) -> int:
    root = Path((argv or sys.argv[1:] or ["results/baselines"])[0])
    if (root / "table1").is_dir():
        recs = _records(root / "table1")
        print("### Test accuracy at the best validation epoch (%), mean ± std over seeds\n")
        print(accuracy_table(recs) + "\n")
        print("### Best test accuracy of any epoch (%, Table I's measure), mean ± std over seeds\n")
        print(accuracy_table(recs, "best_test_acc") + "\n")
    if (root / "fig6").is_dir():
        for (dataset, target), recs in _by_dataset(_records(root / "fig6")).items():
            print(f"### Training time to {target} test accuracy on {dataset} (epochs needed; a cell with n= is "
                  f"a mean over seeds, any other one run, seed {min(r['seed'] for r in recs)})\n")
            print(time_to_target_table(recs) + "\n")
            print(f"### Evaluation time per round (median), {dataset}\n")
            print(eval_time_table(recs) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
