"""Micro-benchmark of a layer's element-wise tail on one thread (issue 12, Build 1):

    python -m scalegnn.benchmarks.elementwise          (or: python benchmarks/elementwise.py)

Shapes: Facebook page-page at sampling ratio 0.1 (B = 2247 rows, hidden 256), and 10x
the rows. Two tables, medians of interleaved repetitions in one process, with the
machine's load average beside them (the ratios are the result; a loaded machine
shifts the absolute times):

Each time is given twice: wall clock and the thread's CPU time (the steadier one on a
shared machine).

* the dropout mask against ``torch.Tensor.bernoulli_`` on the same (B, H) shape (a
  float32 tensor and a bool tensor): the formula before issue 12 (int64 temporaries),
  the in-place torch path (:func:`scalegnn._elementwise.keep_mask_torch`, what CUDA
  runs) and the numba kernel (what the CPU runs);
* the layer tail, forward + backward: the unfused operators before issue 12
  (``parallel_rms_norm`` -> relu -> ``* keep / (1-p)`` -> residual add, its mask by
  the old formula) against :func:`scalegnn.parallel.tail.layer_tail` (numba kernels,
  and its torch path).

No pass/fail: timings live here, correctness in tests/unit/test_elementwise.py and tests/parallel/test_tail.py.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

__all__ = ["elementwise_bench", "main", "mask_before_issue_l"]


def mask_before_issue_l(key: int, row_ids: torch.Tensor, col_ids: torch.Tensor, p: float) -> torch.Tensor:
    """scalegnn.functional.dropout_keep_mask's formula as it was before issue L, frozen: the
    baseline of this benchmark and the specification the tests hold both kernel paths to."""
    m1, m2, gold = 0xBF58476D1CE4E5B9 - (1 << 64), 0x94D049BB133111EB - (1 << 64), 0x9E3779B97F4A7C15 - (1 << 64)

    def lsr(h, k):
        return (h >> k) & ((1 << (64 - k)) - 1)

    h = row_ids.to(torch.int64)[:, None] * gold + col_ids.to(torch.int64)[None, :] * m2 + key
    h = (h ^ lsr(h, 30)) * m1
    h = (h ^ lsr(h, 27)) * m2
    h = h ^ lsr(h, 31)
    return lsr(h, 11) >= int(p * float(1 << 53))


def _interleaved(fns: dict, reps: int) -> dict[str, tuple[float, float]]:
    """Median (wall, this thread's CPU) milliseconds of each function, calls interleaved
    (a load spike hits all). On a shared machine the CPU time is the steadier of the two:
    a descheduled thread's wall time grows, its CPU time does not."""
    for fn in fns.values():  # warm-up (numba compiles or loads its cache here)
        fn()
    wall, cpu = {k: [] for k in fns}, {k: [] for k in fns}
    for _ in range(reps):
        for k, fn in fns.items():
            t0, c0 = time.perf_counter(), time.thread_time()
            fn()
            cpu[k].append(time.thread_time() - c0)
            wall[k].append(time.perf_counter() - t0)
    return {k: (1e3 * statistics.median(wall[k]), 1e3 * statistics.median(cpu[k])) for k in fns}


def _table(header, rows) -> str:
    def cell(v):
        return f"{v:.3g}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows])


def elementwise_bench(shapes=((2247, 256), (22470, 256)), p: float = 0.5, reps: int = 30, seed: int = 0) -> dict:
    """Run both benchmarks; returns {"mask": rows, "tail": rows, "load_avg": (1, 5, 15 min)}."""
    from scalegnn import _elementwise as ew
    from scalegnn.parallel.collectives import CommStats
    from scalegnn.parallel.grid import ProcessGrid
    from scalegnn.parallel.context import ParallelContext
    from scalegnn.parallel.tail import layer_tail, parallel_rms_norm

    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(seed)
    pc = ParallelContext(ProcessGrid.single(), CommStats())
    mask_rows, tail_rows = [], []
    for b, h in shapes:
        rows = torch.sort(torch.randperm(10 * b, generator=gen)[:b]).values  # sampled vertex ids
        cols = torch.arange(h)
        f32, u8 = torch.empty(b, h), torch.empty(b, h, dtype=torch.bool)
        fns = {"bernoulli_ (float32)": lambda: f32.bernoulli_(1 - p),
               "bernoulli_ (bool)": lambda: u8.bernoulli_(1 - p),
               "mask before": lambda: mask_before_issue_l(7, rows, cols, p),
               "mask torch path": lambda: ew.keep_mask_torch(7, rows, cols, p)}
        if ew.available():
            fns["mask numba"] = lambda: ew.keep_mask(7, rows, cols, p)
        ms = _interleaved(fns, reps)
        (bw, bc) = ms["bernoulli_ (float32)"]
        mask_rows += [[f"{b}x{h}", k, w, w / bw, c, c / bc] for k, (w, c) in ms.items()]

        x = torch.randn(b, h, generator=gen).requires_grad_()
        g = (torch.rand(h, generator=gen) + 0.5).requires_grad_()
        res = torch.randn(b, h, generator=gen).requires_grad_()
        dout = torch.randn(b, h, generator=gen)
        drop = ew.DropoutBlock(7, rows, cols, p)

        def clear():  # each call's gradients are fresh (autograd hands them over, no accumulation)
            x.grad = g.grad = res.grad = None

        def before():
            clear()
            z = parallel_rms_norm(x, g, pc, "x", "y", h, 1e-6)
            z = torch.relu(z) * mask_before_issue_l(7, rows, cols, p) / (1.0 - p)
            (z + res).backward(dout)

        def fused():
            clear()
            layer_tail(x, g, res, drop, pc, "x", "y", h, 1e-6, True).backward(dout)

        def fused_torch():
            enabled, ew._ENABLED = ew._ENABLED, False
            try:
                fused()
            finally:
                ew._ENABLED = enabled

        fns = {"unfused before (fwd+bwd)": before, "fused torch path (fwd+bwd)": fused_torch}
        if ew.available():
            fns["fused numba (fwd+bwd)"] = fused
        ms = _interleaved(fns, reps)
        (bw, bc) = ms["unfused before (fwd+bwd)"]
        tail_rows += [[f"{b}x{h}", k, w, bw / w, c, bc / c] for k, (w, c) in ms.items()]
    return {"mask": mask_rows, "tail": tail_rows, "load_avg": os.getloadavg(), "numba": ew.available(),
            "threads": torch.get_num_threads()}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--p", type=float, default=0.5, help="dropout probability")
    ap.add_argument("--rows", type=int, nargs="+", default=[2247, 22470])
    ap.add_argument("--hidden", type=int, default=256)
    args = ap.parse_args(argv)
    out = elementwise_bench(tuple((r, args.hidden) for r in args.rows), p=args.p, reps=args.reps)
    load = ", ".join(f"{v:.2f}" for v in out["load_avg"])
    print(f"one thread (torch threads {out['threads']}), numba {'on' if out['numba'] else 'absent'}, "
          f"p = {args.p}, {args.reps} interleaved repetitions, load average {load}\n")
    print("Dropout mask (ratio: time / bernoulli_ on a float32 tensor of the same shape)\n")
    print(_table(["shape", "mask", "wall ms", "x bernoulli_", "cpu ms", "x bernoulli_ (cpu)"], out["mask"]))
    print("\nLayer tail RMSNorm + ReLU + dropout + residual, forward + backward "
          "(ratio: unfused before / this, > 1 is faster)\n")
    print(_table(["shape", "tail", "wall ms", "speed-up", "cpu ms", "speed-up (cpu)"], out["tail"]))


if __name__ == "__main__":
    main()
