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

The samples are taken by a callback of the epoch loop (:class:`scalegnn.loop.Callback`,
passed to :func:`scalegnn.launch.train_rank` on every rank), so the training code runs unmodified.

``--diagnose`` also splits every sample by owner (:func:`memory_breakdown`): pages of
mapped files (shared-library code and data, touched lazily), glibc's brk heap (the
main arena), its per-thread arenas (anonymous heaps aligned to 64 MiB), other
anonymous memory (Python's object arenas, thread stacks, buffers libraries mmap
themselves), and glibc's own count of bytes in use and free inside its arenas
(``mallinfo2``, ``malloc_info``). ``--tracemalloc`` adds Python's traced allocations
and the lines that grew most from epoch 10 (epoch 1 in shorter runs) to the end; it
changes the allocation pattern itself (its trace table, kept by malloc), so read
RSS without it. ``--trim`` calls ``malloc_trim(0)`` before each sample and records
the RSS just before and after it: what glibc gives back is memory the program had
freed.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scalegnn.config import RunConfig
from scalegnn.loop import Callback  # noqa: E402

_PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def _libc():
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2
    return libc


def _mappings() -> dict[str, tuple[str, int, int]]:
    """{start-end: (kind, size, resident bytes)} of every mapping in /proc/self/smaps;
    kind is file, heap, stack or anon."""
    out, key = {}, None
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if "-" in head[0] and len(head) >= 5:  # a mapping's header line
                start, end = (int(a, 16) for a in head[0].split("-"))
                name = head[5] if len(head) > 5 else ""
                kind = ("file" if name.startswith("/") else "heap" if name == "[heap]"
                        else "stack" if name == "[stack]" else "anon" if name in ("", "[anon]") or
                        name.startswith("[anon:") else "other")
                key = head[0]
                out[key] = (kind, end - start, 0)
            elif head[0] == "Rss:" and key is not None:
                kind, size, _ = out[key]
                out[key] = (kind, size, int(head[1]) * 1024)
    return out


def malloc_arenas(libc) -> list[dict]:
    """glibc's ``malloc_info`` per arena (heap nr 0 is the main, brk arena): bytes the
    arena holds from the system (``system``), of which free inside it (``free``), and
    its address space (``aspace``, the mprotect-ed part of a thread arena's 64 MiB heaps)."""
    import re
    import tempfile

    libc.fopen.restype = ctypes.c_void_p
    libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
    libc.fclose.argtypes = [ctypes.c_void_p]
    with tempfile.NamedTemporaryFile("r", suffix=".xml") as tmp:
        fp = libc.fopen(tmp.name.encode(), b"w")
        libc.malloc_info(0, fp)
        libc.fclose(fp)
        xml = tmp.read()
    arenas = []
    for heap in re.findall(r'<heap nr="\d+">(.*?)</heap>', xml, re.S):
        def size(tag, kind):
            m = re.search(rf'<{tag} type="{kind}"[^>]*size="(\d+)"', heap)
            return int(m.group(1)) if m else 0

        arenas.append({"system": size("system", "current"), "free": size("total", "fast") + size("total", "rest"),
                       "aspace": size("aspace", "mprotect") or size("aspace", "total")})
    return arenas


def memory_breakdown(libc, traced: bool) -> dict:
    """One sample of this process's memory by owner (bytes; see the module docstring)."""
    maps = _mappings()
    by_kind: dict[str, int] = {}
    for kind, _, rss in maps.values():
        by_kind[kind] = by_kind.get(kind, 0) + rss
    # glibc's per-thread arenas live in heaps aligned to HEAP_MAX_SIZE (64 MiB on 64-bit).
    by_kind["thread_arenas"] = sum(rss for key, (kind, _, rss) in maps.items()
                                   if kind == "anon" and int(key.split("-")[0], 16) % (64 << 20) == 0)
    m = libc.mallinfo2()
    sample = {"rss": rss_bytes(), **{f"rss_{k}": v for k, v in by_kind.items()},
              "malloc_in_use": m.uordblks + m.hblkhd, "malloc_free": m.fordblks, "malloc_arena": m.arena,
              "malloc_mmapped": m.hblkhd, "threads": len(os.listdir("/proc/self/task")),
              "anon_maps": {k: (size, rss) for k, (kind, size, rss) in maps.items() if kind == "anon"},
              "arenas": malloc_arenas(libc)}
    if traced:
        import tracemalloc

        sample["python_traced"] = tracemalloc.get_traced_memory()[0]
    return sample


class _EpochSampler(Callback):
    """Samples this rank's memory before the first step and after every epoch."""

    def __init__(self, sink: list, details: list | None = None, trim: bool = False, traced: bool = False):
        self.sink, self.details, self.trim, self.traced = sink, details, trim, traced
        self.libc = _libc() if details is not None or trim else None
        self.snapshots = []
        self.snapshot_at = 1  # the epoch after which tracemalloc's reference snapshot is taken

    def on_start(self, epochs: int) -> None:
        self.snapshot_at = 10 if epochs > 10 else 1
        self.sample()

    def on_epoch_end(self, row: dict) -> None:
        self.sample()

    def sample(self) -> None:
        if self.trim:
            before = rss_bytes()
            self.libc.malloc_trim(0)
        self.sink.append(rss_bytes())
        if self.details is not None:
            sample = memory_breakdown(self.libc, self.traced)
            if self.trim:
                sample["rss_before_trim"] = before
            if len(self.details) > 2:  # keep the mapping lists of epoch 1 and the latest sample only,
                del self.details[-1]["anon_maps"]  # so that the sampler's own memory stays flat
            self.details.append(sample)
            if self.traced and len(self.details) == self.snapshot_at + 1:
                import tracemalloc

                self.snapshots.append(tracemalloc.take_snapshot())


