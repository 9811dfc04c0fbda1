"""``scalegnn train --system NAME``: the baselines' flags and their dispatch.

``scalegnn.cli`` owns the common flags (dataset, loop, model size, lr, --nproc);
this module adds one argument group for the baseline-specific ones and turns the
parsed arguments into each adapter's config. Every adapter takes the common flags
(--dataset --data-root --epochs --eval-every --target-acc --stop-at-target --seed
--out --nproc --lr --hidden --layers --dropout).
"""

from __future__ import annotations

import argparse

from scalegnn.parallel.grid import cube_3d

from scalegnn import systems as registry

from .common import CommonConfig, parse_ints

__all__ = ["add_baseline_arguments", "run_system", "adjust_fullgraph_args", "world_of"]


def add_baseline_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group(
        "compared systems (with --system; --batch-size is the seeds per step of graphsage/salient/distdgl)")
    g.add_argument("--fanouts", default=None, help="neighbor-sampling fanouts, seeds' hop first "
                   "(graphsage/salient: 15,10,5; distdgl: 10,25)")
    g.add_argument("--eval-fanouts", default=None, help="fanouts of sampled evaluation (default 20,20,20; "
                   "distdgl: its training fanouts)")
    g.add_argument("--eval-batch-size", type=int, default=4096, help="seeds per batch of sampled evaluation")
    g.add_argument("--conv", choices=("sage", "gcn"), default="sage", help="graphsage: SAGEConv or GCNConv")
    g.add_argument("--eval-mode", choices=("sampled", "layerwise"), default="sampled",
                   help="graphsage: neighbor-sampled evaluation, or exact full-graph layer-wise inference")
    g.add_argument("--node-budget", type=int, default=None,
                   help="graphsaint: edges drawn per subgraph (PyG's node budget); default min(8000, N/10)")
    g.add_argument("--sample-coverage", type=int, default=50,
                   help="graphsaint: pre-sampled vertices per vertex for the normalization statistics")
    g.add_argument("--saint-steps", type=int, default=None,
                   help="graphsaint: subgraphs per epoch in all (default ceil(N / node budget))")
    g.add_argument("--saint-norm", choices=("exact", "sampled", "none"), default="exact",
                   help="graphsaint: normalization probabilities in closed form (exact), estimated from "
                   "pre-sampled subgraphs as PyG does (sampled), or none")
    g.add_argument("--no-saint-norm", action="store_true", help="graphsaint: same as --saint-norm none")
    g.add_argument("--partition", choices=("metis", "random"), default="metis",
                   help="salient / bns-gcn / distdgl: vertex partitioning")
    g.add_argument("--cache-budget", type=float, default=0.1,
                   help="salient: cached remote feature rows per rank, as a fraction of N")
    g.add_argument("--cache-warmup-epochs", type=int, default=1,
                   help="salient: epochs of simulated sampling that rank vertices for the cache")
    g.add_argument("--sampler-threads", type=int, default=2, help="salient: neighbor-sampling threads")
    g.add_argument("--salient-prefetch", type=int, default=4, help="salient: prepared batches queued ahead")
    g.add_argument("--boundary-rate", type=float, default=0.1,
                   help="bns-gcn: boundary-vertex sampling rate p (1.0 = vanilla partition parallelism)")
    g.add_argument("--dgl-parts", type=int, default=None,
                   help="distdgl: graph partitions = simulated machines (default: --nproc)")
    g.add_argument("--no-balance-train", action="store_true", help="distdgl: partition without balance_train")
    g.add_argument("--no-balance-edges", action="store_true", help="distdgl: partition without balance_edges")
    g.add_argument("--dgl-timeout", type=float, default=1800.0,
                   help="distdgl: seconds before the whole DistDGL job is killed")
    g.add_argument("--dgl-python", default=None, help="distdgl: python of the DGL environment "
                   "(default: $SCALEGNN_DGL_PYTHON or .venv-dgl/bin/python; `make dgl-env` builds it)")


def world_of(args) -> int:
    """Processes of a baseline run: --nproc, else Gd of a pure data-parallel --grid."""
    grid = tuple(getattr(args, "grid", None) or (1, 1, 1, 1))
    if grid[1] * grid[2] * grid[3] != 1:
        raise ValueError(f"--system {args.system} is data parallel only: use --grid Gx1x1x1 or --nproc N, "
                         f"got --grid {'x'.join(map(str, grid))}")
    if args.nproc is not None and grid[0] != 1 and args.nproc != grid[0]:
        raise ValueError(f"--nproc {args.nproc} does not match --grid {'x'.join(map(str, grid))}")
    return args.nproc if args.nproc is not None else grid[0]


