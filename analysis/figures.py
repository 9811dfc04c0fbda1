"""The paper's figures from the runs DataFrame (:func:`scalegnn.analysis.load_runs`).

Every function takes the runs frame (and, where a figure needs it, the speedup
reference or the model validation frame) and returns a matplotlib ``Figure``; it
raises :class:`NoData` when the frame holds no run for that figure. Selection:

    fig5_ablation         runs with a sweep variant (the cumulative optimizations)
    fig6_time_to_target   runs with a target accuracy
    fig7_strong_scaling   ScaleGNN runs without a variant, one curve per
                          (cluster, dataset, 3D grid) as Gd grows
    fig8_epoch_breakdown  the same runs, stacked component times per Gd
    plexus_fig5_model     predicted vs observed epoch time (analysis.perfmodel)

Runs tagged by a sweep manifest are used only by the figures their spec feeds
(``FIGURE_SPECS``); untagged runs (plain ``scalegnn train``) by every figure
whose selection they pass.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

from scalegnn import systems as registry  # noqa: E402

from .paper import canonical_dataset, fig6_points, paper_numbers  # noqa: E402

__all__ = ["NoData", "fig5_ablation", "fig6_time_to_target", "fig7_strong_scaling", "fig8_epoch_breakdown",
           "plexus_fig5_model", "select", "COMPONENTS", "FIGURE_SPECS", "component_table", "paper_points_fig6",
           "paper_points_fig7", "fig6_paper_vs_here", "fig7_paper_vs_here", "fastest_grid_time",
           "short_dataset", "rank_axis_label", "over_runs", "SPREAD"]


class NoData(LookupError):
    """The runs frame holds nothing this figure can show."""


# Which sweep figures feed which report figure (untagged runs feed all of them).
FIGURE_SPECS = {
    "fig5": {"fig5"},
    "fig6": {"fig6", "demo"},
    "fig7": {"fig7", "fig8", "demo"},
    "fig8": {"fig8", "fig7", "demo"},
    "table1": {"table1", "demo"},
    "table2": {"table2", "demo"},
    "perfmodel": {"perfmodel"},
}


# Stacking order and colours of the per-epoch components (records' ``components``).
COMPONENTS = [
    ("sampling", "sampling", "#1b9e77"),
    ("pmm_comm", "3D-PMM all-reduce", "#d95f02"),
    ("dp_comm", "DP all-reduce", "#7570b3"),
    ("spmm", "SpMM", "#e7298a"),
    ("gemm", "GEMM", "#66a61e"),
    ("elementwise", "element-wise", "#e6ab02"),
    ("forward_backward", "forward + backward", "#a6761d"),
    ("optimizer", "optimizer", "#1f78b4"),
    ("other", "other", "#bdbdbd"),
]
_ALIASES = {"dp_allreduce": "dp_comm"}


def _style(system: str):
    """(colour, marker, legend name) of a system (scalegnn.systems; a name the registry
    does not know, from an old or foreign record, gets a neutral style)."""
    try:
        return registry.get(system).style
    except registry.UnknownSystem:
        return "#444444", "o", system


def _log_axis(axis) -> None:
    """Log scale with plain numbers at 1, 2, 3, 5 x 10^k (no 6x10^0 labels)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 3.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def _figure(panels: int, panel_w: float, height: float):
    """A row of panels, at least 7.5 inches wide so titles and legends fit. Constrained
    layout puts the figure's title right above the panels' titles (no blank band under
    it) and makes room for the legend under the panels (:func:`_legend_below`)."""
    fig, axes = plt.subplots(1, panels, figsize=(max(7.5, panel_w * panels), height), squeeze=False,
                             layout="constrained")
    return fig, axes[0]


def _component_legend(fig, used: dict, spread: bool = False) -> None:
    """Legend of the stacked components, in stacking order, under the panels (and of the
    bars' spread over seeds, where one is drawn)."""
    order = [label for _, label, _ in COMPONENTS if label in used]
    handles = [plt.Rectangle((0, 0), 1, 1, color=used[k]) for k in order]
    if spread:
        handles.append(_spread_handle("bar top: mean"))
        order.append(handles[-1].get_label())
    _legend_below(fig, handles, order)


