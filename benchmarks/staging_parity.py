"""Out-of-core staging against in-memory staging on one graph that fits (issue 26's
must-show on the products-scale graph): the same shards, and what each costs.

Three stagings of ``dir:GRAPH`` for ``--grid``, each a child process measured as
:func:`scalegnn.benchmarks.paper_scale.stage` measures it (wall time, peak RSS):

in memory     ``scalegnn data shard dir:GRAPH --grid GRID`` (the whole graph loaded,
              permuted and normalized, then cut)
files         ``--memory-budget SIZE``: per-rank files, which must be byte for byte the
              in-memory ones (the manifests' SHA-256 compared)
blocks        ``--memory-budget SIZE --layout blocks``: each rank's shard, loaded, must
              equal the in-memory one tensor for tensor

    python -m scalegnn data generate csbm:n=2449029,avg_degree=51,classes=47,feature_dim=100 --out /work/products
    python benchmarks/staging_parity.py --graph /work/products --out /work/parity --grid 1x2x2x2 --memory-budget 2G
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def same_shard(got, want) -> list[str]:
    """What differs between two RankShards (nothing: equal tensor for tensor, dtypes too)."""
    import torch

    bad = []
    for p, (a, b) in enumerate(zip(got.adj, want.adj)):
        if (a.row_start, a.row_end, a.col_start, a.col_end) != (b.row_start, b.row_end, b.col_start, b.col_end):
            bad.append(f"plane {p} ranges")
        for t in ("indptr", "indices", "values"):
            ta, tb = getattr(a, t), getattr(b, t)
            if ta.dtype != tb.dtype or not torch.equal(ta, tb):
                bad.append(f"plane {p} {t}")
    if got.x.dtype != want.x.dtype or not torch.equal(got.x, want.x):
        bad.append("x")
    for key in ("y", "train_mask", "val_mask", "test_mask"):
        for ax, t in getattr(want, key).items():
            if not torch.equal(getattr(got, key)[ax], t):
                bad.append(f"{key} {ax}")
    return bad


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--graph", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--grid", default="1x2x2x2")
    parser.add_argument("--memory-budget", default="2G")
    args = parser.parse_args(argv)

    from scalegnn.benchmarks.paper_scale import stage
    from scalegnn.parallel.sharding import grid_coords
    from scalegnn.shards import load_shard, read_manifest

    args.out.mkdir(parents=True, exist_ok=True)
    runs = {"in_memory": stage(args.graph, args.out / "in_memory", args.grid, None)}
    for layout in ("files", "blocks"):
        runs[layout] = stage(args.graph, args.out / layout, args.grid, args.memory_budget, layout)
    for name, r in runs.items():
        print(f"{name}: {r['wall_s']:.1f} s, peak RSS {r['peak_rss_bytes'] / 2**30:.2f} GiB, load average "
              f"{r['loadavg_start'][0]:.1f} -> {r['loadavg_end'][0]:.1f}", flush=True)
    manifest = lambda name: read_manifest(args.out / name)  # noqa: E731
    report = {"graph": json.loads((args.graph / "graph.json").read_text()), "grid": args.grid, "runs": runs,
              "files_identical": manifest("files")["sha256"] == manifest("in_memory")["sha256"]}
    shape = tuple(manifest("in_memory")["grid_shape"])
    report["blocks_differences"] = {r: same_shard(load_shard(args.out / "blocks", r),
                                                  load_shard(args.out / "in_memory", r))
                                    for r in range(len(grid_coords(shape)))}
    report["blocks_identical"] = not any(report["blocks_differences"].values())
    for layout in ("files", "blocks"):
        report[f"time_ratio_{layout}"] = runs[layout]["wall_s"] / runs["in_memory"]["wall_s"]
    print(f"files identical: {report['files_identical']}; blocks identical: {report['blocks_identical']}; time "
          f"out of core / in memory: files {report['time_ratio_files']:.2f}, blocks {report['time_ratio_blocks']:.2f}")
    (args.out / "staging_parity.json").write_text(json.dumps(report, indent=1))
    return 0 if report["files_identical"] and report["blocks_identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
