"""``scalegnn demo``: the harness in miniature, offline, in a few minutes on a laptop.

Trains ScaleGNN on a generated contextual-SBM graph (no internet, no ../shared):
serially, full-graph, and on a 4-process 3D grid; writes one record per run to
``results/demo/`` and prints a comparison table read back from those records.
"""

from __future__ import annotations

import time

from .model import ModelConfig
from .train import RunConfig, run_training, summary_line

DEMO_DATASET = "csbm:n=20000,avg_degree=12,classes=8,feature_dim=64,homophily=0.6,signal=0.4"


def demo_runs(out_dir: str, data_root: str | None, epochs: int) -> list[tuple[str, RunConfig, int | None]]:
    base = dict(dataset=DEMO_DATASET, data_root=data_root, epochs=epochs, eval_every=5, out_dir=out_dir,
                target_acc=0.8, model=ModelConfig(hidden=64, layers=3, dropout=0.3))
    return [
        ("scalegnn, 1 process", RunConfig(batch_ratio=0.1, **base), None),
        ("fullgraph-3d, 1 process", RunConfig(batch_ratio=1.0, **base), None),
        ("scalegnn, grid 1x2x2x1 (4 gloo processes)", RunConfig(batch_ratio=0.1, grid=(1, 2, 2, 1), **base), 4),
    ]


def run_demo(out_dir: str = "results/demo", data_root: str | None = None, epochs: int = 30) -> int:
    from analysis import load_runs

    t0 = time.perf_counter()
    print(f"ScaleGNN demo: dataset {DEMO_DATASET}\n")
    for title, cfg, nproc in demo_runs(out_dir, data_root, epochs):
        print(f"== {title}")
        if nproc is None:
            record = run_training(cfg)
        else:
            from .parallel.launch import run_distributed_training

            record = run_distributed_training(cfg, nproc=nproc)
        print("   " + summary_line(record))
        print(f"   record: {record['path']}\n")
    runs = load_runs(out_dir)
    cols = ["system", "world_size", "summary.test_acc_at_best_val", "summary.train_time_s", "time_to_target_s",
            "peak_memory_bytes"]
    latest = runs.sort_values("run_id").groupby(["system", "world_size"]).tail(1)[cols]
    print(latest.to_string(index=False))
    print(f"\ndemo finished in {time.perf_counter() - t0:.0f} s; records in {out_dir}/")
    return 0
