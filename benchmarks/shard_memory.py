"""The memory model against the measured memory of loading a rank's shard (issue 26 items 5-6).

A generated graph is sharded once per 3D grid (``scalegnn data shard``, in memory);
then every rank's shard is loaded alone in a fresh process, three ways, and the peak
resident memory above that process's baseline (python, torch and scalegnn imported:
VmHWM reset to VmRSS by writing 5 to ``/proc/self/clear_refs``; Linux only) is
measured:

    read     the file read whole (``torch.load`` without ``mmap``: the loading before
             issue 26 item 5), then every array touched
    mapped   ``load_shard``: the file mapped, nothing touched yet
    touched  mapped, then every page of every array read once: what a rank that uses
             its whole shard ends up with (a GPU rank's copy reads it all, too)

and compared with the planner's prediction of that rank's shard
(:func:`scalegnn.perfmodel.shard_bytes`, the ``shard`` term of ``scalegnn plan``'s
per-rank memory). Per grid the table gives the planner's value (the largest rank's
shard), the largest measured, their ratio, and each rank's measured / predicted;
``read`` and ``mapped`` the largest of the ranks, and the slowest rank's load seconds.

    python benchmarks/shard_memory.py --dataset csbm:n=200000,avg_degree=20 --out /tmp/shardmem

The first load of each file hashes it against the manifest (and leaves a marker); the
workers load after that, so no column includes hashing. Seconds are wall time of the
load with the file in the page cache.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

GRIDS = ("1x1x1x1", "1x2x1x1", "1x2x2x1", "1x2x2x2", "1x1x2x3")
MODES = ("read", "mapped", "touched")


def _status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {key} in /proc/self/status: this benchmark needs Linux")


def _touch_tensors(tensors) -> int:
    """Read one byte of every page under ``tensors`` (no temporary of their size: a sum
    over an int32 array would cast it to int64 first)."""
    import torch

    total = 0
    for t in tensors:
        if t.numel():
            raw = t.reshape(-1).view(torch.uint8)
            total += int(raw[::4096].sum()) + int(raw[-1])
    return total


def _touch(shard) -> float:
    """Read every page of ``shard``'s arrays (each page of a mapped file is faulted in)."""
    tensors = [t for b in shard.planes() for t in (b.indptr, b.indices, b.values)] + [shard.x]
    tensors += [t for key in ("y", "train_mask", "val_mask", "test_mask") for t in getattr(shard, key).values()]
    return _touch_tensors(tensors)


def worker(folder: str, rank: int, mode: str) -> dict:
    """One rank's shard loaded ``mode``'s way in this (fresh) process: bytes of peak RSS
    above the baseline, the load's seconds, and the arrays' bytes."""
    import dataclasses

    import torch

    from scalegnn.parallel.sharding import RankShard, grid_coords
    from scalegnn.shards import load_shard, read_manifest, shard_file_name

    import io

    import scalegnn.datasets.streaming  # noqa: F401 - seeded features' code; a training rank has imported it already

    buf = io.BytesIO()  # warm up what every mode uses once (the loader, the reductions) before the baseline
    torch.save({"a": torch.ones(8), "b": torch.ones(8, dtype=torch.int32)}, buf)
    buf.seek(0)
    _touch_tensors(torch.load(buf, weights_only=True).values())
    base = _status("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")
    t0 = time.perf_counter()
    if mode == "read":
        shape = tuple(read_manifest(folder)["grid_shape"])
        path = Path(folder) / shard_file_name(grid_coords(shape)[rank])
        shard = dataclasses.replace(RankShard.from_state(torch.load(path, weights_only=True)), grid_shape=shape)
    else:
        shard = load_shard(folder, rank)
    seconds = time.perf_counter() - t0
    if mode != "mapped":
        _touch(shard)
    return {"rise": _status("VmHWM") - base, "baseline": base, "load_s": seconds, "nbytes": shard.nbytes()}


def measure(folder: Path, rank: int, mode: str) -> dict:
    code = (f"import json, sys; sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r}); "
            f"from benchmarks.shard_memory import worker; print(json.dumps(worker({str(folder)!r}, {rank}, {mode!r})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="csbm:n=200000,avg_degree=20")
    parser.add_argument("--data-root", default=None)
    parser.add_argument("--out", default="/tmp/scalegnn-shardmem")
    parser.add_argument("--grids", nargs="+", default=list(GRIDS))
    args = parser.parse_args(argv)

    from scalegnn.parallel.grid import parse_grid
    from scalegnn.parallel.sharding import grid_coords
    from scalegnn.shards import has_manifest, load_shard, read_manifest
    from scalegnn.perfmodel import Workload, shard_bytes

    out = Path(args.out)
    mib = 2**20
    print(f"dataset {args.dataset}; MiB of peak RSS above each process's baseline (python, torch, scalegnn)")
    print("| grid | ranks | plan: largest shard | touched, largest | ratio | touched / predicted, per rank "
          "| read, largest | mapped, largest | load s, read / mapped | baseline |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for grid in args.grids:
        shape = parse_grid(grid)
        folder = out / "shards" / grid
        if not has_manifest(folder):
            root = ["--data-root", args.data_root] if args.data_root else []
            subprocess.run([sys.executable, "-m", "scalegnn", "data", "shard", args.dataset, "--grid", grid,
                            "--out", str(folder), *root], check=True, stdout=subprocess.DEVNULL)
        info = read_manifest(folder)["graph"]
        w = Workload(num_nodes=info["num_nodes"], nnz=info["adjacency_nnz"], num_features=info["num_features"],
                     num_classes=info["num_classes"])
        ranks = len(grid_coords(shape))
        for r in range(ranks):
            load_shard(folder, r)  # the one hash per file, out of the measured loads
        rows = [{m: measure(folder, r, m) for m in MODES} for r in range(ranks)]
        ratios = [row["touched"]["rise"] / shard_bytes(w, shape, c)["total"]
                  for row, c in zip(rows, grid_coords(shape))]
        plan = shard_bytes(w, shape)["total"]  # what `scalegnn plan` counts for the grid's largest rank
        top = {m: max(row[m]["rise"] for row in rows) for m in MODES}
        load = {m: max(row[m]["load_s"] for row in rows) for m in ("read", "mapped")}
        print(f"| {grid} | {ranks} | {plan / mib:,.1f} | {top['touched'] / mib:,.1f} | {top['touched'] / plan:.3f} "
              f"| {min(ratios):.3f} - {max(ratios):.3f} | {top['read'] / mib:,.1f} | {top['mapped'] / mib:,.1f} "
              f"| {load['read']:.3f} / {load['mapped']:.3f} | {rows[0]['mapped']['baseline'] / mib:,.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
