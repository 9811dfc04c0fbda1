"""``scalegnn bench``: comparisons with the peers (PyG, torch-sparse, GraphSAINT, DGL)
and end-to-end measurements that write JSON and a Markdown table.

    scalegnn bench sampler       Algorithm 2 step vs PyG / torch-sparse / GraphSAINT / DGL (item 7)
    scalegnn bench neighbor-sampler  FastSample's fused sampler vs PyG / torch-sparse / DGL
                                 (benchmarks/fastsample.py)
    scalegnn bench permutation   max/mean nonzeros over 8 x 8 shards (Plexus Table 3)
    scalegnn bench ablation      cumulative paper-V switches on a grid (Fig. 5): time per
                                 component and bytes per collective kind per step
    scalegnn bench steps         one training step per grid: time per component, bytes per kind
    scalegnn bench scaling       step time vs nonzeros at a fixed batch ratio; log-log slope
    scalegnn bench threads       thread policies of runs side by side under a competing load
                                 (benchmarks/thread_policy.py)
    scalegnn bench collectives   all-reduce / all-gather latency and bus bandwidth on this
                                 machine's ranks: a profile's [network] constants
                                 (benchmarks/collectives.py)
    scalegnn bench kernels       GEMM, SpMM and memory bandwidth on this device: a profile's
                                 [compute] constants (benchmarks/kernels.py)

Every command prints its table and writes ``OUT/<name>.json`` and ``OUT/<name>.md``
(default ``results/bench``). Timings are medians of interleaved repetitions measured
in one run (peers and ours alternate, so background load hits both alike); the JSON
keeps every repetition, the machine's load average and the command line.
Micro-benchmarks for pytest-benchmark live in ``tests/benchmarks/`` (``make bench``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from .common import machine_info, markdown_table

__all__ = ["run_bench_command", "random_csr", "sampler_bench", "permutation_bench",
           "ablation_bench", "steps_bench", "scaling_bench", "markdown_table", "ABLATION"]


# --------------------------------------------------------------------------- helpers
def _write(out_dir: str | None, name: str, payload: dict, md: str) -> None:
    print(md)
    if out_dir is None:
        return
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    payload = {**payload, "markdown": md}
    (out / f"{name}.json").write_text(json.dumps(payload, indent=1, default=str))
    (out / f"{name}.md").write_text(md + "\n")
    print(f"wrote {out / (name + '.json')} and {out / (name + '.md')}")


def random_csr(n: int, nnz: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A random CSR matrix (N x N, ~nnz entries, uniform endpoints, sorted and unique
    within rows, float32 values in (0, 1]): the generated graph of the sampler bench."""
    gen = torch.Generator().manual_seed(seed)
    key = torch.unique(torch.randint(0, n * n, (nnz,), generator=gen))  # sorted, unique
    rows = torch.div(key, n, rounding_mode="floor")
    cols = key - rows * n
    indptr = torch.zeros(n + 1, dtype=torch.int64)
    indptr[1:] = torch.cumsum(torch.bincount(rows, minlength=n), 0)
    values = 1.0 - torch.rand(key.numel(), generator=gen)
    return indptr, cols.contiguous(), values


def _median_ms(ts: list[float]) -> float:
    return statistics.median(ts) * 1e3


# --------------------------------------------------------------------------- item 7: sampler
_DGL_SCRIPT = r"""
import json, sys, time, statistics
import numpy as np, torch, dgl
d = sys.argv[1]; n = int(sys.argv[2]); b = int(sys.argv[3]); reps = int(sys.argv[4]); threads = int(sys.argv[5])
torch.set_num_threads(threads)
indptr = torch.from_numpy(np.load(d + "/indptr.npy")); indices = torch.from_numpy(np.load(d + "/indices.npy"))
g = dgl.graph(("csr", (indptr, indices, torch.empty(0, dtype=torch.int64))), num_nodes=n)
g.edata["w"] = torch.from_numpy(np.load(d + "/values.npy"))
g.create_formats_()
gen = torch.Generator().manual_seed(0)
def step():
    nodes = torch.randperm(n, generator=gen)[:b]
    return dgl.node_subgraph(g, nodes)
step()
full, cpu, perm = [], [], []
for _ in range(reps):
    t0, c0 = time.perf_counter(), time.process_time(); step()
    full.append(time.perf_counter() - t0); cpu.append(time.process_time() - c0)
    t0 = time.perf_counter(); torch.randperm(n, generator=gen)[:b]; perm.append(time.perf_counter() - t0)
print(json.dumps({"times": full, "cpu_times": cpu, "randperm": perm, "dgl": dgl.__version__,
                  "torch": torch.__version__}))
"""


