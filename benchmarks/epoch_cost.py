"""A ScaleGNN training epoch in units of a fixed reference workload, with its profile.

What is timed, on one thread (``torch.set_num_threads(1)``):

- **the epoch**: the engine's training steps of one epoch (no evaluation) on the
  given dataset (default Facebook page-page, batch ratio 0.1, 3 layers, hidden 256,
  dropout 0.5, the trainer's own engine and optimizer), after one warm-up epoch;
- **the reference workload** (one "unit"): a 1024 x 1024 x 1024 fp32 matmul plus the
  SpMM of a fixed random CSR matrix of 2,000,000 nonzeros (100,000 x 100,000, seed 0)
  with a dense 100,000 x 64 fp32 matrix.

Each repetition times the reference, then an epoch, then the reference again
(interleaved, so a change in the machine's speed moves both); the result is the
ratio of the medians, epoch / reference, which compares commits and machines where
absolute times do not. A ``torch.profiler`` table of one more epoch (operators by
self CPU time) shows where the time goes.

Run it against any checkout (the imports are those of ``scalegnn`` 2026-11 and later)::

    OMP_NUM_THREADS=1 python benchmarks/epoch_cost.py --data-root ../shared/data
    OMP_NUM_THREADS=1 PYTHONPATH=/path/to/old/checkout python benchmarks/epoch_cost.py ...

or as ``scalegnn bench epoch-cost``, which writes ``results/bench/epoch-cost.{json,md}``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

__all__ = ["reference_workload", "epoch_cost_bench"]


def _reference_operands(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    a = torch.rand(1024, 1024, generator=gen)
    b = torch.rand(1024, 1024, generator=gen)
    n, nnz = 100_000, 2_000_000
    rows = torch.randint(0, n, (nnz,), generator=gen)
    cols = torch.randint(0, n, (nnz,), generator=gen)
    vals = torch.rand(nnz, generator=gen)
    csr = torch.sparse_coo_tensor(torch.stack([rows, cols]), vals, (n, n)).coalesce().to_sparse_csr()
    x = torch.rand(n, 64, generator=gen)
    return a, b, csr, x


def reference_workload(operands) -> float:
    """Seconds of one reference unit: the 1024^3 matmul plus the 2M-nonzero SpMM."""
    a, b, csr, x = operands
    t0 = time.perf_counter()
    torch.mm(a, b)
    torch.sparse.mm(csr, x)
    return time.perf_counter() - t0


def _engine(dataset: str, data_root: str | None, batch_ratio: float, hidden: int, layers: int, seed: int,
            gemm_dtype: str = "fp32", compile_tail: bool = False):
    from scalegnn.config import make_config
    from scalegnn.sampling import resolve_batch_size
    from scalegnn.trainer import make_engine, prepare_graph

    # Checkouts from before --gemm-dtype know only FP32: pass the switches only when set.
    extra = ({} if gemm_dtype == "fp32" else {"gemm_dtype": gemm_dtype}) | ({"compile": True} if compile_tail else {})
    cfg = make_config(dataset=dataset, data_root=data_root, batch_ratio=batch_ratio, hidden=hidden, layers=layers,
                      seed=seed, epochs=1000, **extra)
    graph = prepare_graph(cfg)
    engine = make_engine(cfg, graph, resolve_batch_size(graph.num_nodes, None, batch_ratio))
    return engine, graph


def epoch_cost_bench(dataset: str = "facebook", data_root: str | None = None, reps: int = 7, batch_ratio: float = 0.1,
                     hidden: int = 256, layers: int = 3, seed: int = 0, profile: bool = True,
                     gemm_dtype: str = "fp32", compile_tail: bool = False) -> tuple[dict, str]:
    torch.set_num_threads(1)
    engine, graph = _engine(dataset, data_root, batch_ratio, hidden, layers, seed, gemm_dtype, compile_tail)
    spe = engine.steps_per_epoch
    step = 0

    def epoch() -> float:
        nonlocal step
        t0 = time.perf_counter()
        for _ in range(spe):
            engine.train_step(step)
            step += 1
        return time.perf_counter() - t0

    operands = _reference_operands()
    reference_workload(operands)
    epoch()  # warm-up: first-touch allocations, numba compilation, lazy initialization
    refs, epochs = [], []
    for _ in range(reps):
        refs.append(reference_workload(operands))
        epochs.append(epoch())
        refs.append(reference_workload(operands))
    table = ""
    if profile:
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as torch_profile

        with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
            epoch()
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)
    ref_s, epoch_s = statistics.median(refs), statistics.median(epochs)
    payload = {"bench": "epoch-cost", "dataset": dataset, "num_nodes": graph.num_nodes, "batch_ratio": batch_ratio,
               "hidden": hidden, "layers": layers, "gemm_dtype": gemm_dtype, "compile": compile_tail,
               "steps_per_epoch": spe, "threads": torch.get_num_threads(),
               "reps": reps, "epoch_s": epochs, "reference_s": refs, "epoch_median_s": epoch_s,
               "reference_median_s": ref_s, "epoch_in_reference_units": epoch_s / ref_s,
               "load_average": list(os.getloadavg()), "profile": table}
    md = (f"Epoch of {dataset} (N = {graph.num_nodes:,}, batch ratio {batch_ratio}, {layers} layers, hidden "
          f"{hidden}, GEMM operands {gemm_dtype}{', --compile' if compile_tail else ''}, {spe} steps) on one thread: "
          f"median {1e3 * epoch_s:.1f} ms over {reps}; reference unit "
          f"(1024^3 matmul + 2M-nonzero SpMM x 64) median {1e3 * ref_s:.1f} ms; **epoch = "
          f"{epoch_s / ref_s:.2f} units**. Load average {os.getloadavg()[0]:.2f}.\n")
    if table:
        md += "\nProfile of one epoch (self CPU time):\n\n```\n" + table + "\n```\n"
    return payload, md


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", default="facebook")
    p.add_argument("--data-root", default=None)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--no-profile", action="store_true")
    p.add_argument("--gemm-dtype", default="fp32", choices=("fp32", "bf16"),
                   help="operand dtype of the dense GEMMs (scalegnn train --gemm-dtype); the reference stays fp32")
    p.add_argument("--compile", action="store_true", help="the layer tail's and the loss's compiled phases "
                   "(scalegnn train --compile; inductor's C++ kernels on the CPU) instead of the numba kernels")
    args = p.parse_args(argv)
    payload, md = epoch_cost_bench(args.dataset, args.data_root, args.reps, profile=not args.no_profile,
                                   gemm_dtype=args.gemm_dtype, compile_tail=args.compile)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
