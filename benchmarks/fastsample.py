"""``scalegnn bench neighbor-sampler``: FastSample's fused neighbor sampler against the peers'.

The same generated graph (uniform random endpoints, symmetrized, duplicates merged: N
vertices, ~nnz stored entries), the same B seeds per repetition, the same fanouts (the seeds' hop
first), L-level neighbor sampling into per-layer structures:

    fused (numba)                   baselines.fastsample_kernel, one compiled call, L CSC blocks
    fused (torch path)              the same blocks from the plain torch implementation
    PyG NeighborLoader sampler      torch-sparse's ``neighbor_sample`` (what NeighborLoader
                                    calls without pyg-lib), replace=False: one merged subgraph
    torch-sparse sample_adj         ``SparseTensor.sample_adj`` per hop (PyG's old
                                    NeighborSampler): L bipartite adjacencies
    DGL sample_neighbors+to_block   DGL's per-level sampling and block construction, in the
                                    DGL environment (.venv-dgl, torch 2.1) as a subprocess

The semantics differ in one respect, stated in the table: PyG's sampler samples each
vertex once (at the hop it first appears) and returns one subgraph; the fused kernel,
``sample_adj`` and DGL sample every destination of every level (message flow graphs),
which is more work for the same fanouts. Medians of interleaved repetitions in one run;
ratios are ours / peer (below 1: ours is faster). Timings are for an idle machine.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import tempfile
import time

import numpy as np
import torch

from .common import machine_info, markdown_table

__all__ = ["neighbor_sampler_bench", "random_symmetric_graph"]


def random_symmetric_graph(n: int, nnz: int, seed: int = 0) -> torch.Tensor:
    """``edge_index (2, ~nnz)``: nnz / 2 uniform random pairs and their reverses, no self
    loops, duplicates merged."""
    gen = torch.Generator().manual_seed(seed)
    a, b = torch.randint(0, n, (nnz // 2,), generator=gen), torch.randint(0, n, (nnz // 2,), generator=gen)
    keep = a != b
    a, b = a[keep], b[keep]
    key = torch.unique(torch.cat([a * n + b, b * n + a]))
    return torch.stack([key % n, torch.div(key, n, rounding_mode="floor")])

_DGL_SCRIPT = r"""
import json, sys, time
import numpy as np, torch, dgl
d = sys.argv[1]; n = int(sys.argv[2]); reps = int(sys.argv[3]); threads = int(sys.argv[4])
fanouts = [int(f) for f in sys.argv[5].split(",")]
torch.set_num_threads(threads)
indptr = torch.from_numpy(np.load(d + "/indptr.npy")); indices = torch.from_numpy(np.load(d + "/indices.npy"))
seeds = [torch.from_numpy(s) for s in np.load(d + "/seeds.npy")]
g = dgl.graph(("csc", (indptr, indices, torch.empty(0, dtype=torch.int64))), num_nodes=n)
g.create_formats_()
def step(s):
    blocks, dst = [], s
    for k in fanouts:
        frontier = dgl.sampling.sample_neighbors(g, dst, k, replace=False)
        blk = dgl.to_block(frontier, dst)
        dst = blk.srcdata[dgl.NID]
        blocks.append(blk)
    return blocks
step(seeds[0])
times = []
for r in range(reps):
    t0 = time.perf_counter(); step(seeds[r % len(seeds)]); times.append(time.perf_counter() - t0)