def _run_dgl(py: str, tmp: str, n: int, b: int, reps: int, threads: int) -> dict:
    proc = subprocess.run([py, "-c", _DGL_SCRIPT, tmp, str(n), str(b), str(reps), str(threads)],
                          capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        return {"error": (proc.stderr or proc.stdout).strip().splitlines()[-1:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _lines_touched(indptr: torch.Tensor, indices: torch.Tensor, id_bytes: int, sample: torch.Tensor) -> int:
    """64-byte cache lines a sampler step must read: the row pointers of the sampled rows,
    their column ids (``id_bytes`` each), and the values (float32) of the kept entries."""
    def lines(byte_lo: torch.Tensor, byte_hi: torch.Tensor) -> int:  # union of sorted [lo, hi) byte ranges
        keep = byte_hi > byte_lo
        first, last = byte_lo[keep] // 64, (byte_hi[keep] - 1) // 64
        shared = int((first[1:] == last[:-1]).sum()) if first.numel() else 0
        return int((last - first + 1).sum()) - shared

    starts, stops = indptr[sample], indptr[sample + 1]
    ptr_lines = lines(8 * sample, 8 * (sample + 2))
    id_lines = lines(id_bytes * starts, id_bytes * stops)
    from scalegnn.csr import _row_runs

    _, _, _, flat = _row_runs(indptr, sample, indices.numel())
    pos = flat.long()[torch.isin(indices[flat.long()], sample)]  # stored positions of the kept entries
    return ptr_lines + id_lines + lines(4 * pos, 4 * pos + 4)


def sampler_bench(n: int = 10**6, nnz: int = 2 * 10**7, batch: int = 10**5, reps: int = 5, threads: int | None = None,
                  dgl_python: str | None = None, peers: tuple = ("pyg_subgraph", "saint_subgraph", "graphsaint", "dgl"),
                  seed: int = 0) -> tuple[dict, str]:
    """Algorithm 2 (sample, extract, rescale, both CSRs) against the peers' subgraph
    extraction on the same graph, interleaved repetitions, medians (see module doc)."""
    import warnings

    warnings.filterwarnings("ignore", message=".*Sparse CSR tensor support is in beta.*")
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _sampler_bench(n, nnz, batch, reps, torch.get_num_threads(), dgl_python, peers, seed)
    finally:
        torch.set_num_threads(before)


def _sampler_bench(n, nnz, batch, reps, threads, dgl_python, peers, seed):
    from scalegnn.sampling import CompactIndexMap, CSRBlock, extract_block, inclusion_probability, sample_vertices

    t0 = time.perf_counter()
    indptr, indices, values = random_csr(n, nnz, seed)
    gen_s = time.perf_counter() - t0
    nnz = indices.numel()
    block = CSRBlock(indptr, indices.to(torch.int32), values, 0, n, 0, n)  # as CSRBlock.from_graph stores it
    p = inclusion_probability(n, batch)
    cmap = CompactIndexMap(n)
    step = [0]

    def ours(backend, blk, index_map=None):
        def run():
            step[0] += 1
            s = sample_vertices(n, batch, seed, step[0])
            return extract_block(blk, s, p, index_map, backend=backend)
        return run

    methods = {}
    from scalegnn import _sampling_kernel

    if _sampling_kernel.available():
        methods["ours (numba kernel)"] = ours("numba", block)
    methods["ours (vectorized torch)"] = ours("torch", block, cmap)
    gen = torch.Generator().manual_seed(seed)
    peer_info = {}
    if "pyg_subgraph" in peers or "graphsaint" in peers:
        row = torch.repeat_interleave(torch.arange(n), indptr[1:] - indptr[:-1])
        edge_index = torch.stack([row, indices])
        del row
    if "pyg_subgraph" in peers:
        try:
            import torch_geometric
            from torch_geometric.utils import subgraph

            methods["PyG utils.subgraph"] = lambda: subgraph(torch.randperm(n, generator=gen)[:batch], edge_index,
                                                             values, relabel_nodes=True, num_nodes=n)
            peer_info["PyG utils.subgraph"] = f"torch_geometric {torch_geometric.__version__}"
        except ImportError as exc:
            peer_info["PyG utils.subgraph"] = f"not installed ({exc})"
    if "saint_subgraph" in peers:
        try:
            import torch_sparse
            from torch_sparse import SparseTensor

            adj = SparseTensor(rowptr=indptr, col=indices, value=values, sparse_sizes=(n, n), is_sorted=True,
                               trust_data=True)
            methods["torch-sparse saint_subgraph"] = lambda: adj.saint_subgraph(
                torch.sort(torch.randperm(n, generator=gen)[:batch]).values)
            peer_info["torch-sparse saint_subgraph"] = f"torch_sparse {torch_sparse.__version__}"
        except ImportError as exc:
            peer_info["torch-sparse saint_subgraph"] = f"not installed ({exc})"
    if "graphsaint" in peers:
        try:
            from torch_geometric.data import Data
            from torch_geometric.loader import GraphSAINTNodeSampler

            loader = GraphSAINTNodeSampler(Data(edge_index=edge_index, edge_weight=values, num_nodes=n),
                                           batch_size=batch, num_steps=10**6, sample_coverage=0)
            methods["PyG GraphSAINTNodeSampler (1 batch)"] = lambda: loader._collate([loader[0]])
            peer_info["PyG GraphSAINTNodeSampler (1 batch)"] = "B roots drawn with replacement (degree-biased), unique"
        except ImportError as exc:
            peer_info["PyG GraphSAINTNodeSampler (1 batch)"] = f"not installed ({exc})"
    times = {name: [] for name in methods}
    # CPU seconds of the process beside the wall clock: on a shared machine other jobs
    # stretch the wall time of whichever method they happen to overlap, not its CPU time.
    cpu_times = {name: [] for name in methods}
    for fn in methods.values():  # warm-up: JIT, allocator, caches
        fn()
    dgl_result = None
    from scalegnn.baselines.distdgl.harness import dgl_python as find_dgl_python

    dgl_py = find_dgl_python(dgl_python, required=False) if "dgl" in peers else None
    load_before = machine_info()["load_avg_1m"]
    for rep in range(reps):
        for name, fn in methods.items():
            t, c = time.perf_counter(), time.process_time()
            fn()
            times[name].append(time.perf_counter() - t)
            cpu_times[name].append(time.process_time() - c)
        if rep == reps // 2 and dgl_py is not None:  # the DGL environment (torch 2.1.2) runs as a subprocess
            with tempfile.TemporaryDirectory() as tmp:
                np.save(f"{tmp}/indptr.npy", indptr.numpy())
                np.save(f"{tmp}/indices.npy", indices.numpy())
                np.save(f"{tmp}/values.npy", values.numpy())
                dgl_result = _run_dgl(dgl_py, tmp, n, batch, reps, threads)
    if "dgl" in peers:
        name = "DGL node_subgraph"
        if dgl_py is None:
            peer_info[name] = "not measured: no DGL environment (.venv-dgl / SCALEGNN_DGL_PYTHON)"
        elif dgl_result is None or "error" in dgl_result:
            peer_info[name] = f"failed: {dgl_result}"
        else:
            times[name] = dgl_result["times"]
            cpu_times[name] = dgl_result["cpu_times"]
            peer_info[name] = (f"dgl {dgl_result['dgl']} / torch {dgl_result['torch']} (subprocess); "
                               f"its randperm {_median_ms(dgl_result['randperm']):.1f} ms")
    med = {k: _median_ms(v) for k, v in times.items()}
    cpu_med = {k: _median_ms(v) for k, v in cpu_times.items()}
    ours_names = [k for k in med if k.startswith("ours")]
    peer_names = [k for k in med if not k.startswith("ours")]
    best = ours_names[0]
    fastest_peer = min(peer_names, key=med.get) if peer_names else None
    # What the step must touch: column ids of the sampled rows, values of kept entries, both CSRs out.
    s = sample_vertices(n, batch, seed, 0)
    rows_nnz = int((indptr[s + 1] - indptr[s]).sum())
    out = extract_block(block, s, p, backend="torch", index_map=CompactIndexMap(n))
    kept = out.adj.values().numel()
    touched = rows_nnz * 4 + kept * (4 + 2 * (8 + 4)) + 2 * 8 * (batch + 1)
    # The same reads counted in the 64-byte cache lines memory delivers (the sampled rows
    # are scattered, so a row's few entries cost whole lines), plus the output bytes.
    out_bytes = kept * 2 * (8 + 4) + 2 * 8 * (batch + 1)
    line_bytes = 64 * _lines_touched(indptr, indices, block.indices.element_size(), s) + out_bytes
    big = torch.empty(64 * 2**20 // 4)
    dst = torch.empty_like(big)
    dst.copy_(big)
    bw = []
    for _ in range(5):
        t = time.perf_counter()
        dst.copy_(big)
        bw.append(2 * big.numel() * 4 / (time.perf_counter() - t))
    bandwidth = statistics.median(bw)
    rows = []
    for k in ours_names + sorted(peer_names, key=med.get):
        ratios = [f"{med[o] / med[k]:.2f}" if k in peer_names else "-" for o in ours_names]
        rows.append([k, med[k], min(times[k]) * 1e3, cpu_med[k]] + ratios + [peer_info.get(k, "")])
    for k, why in peer_info.items():
        if k not in med:
            rows.append([k, "-", "-", "-"] + ["-"] * len(ours_names) + [why])
    goal = med[fastest_peer] / 2 if fastest_peer else float("nan")
    payload = {"bench": "sampler", "n": n, "nnz": nnz, "batch": batch, "reps": reps, "threads": threads,
               "graph_generation_s": gen_s, "times_s": times, "median_ms": med, "peer_info": peer_info,
               "fastest_peer": fastest_peer, "goal_ms": goal, "ours_ms": med[best],
               "ratio_vs_fastest_peer": med[best] / med[fastest_peer] if fastest_peer else None,
               "ratios": {o: {k: med[o] / med[k] for k in peer_names} for o in ours_names},
               "sampled_row_entries": rows_nnz, "kept_entries": kept, "bytes_touched": touched,
               "copy_bandwidth_GBps": bandwidth / 1e9, "bytes_floor_ms": touched / bandwidth * 1e3,
               "line_bytes_touched": line_bytes, "line_floor_ms": line_bytes / bandwidth * 1e3,
               "cpu_times_s": cpu_times, "cpu_median_ms": cpu_med,
               "cpu_fastest_peer": min(peer_names, key=cpu_med.get) if peer_names else None,
               "load_avg_before": load_before, "machine": machine_info(), "numba": _sampling_kernel.available()}
    md = (f"Sampler step (sample B, extract, rescale, both CSRs) on a generated graph, N = {n:,}, "
          f"nnz = {nnz:,}, B = {batch:,}; {threads} torch threads; median of {reps} interleaved repetitions "
          f"(load average {load_before} -> {payload['machine']['load_avg_1m']}).\n\n")
    md += markdown_table(["method", "median ms", "min ms", "median CPU ms"] + [f"{o} / peer" for o in ours_names]
                         + ["notes"], rows)
    md += (f"\n\nGoal: at most half the fastest peer ({fastest_peer}: {med.get(fastest_peer, float('nan')):.1f} ms"
           f" -> {goal:.1f} ms); ours: {med[best]:.1f} ms = {payload['ratio_vs_fastest_peer']:.2f}x of it. "
           f"Bytes the step must touch: {touched / 1e6:.1f} MB = {payload['bytes_floor_ms']:.2f} ms at the "
           f"measured copy bandwidth {bandwidth / 1e9:.1f} GB/s; counted in whole 64-byte cache lines "
           f"{line_bytes / 1e6:.1f} MB = {payload['line_floor_ms']:.2f} ms.")
    if payload["cpu_fastest_peer"]:
        cpu_peer = payload["cpu_fastest_peer"]
        payload["cpu_ratio_vs_fastest_peer"] = cpu_med[best] / cpu_med[cpu_peer]
        md += (f" On CPU time (unaffected by other jobs' share of the cores): ours {cpu_med[best]:.1f} ms = "
               f"{payload['cpu_ratio_vs_fastest_peer']:.2f}x the fastest peer ({cpu_peer}: {cpu_med[cpu_peer]:.1f} ms).")
    return payload, md


# --------------------------------------------------------------------------- item 6: permutation
def permutation_bench(data_root: str | None = None, scale: int = 18, parts: int = 8, seed: int = 0,
                      datasets: tuple = ("power-law", "facebook")) -> tuple[dict, str]:
    from scalegnn.permutation import load_balance, power_law_graph

    results, rows = {}, []
    for name in datasets:
        if name == "power-law":
            graph = power_law_graph(scale, 16, seed)
            label = f"R-MAT power law, R-MAT order (N = 2^{scale})"
        else:
            from scalegnn.datasets import load_dataset

            try:
                graph = load_dataset(name, data_root=data_root, seed=seed).gcn_normalize()
            except (FileNotFoundError, ValueError) as exc:
                rows.append([name, "-", "-", "-", "-", f"not available: {exc}"])
                continue
            label = name
        lb = load_balance(graph, parts, parts, seed)
        results[name] = {"num_nodes": graph.num_nodes, "nnz": graph.num_edges, **lb}
        rows.append([label, graph.num_nodes, graph.num_edges] + [f"{lb[m]['max_over_mean']:.3f}"
                                                                for m in ("original", "single", "double")] + [""])
    payload = {"bench": "permutation", "parts": parts, "seed": seed, "results": results, "machine": machine_info()}
    md = (f"Load balance: max / mean nonzeros over the {parts} x {parts} shards of the GCN-normalized adjacency "
          f"(A + I), Plexus Table 3's measure.\n\n")
    md += markdown_table(["graph", "N", "nnz", "original", "single permutation", "double permutation", "notes"], rows)
    return payload, md


# --------------------------------------------------------------------------- item 8: ablation (Fig. 5)
ABLATION = (
    ("baseline", {}),
    ("+ overlap sampling", {"prefetch": True}),
    ("+ bf16 comm", {"prefetch": True, "comm_dtype": "bf16"}),
    ("+ fusion", {"prefetch": True, "comm_dtype": "bf16", "compile": True}),
    ("+ comm overlap", {"prefetch": True, "comm_dtype": "bf16", "compile": True, "comm_overlap": True}),
)


def _ablation_worker(rank, world, shape, dataset, data_root, batch_ratio, hidden, layers, steps, warmup, configs,
                     compile_backend):
    from scalegnn.config import make_config
    from scalegnn.model import ModelConfig
    from scalegnn.numerics import NumericsConfig
    from scalegnn.optim import OptimConfig
    from scalegnn.parallel.engine import COMPONENTS, ParallelEngine
    from scalegnn.parallel.grid import ProcessGrid
    from scalegnn.perf import PerfConfig
    from scalegnn.sampling import resolve_batch_size
    from scalegnn.trainer import prepare_graph

    grid = ProcessGrid(*shape)
    graph = prepare_graph(make_config(dataset=dataset, data_root=data_root, progress=False))
    batch = resolve_batch_size(graph.num_nodes, batch_ratio=batch_ratio)
    numeric = {f.name for f in dataclasses.fields(NumericsConfig)}  # bf16 comm; the others only go faster
    out = []
    for name, switches in configs:
        if switches.get("compile"):
            torch._dynamo.reset()  # compile afresh per config, so its compile time is its own
        perf = PerfConfig(compile_backend=compile_backend, **{k: v for k, v in switches.items() if k not in numeric})
        numerics = NumericsConfig(**{k: v for k, v in switches.items() if k in numeric})
        eng = ParallelEngine(graph, ModelConfig(hidden=hidden, layers=layers, dropout=0.5), OptimConfig(), batch,
                             seed=0, epochs=1, grid=grid, perf=perf, numerics=numerics)
        try:
            for s in range(warmup):
                eng.train_step(s)
            eng.components.clear()
            eng.comm_bytes.clear()
            grid.barrier()
            t0 = time.perf_counter()
            losses = [eng.train_step(warmup + s).loss for s in range(steps)]
            wall = time.perf_counter() - t0
        finally:
            eng.close()
        comp = {k: eng.components.get(k, 0.0) / steps for k in COMPONENTS}
        out.append({"name": name, "switches": switches, "step_s": wall / steps, "components_s": comp,
                    "bytes_per_step": {k: v / steps for k, v in eng.comm_bytes.items()},
                    "compile_time_s": eng.compile_time_s, "losses": losses})
    return out


def ablation_bench(grid: str = "1x2x2x2", dataset: str = "csbm:n=20000,avg_degree=10,feature_dim=64",
                   data_root: str | None = None, batch_ratio: float = 0.1, hidden: int = 64, layers: int = 3,
                   steps: int = 8, warmup: int = 2, compile_backend: str = "inductor") -> tuple[dict, str]:
    """Fig. 5's cumulative breakdown on a local gloo grid: per-step seconds per component
    (rank 0) and bytes per collective kind per step. With 8-16 processes on a few
    cores the seconds show where time goes under oversubscription, not GPU speedups;
    the bytes are exact."""
    from scalegnn.parallel.engine import COMPONENTS
    from scalegnn.parallel.grid import parse_grid
    from scalegnn.launch.job import spawn

    shape = parse_grid(grid)
    world = math.prod(shape)
    if any(sw.get("compile") for _, sw in ABLATION):  # warm the compile cache once, not in every rank
        from scalegnn._compiled import CompiledKernels
        from scalegnn.model import ModelConfig
        from scalegnn.parallel.context import ParallelContext
        from scalegnn.parallel.grid import ProcessGrid
        from scalegnn.parallel.tail import warm_up_compiled

        cfg = ModelConfig(hidden=hidden, layers=layers, dropout=0.5)  # the workers' model
        warm_up_compiled(ParallelContext(ProcessGrid.single(), fused=CompiledKernels(compile_backend)), cfg.hidden,
                         cfg.norm_eps, cfg.dropout, cfg.norm, cfg.residual, torch.device("cpu"), torch.float32)
    res = spawn(_ablation_worker, world, shape, dataset, data_root, batch_ratio, hidden, layers, steps, warmup,
                list(ABLATION), compile_backend, timeout_s=3000, threads_per_worker=1)[0]
    kinds = sorted({k for r in res for k in r["bytes_per_step"]})
    rows = []
    for r in res:
        c = r["components_s"]
        rows.append([r["name"], r["step_s"] * 1e3] + [c[k] * 1e3 for k in COMPONENTS] + [r["compile_time_s"]])
    md = (f"Cumulative ablation (paper Fig. 5) on grid {grid} ({world} gloo processes on {os.cpu_count()} cores), "
          f"{dataset}, B = {batch_ratio} N, L = {layers}, hidden {hidden}; ms per step (rank 0, mean of {steps} "
          f"steps after {warmup} warm-up).\n\n")
    md += markdown_table(["config", "step"] + list(COMPONENTS) + ["compile s"], rows)
    md += "\n\nBytes sent per step by rank 0, per collective kind:\n\n"
    md += markdown_table(["config"] + kinds, [[r["name"]] + [int(r["bytes_per_step"].get(k, 0)) for k in kinds]
                                              for r in res])
    payload = {"bench": "ablation", "grid": grid, "dataset": dataset, "batch_ratio": batch_ratio, "hidden": hidden,
               "layers": layers, "steps": steps, "results": res, "machine": machine_info()}
    return payload, md


def steps_bench(grids: tuple = ("1x1x1x2", "1x2x1x1", "1x2x2x2", "2x2x2x2"),
                dataset: str = "csbm:n=20000,avg_degree=10,feature_dim=64", data_root: str | None = None,
                batch_ratio: float = 0.1, hidden: int = 64, layers: int = 3, steps: int = 8,
                warmup: int = 2) -> tuple[dict, str]:
    """One training step per grid (plain configuration): ms per step and per component
    on rank 0, bytes per step per collective kind."""
    from scalegnn.parallel.engine import COMPONENTS
    from scalegnn.parallel.grid import parse_grid
    from scalegnn.launch.job import spawn

    results, rows = [], []
    for g in grids:
        shape = parse_grid(g)
        r = spawn(_ablation_worker, math.prod(shape), shape, dataset, data_root, batch_ratio, hidden, layers, steps,
                  warmup, [("plain", {})], "inductor", timeout_s=3000, threads_per_worker=1)[0][0]
        r["grid"] = g
        results.append(r)
        rows.append([g, math.prod(shape), r["step_s"] * 1e3] + [r["components_s"][k] * 1e3 for k in COMPONENTS]
                    + [int(sum(r["bytes_per_step"].values()))])
    md = (f"One training step per grid ({dataset}, B = {batch_ratio} N, L = {layers}, hidden {hidden}; gloo "
          f"processes on {os.cpu_count()} cores); ms per step on rank 0, mean of {steps} steps.\n\n")
    md += markdown_table(["grid", "ranks", "step"] + list(COMPONENTS) + ["bytes sent / step"], rows)
    return {"bench": "steps", "dataset": dataset, "results": results, "machine": machine_info()}, md


# --------------------------------------------------------------------------- item 8: scaling
def scaling_bench(nnzs: tuple = (10**6, 4 * 10**6, 16 * 10**6), avg_degree: int = 20, batch_ratio: float = 0.1,
                  reps: int = 7, hidden: int = 64, features: int = 32, layers: int = 2,
                  threads: int | None = None) -> tuple[dict, str]:
    """Step time vs graph size at a fixed batch ratio (N = nnz / avg_degree): the
    sampler step and one single-process training step. The log-log slope of time vs
    nnz is expected close to 1 (work is proportional to the sampled rows' entries)."""
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _scaling_bench(nnzs, avg_degree, batch_ratio, reps, hidden, features, layers)
    finally:
        torch.set_num_threads(before)


def _scaling_bench(nnzs, avg_degree, batch_ratio, reps, hidden, features, layers):
    from scalegnn.graph import Graph
    from scalegnn.model import ModelConfig
    from scalegnn.optim import OptimConfig
    from scalegnn.parallel.engine import ParallelEngine

    rows, results = [], []
    for nnz in nnzs:
        n = nnz // avg_degree
        indptr, indices, values = random_csr(n, nnz, 0)
        gen = torch.Generator().manual_seed(0)
        idx = torch.arange(n)
        g = Graph(indptr, indices, values, torch.randn(n, features, generator=gen),
                  torch.randint(0, 8, (n,), generator=gen), idx[: n // 2], idx[n // 2: 3 * n // 4],
                  idx[3 * n // 4:], 8, meta={"normalized": "gcn"})
        eng = ParallelEngine(g, ModelConfig(hidden=hidden, layers=layers), OptimConfig(), max(2, int(batch_ratio * n)))
        for s in range(2):  # warm-up: JIT, allocator
            eng.train_step(s)
        sample_t, step_t = [], []
        for r in range(reps):
            t = time.perf_counter()
            eng.sampler.sample(r + 2)
            sample_t.append(time.perf_counter() - t)
            t = time.perf_counter()
            eng.train_step(r + 2)
            step_t.append(time.perf_counter() - t)
        eng.close()
        results.append({"nnz": g.num_edges, "n": n, "sample_ms": _median_ms(sample_t), "step_ms": _median_ms(step_t),
                        "sample_min_ms": min(sample_t) * 1e3, "step_min_ms": min(step_t) * 1e3,
                        "sample_s": sample_t, "step_s": step_t})
        r = results[-1]
        rows.append([g.num_edges, n, r["sample_ms"], r["sample_min_ms"], r["step_ms"], r["step_min_ms"]])

    def slope(key):
        x = np.log([r["nnz"] for r in results])
        y = np.log([r[key] for r in results])
        return float(np.polyfit(x, y, 1)[0])

    payload = {"bench": "scaling", "batch_ratio": batch_ratio, "avg_degree": avg_degree, "results": results,
               "slope_sample": slope("sample_ms"), "slope_step": slope("step_ms"),
               "slope_sample_min": slope("sample_min_ms"), "slope_step_min": slope("step_min_ms"),
               "machine": machine_info()}
    md = (f"Step time vs graph size at B = {batch_ratio} N (generated graphs, average degree {avg_degree}, "
          f"one process, hidden {hidden}, {layers} layers, {features} features, {torch.get_num_threads()} torch "
          f"threads; median and min of {reps}).\n\n")
    md += markdown_table(["nnz", "N", "sampler step ms (median)", "(min)", "training step ms (median)", "(min)"], rows)
    md += (f"\n\nlog-log slope of time vs nnz (1 = linear): sampler {payload['slope_sample']:.2f} on medians, "
           f"{payload['slope_sample_min']:.2f} on minima; training step {payload['slope_step']:.2f} on medians, "
           f"{payload['slope_step_min']:.2f} on minima.")
    return payload, md


# --------------------------------------------------------------------------- CLI
# The parser of `scalegnn bench` is scalegnn.benchmarks.cli (loads no torch); its runs come here.
def run_bench_command(args) -> int:
    cmd = args.bench_command
    if cmd == "sampler":
        payload, md = sampler_bench(int(args.nodes), int(args.nnz), int(args.batch), args.reps, args.threads,
                                    args.dgl_python, tuple(args.peers.split(",")))
        cmd = "sampler" if args.threads is None else f"sampler_threads{args.threads}"
    elif cmd == "neighbor-sampler":
        from .fastsample import neighbor_sampler_bench

        payload, md = neighbor_sampler_bench(int(args.nodes), int(args.nnz), args.batch,
                                             tuple(int(f) for f in args.fanouts.split(",")), args.reps, args.threads,
                                             args.dgl_python)
    elif cmd == "permutation":
        payload, md = permutation_bench(args.data_root, args.scale, args.parts,
                                        datasets=tuple(args.datasets.split(",")))
    elif cmd == "ablation":
        payload, md = ablation_bench(args.grid, args.dataset, args.data_root, args.batch_ratio, args.hidden,
                                     args.layers, args.steps, args.warmup, args.compile_backend)
        cmd = f"ablation_{args.grid}"
    elif cmd == "steps":
        payload, md = steps_bench(tuple(args.grids.split(",")), args.dataset, args.data_root, steps=args.steps)
    elif cmd == "epoch-cost":
        from .epoch_cost import epoch_cost_bench

        payload, md = epoch_cost_bench(args.dataset, args.data_root, args.reps, gemm_dtype=args.gemm_dtype,
                                       compile_tail=args.compile)
    elif cmd == "scaling":
        payload, md = scaling_bench(tuple(int(float(v)) for v in args.nnz.split(",")), reps=args.reps,
                                    batch_ratio=args.batch_ratio, threads=args.threads)
    elif cmd == "collectives":
        from .collectives import collectives_bench

        payload, md = collectives_bench(args)
        if payload is None:  # a rank other than 0 of a launched job: rank 0 writes
            return 0
    elif cmd == "kernels":
        from .kernels import kernels_bench

        payload, md = kernels_bench(args)
    elif cmd == "threads":
        from .thread_policy import run as thread_bench

        payload, md = thread_bench(args)
    else:
        raise ValueError(f"unknown bench command {cmd!r}")
    payload["command"] = "scalegnn bench " + " ".join(sys.argv[sys.argv.index("bench") + 1:]) \
        if "bench" in sys.argv else f"scalegnn bench {cmd}"
    # The bf16-GEMM epoch cost is its own result beside the FP32 one, not over it.
    _write(args.out, cmd if getattr(args, "gemm_dtype", "fp32") == "fp32" else f"{cmd}-{args.gemm_dtype}", payload, md)
    return 0
