"""Soak run: resident memory per rank, sampled every epoch, over a long local run.

    python benchmarks/soak.py                       # 8 ranks, 1x2x2x2, prefetch on, 50 epochs
    python benchmarks/soak.py --epochs 5 --nproc 2 --grid 1x1x1x2    # a quick look

Each rank reads its resident set size (``/proc/self/statm``: resident pages x page
size) once before the first step and once at the end of every epoch (after its
evaluation, when there is one), and the largest value the kernel saw
(``ru_maxrss``). The report gives, per rank, the RSS after epoch 1, after the last
epoch, and the growth in between, in MiB, and the least-squares slope of the second
half of the run (KiB/epoch); the target is no growth after the first epoch
(allocator caches, the full-graph evaluation batch and the prefetch thread's batch
are all in place by then; evaluation runs every epoch by default so that the first
epoch includes it). The JSON with every sample goes to
``--out`` (default ``results/soak/soak-<grid>.json``).

The per-epoch hook is the loop's progress bar (``scalegnn.train._progress``,
replaced in the workers by a sampler that every rank gets), so the training code
runs unmodified.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

_PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


class _EpochSampler:
    """Stands in for the tqdm bar: ``update`` is called once per finished epoch."""

    def __init__(self, sink: list):
        self.sink = sink
        sink.append(rss_bytes())

    def update(self, n=1):
        self.sink.append(rss_bytes())

    def set_postfix(self, **kw):
        pass

    def close(self):
        pass


def _soak_worker(rank, world, cfg):
    import scalegnn.train as train
    from scalegnn.parallel.grid import ProcessGrid

    samples: list[int] = []
    train._progress = lambda cfg, total, rank: _EpochSampler(samples)
    grid = ProcessGrid(*cfg.grid)
    t0 = time.perf_counter()
    record = train.run_training(cfg, grid=grid, write=(rank == 0))
    return {"rank": rank, "rss": samples, "maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "wall_s": time.perf_counter() - t0, "threads": len(os.listdir("/proc/self/task")),
            "record": {k: record[k] for k in ("run_id", "status", "steps_per_epoch", "batch_size", "path")
                       if k in record} if rank == 0 else None}


def main(argv=None) -> int:
    from scalegnn.engine import OptimConfig
    from scalegnn.model import ModelConfig
    from scalegnn.parallel.grid import parse_grid
    from scalegnn.parallel.launch import spawn
    from scalegnn.perf import PerfConfig
    from scalegnn.train import RunConfig

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default="csbm:n=20000,avg_degree=10,classes=8,feature_dim=64")
    ap.add_argument("--nproc", type=int, default=8)
    ap.add_argument("--grid", default="1x2x2x2")
    ap.add_argument("--epochs", type=int, default=50)
    ap.add_argument("--batch-ratio", type=float, default=0.1)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--eval-every", type=int, default=1)
    ap.add_argument("--no-prefetch", action="store_true")
    ap.add_argument("--data-root", default=None)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    grid = parse_grid(args.grid)
    runs = Path("results/soak")
    cfg = RunConfig(dataset=args.dataset, data_root=args.data_root, batch_ratio=args.batch_ratio,
                    epochs=args.epochs, eval_every=args.eval_every, grid=grid, out_dir=str(runs / "runs"),
                    model=ModelConfig(hidden=args.hidden, layers=3, dropout=0.5), optim=OptimConfig(lr=1e-3),
                    perf=PerfConfig(prefetch=not args.no_prefetch))
    threads = max(1, (os.cpu_count() or 1) // args.nproc)
    t0 = time.perf_counter()
    results = spawn(_soak_worker, args.nproc, cfg, timeout_s=None, threads_per_worker=threads)
    wall = time.perf_counter() - t0
    mib = 1 / 2**20
    print(f"{args.dataset}, grid {args.grid}, {args.epochs} epochs, prefetch {'off' if args.no_prefetch else 'on'}, "
          f"{wall:.0f} s wall ({results[0]['record']['steps_per_epoch']} steps/epoch, "
          f"B={results[0]['record']['batch_size']})")
    print("rank  start  epoch 1  epoch 10   last  growth after 1  after 10  slope, 2nd half  maxrss  threads")
    print("        MiB      MiB       MiB    MiB             MiB       MiB        KiB/epoch     MiB")
    growth, late, slopes = [], [], []
    for r in results:
        s = r["rss"]  # s[0]: before the first step; s[e]: after epoch e
        e10 = s[min(10, len(s) - 1)]
        half = s[len(s) // 2:]
        xs = range(len(half))
        mx, my = sum(xs) / len(half), sum(half) / len(half)
        var = sum((x - mx) ** 2 for x in xs) or 1.0
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, half)) / var  # least squares, bytes/epoch
        growth.append((s[-1] - s[1]) * mib)
        late.append((s[-1] - e10) * mib)
        slopes.append(slope / 1024)
        print(f"{r['rank']:>4}  {s[0] * mib:5.0f}  {s[1] * mib:7.0f}  {e10 * mib:8.0f}  {s[-1] * mib:5.0f}  "
              f"{growth[-1]:14.1f}  {late[-1]:8.1f}  {slopes[-1]:15.1f}  {r['maxrss'] * mib:6.0f}  {r['threads']:7d}")
    print(f"growth after epoch 1: max {max(growth):.1f} MiB, mean {sum(growth) / len(growth):.1f} MiB; after epoch "
          f"10: max {max(late):.1f} MiB; 2nd-half slope: max {max(slopes):.1f} KiB/epoch")
    out = Path(args.out) if args.out else runs / f"soak-{args.grid}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"dataset": args.dataset, "grid": args.grid, "epochs": args.epochs,
                               "prefetch": not args.no_prefetch, "wall_s": wall, "ranks": results}, indent=1))
    print(f"samples: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
