"""A paper-scale graph staged out of core on one machine, against the disk's bandwidth
and the memory model (issue 26's must-show).

Three measurements, in one run, written to ``--out``/paper_scale.json and printed as the
tables of docs/benchmarks.md:

disk      sequential write then read of ``--disk-gib`` GiB in 64 MiB blocks (the write
          fsynced; the file's pages dropped from the page cache before the read with
          ``posix_fadvise(DONTNEED)``): the physical limit of a pass over the graph
staging   ``scalegnn data shard dir:GRAPH --grid GRID --memory-budget SIZE --layout
          blocks`` in a child process: wall time, peak RSS (``wait4``), the bytes the
          kernel read and wrote for it (``/proc/PID/io``, sampled each second), the
          input and output sizes and their throughput against the disk's
loads     each chosen rank's shard loaded alone in a fresh process and every page
          touched (:func:`scalegnn.benchmarks.shard_memory.measure`): peak RSS above the process's
          baseline against the planner's prediction of that rank's shard
          (:func:`scalegnn.perfmodel.shard_bytes`); the manifest's checksums are checked
          once beforehand (timed on their own)

    python -m scalegnn data generate powerlaw:n=111059956,avg_degree=30,exponent=2.5 --out /work/paper/graph
    python benchmarks/paper_scale.py --graph /work/paper/graph --out /work/paper/run --grid 1x4x4x4 \\
        --memory-budget 5G

Ranks: every rank, ``--jobs`` at a time, or those ``--ranks`` names (``--ranks`` alone:
the planner's largest, the first and the last).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

BLOCK = 64 << 20


def disk_bandwidth(folder: Path, gib: float) -> dict:
    """Sequential write (fsynced) and cold read of one file of ``gib`` GiB, in GB/s."""
    path = folder / ".disk-probe"
    buf = os.urandom(BLOCK)
    blocks = max(1, int(gib * (1 << 30) // BLOCK))
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        for _ in range(blocks):
            f.write(buf)
        f.flush()
        os.fsync(f.fileno())
    write_s = time.perf_counter() - t0
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # clean pages after the fsync: dropped, read from disk
        t0 = time.perf_counter()
        while os.read(fd, BLOCK):
            pass
        read_s = time.perf_counter() - t0
    finally:
        os.close(fd)
        path.unlink()
    size = blocks * BLOCK
    return {"bytes": size, "write_s": write_s, "read_s": read_s, "write_gb_s": size / write_s / 1e9,
            "read_gb_s": size / read_s / 1e9}


def _io(pid: int) -> dict:
    try:
        return {k: int(v) for k, v in (line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())}
    except OSError:
        return {}


def _tree_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def stage(graph: Path, out: Path, grid: str, budget: str | None, layout: str = "blocks") -> dict:
    """``scalegnn data shard dir:GRAPH`` in a child process, out of core with ``budget``
    (in memory when None), measured (module docstring)."""
    cmd = [sys.executable, "-m", "scalegnn", "data", "shard", f"dir:{graph}", "--grid", grid, "--out", str(out)]
    if budget is not None:
        cmd += ["--memory-budget", budget, "--layout", layout]
    load0 = os.getloadavg()
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"})
    io: dict = {}
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        io = _io(proc.pid) or io
        time.sleep(1.0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"staging failed ({os.waitstatus_to_exitcode(status)}): {' '.join(cmd)}")
    read_in = sum((graph / f).stat().st_size for f in ("indptr.npy", "indices.npy", "y.npy"))
    written = _tree_bytes(out)
    return {"command": " ".join(cmd[1:]), "wall_s": wall, "peak_rss_bytes": usage.ru_maxrss * 1024,
            "cpu_s": usage.ru_utime + usage.ru_stime, "input_bytes": read_in, "output_bytes": written,
            "kernel_read_bytes": io.get("read_bytes"), "kernel_write_bytes": io.get("write_bytes"),
            "loadavg_start": load0, "loadavg_end": os.getloadavg()}


def drop_page_cache() -> None:
    """Empty the page cache (root only): a rank's clean mapped pages compete with it for
    memory, and the kernel reclaims the ones touched first while the last are read, so a
    full cache lowers a 9.6 GiB rank's measured peak on this 24 GB box by up to a third."""
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("1")


