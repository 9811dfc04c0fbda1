"""Collective bucketing (issue L item 6): calls and bytes per training step, and the step
time, with ``--bucket-collectives`` off and on, side by side in one run.

Every rank builds one engine per configuration (bucketing off/on, each with comm
overlap off/on as asked) on the same graph, warms each up, then times blocks of
``--steps`` steps per engine in turn, ``--reps`` times, alternating the order (ABBA),
so that drift of a shared machine falls on both. Times are rank 0's wall clock per
step (median over the blocks); calls and bytes per step are rank 0's, exact.

    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/bucketing.py --grid 1x2x2x2 --data-root ../shared/data
    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/bucketing.py --grid 2x2x2x1 --grad-clip 1.0 --counts-only

Writes ``bucketing_<grid>.json`` and ``.md`` under ``--out`` (default results/bench).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path


def _worker(rank, world, shape, args: dict):
    from scalegnn.config import make_config
    from scalegnn.model import ModelConfig
    from scalegnn.numerics import NumericsConfig
    from scalegnn.optim import OptimConfig
    from scalegnn.parallel.engine import ParallelEngine
    from scalegnn.parallel.grid import ProcessGrid
    from scalegnn.perf import PerfConfig
    from scalegnn.sampling import resolve_batch_size
    from scalegnn.trainer import prepare_graph

    grid = ProcessGrid(*shape)
    graph = prepare_graph(make_config(dataset=args["dataset"], data_root=args["data_root"], progress=False))
    batch = resolve_batch_size(graph.num_nodes, batch_ratio=args["batch_ratio"])
    engines = {}
    for overlap in args["overlaps"]:
        for bucket in (False, True):
            perf = PerfConfig(bucket_collectives=bucket, comm_overlap=overlap)
            eng = ParallelEngine(graph, ModelConfig(hidden=args["hidden"], layers=args["layers"]),
                                 OptimConfig(grad_clip=args["grad_clip"]), batch, seed=0, epochs=1000, grid=grid,
                                 perf=perf, numerics=NumericsConfig(comm_dtype=args["comm_dtype"]))
            engines[(overlap, bucket)] = eng
    step = {k: 0 for k in engines}
    for key, eng in engines.items():
        for _ in range(args["warmup"]):
            eng.train_step(step[key])
            step[key] += 1
        eng.reset_counters()
    blocks = {k: [] for k in engines}
    reps = 1 if args["counts_only"] else args["reps"]
    for rep in range(reps):
        for overlap in args["overlaps"]:
            order = (False, True) if rep % 2 == 0 else (True, False)  # ABBA
            for bucket in order:
                key = (overlap, bucket)
                eng = engines[key]
                grid.barrier()
                t0 = time.perf_counter()
                for _ in range(args["steps"]):
                    eng.train_step(step[key])
                    step[key] += 1
                eng.synchronize()
                blocks[key].append((time.perf_counter() - t0) / args["steps"])
    out = []
    for (overlap, bucket), eng in engines.items():
        _, nbytes, calls = eng.counters()
        n = reps * args["steps"]
        out.append({"overlap": overlap, "bucket": bucket, "step_ms": [b * 1e3 for b in blocks[(overlap, bucket)]],
                    "calls_per_step": {k: v / n for k, v in sorted(calls.items())},
                    "bytes_per_step": {k: v / n for k, v in sorted(nbytes.items())}})
        eng.close()
    return out


def run(args) -> tuple[dict, str]:
    from scalegnn.parallel.grid import parse_grid
    from scalegnn.launch.job import spawn

    shape = parse_grid(args.grid)
    opts = {"dataset": args.dataset, "data_root": args.data_root, "batch_ratio": args.batch_ratio,
            "hidden": args.hidden, "layers": args.layers, "grad_clip": args.grad_clip, "comm_dtype": args.comm_dtype,
            "overlaps": {"off": (False,), "on": (True,), "both": (False, True)}[args.overlap],
            "warmup": args.warmup, "steps": args.steps, "reps": args.reps, "counts_only": args.counts_only}
    load_before = os.getloadavg()
    res = spawn(_worker, math.prod(shape), shape, opts, timeout_s=3000, threads_per_worker=1)[0]
    load_after = os.getloadavg()
    kinds = sorted({k for r in res for k in r["calls_per_step"]})
    head = ["overlap", "bucketing", "calls / step", "bytes / step"] + [f"calls {k}" for k in kinds]
    if not args.counts_only:
        head += ["ms / step (median)", "blocks", "on / off"]
    rows = []
    for r in res:
        calls = r["calls_per_step"]
        row = ["on" if r["overlap"] else "off", "on" if r["bucket"] else "off", round(sum(calls.values()), 2),
               round(sum(r["bytes_per_step"].values())), *[round(calls.get(k, 0.0), 2) for k in kinds]]
        if not args.counts_only:
            med = statistics.median(r["step_ms"])
            off = next(o for o in res if o["overlap"] == r["overlap"] and not o["bucket"])
            row += [round(med, 2), " ".join(f"{t:.1f}" for t in r["step_ms"]),
                    round(med / statistics.median(off["step_ms"]), 3)]
        rows.append(row)
    md = (f"Collective bucketing on grid {args.grid} ({math.prod(shape)} gloo processes, {os.cpu_count()} cores), "
          f"{args.dataset}, B = {args.batch_ratio} N, L = {args.layers}, hidden {args.hidden}, comm {args.comm_dtype}"
          f"{f', grad clip {args.grad_clip}' if args.grad_clip else ''}; rank 0, per step"
          f"{'' if args.counts_only else f' (blocks of {args.steps} steps, {args.reps} reps, ABBA)'}; "
          f"load average {load_before[0]:.2f} before, {load_after[0]:.2f} after.\n\n")
    md += "| " + " | ".join(head) + " |\n|" + "---|" * len(head) + "\n"
    md += "\n".join("| " + " | ".join(str(c) for c in row) + " |" for row in rows) + "\n"
    payload = {"bench": "bucketing", "grid": args.grid, "options": opts, "results": res,
               "load_average": [load_before, load_after], "command": " ".join(sys.argv)}
    return payload, md


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--grid", default="1x2x2x2")
    p.add_argument("--dataset", default="facebook")
    p.add_argument("--data-root", default=None)
    p.add_argument("--batch-ratio", type=float, default=0.1)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--comm-dtype", default="fp32", choices=("fp32", "bf16"))
    p.add_argument("--grad-clip", type=float, default=None)
    p.add_argument("--overlap", default="both", choices=("off", "on", "both"))
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=10, help="steps per timed block")
    p.add_argument("--reps", type=int, default=4, help="timed blocks per configuration")
    p.add_argument("--counts-only", action="store_true", help="one block, no timing columns")
    p.add_argument("--out", default="results/bench")
    args = p.parse_args(argv)
    payload, md = run(args)
    print(md)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        name = f"bucketing_{args.grid}" + ("_counts" if args.counts_only else "")
        (out / f"{name}.json").write_text(json.dumps(payload, indent=1))
        (out / f"{name}.md").write_text(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
