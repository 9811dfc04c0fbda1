"""Peak memory per rank as the 3D grid grows, on a generated graph.

For each grid the graph is sharded once with ``scalegnn data shard`` and every rank
reads only its own shard (``--shard-dir``), so no rank ever holds the whole graph;
one epoch of training plus one full-graph evaluation is run and the run record's
``peak_memory_bytes_per_rank`` (max RSS of each rank process) is tabulated.

    python benchmarks/memory_vs_grid.py --dataset csbm:n=500000,avg_degree=20 --out /tmp/memgrid

Prints a Markdown table; the records stay in ``OUT/runs``.

``--phases`` measures instead, per rank, the peak RSS of each phase of the same run
(the kernel's high-water mark VmHWM, reset before each phase by writing 5 to
``/proc/self/clear_refs``; Linux only): ``start`` python + torch + scalegnn,
``numba`` the JIT and the CPU kernels (compiled, or loaded from numba's cache),
``shard`` reading the rank's shard, ``engine`` the model, optimizer and sampler,
``train`` one epoch, ``evaluate`` the full-graph evaluation. Each phase's peak is
the process's RSS at its highest during that phase (what came before included).

    python benchmarks/memory_vs_grid.py --phases --grids 1x1x1x1 1x2x2x2 --out /tmp/memgrid
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from scalegnn.records import read_record

GRIDS = ("1x1x1x1", "1x2x1x1", "1x2x2x1", "1x2x2x2")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="csbm:n=500000,avg_degree=20")
    parser.add_argument("--data-root", default=None)
    parser.add_argument("--out", default="/tmp/scalegnn-memgrid")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--batch-ratio", default="0.1")
    parser.add_argument("--grids", nargs="+", default=list(GRIDS))
    parser.add_argument("--phases", action="store_true", help="peak RSS per phase and rank instead of whole runs")
    args = parser.parse_args(argv)
    from scalegnn.shards import has_manifest

    out = Path(args.out)
    common = ["--data-root", args.data_root] if args.data_root else []
    rows = []
    for grid in args.grids:
        shard_dir = out / "shards" / grid
        if not has_manifest(shard_dir):
            subprocess.run([sys.executable, "-m", "scalegnn", "data", "shard", args.dataset, "--grid", grid,
                            "--out", str(shard_dir), *common], check=True)
        world = grid_world_size(grid)
        if args.phases:
            print_phases(grid, phase_peaks(grid, shard_dir, args))
            continue
        run_dir = out / "runs" / grid
        subprocess.run([sys.executable, "-m", "scalegnn", "train", "--dataset", args.dataset, *common,
                        "--grid", grid, "--nproc", str(world), "--shard-dir", str(shard_dir),
                        "--batch-ratio", args.batch_ratio, "--hidden", str(args.hidden), "--epochs", "1",
                        "--out", str(run_dir), "--quiet"], check=True)
        record = read_record(max(run_dir.glob("*.json"), key=lambda p: p.stat().st_mtime))
        per_rank = record["peak_memory_bytes_per_rank"]
        rows.append((grid, world, record["graph"]["adjacency_nnz"], max(per_rank), sum(per_rank) / len(per_rank)))
    if args.phases:
        return 0
    print("| grid | ranks | stored edges | max peak RSS per rank (MiB) | mean peak RSS per rank (MiB) |")
    print("|---|---|---|---|---|")
    for grid, world, nnz, peak, mean in rows:
        print(f"| {grid} | {world} | {nnz:,} | {peak / 2**20:,.0f} | {mean / 2**20:,.0f} |")
    return 0


PHASES = ("start", "numba", "shard", "engine", "train", "evaluate")


def _hwm_mib() -> float:
    """This process's peak RSS since the last reset (VmHWM), in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status: --phases needs Linux")


def _reset_hwm() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # 5: reset the peak RSS to the current RSS


def _phase_worker(rank, world, grid_spec, shard_dir, settings):
    """One rank of the run the benchmark measures whole, phase by phase: {phase: (RSS at
    its start, peak RSS during it)} in MiB, and the accuracies."""
    import torch

    from scalegnn.config import make_config
    from scalegnn.parallel.engine import ParallelEngine, _release_free_heap
    from scalegnn.parallel.grid import ProcessGrid, parse_grid
    from scalegnn.shards import load_shard
    from scalegnn.sampling import resolve_batch_size

    peaks = {}
    start = [0.0]

    def phase(name):  # the phase that just ended; the next starts from the current RSS
        peaks[name] = (start[0], _hwm_mib())
        _reset_hwm()
        start[0] = _hwm_mib()

    phase("start")
    from scalegnn import _elementwise

    _elementwise.warm_up(torch.float32)
    phase("numba")
    cfg = make_config(**settings)
    shape = parse_grid(grid_spec)
    shard = load_shard(shard_dir, rank, shape)
    phase("shard")
    batch = resolve_batch_size(shard.num_nodes, cfg.sampling.batch_size, cfg.sampling.batch_ratio)
    eng = ParallelEngine(None, cfg.model, cfg.optim, batch, seed=cfg.seed, epochs=1, grid=ProcessGrid(*shape),
                         shard=shard, perf=cfg.perf, numerics=cfg.numerics)
    phase("engine")
    for step in range(eng.steps_per_epoch):
        eng.train_step(step)
    eng.synchronize()
    _release_free_heap()  # what evaluate() does first: the evaluation's peak is then its own
    phase("train")
    result = eng.evaluate()
    phase("evaluate")
    eng.close()
    return peaks, result.as_dict()


def phase_peaks(grid: str, shard_dir: Path, args) -> list:
    from scalegnn.launch.job import spawn

    settings = dict(dataset=args.dataset, hidden=args.hidden, batch_ratio=float(args.batch_ratio), epochs=1)
    return spawn(_phase_worker, grid_world_size(grid), grid, str(shard_dir), settings, timeout_s=3600)


def print_phases(grid: str, per_rank: list) -> None:
    """Per phase, over the ranks: max peak RSS (MiB), mean peak, and the max of the
    peak's rise over the phase's starting RSS; then the accuracies."""
    print(f"grid {grid}, {len(per_rank)} ranks: peak RSS per phase (MiB) max / mean (+ max rise in the phase); "
          f"accuracies {per_rank[0][1]}")
    print("| grid | " + " | ".join(PHASES) + " |")
    print("|---|" + "---|" * len(PHASES))
    cells = []
    for ph in PHASES:
        peaks = [p[ph][1] for p, _ in per_rank]
        rise = max(p[ph][1] - p[ph][0] for p, _ in per_rank)
        cells.append(f"{max(peaks):,.0f} / {sum(peaks) / len(peaks):,.0f} (+{rise:,.0f})")
    print(f"| {grid} | " + " | ".join(cells) + " |", flush=True)


def grid_world_size(grid: str) -> int:
    size = 1
    for part in grid.split("x"):
        size *= int(part)
    return size


if __name__ == "__main__":
    sys.exit(main())