def _soak_worker(rank, world, cfg: RunConfig, diagnose=False, trim=False, traced=False):
    from scalegnn.launch import train_rank
    from scalegnn.launch.environment import local_rank_env

    if traced:
        import tracemalloc

        tracemalloc.start(1)
    samples: list[int] = []
    details: list[dict] | None = [] if diagnose else None
    sampler = _EpochSampler(samples, details, trim, traced)
    env = local_rank_env(rank, world, cfg.parallel, "gloo")
    t0 = time.perf_counter()
    record = train_rank(cfg, None, env, failures="raise", write=(rank == 0), callbacks=[sampler])
    out = {"rank": rank, "rss": samples, "maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
           "wall_s": time.perf_counter() - t0, "threads": len(os.listdir("/proc/self/task")),
           "record": {k: record[k] for k in ("run_id", "status", "steps_per_epoch", "batch_size", "path")
                      if k in record} if rank == 0 else None}
    if diagnose:
        out["details"] = details
    if traced and sampler.snapshots:
        import tracemalloc

        growth = tracemalloc.take_snapshot().compare_to(sampler.snapshots[0], "lineno")
        growth = sorted(growth, key=lambda d: d.size_diff, reverse=True)
        out["python_growth_top"] = [(str(d.traceback[0]), d.size_diff, d.count_diff) for d in growth[:8]]
    return out


def _owners(sample: dict) -> dict:
    """A sample's RSS split into owners (bytes): mapped files, glibc's main (brk) arena,
    its per-thread arenas, and other anonymous memory (Python's object arenas, thread
    stacks, buffers that libraries mmap themselves); plus glibc's bytes in use and free."""
    threads = sample.get("rss_thread_arenas", 0)
    return {"rss": sample["rss"], "files": sample.get("rss_file", 0), "main_arena": sample.get("rss_heap", 0),
            "thread_arenas": threads, "other_anon": sample.get("rss_anon", 0) - threads,
            "malloc_in_use": sample["malloc_in_use"], "malloc_free": sample["malloc_free"],
            **({"python_traced": sample["python_traced"]} if "python_traced" in sample else {})}


def _print_breakdown(results, mib: float) -> None:
    """Growth per owner from epoch 1 and from epoch 10 to the end, per rank (``--diagnose``)."""
    keys = list(_owners(results[0]["details"][1]))
    print("growth per owner, MiB, epoch 1 -> last [epoch 10 -> last]: " + ", ".join(keys))
    for r in results:
        d = [_owners(s) for s in r["details"]]
        d1, d10, dn = d[1], d[min(10, len(d) - 1)], d[-1]
        row = "  ".join(f"{(dn[k] - d1[k]) * mib:+6.1f} [{(dn[k] - d10[k]) * mib:+5.1f}]" for k in keys)
        extra = ""
        if "rss_before_trim" in r["details"][-1]:
            extra = f"  malloc_trim gave back {(r['details'][-1]['rss_before_trim'] - dn['rss']) * mib:.1f} MiB"
        print(f"rank {r['rank']}: {row}{extra}")
        for where, size, count in r.get("python_growth_top", [])[:3]:
            print(f"        python: {where} {size * mib:+.2f} MiB ({count:+d} blocks)")


def main(argv=None) -> int:
    from scalegnn.config import make_config
    from scalegnn.parallel.grid import parse_grid
    from scalegnn.launch.job import spawn

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
    ap.add_argument("--diagnose", action="store_true", help="split every sample by owner (module docstring)")
    ap.add_argument("--trim", action="store_true", help="malloc_trim(0) before every sample (implies --diagnose)")
    ap.add_argument("--tracemalloc", action="store_true", help="trace Python allocations (implies --diagnose)")
    args = ap.parse_args(argv)
    diagnose = args.diagnose or args.trim or args.tracemalloc

    grid = parse_grid(args.grid)
    runs = Path("results/soak")
    cfg = make_config(dataset=args.dataset, data_root=args.data_root, batch_ratio=args.batch_ratio,
                      epochs=args.epochs, eval_every=args.eval_every, grid=grid, out_dir=str(runs / "runs"),
                      hidden=args.hidden, layers=3, dropout=0.5, lr=1e-3, prefetch=not args.no_prefetch)
    threads = max(1, (os.cpu_count() or 1) // args.nproc)
    t0 = time.perf_counter()
    results = spawn(_soak_worker, args.nproc, cfg, diagnose, args.trim, args.tracemalloc, timeout_s=None,
                    threads_per_worker=threads)
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
    if diagnose:
        _print_breakdown(results, mib)
    out = Path(args.out) if args.out else runs / f"soak-{args.grid}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"dataset": args.dataset, "grid": args.grid, "epochs": args.epochs,
                               "prefetch": not args.no_prefetch, "trim": args.trim,
                               "malloc_env": {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")},
                               "wall_s": wall, "ranks": results}, indent=None if diagnose else 1))
    print(f"samples: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