print(json.dumps({"times": times, "dgl": dgl.__version__, "torch": torch.__version__}))
"""


def _median_ms(ts):
    return statistics.median(ts) * 1e3


def neighbor_sampler_bench(n: int = 10**6, nnz: int = 2 * 10**7, batch: int = 1000, fanouts=(15, 10, 5),
                           reps: int = 7, threads: int | None = None, dgl_python: str | None = None,
                           seed: int = 0) -> tuple[dict, str]:
    """Time one L-level neighbor sample of ``batch`` seeds per method (see the module doc);
    ``dgl_python=""`` skips DGL."""
    import warnings

    from scalegnn.baselines.fastsample_kernel import TopologyCSC, available, sample_blocks

    warnings.filterwarnings("ignore", message=".*pyg-lib.*")
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    threads = torch.get_num_threads()
    try:
        ei = random_symmetric_graph(n, nnz, seed)
        topo = TopologyCSC.from_edge_index(ei, n)
        del ei
        fanouts = tuple(int(f) for f in fanouts)
        gen = torch.Generator().manual_seed(seed)
        seed_sets = [torch.randperm(n, generator=gen)[:batch] for _ in range(reps + 1)]
        step = [0]

        def seeds():
            return seed_sets[step[0] % len(seed_sets)]

        methods, info = {}, {}
        if available():
            methods["fused (numba)"] = lambda: sample_blocks(topo, seeds(), fanouts, step[0], "numba")
            info["fused (numba)"] = "L CSC blocks, every level's destinations sampled"
            if threads > 1:
                name = f"fused (numba, {threads} threads)"
                methods[name] = lambda: sample_blocks(topo, seeds(), fanouts, step[0], "numba", threads=threads)
                info[name] = "the draw loop over numba's threads; the same blocks"
        methods["fused (torch path)"] = lambda: sample_blocks(topo, seeds(), fanouts, step[0], "torch")
        info["fused (torch path)"] = "the same blocks, bit for bit"
        try:
            import torch_sparse
            from torch_sparse import SparseTensor

            methods["PyG NeighborLoader sampler"] = lambda: torch.ops.torch_sparse.neighbor_sample(
                topo.indptr, topo.indices, seeds(), list(fanouts), False, True)
            info["PyG NeighborLoader sampler"] = (f"torch_sparse {torch_sparse.__version__} neighbor_sample: one "
                                                  "merged subgraph, each vertex sampled once")
            adj_t = SparseTensor(rowptr=topo.indptr, col=topo.indices, sparse_sizes=(n, n), is_sorted=True,
                                 trust_data=True)

            def sample_adj():
                nid = seeds()
                for k in fanouts:
                    _, nid = adj_t.sample_adj(nid, k, replace=False)
            methods["torch-sparse sample_adj"] = sample_adj
            info["torch-sparse sample_adj"] = "per-level bipartite adjacency (PyG's old NeighborSampler)"
        except ImportError as exc:
            info["PyG NeighborLoader sampler"] = f"not installed ({exc})"
        times = {k: [] for k in methods}
        for fn in methods.values():  # warm-up: JIT compile (or cache load), allocator
            fn()
        load_before = machine_info()["load_avg_1m"]
        for rep in range(reps):
            step[0] = rep
            for name, fn in methods.items():
                t = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t)
        dgl_name = "DGL sample_neighbors + to_block"
        from scalegnn.baselines.distdgl.harness import dgl_python as find_dgl_python

        py = None if dgl_python == "" else find_dgl_python(dgl_python, required=False)
        if py is None:
            info[dgl_name] = "not measured: no DGL environment (.venv-dgl / SCALEGNN_DGL_PYTHON)" \
                if dgl_python != "" else "skipped"
        else:
            with tempfile.TemporaryDirectory() as tmp:
                np.save(f"{tmp}/indptr.npy", topo.indptr.numpy())
                np.save(f"{tmp}/indices.npy", topo.indices.numpy())
                np.save(f"{tmp}/seeds.npy", torch.stack(seed_sets[:reps]).numpy())
                proc = subprocess.run([py, "-c", _DGL_SCRIPT, tmp, str(n), str(reps), str(threads),
                                       ",".join(map(str, fanouts))], capture_output=True, text=True, timeout=1800)
            if proc.returncode != 0:
                info[dgl_name] = f"failed: {(proc.stderr or proc.stdout).strip().splitlines()[-1:]}"
            else:
                res = json.loads(proc.stdout.strip().splitlines()[-1])
                times[dgl_name] = res["times"]
                info[dgl_name] = f"dgl {res['dgl']} / torch {res['torch']} (subprocess), message flow graphs"
    finally:
        torch.set_num_threads(before)
    med = {k: _median_ms(v) for k, v in times.items()}
    ours = [k for k in med if k.startswith("fused")]
    peers = [k for k in med if not k.startswith("fused")]
    rows = []
    for k in ours + sorted(peers, key=med.get):
        rows.append([k, med[k], min(times[k]) * 1e3] + [f"{med[o] / med[k]:.2f}" if k in peers else "-"
                                                        for o in ours] + [info.get(k, "")])
    for k, why in info.items():
        if k not in med:
            rows.append([k, "-", "-"] + ["-"] * len(ours) + [why])
    payload = {"bench": "neighbor-sampler", "n": n, "nnz": int(topo.indices.numel()), "batch": batch,
               "fanouts": list(fanouts), "reps": reps, "threads": threads, "times_s": times, "median_ms": med,
               "peer_info": info, "ratios": {o: {p: med[o] / med[p] for p in peers} for o in ours},
               "load_avg_before": load_before, "machine": machine_info(), "numba": available()}
    md = (f"L-level neighbor sampling, B = {batch:,} seeds, fanouts {','.join(map(str, fanouts))} (seeds' hop "
          f"first), generated symmetric graph N = {n:,}, nnz = {payload['nnz']:,}; {threads} torch threads; median "
          f"of {reps} interleaved repetitions (load average {load_before} -> {payload['machine']['load_avg_1m']}).\n\n")
    md += markdown_table(["method", "median ms", "min ms"] + [f"{o} / peer" for o in ours] + ["notes"], rows)
    return payload, md
