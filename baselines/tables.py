"""Markdown tables of README "Baselines" from recorded runs.

    python -m baselines.tables results/baselines

reads ``table1/`` (accuracy: Table I style) and ``fig6/`` (time to target accuracy:
Fig. 6 style, and evaluation time per round: Table II style) under the folder.
"""

from __future__ import annotations

import statistics
import sys
from collections import defaultdict
from pathlib import Path

from scalegnn.records import RecordError, read_record

ORDER = ("scalegnn", "fullgraph-3d", "graphsage", "graphsaint", "salient", "bns-gcn", "distdgl")


def load(folder: Path) -> list[dict]:
    out = []
    for p in sorted(Path(folder).glob("*.json")):
        try:
            out.append(read_record(p))
        except RecordError as exc:
            print(f"skipped: {exc}", file=sys.stderr)
    return out


def _sys_key(s):
    return ORDER.index(s) if s in ORDER else len(ORDER)


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


def time_to_target_table(recs: list[dict]) -> str:
    cell, procs = {}, set()
    for r in recs:
        n = r["world_size"]
        procs.add(n)
        if r["status"] != "ok":
            cell[(r["system"], n)] = f"{r['status']}"
            continue
        epochs = r["epochs"]
        if r["time_to_target_s"] is not None:
            hit = next(e for e in epochs if (e["test_acc"] or 0) >= r["target_acc"])
            cell[(r["system"], n)] = f"{r['time_to_target_s']:.1f} s ({hit['epoch']} ep)"
        else:
            best = max((e for e in epochs if e["test_acc"] is not None), key=lambda e: e["test_acc"])
            cell[(r["system"], n)] = (f"× {best['test_acc']:.3f} best, {best['train_time_s']:.1f} s "
                                      f"({len(epochs)} ep)")
    return _system_by_procs(cell, procs)


def eval_time_table(recs: list[dict]) -> str:
    cell, procs = {}, set()
    for r in recs:
        times = [e["eval_time_s"] for e in r["epochs"] if e.get("eval_time_s") is not None]
        if not times:
            continue
        n = r["world_size"]
        procs.add(n)
        per_epoch = statistics.median(
            [b["train_time_s"] - a["train_time_s"] for a, b in zip(r["epochs"], r["epochs"][1:])] or
            [r["epochs"][0]["train_time_s"]])
        cell[(r["system"], n)] = f"{statistics.median(times):.3f} s (epoch {per_epoch:.2f} s)"
    return _system_by_procs(cell, procs)


def main(argv=None) -> int:
    root = Path((argv or sys.argv[1:] or ["results/baselines"])[0])
    if (root / "table1").is_dir():
        recs = load(root / "table1")
        print("### Test accuracy at the best validation epoch (%), mean ± std over seeds\n")
        print(accuracy_table(recs) + "\n")
        print("### Best test accuracy of any epoch (%, Table I's measure), mean ± std over seeds\n")
        print(accuracy_table(recs, "best_test_acc") + "\n")
    if (root / "fig6").is_dir():
        recs = load(root / "fig6")
        print("### Training time to 0.92 test accuracy on Facebook (epochs needed)\n")
        print(time_to_target_table(recs) + "\n")
        print("### Evaluation time per round (median), Facebook\n")
        print(eval_time_table(recs) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