def loads(folder: Path, ranks: list[int] | None, jobs: int = 1, drop_caches: bool = False) -> dict:
    from scalegnn.benchmarks.shard_memory import measure
    from scalegnn.parallel.sharding import grid_coords
    from scalegnn.shards import read_manifest, verify_shard_file
    from scalegnn.perfmodel import Workload, shard_bytes

    manifest = read_manifest(folder)
    shape = tuple(manifest["grid_shape"])
    info = manifest["graph"]
    w = Workload(num_nodes=info["num_nodes"], nnz=info["adjacency_nnz"], num_features=info["num_features"],
                 num_classes=info["num_classes"])
    coords = grid_coords(shape)
    predicted = [shard_bytes(w, shape, c)["total"] for c in coords]
    if ranks is None:  # every rank
        ranks = list(range(len(coords)))
    elif not ranks:  # the planner's largest, the first and the last
        top = max(range(len(coords)), key=predicted.__getitem__)
        ranks = sorted({top, 0, len(coords) - 1})
    t0 = time.perf_counter()
    for rel, digest in manifest["sha256"].items():  # the one hash per file, out of the measured loads
        assert verify_shard_file(folder / rel, digest), rel
    verify_s = time.perf_counter() - t0

    def one(r: int) -> dict:  # a fresh process per rank: its own peak, whatever runs beside it
        if drop_caches:
            drop_page_cache()
        got = measure(folder, r, "touched")
        print(f"rank {r} {coords[r]}: peak {got['rise'] / 2**30:.2f} GiB above the baseline, predicted "
              f"{predicted[r] / 2**30:.2f} GiB (x{got['rise'] / predicted[r]:.3f}), load {got['load_s']:.1f} s",
              flush=True)
        return {"rank": r, "coords": coords[r], "predicted_bytes": predicted[r], "rise_bytes": got["rise"],
                "ratio": got["rise"] / predicted[r], "load_s": got["load_s"], "nbytes": got["nbytes"]}

    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        rows = list(pool.map(one, ranks))
    ratios = [row["ratio"] for row in rows]
    return {"verify_s": verify_s, "largest_predicted_bytes": max(predicted), "jobs": jobs,
            "ratio_min": min(ratios), "ratio_max": max(ratios), "ranks": rows}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--graph", type=Path, required=True, help="a folder written by `scalegnn data generate`")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--grid", default="1x4x4x4")
    parser.add_argument("--memory-budget", default="5G")
    parser.add_argument("--disk-gib", type=float, default=8.0)
    parser.add_argument("--ranks", type=int, nargs="*", default=None,
                        help="ranks to load (none given: the planner's largest, the first and the last; "
                        "without the flag: every rank)")
    parser.add_argument("--jobs", type=int, default=1, help="ranks loaded at a time, each in its own process")
    parser.add_argument("--drop-caches", action="store_true",
                        help="empty the page cache before each rank's load (root; see drop_page_cache)")
    parser.add_argument("--skip-staging", action="store_true", help="measure the loads of an earlier staging")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    report_path = args.out / "paper_scale.json"
    report = json.loads(report_path.read_text()) if report_path.exists() else {}
    report.update(graph=json.loads((args.graph / "graph.json").read_text()), grid=args.grid,
                  commit=os.environ.get("SCALEGNN_COMMIT"))
    if not args.skip_staging:
        report["disk"] = disk_bandwidth(args.out, args.disk_gib)
        print(f"disk: write {report['disk']['write_gb_s']:.2f} GB/s, read {report['disk']['read_gb_s']:.2f} GB/s",
              flush=True)
        report["staging"] = stage(args.graph, args.out / "shards", args.grid, args.memory_budget)
        s = report["staging"]
        print(f"staging: {s['wall_s']:.0f} s, peak RSS {s['peak_rss_bytes'] / 2**30:.2f} GiB, in "
              f"{s['input_bytes'] / 1e9:.1f} GB, out {s['output_bytes'] / 1e9:.1f} GB", flush=True)
        report_path.write_text(json.dumps(report, indent=1))
    report["loads"] = loads(args.out / "shards", args.ranks, args.jobs, args.drop_caches)
    report_path.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