def adjust_fullgraph_args(args) -> None:
    """``fullgraph-3d`` is ScaleGNN with batch ratio 1.0 (Plexus) and double permutation
    (``--permute double``, residual off) where this scalegnn has it; ``--nproc N`` alone
    picks a 3D grid of N ranks."""
    if args.batch_size is not None:
        raise ValueError("--system fullgraph-3d trains on the whole graph: drop --batch-size")
    args.batch_ratio = 1.0
    if hasattr(args, "permute") and getattr(args, "permute", None) in (None, "none"):
        # Plexus' double permutation; scalegnn's double permutation needs the residual off
        # (the layer input and output live in different permutations), which is also Plexus'
        # plain GCN. `--system scalegnn --batch-ratio 1.0` is full-graph training without either.
        args.permute = "double"
        args.no_residual = True
    if args.nproc is not None and tuple(args.grid) == (1, 1, 1, 1) and args.nproc > 1:
        args.grid = (1, *cube_3d(args.nproc))


def common_config(args, world: int) -> CommonConfig:
    return CommonConfig(
        system=args.system, dataset=args.dataset, data_root=args.data_root, epochs=args.epochs,
        eval_every=args.eval_every, target_acc=args.target_acc, stop_at_target=args.stop_at_target,
        seed=args.seed, out_dir=args.out, nproc=world, lr=args.lr, weight_decay=args.weight_decay,
        hidden=args.hidden, layers=args.layers, dropout=args.dropout, progress=False,
        device=getattr(args, "device", "auto"), backend=getattr(args, "backend", "auto"),
    )


def run_system(args) -> dict:
    """Build the adapter's config from ``scalegnn train`` arguments, run it, return the record."""
    world = world_of(args)
    cfg = common_config(args, world)
    name = args.system
    if name == "graphsage":
        from . import graphsage

        opts = graphsage.GraphSAGEOptions(
            conv=args.conv, fanouts=parse_ints(args.fanouts) if args.fanouts else None,
            batch_size=args.batch_size or 1024, eval_mode=args.eval_mode,
            eval_fanouts=parse_ints(args.eval_fanouts) if args.eval_fanouts else None,
            eval_batch_size=args.eval_batch_size)
        return graphsage.run(cfg, opts)
    if name == "graphsaint":
        from . import graphsaint

        opts = graphsaint.GraphSAINTOptions(node_budget=args.batch_size or args.node_budget,
                                            sample_coverage=args.sample_coverage, steps_per_epoch=args.saint_steps,
                                            normalization="none" if args.no_saint_norm else args.saint_norm)
        return graphsaint.run(cfg, opts)
    if name == "salient":
        from . import salient

        opts = salient.SalientOptions(
            fanouts=parse_ints(args.fanouts) if args.fanouts else None, batch_size=args.batch_size or 1024,
            eval_fanouts=parse_ints(args.eval_fanouts) if args.eval_fanouts else None,
            eval_batch_size=args.eval_batch_size, partition=args.partition, cache_budget=args.cache_budget,
            cache_warmup_epochs=args.cache_warmup_epochs, sampler_threads=args.sampler_threads,
            prefetch=args.salient_prefetch)
        return salient.run(cfg, opts)
    if name == "bns-gcn":
        from . import bns_gcn

        opts = bns_gcn.BNSOptions(boundary_rate=args.boundary_rate, partition=args.partition)
        return bns_gcn.run(cfg, opts)
    if name == "distdgl":
        from .distdgl import harness

        opts = harness.DistDGLOptions(
            fanouts=parse_ints(args.fanouts) if args.fanouts else (10, 25),
            eval_fanouts=parse_ints(args.eval_fanouts) if args.eval_fanouts else None,
            batch_size=args.batch_size or 1000, eval_batch_size=args.eval_batch_size,
            num_parts=args.dgl_parts or world, partition=args.partition,
            balance_train=not args.no_balance_train, balance_edges=not args.no_balance_edges,
            timeout_s=args.dgl_timeout, python=args.dgl_python)
        return harness.run(cfg, opts)
    raise ValueError(f"--system {name} is not a baseline adapter (choose one of {', '.join(registry.names(True))})")
