"""``scalegnn demo``: the harness in miniature, offline, in a few minutes on a laptop.

It is exactly what a cluster user does, on this machine:

  1. ``scalegnn sweep demo --cluster local``: the ``demo`` sweep spec
     (``sweeps/specs/demo.toml``) expanded for the ``local`` profile and run through
     submitit's LocalExecutor, one job per run with one task (process) per rank --
     ScaleGNN on two 4D grids that share the 3D grid (Gd = 1 and 2), and the compared
     systems (GraphSAGE and GraphSAINT when the baselines are installed, and
     full-graph 3D training), all on a generated contextual-SBM graph;
  2. ``scalegnn report``: figures, tables, provenance and failures from the records.

Runs that already have an ok record are skipped, so a second ``scalegnn demo``
only rewrites the report.
"""

from __future__ import annotations

import time
from pathlib import Path

__all__ = ["run_demo", "DEMO_SPEC"]

DEMO_SPEC = "demo"


def run_demo(out_dir: str = "results/demo", data_root: str | None = None, epochs: int | None = None) -> int:
    from analysis import load_runs
    from analysis.report import write_report
    from sweeps.launcher import sweep

    t0 = time.perf_counter()
    out = Path(out_dir)
    print(f"ScaleGNN demo: `scalegnn sweep {DEMO_SPEC} --cluster local --out {out}`, then `scalegnn report`\n")
    result = sweep(DEMO_SPEC, "local", out, epochs=epochs, data_root=data_root)
    runs = load_runs(out)
    if not runs.empty:
        runs = runs[runs["status"] == "ok"].sort_values("run_id").groupby("run_key").tail(1)
        table = runs.assign(
            test_acc=runs["best_test_acc"], epoch_s=runs["epoch_time_s"], eval_s=runs["eval_time_s"],
            to_target_s=runs["time_to_target_s"])[
            ["system", "grid_str", "world_size", "epochs_run", "test_acc", "epoch_s", "eval_s", "to_target_s"]]
        print("\n" + table.sort_values(["system", "world_size"]).to_string(
            index=False, float_format=lambda v: f"{v:.3f}", na_rep="-"))
    report = write_report(out, out / "report", data_root=data_root, title="ScaleGNN demo report")
    print(f"\ndemo finished in {time.perf_counter() - t0:.0f} s; records in {out}/runs/, report: {report}")
    return 1 if result.failed else 0
