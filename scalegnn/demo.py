"""``scalegnn demo``: the paper's time-to-accuracy claim in miniature, where it holds
and where it does not, offline, in a few minutes on a laptop.

It is exactly what a cluster user does, on this machine:

  1. ``scalegnn sweep demo --cluster local``: the ``demo`` sweep spec
     (``sweeps/specs/demo.toml``) expanded for the ``local`` profile and run through
     submitit's LocalExecutor, one job per run with one task (process) per rank. On a
     generated contextual-SBM graph as dense as ogbn-products (average degree 50):
     ScaleGNN at 1 process and on two 2-process grids (2x1x1x1, 1x2x1x1), GraphSAGE
     and GraphSAINT (when the baselines are installed) at 1 and 2 processes, full-graph
     3D at 1. On the same generator at average degree 10: ScaleGNN, GraphSAGE and
     GraphSAINT at 1 process. Every run stops at the target accuracy; every process
     has one thread (``--threads-per-task 1``), so N processes use N cores, as N GPUs
     would;
  2. ``scalegnn report``: the result lines, figures, tables, provenance and failures
     from the records.

The demo ends with the result in one line (``analysis.verdict``: ScaleGNN's time to
the target against every system at the same process count, densest graph first),
after the line that says where it does not hold (the sparse graph). Runs that already
have an ok record are skipped, so a second ``scalegnn demo`` only rewrites the report.
"""

from __future__ import annotations

import time
from pathlib import Path

__all__ = ["run_demo", "DEMO_SPEC"]

DEMO_SPEC = "demo"


def run_demo(out_dir: str = "results/demo", data_root: str | None = None, epochs: int | None = None) -> int:
    from scalegnn.analysis import load_runs
    from scalegnn.analysis.figures import short_dataset
    from scalegnn.analysis.report import write_report
    from scalegnn.analysis.verdict import result_lines
    from scalegnn.sweeps.launcher import sweep

    t0 = time.perf_counter()
    out = Path(out_dir)
    print(f"ScaleGNN demo: `scalegnn sweep {DEMO_SPEC} --cluster local --threads-per-task 1 --out {out}`, then "
          "`scalegnn report`\n")
    # one thread per process, as one GPU per rank: a count of processes is a count of cores,
    # and a 1-process run does not lose its time to OpenMP threads waiting on a busy core
    result = sweep(DEMO_SPEC, "local", out, epochs=epochs, data_root=data_root, overrides={"threads_per_task": 1})
    runs = load_runs(out)
    if not runs.empty:
        runs = runs[runs["status"] == "ok"].sort_values("run_id").groupby("run_key").tail(1)
        table = runs.assign(
            graph=runs["dataset"].map(short_dataset), test_acc=runs["best_test_acc"], epoch_s=runs["epoch_time_s"],
            eval_s=runs["eval_time_s"], to_target_s=runs["time_to_target_s"])[
            ["graph", "system", "grid_str", "world_size", "epochs_run", "test_acc", "epoch_s", "eval_s",
             "to_target_s"]]
        print("\n" + table.sort_values(["graph", "system", "world_size"]).to_string(
            index=False, float_format=lambda v: f"{v:.3f}", na_rep="-"))
    report = write_report(out, out / "report", data_root=data_root, title="ScaleGNN demo report")
    print(f"\ndemo finished in {time.perf_counter() - t0:.0f} s; records in {out}/runs/, report: {report}")
    lines = result_lines(runs) if not runs.empty else []
    if lines:  # where it does not hold first, so that the last line is the result
        print("")
        for text in lines[1:]:
            print(text)
        print("Result: " + lines[0])
    return 1 if result.failed else 0
