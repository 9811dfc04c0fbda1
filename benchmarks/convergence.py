"""Epochs to a target accuracy, one change at a time from the benchmark's ScaleGNN recipe (issue V).

    python -m scalegnn.benchmarks.convergence [--nodes 200000] [--target 0.9] [--max-epochs 15]
                                              [--seeds 0 1 ...] [--only NAME ...] [--out DIR] [--work DIR]
                                              [--dataset NAME --data-root DIR] [--full-budget --eval-every K]

The GPU benchmark (``benchmarks/gpu.py``) trains ScaleGNN on a products-shaped CSBM graph
(47 classes, 100 features, average degree 52, homophily 0.7) with batch ratio 0.1,
hidden 256, 3 layers, dropout 0.5 and AdamW at lr 0.003, and needed 13-15 epochs to
90 % test accuracy where PyG's full-batch GCN needed 4. Each variant below is a real
run of the trainer (one process, ``scalegnn.launch``) on that graph with settings
changed, stopped at the target; the table gives epochs to the target (test accuracy of
the full-graph evaluation after each epoch, as ``--target-acc`` reads it) per seed, the
best test accuracy within the budget, and the command that reproduces the row.
``--dataset`` runs the same variants on another graph (the real-graph check);
``--full-budget`` trains every run for all ``--max-epochs`` instead of stopping at the
target, and the table adds the test accuracy at the best validation accuracy (model
selection as the run records it) and the final one, so that a variant that reaches the
target sooner but ends lower shows it. Accuracies, not times: the runs may share the
machine with other work.

Writes ``convergence.json`` (``convergence-DATASET.json`` with ``--dataset``: every
epoch's accuracies per variant and seed) and its ``.md`` table to ``--out``; the
generated graph and the runs' records go to ``--work`` (default: a temporary folder,
removed at the end).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from scalegnn.fileio import atomic_write

from .common import markdown_table

__all__ = ["RECIPE", "BASE", "VARIANTS", "recipe", "command", "run_variant", "main"]

# The benchmark's graph (benchmarks/gpu.py's products-scale CSBM, at --nodes vertices)
RECIPE = dict(avg_degree=52.0, classes=47, homophily=0.7, feature_dim=100, signal=0.75)
# The benchmark's ScaleGNN settings
BASE = dict(hidden=256, layers=3, dropout=0.5, lr=0.003, batch_ratio=0.1)
# name: the settings changed from BASE
VARIANTS = {
    "benchmark recipe (paper model)": {},
    "lr 0.01": {"lr": 0.01},
    "lr 0.001": {"lr": 0.001},
    "dropout 0.3 (ScaleGNN's own setting)": {"dropout": 0.3},
    "dropout 0.1": {"dropout": 0.1},
    "dropout 0": {"dropout": 0.0},
    "no RMSNorm": {"norm": False},
    "no RMSNorm, lr 0.01": {"norm": False, "lr": 0.01},
    "no residual": {"residual": False},
    "weight decay 0.01": {"weight_decay": 0.01},
    "cosine schedule": {"schedule": "cosine"},
    "batch ratio 0.25": {"batch_ratio": 0.25},
    "full graph (B = N), lr 0.01": {"batch_ratio": 1.0, "lr": 0.01},
    "lr 0.001, dropout 0.3": {"lr": 0.001, "dropout": 0.3},
    "lr 0.001, dropout 0.1": {"lr": 0.001, "dropout": 0.1},
    "pre-norm (departs from the paper)": {"norm_position": "pre"},
    "pre-norm, dropout 0.3": {"norm_position": "pre", "dropout": 0.3},
    "pre-norm, lr 0.01": {"norm_position": "pre", "lr": 0.01},
    "pre-norm, lr 0.01, dropout 0.3": {"norm_position": "pre", "lr": 0.01, "dropout": 0.3},
}


def recipe(nodes: int) -> str:
    return "csbm:" + ",".join(f"{k}={v}" for k, v in {"n": nodes, **RECIPE}.items())


def _flag(name: str, value) -> str:
    flag = "--" + name.replace("_", "-")
    if isinstance(value, bool):
        return flag if value else "--no-" + name.replace("_", "-")
    return f"{flag} {value}"


def command(dataset: str, settings: dict, target: float, max_epochs: int, seed: int, stop: bool = True,
            eval_every: int = 1) -> str:
    """The ``scalegnn train`` line of a variant."""
    flags = " ".join(_flag(k, v) for k, v in settings.items())
    return (f"scalegnn train --dataset {dataset} {flags} --epochs {max_epochs} --seed {seed} "
            f"--target-acc {target}" + (" --stop-at-target" if stop else "")
            + (f" --eval-every {eval_every}" if eval_every != 1 else ""))


def run_variant(dataset: str, settings: dict, target: float, max_epochs: int, seed: int, root: Path,
                data_root: Path | None = None, stop: bool = True, eval_every: int = 1) -> dict:
    """One run, to the target (``stop``) or for all ``max_epochs``: epochs and steps to the
    target (None if not reached; counted in epochs, evaluated every ``eval_every``), the
    curve, and the record's model selection (test accuracy at the best validation one)."""
    from scalegnn.config import make_config
    from scalegnn.launch import launch

    cfg = make_config(dataset=dataset, epochs=max_epochs, seed=seed, target_acc=target, stop_at_target=stop,
                      eval_every=eval_every, progress=False, data_root=str(data_root or root / "data"),
                      out_dir=str(root / "runs"), **settings)
    rec = launch(cfg)
    rows = rec["epochs"]
    curve = [r["test_acc"] for r in rows]
    reached = next((r["epoch"] for r in rows if r["test_acc"] is not None and r["test_acc"] >= target), None)
    summary = rec.get("summary") or {}
    return {"settings": settings, "seed": seed, "status": rec["status"], "steps_per_epoch": rec["steps_per_epoch"],
            "epochs_to_target": reached, "steps_to_target": reached * rec["steps_per_epoch"] if reached else None,
            "best_test_acc": max((a for a in curve if a is not None), default=None), "test_acc": curve,
            "test_acc_at_best_val": summary.get("test_acc_at_best_val"),
            "final_test_acc": summary.get("final_test_acc"),
            "train_time_s": [r["train_time_s"] for r in rows]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=200_000, help="the CSBM recipe's vertices")
    ap.add_argument("--dataset", default=None, help="another dataset instead of the CSBM recipe (e.g. facebook)")
    ap.add_argument("--data-root", type=Path, default=None, help="where --dataset is found (default: --work)")
    ap.add_argument("--target", type=float, default=0.9)
    ap.add_argument("--max-epochs", type=int, default=15)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--only", nargs="*", default=None, help="variant names to run (default: all)")
    ap.add_argument("--full-budget", action="store_true",
                    help="train every run for --max-epochs (no stop at the target); adds the final accuracies")
    ap.add_argument("--eval-every", type=int, default=1, help="evaluate every K epochs (with --full-budget)")
    ap.add_argument("--out", type=Path, default=Path("results/bench/convergence"))
    ap.add_argument("--work", type=Path, default=None, help="folder for the graph and the runs (default: temporary)")
    args = ap.parse_args(argv)
    if args.eval_every != 1 and not args.full_budget:
        ap.error("--eval-every needs --full-budget (a run stopped at its target is evaluated every epoch)")
    unknown = sorted(set(args.only or ()) - set(VARIANTS))
    if unknown:
        ap.error(f"no variant {unknown[0]!r}; the variants: {', '.join(VARIANTS)}")
    dataset = args.dataset or recipe(args.nodes)
    name = "convergence" if args.dataset is None else f"convergence-{args.dataset}"
    args.out.mkdir(parents=True, exist_ok=True)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        for variant, change in VARIANTS.items():
            if args.only and variant not in args.only:
                continue
            settings = {**BASE, **change}
            stop = not args.full_budget
            results[variant] = runs = [
                {**run_variant(dataset, settings, args.target, args.max_epochs, seed, work, args.data_root, stop,
                               args.eval_every),
                 "command": command(dataset, settings, args.target, args.max_epochs, seed, stop, args.eval_every)}
                for seed in args.seeds]
            print(f"{variant}: epochs to {args.target}: {[r['epochs_to_target'] for r in runs]}, "
                  f"best {[r['best_test_acc'] for r in runs]}, "
                  f"at best val {[r['test_acc_at_best_val'] for r in runs]}", flush=True)
    text = json.dumps(
        {"dataset": dataset, "target": args.target, "max_epochs": args.max_epochs, "seeds": args.seeds,
         "full_budget": args.full_budget, "eval_every": args.eval_every, "base": BASE, "results": results}, indent=1)
    atomic_write(args.out / f"{name}.json", lambda f: f.write(text), text=True)

    def each(runs, key, fmt="{}"):
        return ", ".join(fmt.format(r[key]) if r[key] is not None else f"> {args.max_epochs}" for r in runs)

    seeds = ", ".join(map(str, args.seeds))
    if args.full_budget:
        rows = [[variant, each(runs, "epochs_to_target"), each(runs, "test_acc_at_best_val", "{:.3f}"),
                 each(runs, "final_test_acc", "{:.3f}"), f"`{runs[0]['command']}`"]
                for variant, runs in results.items()]
        md = (f"Epochs to {args.target:.1%} test accuracy on `{dataset}` (evaluated every {args.eval_every}), one "
              f"process, seed(s) {seeds}, every run trained for {args.max_epochs} epochs; the test accuracy at the "
              "best validation accuracy and the final one.\n\n"
              + markdown_table(["variant", "epochs", "test acc at best val", "final test acc", "command (first seed)"],
                               rows))
    else:
        rows = [[variant, each(runs, "epochs_to_target"), each(runs, "best_test_acc", "{:.3f}"),
                 f"`{runs[0]['command']}`"] for variant, runs in results.items()]
        md = (f"Epochs to {args.target:.0%} test accuracy on `{dataset}`, one process, seed(s) {seeds}, at most "
              f"{args.max_epochs} epochs (a run stops at the target, so its best accuracy is the one that reached "
              "it).\n\n" + markdown_table(["variant", "epochs", "best test acc", "command (first seed)"], rows))
    atomic_write(args.out / f"{name}.md", lambda f: f.write(md + "\n"), text=True)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
