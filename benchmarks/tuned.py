"""Time to accuracy, tuned against tuned and paper settings against paper settings (issue V).

    python -m scalegnn.benchmarks.tuned --tuned DIR --target 0.9 [--seeds 0 1 2] [--max-epochs 30]
                                        [--systems a,b] [--out results/bench/tuned] [-- TRAIN FLAGS]

The comparison the GPU benchmark makes, on any device and for every registered
system, made fair the way issue V asks:

* **tuned against tuned**: each system runs the settings ``scalegnn tune`` chose for
  it (``DIR/*/tune.json``, one search per system, all on the same dataset, under the
  same budget); and, as a second table, **paper against paper**: each system at its own
  defaults (its published hyper-parameters, what ``scalegnn train --system S`` runs);
* **a warm-up first**: one untimed epoch of every system in this process before any
  timed run, so no system pays the process's first CUDA/cuBLAS/PyG initialization and
  none rides on another's;
* **alternating order**: seed i runs the systems in the listed order when i is even and
  reversed when it is odd, so drift in the machine's load does not favour one side.

Every timed run is an ordinary run record (``OUT/runs``), stopped at ``--target`` test
accuracy (evaluation after each epoch, excluded from the time, as the paper's VI-C).
The table gives per system the median over seeds of epochs and seconds to the target
(a seed that does not reach it counts as not reached), the ratio of that time to
``pyg-gcn``'s where it ran, and the settings. Times are wall times: run it alone.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
from pathlib import Path

from scalegnn.fileio import atomic_write

from .common import machine_info, markdown_table

__all__ = ["load_tuned", "run_order", "compare", "main"]

REFERENCE = "pyg-gcn"


def load_tuned(folder: Path) -> dict[str, dict]:
    """``{system: tuning record}`` of every complete search under ``folder``, one dataset."""
    found = {}
    for path in sorted(Path(folder).glob("*/tune.json")):
        doc = json.loads(path.read_text())
        if not doc.get("complete") or doc.get("chosen") is None:
            raise ValueError(f"{path}: the search did not finish (rerun its scalegnn tune command to resume it)")
        system = doc["spec"]["system"]
        if system in found:
            raise ValueError(f"two searches for {system} under {folder}: {found[system]['path']} and {path}")
        found[system] = {**doc, "path": str(path)}
    if not found:
        raise ValueError(f"no */tune.json under {folder}; run `scalegnn tune --out {folder}/SYSTEM ...` first")
    datasets = {d["spec"]["dataset"] for d in found.values()}
    if len(datasets) > 1:
        raise ValueError(f"the searches under {folder} tuned different datasets: {sorted(datasets)}")
    return found


def run_order(systems: list[str], seed_index: int) -> list[str]:
    """The systems in order for even seed indices, reversed for odd ones."""
    return list(systems) if seed_index % 2 == 0 else list(reversed(systems))


def _flags(flags: dict[str, str]) -> list[str]:
    return [x for kv in flags.items() for x in kv]


def _run(system: str, dataset: str, flags: list[str], extra: list[str], epochs: int, seed: int, target: float | None,
         out: Path) -> dict:
    from scalegnn.config import parse_train_args
    from scalegnn.launch import launch

    argv = ["--system", system, "--dataset", dataset, *extra, *flags, "--epochs", str(epochs), "--seed", str(seed),
            "--out", str(out), "--quiet"]
    if target is not None:
        argv += ["--target-acc", str(target), "--stop-at-target"]
    return launch(parse_train_args(argv)[0])


def compare(settings: dict[str, list[str]], dataset: str, target: float, seeds: list[int], max_epochs: int,
            extra: list[str], out: Path, log=print) -> dict:
    """Warm up every system, then run each seed's systems in alternating order; per
    system the runs' epochs and seconds to ``target`` and their medians."""
    systems = list(settings)
    for system in systems:  # untimed: one epoch each, records kept apart
        _run(system, dataset, settings[system], extra, 1, seeds[0], None, out / "warmup")
    runs: dict[str, list[dict]] = {s: [] for s in systems}
    for i, seed in enumerate(seeds):
        for system in run_order(systems, i):
            rec = _run(system, dataset, settings[system], extra, max_epochs, seed, target, out / "runs")
            reached = next((r["epoch"] for r in rec["epochs"]
                            if r["test_acc"] is not None and r["test_acc"] >= target), None)
            runs[system].append({"seed": seed, "status": rec["status"], "run_id": rec["run_id"],
                                 "epochs_to_target": reached, "time_to_target_s": rec["time_to_target_s"],
                                 "best_test_acc": (rec.get("summary") or {}).get("best_test_acc"),
                                 "epoch_s": (rec["epochs"][-1]["train_time_s"] / len(rec["epochs"])
                                             if rec["epochs"] else None)})
            log(f"seed {seed} {system}: {runs[system][-1]}")
    result = {}
    for system, rs in runs.items():
        def median(key):
            values = [r[key] for r in rs]
            return statistics.median(values) if values and None not in values else None
        result[system] = {"flags": settings[system], "runs": rs, "epochs_to_target": median("epochs_to_target"),
                          "time_to_target_s": median("time_to_target_s"), "epoch_s": median("epoch_s"),
                          "reached": sum(r["time_to_target_s"] is not None for r in rs)}
    ref = result.get(REFERENCE, {}).get("time_to_target_s")
    for r in result.values():
        r["ratio_to_pyg_gcn"] = r["time_to_target_s"] / ref if ref and r["time_to_target_s"] is not None else None
    return result


