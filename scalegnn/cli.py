"""Command line: ``scalegnn train``, ``scalegnn data info|shard``, ``scalegnn demo``.

``python -m scalegnn`` is the same program.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

__all__ = ["main", "build_parser"]


def _grid(text: str) -> tuple[int, int, int, int]:
    parts = text.lower().split("x")
    if len(parts) != 4 or not all(p.isdigit() and int(p) >= 1 for p in parts):
        raise argparse.ArgumentTypeError(
            f"--grid must be GdxGxxGyxGz with four positive integers, e.g. 1x2x2x2; got {text!r}"
        )
    return tuple(int(p) for p in parts)


def _fraction(text: str) -> float:
    value = float(text)
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a fraction in (0, 1], got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="scalegnn",
        description="ScaleGNN: mini-batch GCN training with communication-free uniform vertex sampling "
        "and 4D parallelism, plus the harness that compares it with other systems.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="train one model and write a run record",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    data = t.add_argument_group("data")
    data.add_argument("--dataset", required=True,
                      help="dataset name (see `scalegnn data list`), e.g. facebook, twitch-de, cora, "
                      "ogbn-products, csbm:n=100000,avg_degree=20, rmat:scale=18, npz:/path/graph.npz")
    data.add_argument("--data-root", default=None,
                      help="folder holding dataset files (default: $SCALEGNN_DATA_ROOT or ~/.cache/scalegnn/data)")
    batch = t.add_mutually_exclusive_group()
    batch.add_argument("--batch-size", type=int, default=None, help="sampled vertices per step B (a count)")
    batch.add_argument("--batch-ratio", type=_fraction, default=None,
                       help="B as a fraction of N (default 0.1); 1.0 is full-graph training (fullgraph-3d)")
    model = t.add_argument_group("model")
    model.add_argument("--layers", type=int, default=3, help="GCN layers L")
    model.add_argument("--hidden", type=int, default=256, help="hidden dimension d_h")
    model.add_argument("--dropout", type=float, default=0.5, help="dropout probability")
    model.add_argument("--no-norm", action="store_true", help="disable RMSNorm")
    model.add_argument("--no-residual", action="store_true", help="disable residual connections")
    opt = t.add_argument_group("optimization")
    opt.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate")
    opt.add_argument("--weight-decay", type=float, default=0.0, help="AdamW weight decay")
    opt.add_argument("--schedule", choices=("constant", "cosine"), default="constant", help="learning-rate schedule")
    opt.add_argument("--grad-clip", type=float, default=None, help="clip the global gradient L2 norm to this value")
    loop = t.add_argument_group("loop")
    loop.add_argument("--epochs", type=int, default=100, help="training epochs (ceil(N/B)/Gd steps each)")
    loop.add_argument("--eval-every", type=int, default=1, help="full-graph evaluation every K epochs")
    loop.add_argument("--target-acc", type=_fraction, default=None,
                      help="target test accuracy for time-to-accuracy (fraction, e.g. 0.92)")
    loop.add_argument("--stop-at-target", action="store_true", help="stop once --target-acc is reached")
    loop.add_argument("--seed", type=int, default=0, help="seed for the split, the weights and the samples")
    loop.add_argument("--out", default="results/runs", help="folder for the run record")
    loop.add_argument("--quiet", action="store_true", help="no progress bar")
    par = t.add_argument_group("parallelism")
    par.add_argument("--grid", type=_grid, default=(1, 1, 1, 1),
                     help="4D process grid GdxGxxGyxGz (data parallel x 3D PMM)")
    par.add_argument("--shard-dir", default=None,
                     help="read this rank's graph shard from files written by `scalegnn data shard` "
                     "instead of loading the whole graph on every rank")
    par.add_argument("--nproc", type=int, default=None,
                     help="spawn this many local worker processes (gloo); without it, a multi-rank grid "
                     "expects to be started by torchrun, srun or submitit")

    demo = sub.add_parser("demo", help="offline demo: train on a generated graph, write records, compare")
    demo.add_argument("--out", default="results/demo")
    demo.add_argument("--data-root", default=None)
    demo.add_argument("--epochs", type=int, default=30)

    d = sub.add_parser("data", help="dataset utilities")
    dsub = d.add_subparsers(dest="data_command", required=True)
    info = dsub.add_parser("info", help="print a dataset's statistics")
    info.add_argument("name")
    info.add_argument("--data-root", default=None)
    info.add_argument("--seed", type=int, default=0)
    info.add_argument("--json", action="store_true", help="print JSON instead of a table")
    dsub.add_parser("list", help="list the known dataset names")
    shard = dsub.add_parser("shard", help="write per-rank adjacency/feature shards for a grid, once")
    shard.add_argument("name")
    shard.add_argument("--grid", type=_grid, required=True)
    shard.add_argument("--out", required=True, help="output folder for the shard files")
    shard.add_argument("--data-root", default=None)
    shard.add_argument("--seed", type=int, default=0)
    return parser


def _run_config(args):
    from .engine import OptimConfig
    from .model import ModelConfig
    from .train import RunConfig

    ratio = args.batch_ratio if args.batch_ratio is not None else (None if args.batch_size else 0.1)
    return RunConfig(
        dataset=args.dataset, data_root=args.data_root, batch_size=args.batch_size, batch_ratio=ratio,
        epochs=args.epochs, eval_every=args.eval_every, target_acc=args.target_acc,
        stop_at_target=args.stop_at_target, seed=args.seed, grid=args.grid, out_dir=args.out,
        shard_dir=args.shard_dir,
        progress=False if args.quiet else None,
        model=ModelConfig(hidden=args.hidden, layers=args.layers, dropout=args.dropout,
                          norm=not args.no_norm, residual=not args.no_residual),
        optim=OptimConfig(lr=args.lr, weight_decay=args.weight_decay, schedule=args.schedule,
                          grad_clip=args.grad_clip),
    )


def _cmd_train(args) -> int:
    from .train import run_training, summary_line

    cfg = _run_config(args)
    launched = any(k in os.environ for k in ("TORCHELASTIC_RUN_ID", "SLURM_PROCID", "SUBMITIT_EXECUTOR")) and \
        int(os.environ.get("WORLD_SIZE", os.environ.get("SLURM_NTASKS", "1"))) > 1
    if args.nproc is not None or launched or cfg.world_size > 1:
        from .parallel.launch import run_distributed_training

        record = run_distributed_training(cfg, nproc=args.nproc)
    else:
        record = run_training(cfg)
    if record is not None:  # None on ranks other than 0 of an externally launched job
        print(summary_line(record))
        if record.get("path"):
            print(f"record: {record['path']}")
        return 0 if record["status"] == "ok" else 1
    return 0


def _cmd_data(args) -> int:
    from . import datasets

    if args.data_command == "list":
        print("\n".join(datasets.list_datasets()))
        return 0
    graph = datasets.load_dataset(args.name, data_root=args.data_root, seed=args.seed)
    if args.data_command == "info":
        stats = graph.stats()
        if args.json:
            print(json.dumps(stats, indent=1))
        else:
            width = max(map(len, stats))
            for key, value in stats.items():
                print(f"{key:<{width}}  {value:,}" if isinstance(value, int) and not isinstance(value, bool)
                      else f"{key:<{width}}  {value}")
        return 0
    if args.data_command == "shard":
        from .parallel.sharding import shard_command

        paths = shard_command(graph.gcn_normalize(), args.grid, args.out)
        print(f"wrote {len(paths)} shard files to {args.out}")
        return 0
    raise AssertionError(args.data_command)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "train":
            return _cmd_train(args)
        if args.command == "data":
            return _cmd_data(args)
        if args.command == "demo":
            from .demo import run_demo

            return run_demo(args.out, args.data_root, args.epochs)
    except (ValueError, FileNotFoundError) as exc:  # user errors: one clear line, no traceback
        print(f"scalegnn: error: {exc}", file=sys.stderr)
        return 2
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
