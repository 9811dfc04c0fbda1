"""The parser of ``scalegnn bench`` (:mod:`scalegnn.benchmarks.bench_command` lists the
benchmarks): standard library only, so that ``scalegnn --help`` loads no torch; a
benchmark's modules load when it runs (:func:`scalegnn.benchmarks.bench_command.run_bench_command`).
"""

from __future__ import annotations

__all__ = ["add_commands"]


def add_commands(sub) -> None:
    """Add ``scalegnn bench`` and its subcommands to ``sub`` (the ``scalegnn`` subparsers)."""
    b = sub.add_parser("bench", help="benchmarks: sampler vs peers, permutation load balance, Fig. 5 ablation, "
                       "scaling; each writes JSON and a Markdown table")
    b.add_argument("--out", default="results/bench", help="folder for <name>.json and <name>.md")
    bs = b.add_subparsers(dest="bench_command", required=True)
    s = bs.add_parser("sampler", help="Algorithm 2 step vs PyG, torch-sparse, GraphSAINT, DGL (same graph, same run)")
    s.add_argument("--nodes", type=float, default=1e6)
    s.add_argument("--nnz", type=float, default=2e7)
    s.add_argument("--batch", type=float, default=1e5)
    s.add_argument("--reps", type=int, default=5)
    s.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's default)")
    s.add_argument("--dgl-python", default=None, help="python of the DGL environment (default .venv-dgl/bin/python)")
    s.add_argument("--peers", default="pyg_subgraph,saint_subgraph,graphsaint,dgl")
    ns = bs.add_parser("neighbor-sampler", help="FastSample's fused L-level neighbor sampler vs PyG NeighborLoader's, "
                       "torch-sparse sample_adj, DGL (benchmarks/fastsample.py)")
    ns.add_argument("--nodes", type=float, default=1e6)
    ns.add_argument("--nnz", type=float, default=2e7)
    ns.add_argument("--batch", type=int, default=1000)
    ns.add_argument("--fanouts", default="15,10,5")
    ns.add_argument("--reps", type=int, default=7)
    ns.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's default)")
    ns.add_argument("--dgl-python", default=None, help="python of the DGL environment (default .venv-dgl/bin/python)")
    p = bs.add_parser("permutation", help="max/mean nonzeros over 8x8 shards: original, single, double permutation")
    p.add_argument("--data-root", default=None)
    p.add_argument("--scale", type=int, default=18, help="R-MAT scale of the generated power-law graph")
    p.add_argument("--parts", type=int, default=8)
    p.add_argument("--datasets", default="power-law,facebook")
    a = bs.add_parser("ablation", help="cumulative paper-V switches on a gloo grid (Fig. 5)")
    a.add_argument("--grid", default="1x2x2x2")
    a.add_argument("--dataset", default="csbm:n=20000,avg_degree=10,feature_dim=64")
    a.add_argument("--data-root", default=None)
    a.add_argument("--batch-ratio", type=float, default=0.1)
    a.add_argument("--hidden", type=int, default=64)
    a.add_argument("--layers", type=int, default=3)
    a.add_argument("--steps", type=int, default=8)
    a.add_argument("--warmup", type=int, default=2)
    a.add_argument("--compile-backend", default="inductor")
    st = bs.add_parser("steps", help="one training step per grid (plain configuration)")
    st.add_argument("--grids", default="1x1x1x2,1x2x1x1,1x2x2x2,2x2x2x2")
    st.add_argument("--dataset", default="csbm:n=20000,avg_degree=10,feature_dim=64")
    st.add_argument("--data-root", default=None)
    st.add_argument("--steps", type=int, default=8)
    e = bs.add_parser("epoch-cost", help="a training epoch on one thread in units of a fixed reference workload, "
                      "with its profile (benchmarks/epoch_cost.py)")
    e.add_argument("--dataset", default="facebook")
    e.add_argument("--data-root", default=None)
    e.add_argument("--reps", type=int, default=7)
    e.add_argument("--gemm-dtype", default="fp32", choices=("fp32", "bf16"),
                   help="operand dtype of the dense GEMMs (scalegnn train --gemm-dtype)")
    e.add_argument("--compile", action="store_true",
                   help="the compiled phases of scalegnn train --compile instead of the numba kernels")
    c = bs.add_parser("scaling", help="step time vs nnz at a fixed batch ratio (log-log slope)")
    c.add_argument("--nnz", default="1e6,4e6,1.6e7")
    c.add_argument("--reps", type=int, default=7)
    c.add_argument("--batch-ratio", type=float, default=0.1)
    c.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's default)")
    co = bs.add_parser("collectives", help="all-reduce and all-gather times by size on this machine's ranks: the "
                       "latency and bus bandwidth of the planner's [network] constants (benchmarks/collectives.py)")
    co.add_argument("--nproc", type=int, default=2, help="local ranks to start (ignored under a launcher: the job's)")
    co.add_argument("--backend", default=None, help="gloo, nccl (default: nccl on GPUs, else gloo)")
    co.add_argument("--sizes", default="4K,64K,1M,16M", help="message sizes in bytes per rank (K, M, G suffixes)")
    co.add_argument("--reps", type=int, default=10)
    co.add_argument("--profile", default=None, help="a cluster profile to compare the measured constants with")
    k = bs.add_parser("kernels", help="GEMM, SpMM and memory-bandwidth throughput on this device: the planner's "
                      "[compute] constants (benchmarks/kernels.py)")
    k.add_argument("--device", default=None, help="cpu, cuda (default: cuda when there is one)")
    k.add_argument("--batch", type=float, default=2.4e5, help="rows of the GEMM and SpMM operands (B)")
    k.add_argument("--hidden", type=int, default=256)
    k.add_argument("--nnz", type=float, default=None, help="entries of the SpMM's sparse matrix (default 30 B)")
    k.add_argument("--reps", type=int, default=10)
    k.add_argument("--profile", default=None, help="a cluster profile to compare the measured constants with")
    from .thread_policy import add_arguments as add_thread_arguments

    add_thread_arguments(bs.add_parser("threads", help="thread policies (torch's default, one, auto) of runs side "
                                       "by side under a competing load (benchmarks/thread_policy.py)"))