def _shown(flags: list[str]) -> list[str]:
    """The flags that set training, without where the data is cached (``--data-root``) and
    the search the settings come from (``--tuned-from``: the table's heading says it)."""
    out, skip = [], False
    for f in flags:
        if skip:
            skip = False
        elif f in ("--data-root", "--tuned-from"):
            skip = True
        else:
            out.append(f)
    return out


def _table(result: dict, seeds: int) -> str:
    rows = []
    for system, r in result.items():
        shown = _shown(r["flags"])
        rows.append([system, f"{r['reached']}/{seeds}", "-" if r["epochs_to_target"] is None else r["epochs_to_target"],
                     "-" if r["time_to_target_s"] is None else r["time_to_target_s"], r["epoch_s"],
                     "-" if r["ratio_to_pyg_gcn"] is None else r["ratio_to_pyg_gcn"],
                     f"`{shlex.join(shown)}`" if shown else "(its defaults)"])
    return markdown_table(["system", "reached", "epochs to target", "s to target", "s per epoch", "ratio to pyg-gcn",
                           "settings"], rows)


def markdown(doc: dict) -> str:
    """The tables of a comparison (``tuned.json``)."""
    md = [f"Time to {doc['target']:.0%} test accuracy on `{doc['dataset']}`, seeds {doc['seeds']}, order "
          "alternating, one untimed warm-up epoch per system first."]
    for name in ("tuned", "paper"):
        if name in doc:
            budget = next(iter(doc["budget"].values()))
            title = (f"Tuned (`scalegnn tune`: {budget['configurations']} configurations of {budget['epochs']} "
                     "epochs per system, chosen by validation time to the target)" if name == "tuned"
                     else "Each system at its own defaults")
            md += ["", f"## {title}", "", _table(doc[name], len(doc["seeds"]))]
    before, after = doc["machine_before"], doc["machine_after"]
    md += ["", f"Load average (1 min) before {before['load_avg_1m']}, after {after['load_avg_1m']}; {after['cpus']} "
               f"CPUs, torch {after['torch']}. Command: `{doc['command']}`."]
    return "\n".join(md) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m scalegnn.benchmarks.tuned", description=__doc__.splitlines()[0])
    ap.add_argument("--tuned", type=Path, required=True, help="folder of scalegnn tune searches (*/tune.json)")
    ap.add_argument("--target", type=float, required=True, help="test accuracy to reach")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--max-epochs", type=int, default=30)
    ap.add_argument("--systems", default=None, help="only these systems, in this order (comma-separated)")
    ap.add_argument("--no-paper", action="store_true", help="only the tuned table")
    ap.add_argument("--out", type=Path, default=Path("results/bench/tuned"))
    ap.add_argument("train_flags", nargs=argparse.REMAINDER, help="after `--`: flags for every run (e.g. --data-root)")
    args = ap.parse_args(argv)
    extra = args.train_flags[1:] if args.train_flags[:1] == ["--"] else args.train_flags
    try:
        tuned = load_tuned(args.tuned)
    except ValueError as exc:
        ap.error(str(exc))
    systems = args.systems.split(",") if args.systems else list(tuned)
    missing = [s for s in systems if s not in tuned]
    if missing:
        ap.error(f"no search for {missing[0]} under {args.tuned}; searched: {', '.join(tuned)}")
    dataset = next(iter(tuned.values()))["spec"]["dataset"]
    common = {s: list(tuned[s]["spec"]["train_flags"]) for s in systems}
    doc = {"command": "python -m scalegnn.benchmarks.tuned " + shlex.join(sys.argv[1:] if argv is None else argv),
           "machine_before": machine_info(), "dataset": dataset, "target": args.target, "seeds": args.seeds,
           "max_epochs": args.max_epochs, "tuned_from": {s: tuned[s]["path"] for s in systems},
           "budget": {s: {"epochs": tuned[s]["spec"]["epochs"], "configurations": len(tuned[s]["trials"]),
                          "space": tuned[s]["spec"]["space"]} for s in systems}}
    args.out.mkdir(parents=True, exist_ok=True)
    tables = {"tuned": {s: common[s] + _flags(tuned[s]["chosen"]["flags"]) + ["--tuned-from", tuned[s]["path"]]
                        for s in systems}}
    if not args.no_paper:
        tables["paper"] = {s: common[s] for s in systems}
    for name, settings in tables.items():
        doc[name] = compare(settings, dataset, args.target, args.seeds, args.max_epochs, extra, args.out / name)
    doc["machine_after"] = machine_info()
    md = markdown(doc)
    text = json.dumps(doc, indent=1)
    atomic_write(args.out / "tuned.json", lambda f: f.write(text), text=True)
    atomic_write(args.out / "tuned.md", lambda f: f.write(md), text=True)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