def _legend_below(fig, handles, labels=None, fontsize: float = 8) -> None:
    """A legend under the panels of ``fig`` (a figure or a subfigure with constrained
    layout), outside every axes, so it never covers a line or a bar: as many columns as
    the longest label lets fit in the figure's width."""
    labels = labels if labels is not None else [h.get_label() for h in handles]
    width = fig.get_size_inches()[0] if hasattr(fig, "get_size_inches") else fig.figure.get_size_inches()[0]
    if hasattr(fig, "bbox_relative"):  # a subfigure: its share of the figure's width
        width *= fig.bbox_relative.width
    entry = 0.6 + 0.062 * fontsize / 8 * max((len(x) for x in labels), default=1)  # inches per column
    ncol = max(1, min(len(labels), int(width // entry)))
    fig.legend(handles, labels, loc="outside lower center", ncol=ncol, fontsize=fontsize, frameon=False)


# The spread over the runs of one configuration (its seeds): a bar from the smallest to the
# largest value, drawn where a configuration has two runs or more; SPREAD is its artists' gid.
SPREAD = "min-max over runs"


def over_runs(frame: pd.DataFrame, by, value: str, scale: float = 1.0) -> pd.DataFrame:
    """Per value of ``by`` (one configuration), over its runs (its seeds): ``mean``,
    ``min`` and ``max`` of ``value`` times ``scale``, and ``n`` the number of runs; sorted by ``by``."""
    g = frame.groupby(by)[value]
    return pd.DataFrame({"mean": g.mean() * scale, "min": g.min() * scale, "max": g.max() * scale,
                         "n": g.count()}).sort_index()


def _spread(ax, x, center, lo, hi, n, color) -> bool:
    """Min-max bars (with caps) at ``x`` from ``lo`` to ``hi`` around ``center`` where ``n``
    >= 2 runs; returns whether any was drawn."""
    keep = np.asarray(n) >= 2
    if not keep.any():
        return False
    x, center, lo, hi = (np.asarray(a, dtype=float)[keep] for a in (x, center, lo, hi))
    bars = ax.errorbar(x, center, yerr=[center - lo, hi - center], fmt="none", ecolor=color, elinewidth=1.3,
                       capsize=4, capthick=1.3, zorder=3)
    for artist in (*bars.lines[1], *bars.lines[2]):
        artist.set_gid(SPREAD)
    return True


def _spread_handle(center: str = "point: mean") -> Line2D:
    """The legend entry of :func:`_spread`'s bars, saying what the bar and the point are."""
    return Line2D([], [], color="#555555", marker="|", markersize=11, mew=1.3, linestyle="none",
                  label=f"bar: min-max over seeds ({center})")


def select(runs: pd.DataFrame, figure: str) -> pd.DataFrame:
    """Ok runs that may feed ``figure``: tagged for it, or untagged."""
    if runs is None or runs.empty:
        return pd.DataFrame(columns=list(runs.columns) if runs is not None else [])
    ok = runs[runs["status"] == "ok"] if "status" in runs else runs
    tag = ok["sweep.figure"] if "sweep.figure" in ok else pd.Series([None] * len(ok), index=ok.index)
    keep = tag.isna() | tag.isin(FIGURE_SPECS.get(figure, {figure}))
    return ok[keep].copy()


def _cluster(frame: pd.DataFrame) -> pd.Series:
    if "sweep.cluster" in frame:
        host = frame["env.hostname"] if "env.hostname" in frame else "unknown"
        return frame["sweep.cluster"].fillna(host if isinstance(host, str) else host.astype(str))
    return frame.get("env.hostname", pd.Series(["unknown"] * len(frame), index=frame.index))


def short_dataset(ds: str) -> str:
    """A long generated-graph name shortened to what tells two apart in a demo:
    ``csbm:n=20000,avg_degree=12,classes=8,...`` -> ``csbm n=20000 avg_degree=12`` (the
    first parameter, and the average degree where given); other names unchanged."""
    if not isinstance(ds, str) or ":" not in ds or len(ds) <= 24:
        return ds
    name, params = ds.split(":", 1)
    parts = params.split(",")
    keep = [parts[0]] + [p for p in parts[1:] if p.startswith("avg_degree=")]
    return f"{name} {' '.join(keep)}"


def _dataset_label(row) -> str:
    ds = row["dataset"]
    paper = row.get("sweep.paper_dataset")
    short = short_dataset(ds)
    if isinstance(paper, str) and paper and paper != ds:
        return f"{short} (stand-in for {paper})"
    return short


def _variant(frame: pd.DataFrame) -> pd.Series:
    v = frame["sweep.variant"] if "sweep.variant" in frame else pd.Series([None] * len(frame), index=frame.index)
    return v.fillna("").astype(str)


def component_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Per-run seconds per epoch of each component in :data:`COMPONENTS` order (zeros
    where a component was not measured)."""
    out = pd.DataFrame(index=frame.index)
    for key, _, _ in COMPONENTS:
        col = f"time.{key}"
        out[key] = frame[col].fillna(0.0) if col in frame else 0.0
    for alias, key in _ALIASES.items():
        if f"time.{alias}" in frame:
            out[key] = out[key] + frame[f"time.{alias}"].fillna(0.0)
    return out


def _stacked_bars(ax, x, comps: pd.DataFrame, scale: float = 1e3, width: float = 0.7):
    """Stack the non-zero components; returns the bar totals and the legend handles used."""
    bottom = np.zeros(len(x))
    used = {}
    for key, label, color in COMPONENTS:
        vals = comps[key].to_numpy(dtype=float) * scale
        if not np.any(vals > 0):
            continue
        ax.bar(x, vals, width, bottom=bottom, color=color, label=label, edgecolor="white", linewidth=0.5)
        bottom += vals
        used[label] = color
    return bottom, used


# ---------------------------------------------------------------------------- Fig. 5
def fig5_ablation(runs: pd.DataFrame) -> plt.Figure:
    """Stacked epoch-time breakdown per cumulative optimization, one panel per Gd
    (paper Fig. 5): bars labelled with the epoch time and the speedup over the first
    variant (the baseline); means over the runs (seeds) of a variant, with their min-max
    on the bar where there are several."""
    frame = select(runs, "fig5")
    frame = frame[_variant(frame) != ""]
    if frame.empty:
        raise NoData("no runs with a sweep variant (the `fig5` sweep)")
    frame = frame.assign(_order=frame["sweep.order"] if "sweep.order" in frame else 0, _variant=_variant(frame))
    panels = sorted(frame["grid.dp"].unique())
    fig, axes = _figure(len(panels), 5.2, 4.8)
    handles, spread = {}, False
    for ax, gd in zip(axes, panels):
        sub = frame[frame["grid.dp"] == gd]
        order = sub.groupby("_variant")["_order"].min().sort_values().index.tolist()
        comps = component_table(sub).assign(_variant=sub["_variant"]).groupby("_variant").mean().loc[order]
        stats = over_runs(sub, "_variant", "epoch_time_s", 1e3).loc[order]
        totals_epoch = stats["mean"] / 1e3
        # the "other" share makes each bar add up to the measured epoch time
        comps["other"] = np.maximum(0.0, totals_epoch.to_numpy() - comps.drop(columns="other").sum(axis=1).to_numpy())
        x = np.arange(len(order))
        totals, used = _stacked_bars(ax, x, comps)
        handles.update(used)
        spread |= _spread(ax, x, stats["mean"], stats["min"], stats["max"], stats["n"], "black")
        tops = np.maximum(totals, np.where(stats["n"] > 1, stats["max"], 0.0))  # labels above the spread
        base = totals[0]
        for xi, tot, top in zip(x, totals, tops):
            ax.annotate(f"{tot:.0f} ms\n{base / tot:.2f}x", (xi, top), textcoords="offset points", xytext=(0, 2),
                        ha="center", va="bottom", fontsize=8)
        ax.set_xticks(x, order, rotation=20, ha="right")
        world = int(sub["world_size"].iloc[0])
        ax.set_title(f"DP{gd}: {world} ranks, grid {sub['grid_str'].iloc[0]}")
        ax.set_ylabel("epoch time (ms)")
        ax.set_ylim(0, max(tops) * 1.22)
        ax.grid(axis="y", alpha=0.3)
    row = frame.iloc[0]
    fig.suptitle(f"Optimizations applied cumulatively\n{_dataset_label(row)}, {_cluster(frame).iloc[0]}",
                 fontsize=11)
    _component_legend(fig, handles, spread)
    return fig


# ---------------------------------------------------------------------------- Fig. 6
def _log2_ticks(ax, counts):
    counts = sorted(set(int(c) for c in counts))
    ax.set_xscale("log", base=2)
    ax.set_xticks(counts, [str(c) for c in counts])
    ax.minorticks_off()
    if len(counts) == 1:
        ax.set_xlim(counts[0] / 1.6, counts[0] * 1.6)


def _real_dataset(frame: pd.DataFrame) -> pd.Series:
    """True where a run is on the dataset itself, not on a generated stand-in for another."""
    paper = frame["sweep.paper_dataset"] if "sweep.paper_dataset" in frame else pd.Series(index=frame.index)
    return paper.isna() | (paper == frame["dataset"])


def _fig6_frame(runs: pd.DataFrame) -> pd.DataFrame:
    frame = select(runs, "fig6")
    frame = frame[frame["target_acc"].notna()] if "target_acc" in frame else frame.iloc[0:0]
    if frame.empty:
        raise NoData("no runs with a target accuracy (the `fig6` sweep or --target-acc)")
    frame = frame.assign(_cluster=_cluster(frame), _ds=frame.apply(_dataset_label, axis=1))
    # Times to different targets are different experiments: a graph run at several gets a panel per target.
    several = frame.groupby(["_cluster", "_ds"])["target_acc"].transform("nunique") > 1
    return frame.assign(_ds=frame["_ds"].where(~several, frame["_ds"] + " @ " +
                                               (100 * frame["target_acc"]).map("{:g} %".format)))


def _panel_order(frame: pd.DataFrame) -> list[tuple[str, str]]:
    """(cluster, dataset label) panels: by cluster, the densest graph first (entries per vertex)."""
    if "graph.adjacency_nnz" in frame and "graph.num_nodes" in frame:
        density = (frame["graph.adjacency_nnz"] / frame["graph.num_nodes"]).groupby([frame["_cluster"], frame["_ds"]]).max()
    else:
        density = pd.Series(dtype=float)
    return sorted(frame.groupby(["_cluster", "_ds"]).groups,
                  key=lambda k: (k[0], -float(density.get(k, 0.0) or 0.0), k[1]))


def paper_points_fig6(runs: pd.DataFrame | None, paper: dict | None = None) -> pd.DataFrame:
    """The paper's Fig. 6 times (``analysis/paper_numbers.toml``), one row per (cluster,
    dataset, system, GPUs), with ``matched``: a run here is the same experiment (same
    cluster, the dataset itself, not a stand-in, same system and GPU count, on GPUs, to
    the paper's target), so the paper's point belongs on its axes; ``label`` is the panel's
    dataset label of the matching runs."""
    paper = paper if paper is not None else paper_numbers()
    rows = [{"cluster": cl, "dataset": ds, "system": system, "gpus": g, "seconds": secs, "matched": False,
             "label": ""} for cl, ds, system, g, secs in fig6_points(paper)]
    out = pd.DataFrame(rows, columns=["cluster", "dataset", "system", "gpus", "seconds", "matched", "label"])
    try:
        frame = _fig6_frame(runs) if runs is not None and not runs.empty else None
    except NoData:
        frame = None
    if frame is not None and not out.empty:
        targets = paper.get("fig6", {}).get("targets", {})
        frame = frame[_real_dataset(frame) & _on_gpus(frame)]
        same_target = np.array([abs(float(t) - float(targets.get(canonical_dataset(ds), np.nan))) < 5e-4
                                for ds, t in zip(frame["dataset"], frame["target_acc"])], dtype=bool)
        frame = frame.loc[same_target]  # the paper's seconds are to its own target
        here = {(cl, canonical_dataset(ds), s, int(g)): label for cl, ds, s, g, label in
                zip(frame["_cluster"], frame["dataset"], frame["system"], frame["world_size"], frame["_ds"])}
        keys = list(zip(out["cluster"], out["dataset"], out["system"], out["gpus"]))
        out["matched"] = [k in here for k in keys]
        out["label"] = [here.get(k, "") for k in keys]
    return out


def _on_gpus(frame: pd.DataFrame) -> pd.Series:
    """Runs on GPUs: the paper's points are GPU measurements (a CPU run on a cluster's
    profile is not the same experiment)."""
    if "device_kind" not in frame:
        return pd.Series(False, index=frame.index)
    return frame["device_kind"].eq("gpu")


def fastest_grid_time(runs: pd.DataFrame) -> tuple[float, str]:
    """(seconds, grid) of one system at one rank count: the median time to target over the
    runs (seeds) of each grid that reached it, the fastest grid (ScaleGNN may run several
    grids at one count; a system's best configuration is what Fig. 6 compares)."""
    reached = runs[runs["time_to_target_s"].notna()]
    by_grid = reached.groupby("grid_str")["time_to_target_s"].median().sort_values()
    return float(by_grid.iloc[0]), str(by_grid.index[0])


def _paper_style(ax, xs, ys, system: str, label: str | None = None):
    """The paper's points: hollow markers in the system's colour, and no line: only these
    counts are published, and a line would claim the values between them."""
    color, marker, _ = _style(system)
    ax.plot(xs, ys, linestyle="none", marker=marker, mfc="none", mew=1.5, markersize=8, color=color, alpha=0.9,
            linewidth=1.2, label=label or "_paper")


def _fig6_panel(ax, sub: pd.DataFrame, cluster: str, reference: dict | None, systems_seen: list,
                label_of: dict) -> bool:
    """One Fig. 6 panel of measured runs (see :func:`fig6_time_to_target`); returns whether
    it drew a spread over seeds."""
    points = {}  # system -> {gpus: (seconds, reached, best_acc)}
    spreads = {}  # system -> {gpus: (min, max, runs that reached, runs)} of the grid drawn
    device = sub.groupby("system")["device_kind"].agg(lambda k: "/".join(sorted(set(k)))) \
        if "device_kind" in sub else pd.Series(dtype=object)
    unit = _rank_unit(sub)
    for system, s in sub.groupby("system"):
        pts, spreads[system] = {}, {}
        for g, r in s.groupby("world_size"):
            reached = r["time_to_target_s"].notna()
            if reached.any():
                seconds, grid = fastest_grid_time(r)
                pts[int(g)] = (seconds, True, None)
                of_grid = r[r["grid_str"] == grid]
                times = of_grid["time_to_target_s"].dropna()
                spreads[system][int(g)] = (times.min(), times.max(), len(times), len(of_grid))
            else:
                best = r["best_test_acc"].astype(float)
                i = best.idxmax() if best.notna().any() else r.index[0]
                pts[int(g)] = (float(r.loc[i, "time_to_best_s"] or r.loc[i, "summary.train_time_s"] or np.nan),
                               False, best.get(i))
        points[system] = pts
    order = sorted(points, key=lambda s: (s != "scalegnn", s))
    stacked: dict[int, int] = {}  # labels already written at a GPU count: offset the next one
    spread = False
    for system in order:
        color, marker, name = _style(system)
        if system not in systems_seen:
            systems_seen.append(system)
        pts = dict(sorted(points[system].items()))
        g = list(pts)
        if device.nunique() > 1:  # the panel mixes devices: every curve says which it ran on
            name = f"{name} ({device.get(system)})"
        label_of[system] = name
        reached = [k for k in g if pts[k][1]]  # a line joins reached points only: into a miss it reads as a gain
        ax.plot(reached, [pts[k][0] for k in reached], "-", color=color, alpha=0.6, linewidth=1.5, label=name)
        for gi, (t, ok, acc) in pts.items():
            if ok:
                ax.plot([gi], [t], marker=marker, color=color, markersize=7, linestyle="none")
                lo, hi, n, runs_at = spreads[system][gi]
                spread |= _spread(ax, [gi], [t], [lo], [hi], [n], color)
                if n < runs_at:  # the spread is over the runs that reached the target: say how many did
                    k = stacked.get(gi, 0)
                    stacked[gi] = k + 1
                    last = gi == sub["world_size"].max()  # at the right edge, written to the left
                    ax.annotate(f"{n} of {runs_at} runs reached it", (gi, t), textcoords="offset points",
                                xytext=(-7 if last else 7, -3 - 9 * k), ha="right" if last else "left",
                                fontsize=7, color=color)
            else:
                ax.plot([gi], [t], marker="x", color=color, markersize=9, mew=2.2, linestyle="none")
                if acc is not None and not pd.isna(acc):
                    k = stacked.get(gi, 0)
                    stacked[gi] = k + 1
                    ax.annotate(f"best {100 * acc:.1f}%", (gi, t), textcoords="offset points",
                                xytext=(7, -3 - 9 * k), fontsize=7, color=color)
    # ScaleGNN's speedup over each other system at the largest GPU count where both ran
    # and ScaleGNN reached the target: never across rank counts, never across devices
    sg = {k: v for k, v in points.get("scalegnn", {}).items() if v[1]}
    if sg:
        ref = (reference or {}).get(cluster)
        others = [ref] if ref in points else [s for s in order if s != "scalegnn"]
        lines = []
        for other in others:
            common = sorted(set(sg) & set(points.get(other, {})))
            if not common:
                continue  # no run at a GPU count where ScaleGNN reached the target: nothing to compare
            g_at = common[-1]
            t_other, ok_other, _ = points[other][g_at]
            at = f" at {g_at} {unit}{'es' if unit == 'process' and g_at > 1 else 's' if g_at > 1 else ''}"
            if device.get(other) != device.get("scalegnn"):  # a speedup across devices measures hardware
                lines.append(f"vs {_style(other)[2]}{at}: not comparable ({device.get('scalegnn')} vs "
                             f"{device.get(other)})")
                continue
            ratio = t_other / sg[g_at][0]
            if ok_other and ratio * 1.05 <= 1.0:  # slower: say so, never "0.6x vs"
                lines.append(f"{1 / ratio:.1f}x slower than {_style(other)[2]}{at}")
                continue
            lines.append(f"{ratio:.1f}x vs {_style(other)[2]}{at}"
                         + ("" if ok_other else f" or more ({_style(other)[2]} did not reach the target)"))
        gmax = max(sg)
        if lines:
            ax.annotate("\n".join(lines), (gmax, sg[gmax][0]), textcoords="offset points", xytext=(-8, -14),
                        ha="right", va="top", fontsize=8, color=_style("scalegnn")[0],
                        bbox=dict(boxstyle="round,pad=0.2", fc="white", ec="none", alpha=0.8))
    return spread


def _rank_unit(runs: pd.DataFrame) -> str:
    """What a rank is in these runs: a GPU when every run is on GPUs, a process when none
    is, a rank when they mix."""
    kinds = set(runs["device_kind"].dropna()) if "device_kind" in runs else set()
    return "GPU" if kinds == {"gpu"} else "rank" if "gpu" in kinds else "process"


# What the ranks of a set of runs are (:func:`_rank_unit`): (the noun an axis counts, a note when they mix).
_RANKS = {"GPU": ("GPUs", ""), "process": ("CPU processes", ""), "rank": ("ranks", "GPU and CPU runs mixed")}


def rank_axis_label(runs: pd.DataFrame) -> str:
    """What an axis of rank counts counts, from the records' ``env.device_type`` (the
    ``device_kind`` column): "GPUs (ranks)" only when every run computed on GPUs, "CPU
    processes (ranks)" when none did, and "ranks (GPU and CPU runs mixed)" when they mix."""
    noun, note = _RANKS[_rank_unit(runs)]
    return f"{noun} ({note or 'ranks'})"


def _fig6_axes(ax, counts, target: float, title: str, ylabel: bool = True, xlabel: str = "GPUs (ranks)"):
    _log2_ticks(ax, counts)
    ax.set_yscale("log")
    lo, hi = ax.get_ylim()
    ax.set_ylim(lo / 1.25, hi * 1.1)  # room for the "best x%" labels under the lowest point
    _log_axis(ax.yaxis)
    ax.set_xlabel(xlabel)
    if ylabel:
        ax.set_ylabel(f"training time to {100 * target:.0f}% test accuracy (s)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3, which="both")


def fig6_time_to_target(runs: pd.DataFrame, reference: dict | None = None, paper: dict | None = None) -> plt.Figure:
    """Training time to the target test accuracy vs ranks (GPUs, or CPU processes:
    :func:`rank_axis_label`), one panel per (cluster, dataset), log scale (paper Fig. 6).
    A point is the median over the runs (seeds) of the fastest grid at that count
    (:func:`fastest_grid_time`, as in the table and the result line), with the min-max of
    those that reached the target as a bar where there are several (and "k of n runs
    reached it" where some did not). Runs that never reached the target are drawn with an
    x at the time to their best accuracy, which is written next to them. At the largest
    count where ScaleGNN reached the target, its speedup over the reference system
    (``reference[cluster]``, else every other system there) is annotated. The paper's own
    times (:func:`paper_points_fig6`) are drawn on the same axes, hollow markers without a
    line (only those counts are published), where the experiment matches (same cluster,
    dataset, system and GPU count); the others go to :func:`fig6_paper_vs_here`."""
    frame = _fig6_frame(runs)
    pp = paper_points_fig6(runs, paper)
    pp = pp[pp["matched"]]
    keys = _panel_order(frame)
    fig, axes = _figure(len(keys), 5.0, 4.8)
    systems_seen, label_of, spread = [], {}, False
    for ax, (cluster, ds) in zip(axes, keys):
        sub = frame[(frame["_cluster"] == cluster) & (frame["_ds"] == ds)]
        spread |= _fig6_panel(ax, sub, cluster, reference, systems_seen, label_of)
        mine = pp[(pp["cluster"] == cluster) & (pp["label"] == ds)]
        for system, p in mine.groupby("system"):
            p = p.sort_values("gpus")
            _paper_style(ax, p["gpus"].tolist(), p["seconds"].tolist(), system,
                         label=f"{_style(system)[2]} (paper)")
        counts = list(sub["world_size"]) + list(mine["gpus"])
        _fig6_axes(ax, counts, float(sub["target_acc"].iloc[0]), f"{ds}, {cluster}", xlabel=rank_axis_label(sub))
    handles = [Line2D([], [], color=_style(s)[0], marker=_style(s)[1], label=label_of.get(s, _style(s)[2]))
               for s in systems_seen]
    handles.append(Line2D([], [], color="black", marker="x", linestyle="none", mew=2,
                          label="target not reached (time to best)"))
    if not pp.empty:
        handles.append(Line2D([], [], color="black", marker="o", mfc="none", linestyle="none",
                              label="paper, same experiment (published points only)"))
    if spread:
        handles.append(_spread_handle("point: median"))
    _legend_below(fig, handles)
    fig.suptitle("Training time to target test accuracy (evaluation excluded; lower is better)", fontsize=11)
    return fig


def fig6_paper_vs_here(runs: pd.DataFrame, reference: dict | None = None, paper: dict | None = None) -> plt.Figure:
    """Paper vs here for Fig. 6 when no experiment matches: the paper's time-to-target
    panels (left, two rows, hollow markers of its published points, its clusters and datasets) beside the
    panels measured here (right, full height), each on its own axes. Raises :class:`NoData` without
    measured runs, or when some paper point matches (it is then on Fig. 6 itself)."""
    paper = paper if paper is not None else paper_numbers()
    frame = _fig6_frame(runs)
    pp = paper_points_fig6(runs, paper)
    if pp.empty:
        raise NoData("no paper numbers for Fig. 6")
    if pp["matched"].any():
        raise NoData("the paper's Fig. 6 points are drawn on the measured axes (same experiment)")
    targets = paper.get("fig6", {}).get("targets", {})
    paper_keys = sorted(pp.groupby(["cluster", "dataset"]).groups, key=lambda k: (k[0] != "perlmutter", k))
    here_keys = _panel_order(frame)
    # the paper's panels in a block of two rows on the left, ours on the right at full height
    pcols = -(-len(paper_keys) // 2)
    fig = plt.figure(figsize=(3.3 * pcols + 4.6 * len(here_keys), 7.4), layout="constrained")
    grid = fig.add_gridspec(2, pcols + len(here_keys), width_ratios=[1] * pcols + [1.5] * len(here_keys))
    seen, label_of, missed, spread = [], {}, False, False
    for i, (cl, ds) in enumerate(paper_keys):
        ax = fig.add_subplot(grid[i // pcols, i % pcols])
        sub = pp[(pp["cluster"] == cl) & (pp["dataset"] == ds)]
        for system, p in sorted(sub.groupby("system"), key=lambda kv: (kv[0] != "scalegnn", kv[0])):
            p = p.sort_values("gpus")
            _paper_style(ax, p["gpus"].tolist(), p["seconds"].tolist(), system, label=_style(system)[2])
            if system not in seen:
                seen.append(system)
        _fig6_axes(ax, sub["gpus"], float(targets.get(ds, np.nan)), f"paper: {ds}, {cl}")
        ax.set_ylabel(f"time to {100 * float(targets.get(ds, np.nan)):.0f}% test acc. (s)", fontsize=9)
    for j, (cl, ds) in enumerate(here_keys):
        ax = fig.add_subplot(grid[:, pcols + j])
        sub = frame[(frame["_cluster"] == cl) & (frame["_ds"] == ds)]
        spread |= _fig6_panel(ax, sub, cl, reference, seen, label_of)
        _fig6_axes(ax, sub["world_size"], float(sub["target_acc"].iloc[0]), f"here: {ds}, {cl}",
                   xlabel=rank_axis_label(sub))
        missed = missed or not sub["time_to_target_s"].notna().all()
    # one legend for every panel, under them: a system has one colour and marker everywhere
    seen.sort(key=lambda s: (s != "scalegnn", s))
    handles = [Line2D([], [], color=_style(s)[0], marker=_style(s)[1], label=label_of.get(s, _style(s)[2]))
               for s in seen]
    handles.append(Line2D([], [], color="black", marker="o", mfc="none", linestyle="none",
                          label="paper (published points only)"))
    if missed:
        handles.append(Line2D([], [], color="black", marker="x", linestyle="none", mew=2,
                              label="target not reached (time to best)"))
    if spread:
        handles.append(_spread_handle("point: median"))
    _legend_below(fig, handles)
    fig.suptitle("Fig. 6, paper vs here: time to target accuracy. Left: the paper's GPU clusters (hollow: its "
                 "published points); right: measured here.\nNo experiment here is the paper's (same cluster, dataset, "
                 "system and GPU count), so each has its own axes.", fontsize=10)
    return fig


# ---------------------------------------------------------------------------- Fig. 7
def _scaling_frame(runs: pd.DataFrame, figure: str) -> pd.DataFrame:
    frame = select(runs, figure)
    frame = frame[(frame["system"] == "scalegnn") & (_variant(frame) == "") & frame["epoch_time_s"].notna()]
    if frame.empty:
        raise NoData("no ScaleGNN runs with epoch times (the `fig7` / `fig8` sweeps)")
    return frame.assign(_cluster=_cluster(frame), _ds=frame.apply(_dataset_label, axis=1))


def paper_points_fig7(runs: pd.DataFrame | None, paper: dict | None = None) -> pd.DataFrame:
    """The paper's Fig. 7 strong-scaling numbers, two rows per (cluster, dataset): the
    first and last GPU counts, their epoch times where the text states them
    (``epoch_ms``, else NaN) and the speedup over the first count (1 at the first).
    ``matched``: a ScaleGNN scaling run here is the same experiment (same cluster, the
    dataset itself, same GPU count, on GPUs); ``label`` is its dataset label in Fig. 7."""
    paper = paper if paper is not None else paper_numbers()
    rows = []
    for cl, datasets in paper.get("fig7", {}).items():
        for ds, v in datasets.items():
            ems = list(v.get("epoch_ms", [np.nan, np.nan]))
            for i, g in enumerate(v["gpus"]):
                rows.append({"cluster": cl, "dataset": ds, "gpus": int(g), "epoch_ms": float(ems[i]),
                             "speedup": 1.0 if i == 0 else float(v["speedup"]), "matched": False, "label": ""})
    out = pd.DataFrame(rows, columns=["cluster", "dataset", "gpus", "epoch_ms", "speedup", "matched", "label"])
    try:
        frame = _scaling_frame(runs, "fig7") if runs is not None and not runs.empty else None
    except NoData:
        frame = None
    if frame is not None and not out.empty:
        frame = frame[_real_dataset(frame) & _on_gpus(frame)]
        here = {(cl, canonical_dataset(ds), int(g)): label for cl, ds, g, label in
                zip(frame["_cluster"], frame["dataset"], frame["world_size"], frame["_ds"])}
        keys = list(zip(out["cluster"], out["dataset"], out["gpus"]))
        out["matched"] = [k in here for k in keys]
        out["label"] = [here.get(k, "") for k in keys]
    return out


def fig7_strong_scaling(runs: pd.DataFrame, paper: dict | None = None) -> plt.Figure:
    """Epoch time vs ranks (GPUs, or CPU processes: :func:`rank_axis_label` says which),
    one panel per cluster and one curve per (dataset, 3D grid)
    as Gd grows, with ideal scaling from each curve's first point (dashed) and the
    measured speedup annotated at its last point (paper Fig. 7); a point is the mean over
    its runs (seeds), with their min-max as a bar where there are several. The paper's epoch
    times (:func:`paper_points_fig7`, where stated) are drawn on the same axes where the
    experiment matches (same cluster, dataset and GPU count): hollow markers at its first
    and last GPU counts, the only ones it publishes, with no line between them."""
    frame = _scaling_frame(runs, "fig7")
    if frame.groupby(["_cluster", "_ds", "mp_grid"])["world_size"].nunique().max() < 2:
        raise NoData("scaling needs ScaleGNN runs of one 3D grid at two or more rank counts; every curve here "
                     "has one point")
    pp = paper_points_fig7(runs, paper)
    pp = pp[pp["matched"] & pp["epoch_ms"].notna()]
    clusters = sorted(frame["_cluster"].unique())
    fig, axes = _figure(len(clusters), 5.6, 4.8)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    # one colour per (dataset, 3D grid) in every panel, so that one legend under the panels serves them all
    all_curves = sorted(frame.groupby(["_ds", "mp_grid"]).groups)
    color_of = {k: colors[i % len(colors)] for i, k in enumerate(all_curves)}
    legend: dict[str, object] = {}
    spread = False
    for ax, cluster in zip(axes, clusters):
        sub = frame[frame["_cluster"] == cluster]
        curves = sorted(sub.groupby(["_ds", "mp_grid"]).groups)
        color_of_ds = {}
        for ds, mp in curves:
            c = sub[(sub["_ds"] == ds) & (sub["mp_grid"] == mp)]
            stats = over_runs(c, "world_size", "epoch_time_s", 1e3)
            pts = stats["mean"]
            color = color_of[(ds, mp)]
            color_of_ds.setdefault(ds, color)
            label = f"{ds}, 3D grid {mp}" if len(all_curves) > 1 else ds
            (line,) = ax.plot(pts.index, pts.values, "o-", color=color, label=label, linewidth=2)
            legend.setdefault(label, line)
            spread |= _spread(ax, stats.index, pts, stats["min"], stats["max"], stats["n"], color)
            if len(pts) > 1:
                g0, t0 = pts.index[0], pts.iloc[0]
                ax.plot(pts.index, [t0 * g0 / g for g in pts.index], "--", color=color, alpha=0.5, linewidth=1)
                speed = t0 / pts.iloc[-1]
                ideal = pts.index[-1] / g0
                ax.annotate(f"{speed:.1f}x ({100 * speed / ideal:.0f}% of ideal {ideal:.0f}x)",
                            (pts.index[-1], pts.iloc[-1]), textcoords="offset points", xytext=(-4, 8),
                            ha="right", fontsize=8, color=color)
        mine = pp[pp["cluster"] == cluster]
        for ds, p in mine.groupby("label"):
            p = p.sort_values("gpus")
            (line,) = ax.plot(p["gpus"], p["epoch_ms"], linestyle="none", marker="o", mfc="none", mew=1.5,
                              markersize=8, color=color_of_ds.get(ds, "black"),
                              label=f"{ds}, paper (published endpoints)")
            legend.setdefault(line.get_label(), line)
        _log2_ticks(ax, list(sub["world_size"]) + list(mine["gpus"]))
        ax.set_yscale("log")
        _log_axis(ax.yaxis)
        ax.set_xlabel(f"{rank_axis_label(sub)}; Gd grows from the first point")
        ax.set_ylabel("epoch time (ms)")
        ax.set_title(cluster)
        ax.grid(alpha=0.3, which="both")
    handles = list(legend.values()) + [Line2D([], [], color="gray", linestyle="--", label="ideal scaling")]
    _legend_below(fig, handles + ([_spread_handle()] if spread else []))
    fig.suptitle("Strong scaling of ScaleGNN epoch time (3D grid fixed, Gd grows)", fontsize=11)
    return fig


def fig7_paper_vs_here(runs: pd.DataFrame, paper: dict | None = None) -> plt.Figure:
    """Paper vs here for Fig. 7 when no experiment matches: speedup over the first GPU
    count against the GPU multiple (GPUs / first GPUs, so one ideal line y = x serves
    every curve; here the ranks' multiple, named by :func:`rank_axis_label`), the paper's
    strong-scaling results on the left (its published endpoints, the first and last count:
    hollow markers, no line) and the ScaleGNN curves measured here on the right, each
    on its own axes. Raises :class:`NoData` without a measured curve of two or more
    counts, or when a paper point matches (it is then on Fig. 7 itself)."""
    frame = _scaling_frame(runs, "fig7")
    pp = paper_points_fig7(runs, paper)
    if pp.empty:
        raise NoData("no paper numbers for Fig. 7")
    if pp["matched"].any():
        raise NoData("the paper's Fig. 7 points are drawn on the measured axes (same experiment)")
    curves = []
    for (cl, ds, mp), c in frame.groupby(["_cluster", "_ds", "mp_grid"]):
        stats = over_runs(c, "world_size", "epoch_time_s")
        if len(stats) > 1:
            curves.append((cl, ds, mp, stats))
    if not curves:
        raise NoData("scaling needs ScaleGNN runs of one 3D grid at two or more rank counts")
    measured = frame[[k in {c[:3] for c in curves} for k in zip(frame["_cluster"], frame["_ds"], frame["mp_grid"])]]
    noun, note = _RANKS[_rank_unit(measured)]  # the paper's ranks are GPUs; ours may be CPU processes
    fig = plt.figure(figsize=(12, 6.2), layout="constrained")
    left, right = fig.subfigures(1, 2)
    a1, a2 = left.subplots(), right.subplots()
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    markers = {"perlmutter": "o", "frontier": "s", "tuolumne": "^"}
    ds_color = {ds: colors[i % len(colors)] for i, ds in enumerate(sorted(pp["dataset"].unique()))}
    top = 1.0
    for (cl, ds), p in sorted(pp.groupby(["cluster", "dataset"])):
        p = p.sort_values("gpus")
        mult = p["gpus"] / p["gpus"].iloc[0]
        # the endpoints only, as published: the paper's text gives no point between them
        a1.plot(mult, p["speedup"], linestyle="none", marker=markers.get(cl, "D"), mfc="none", mew=1.5,
                markersize=7, color=ds_color[ds],
                label=f"{ds}, {cl} ({p['gpus'].iloc[0]} -> {p['gpus'].iloc[-1]} GPUs)")
        top = max(top, float(mult.iloc[-1]))
    here_top, spread = 1.0, False
    for i, (cl, ds, mp, stats) in enumerate(curves):
        mult = stats.index / stats.index[0]
        t0 = stats["mean"].iloc[0]  # speedups over the mean of the first count: its runs' spread stays visible
        a2.plot(mult, t0 / stats["mean"], "o-", color=colors[i % len(colors)], linewidth=2,
                label=f"{ds}, 3D grid {mp}, {cl} ({stats.index[0]} -> {stats.index[-1]})")
        spread |= _spread(a2, mult, t0 / stats["mean"], t0 / stats["max"], t0 / stats["min"], stats["n"],
                          colors[i % len(colors)])
        here_top = max(here_top, float(mult[-1]))
    paper_title = ("paper: ScaleGNN strong scaling (Fig. 7, Section VII-C), its published endpoints\n"
                   "(the first and last count: no line, the points between are not published)")
    here_x = f"{noun} / first count" + (f" ({note})" if note else "")
    for sub_fig, ax, hi, title, xlabel, count in (
            (left, a1, top, paper_title, "GPUs / first GPU count", "GPU count"),
            (right, a2, here_top, "here: ScaleGNN strong scaling (measured)", here_x, "count")):
        ax.plot([1, hi], [1, hi], color="gray", linestyle=":", linewidth=1, label="ideal")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_formatter(plt.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.set_xlabel(xlabel)
        ax.set_ylabel(f"speedup over the first {count}")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3, which="both")
        handles = ax.get_legend_handles_labels()[0] + ([_spread_handle()] if spread and ax is a2 else [])
        _legend_below(sub_fig, handles, fontsize=7)  # under its own axes
    fig.suptitle("Fig. 7, paper vs here: no experiment here matches the paper's, so each has its own axes",
                 fontsize=11)
    return fig


# ---------------------------------------------------------------------------- Fig. 8
def fig8_epoch_breakdown(runs: pd.DataFrame) -> plt.Figure:
    """Epoch time by component vs Gd with the 3D grid fixed (paper Fig. 8), one
    panel per (cluster, dataset, 3D grid) that has at least two Gd values (at most 3
    panels: those with the most Gd values); means over the runs (seeds) of a Gd, with
    their min-max on the bar where there are several."""
    frame = _scaling_frame(runs, "fig8")
    groups = frame.groupby(["_cluster", "_ds", "mp_grid"])
    keys = sorted(groups.groups, key=lambda k: (-groups.get_group(k)["grid.dp"].nunique(), k))
    keys = [k for k in keys if groups.get_group(k)["grid.dp"].nunique() > 1][:3] or keys[:1]
    fig, axes = _figure(len(keys), 5.2, 4.8)
    handles, spread = {}, False
    for ax, key in zip(axes, keys):
        sub = groups.get_group(key)
        comps = component_table(sub).assign(gd=sub["grid.dp"]).groupby("gd").mean().sort_index()
        stats = over_runs(sub, "grid.dp", "epoch_time_s", 1e3)
        epoch = stats["mean"] / 1e3
        comps["other"] = np.maximum(0.0, epoch.to_numpy() - comps.drop(columns="other").sum(axis=1).to_numpy())
        x = np.arange(len(comps))
        totals, used = _stacked_bars(ax, x, comps)
        handles.update(used)
        worlds = sub.groupby("grid.dp")["world_size"].first().sort_index()
        ax.set_xticks(x, [f"Gd={gd}\n{int(w)} rank{'s' if int(w) != 1 else ''}" for gd, w in worlds.items()])
        spread |= _spread(ax, x, stats["mean"], stats["min"], stats["max"], stats["n"], "black")
        tops = np.maximum(totals, np.where(stats["n"] > 1, stats["max"], 0.0))  # labels above the spread
        for xi, tot, top in zip(x, totals, tops):
            ax.annotate(f"{tot:.0f}", (xi, top), textcoords="offset points", xytext=(0, 2), ha="center",
                        va="bottom", fontsize=8)
        ax.set_ylabel("epoch time (ms)")
        ax.set_ylim(0, max(tops) * 1.15)
        ax.set_title(f"{key[1]}\n{key[0]}, 3D grid {key[2]}", fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    _component_legend(fig, handles, spread)
    fig.suptitle("Epoch time by component as data parallelism Gd grows", fontsize=11)
    return fig


# ---------------------------------------------------------------------------- Plexus Fig. 5
def plexus_fig5_model(validation: pd.DataFrame) -> plt.Figure:
    """Predicted vs observed epoch time per grid (Plexus Fig. 5): left, a scatter with
    y = x (filled: model fitted on all runs; hollow: leave-one-out prediction);
    right, observed and predicted bars per grid, sorted by observed time."""
    if validation is None or validation.empty:
        raise NoData("no runs to validate the performance model on (the `perfmodel` sweep)")
    v = validation.sort_values("observed_s").reset_index(drop=True)
    ms = 1e3
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 5.2), gridspec_kw={"width_ratios": [1, 1.5]},
                                 layout="constrained")
    lo = min(v["observed_s"].min(), v["predicted_s"].min(), v["loo_s"].min()) * ms / 1.3
    hi = max(v["observed_s"].max(), v["predicted_s"].max(), v["loo_s"].max()) * ms * 1.3
    (diag,) = a1.plot([lo, hi], [lo, hi], "k-", linewidth=1, label="predicted = observed")
    band = a1.fill_between([lo, hi], [lo / 1.25, hi / 1.25], [lo * 1.25, hi * 1.25], color="gray", alpha=0.15,
                           label="within 25%")
    (fit,) = a1.plot(v["observed_s"] * ms, v["predicted_s"] * ms, "o", color="#d62728", label="fit on all runs")
    (loo_pts,) = a1.plot(v["observed_s"] * ms, v["loo_s"] * ms, "o", mfc="none", color="#1f77b4",
                         label="leave-one-out")
    worst = (v["loo_s"] / v["observed_s"] - 1).abs().nlargest(min(3, len(v))).index
    for i in worst:  # name the largest leave-one-out misses (every grid is named on the right)
        r = v.loc[i]
        a1.annotate(r["grid"], (r["observed_s"] * ms, r["loo_s"] * ms), textcoords="offset points",
                    xytext=(6, -3), fontsize=7, color="#1f77b4")
    a1.set_xscale("log")
    a1.set_yscale("log")
    _log_axis(a1.xaxis)
    _log_axis(a1.yaxis)
    a1.set_xlim(lo, hi)
    a1.set_ylim(lo, hi)
    a1.set_xlabel("observed epoch time (ms)")
    a1.set_ylabel("predicted epoch time (ms)")
    mape = (v["predicted_s"] / v["observed_s"] - 1).abs().mean()
    loo = (v["loo_s"] / v["observed_s"] - 1).abs().mean()
    a1.set_title(f"mean |error|: {100 * mape:.0f}% fitted, {100 * loo:.0f}% leave-one-out", fontsize=10)
    a1.grid(alpha=0.3, which="both")
    x = np.arange(len(v))
    w = 0.28
    observed = a2.bar(x - w, v["observed_s"] * ms, w, color="#444444", label="observed")
    a2.bar(x, v["predicted_s"] * ms, w, color="#d62728", label="predicted (fit on all)")
    a2.bar(x + w, v["loo_s"] * ms, w, color="#1f77b4", alpha=0.7, label="predicted (leave-one-out)")
    a2.set_xticks(x, v["grid"], rotation=45, ha="right", fontsize=8)
    a2.set_xlabel("grid Gd x Gx x Gy x Gz (sorted by observed time)")
    a2.set_ylabel("epoch time (ms)")
    best_obs = v.loc[v["observed_s"].idxmin(), "grid"]
    best_pred = v.loc[v["loo_s"].idxmin(), "grid"]
    a2.set_title(f"fastest observed {best_obs}; fastest predicted (leave-one-out) {best_pred}", fontsize=10)
    a2.grid(axis="y", alpha=0.3)
    title = "Performance model: predicted vs observed epoch time"
    if "dataset" in v and v["dataset"].nunique() == 1:
        ds = str(v["dataset"].iloc[0])
        short = f"{ds.split(':', 1)[0]} {ds.split(':', 1)[1].split(',')[0]}" if ":" in ds else ds
        title += f"\n{short}, {len(v)} grids, {v['cluster'].iloc[0] if 'cluster' in v else ''}"
    fig.suptitle(title, fontsize=11)
    # one legend under both panels (the colours mean the same on both): never over a point or a bar
    _legend_below(fig, [observed, fit, loo_pts, diag, band],
                  ["observed", "predicted: fit on all runs", "predicted: leave-one-out", "predicted = observed",
                   "within 25%"])
    return fig



def fig7_model_vs_paper(curves: list[dict]) -> plt.Figure:
    """The calibrated performance model (lines) against the paper's Fig. 7 (hollow markers:
    the stated endpoints), one panel per machine; the legend gives each curve's speedup,
    paper vs model. Curves the paper states no times for show the model only."""
    clusters = list(dict.fromkeys(c["cluster"] for c in curves))
    fig, axes = _figure(len(clusters), 3.6, 3.6)
    colors = {"ogbn-products": "#1b9e77", "isolate-3-8m": "#d95f02", "products-14m": "#7570b3",
              "ogbn-papers100M": "#e7298a"}
    handles = {}
    for ax, cl in zip(axes, clusters):
        for c in (c for c in curves if c["cluster"] == cl):
            color = colors.get(c["dataset"], "#444444")
            label = short_dataset(c["dataset"])
            ax.plot(c["gpus"], c["model_ms"], "-", color=color, lw=1.5)
            txt = f"x{c['paper_speedup']:.1f} / x{c['model_speedup']:.1f}"
            ax.annotate(txt, (c["gpus"][-1], c["model_ms"][-1]), textcoords="offset points", xytext=(3, -3),
                        fontsize=6.5, color=color)
            if c["paper_ms"]:
                ax.plot([c["gpus"][0], c["gpus"][-1]], c["paper_ms"], "o", mfc="none", mec=color, ms=7, mew=1.5)
            handles.setdefault(label, Line2D([], [], color=color, lw=1.5, label=label))
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        _log_axis(ax.yaxis)
        counts = sorted({g for c in curves if c["cluster"] == cl for g in c["gpus"]})
        _log2_ticks(ax, counts)
        ax.set_xlim(counts[0] / 1.3, counts[-1] * 5.5)
        ax.set_title(cl, fontsize=9)
        ax.set_xlabel("GCDs" if cl == "frontier" else "GPUs", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(True, which="major", alpha=0.3)
    axes[0].set_ylabel("epoch time (ms)", fontsize=8)
    extra = [Line2D([], [], color="#444444", lw=1.5, label="model (calibrated)"),
             Line2D([], [], ls="none", marker="o", mfc="none", mec="#444444", label="paper (stated endpoints)")]
    fig.suptitle("Fig. 7: performance model vs paper (labels: speedup paper / model)", fontsize=9)
    _legend_below(fig, list(handles.values()) + extra)
    return fig
