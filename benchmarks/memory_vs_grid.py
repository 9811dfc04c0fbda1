"""Peak memory per rank as the 3D grid grows, on a generated graph.

For each grid the graph is sharded once with ``scalegnn data shard`` and every rank
reads only its own shard (``--shard-dir``), so no rank ever holds the whole graph;
one epoch of training plus one full-graph evaluation is run and the run record's
``peak_memory_bytes_per_rank`` (max RSS of each rank process) is tabulated.

    python benchmarks/memory_vs_grid.py --dataset csbm:n=500000,avg_degree=20 --out /tmp/memgrid

Prints a Markdown table; the records stay in ``OUT/runs``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

GRIDS = ("1x1x1x1", "1x2x1x1", "1x2x2x1", "1x2x2x2")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="csbm:n=500000,avg_degree=20")
    parser.add_argument("--data-root", default=None)
    parser.add_argument("--out", default="/tmp/scalegnn-memgrid")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--batch-ratio", default="0.1")
    parser.add_argument("--grids", nargs="+", default=list(GRIDS))
    args = parser.parse_args(argv)
    out = Path(args.out)
    common = ["--data-root", args.data_root] if args.data_root else []
    rows = []
    for grid in args.grids:
        shard_dir = out / "shards" / grid
        if not (shard_dir / "manifest.json").exists():
            subprocess.run([sys.executable, "-m", "scalegnn", "data", "shard", args.dataset, "--grid", grid,
                            "--out", str(shard_dir), *common], check=True)
        world = grid_world_size(grid)
        run_dir = out / "runs" / grid
        subprocess.run([sys.executable, "-m", "scalegnn", "train", "--dataset", args.dataset, *common,
                        "--grid", grid, "--nproc", str(world), "--shard-dir", str(shard_dir),
                        "--batch-ratio", args.batch_ratio, "--hidden", str(args.hidden), "--epochs", "1",
                        "--out", str(run_dir), "--quiet"], check=True)
        record = json.loads(max(run_dir.glob("*.json"), key=lambda p: p.stat().st_mtime).read_text())
        per_rank = record["peak_memory_bytes_per_rank"]
        rows.append((grid, world, record["graph"]["num_edges"], max(per_rank), sum(per_rank) / len(per_rank)))
    print("| grid | ranks | stored edges | max peak RSS per rank (MiB) | mean peak RSS per rank (MiB) |")
    print("|---|---|---|---|---|")
    for grid, world, nnz, peak, mean in rows:
        print(f"| {grid} | {world} | {nnz:,} | {peak / 2**20:,.0f} | {mean / 2**20:,.0f} |")
    return 0


def grid_world_size(grid: str) -> int:
    size = 1
    for part in grid.split("x"):
        size *= int(part)
    return size


if __name__ == "__main__":
    sys.exit(main())
