"""Command line: ``scalegnn train``, ``scalegnn data info|shard``, ``scalegnn demo``,
``scalegnn sweep|report|plan`` (the harness: :mod:`sweeps.cli`).

``python -m scalegnn`` is the same program.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

__all__ = ["main", "build_parser"]


def _grid(text: str) -> tuple[int, int, int, int]:
    from .parallel.grid import parse_grid

    try:
        return parse_grid(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--grid must be GdxGxxGyxGz with four positive integers, e.g. 1x2x2x2; got {text!r}") from None


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
    loop.add_argument("--quiet", action="store_true",
                      help="no progress bar (the per-epoch log lines stay: --log-level WARNING drops them)")
    from .progress import LOG_LEVELS, default_log_level

    loop.add_argument("--log-level", type=str.upper, default=default_log_level(), metavar="|".join(LOG_LEVELS),
                      help="Python logging level of scalegnn's messages, e.g. the one line per epoch (rank 0) "
                      "written when stderr is not a terminal (batch jobs); default $SCALEGNN_LOG_LEVEL or INFO")
    par = t.add_argument_group("parallelism")
    par.add_argument("--grid", type=_grid, default=(1, 1, 1, 1),
                     help="4D process grid GdxGxxGyxGz (data parallel x 3D PMM)")
    par.add_argument("--shard-dir", default=None,
                     help="read this rank's graph shard from files written by `scalegnn data shard` "
                     "instead of loading the whole graph on every rank")
    par.add_argument("--nproc", type=int, default=None,
                     help="spawn this many local worker processes; without it, a multi-rank grid "
                     "expects to be started by torchrun, srun or submitit")
    par.add_argument("--device", default="auto", metavar="{auto,cpu,cuda,cuda:N}",
                     help="where to compute: auto takes the local rank's GPU when CUDA or ROCm is visible, "
                     "else the CPU")
    par.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto",
                     help="torch.distributed backend: auto follows the device (NCCL/RCCL for GPUs, gloo for CPU); "
                     "gloo with GPUs lets several ranks share one GPU (tests)")
    from . import systems as registry

    t.add_argument("--system", default="scalegnn", choices=registry.names(available=True),
                   help="which system trains: scalegnn, fullgraph-3d (batch ratio 1.0, Plexus) or a compared "
                   "system from baselines/ (same dataset split, same run record)")
    from baselines.cli import add_baseline_arguments

    add_baseline_arguments(t)
    rel = t.add_argument_group("checkpointing and failures")
    rel.add_argument("--checkpoint-every", default=None, metavar="K",
                     help="save a checkpoint every K steps (e.g. 500) or every period (e.g. 30m, 90s, 2h)")
    rel.add_argument("--checkpoint-dir", default=None,
                     help="folder for this run's checkpoints (one per run; shared storage on multi-node jobs)")
    rel.add_argument("--resume", action="store_true",
                     help="continue from the newest complete checkpoint in --checkpoint-dir; starts from "
                     "scratch when there is none, so a requeued job can always pass it")
    rel.add_argument("--keep-checkpoints", type=int, default=2, help="complete checkpoints kept on disk")
    rel.add_argument("--collective-timeout", type=float, default=None, metavar="SECONDS",
                     help="a collective that waits longer (a rank died or hangs) fails the run "
                     "(default: scalegnn.train.DEFAULT_COLLECTIVE_TIMEOUT_S, 10 minutes)")
    perf = t.add_argument_group("performance (paper V; each switch leaves the trained result unchanged, "
                                "bf16 up to its rounding)")
    perf.add_argument("--prefetch", action=argparse.BooleanOptionalAction, default=False,
                      help="sample step t+1 while step t trains (background thread; CUDA side stream on GPU)")
    perf.add_argument("--comm-dtype", choices=("fp32", "bf16"), default="fp32",
                      help="wire dtype of the 3D-PMM partial-sum all-reduces (RMSNorm/loss stay fp32)")
    perf.add_argument("--compile", action="store_true",
                      help="fuse RMSNorm + ReLU + dropout with torch.compile (compile time recorded apart)")
    perf.add_argument("--comm-overlap", action="store_true",
                      help="asynchronous gradient all-reduces in backward, overlapped with the weight-gradient GEMM")
    perf.add_argument("--profile", default=None, metavar="DIR",
                      help="write a torch.profiler trace of a few training steps per rank to DIR")
    perf.add_argument("--permute", choices=("none", "single", "double"), default="none",
                      help="vertex permutation for shard load balance (Plexus 5.1); double needs --no-residual")
    perf.add_argument("--sampler", choices=("auto", "torch", "numba"), default="auto",
                      help="Algorithm 2 kernel: numba on CPU when installed (auto), else vectorized torch")

    demo = sub.add_parser("demo", help="offline demo: a local sweep (ScaleGNN on two grids and the compared "
                          "systems on a generated graph), then its report")
    demo.add_argument("--out", default="results/demo")
    demo.add_argument("--data-root", default=None)
    demo.add_argument("--epochs", type=int, default=None, help="override the demo sweep's epochs "
                      "(default: sweeps/specs/demo.toml)")

    from sweeps.cli import add_commands as add_harness_commands  # sweep, report, plan

    add_harness_commands(sub)

    from benchmarks.peers import add_bench_command

    add_bench_command(sub)

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
    shard.add_argument("--seed", type=int, default=0, help="the run's --seed (the dataset's split; the permutation)")
    shard.add_argument("--permute", choices=("none", "single", "double"), default="none",
                       help="write shards for runs with this --permute (Plexus 5.1); the run must use the same")
    return parser


def _run_config(args):
    from .checkpoint import CheckpointConfig
    from .engine import OptimConfig
    from .model import ModelConfig
    from .perf import PerfConfig
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
        checkpoint=CheckpointConfig(dir=args.checkpoint_dir, every=args.checkpoint_every, resume=args.resume,
                                    keep=args.keep_checkpoints),
        **({} if args.collective_timeout is None else {"collective_timeout_s": args.collective_timeout}),
        device=args.device, backend=args.backend,
        perf=PerfConfig(prefetch=args.prefetch, comm_dtype=args.comm_dtype, compile=args.compile,
                        comm_overlap=args.comm_overlap, profile=args.profile, permute=args.permute,
                        sampler=args.sampler),
    )


def _cmd_train(args) -> int:
    from .train import run_training, summary_line

    if args.system not in ("scalegnn", "fullgraph-3d"):  # a compared system: baselines/
        from baselines.cli import run_system

        record = run_system(args)
        if record is None:  # a rank other than 0 of an externally launched job
            return 0
        print(summary_line(record))
        if record.get("path"):
            print(f"record: {record['path']}")
        return 0 if record["status"] == "ok" else 1
    if args.system == "fullgraph-3d":
        from baselines.cli import adjust_fullgraph_args

        adjust_fullgraph_args(args)
    cfg = _run_config(args)
    launched = any(k in os.environ for k in ("TORCHELASTIC_RUN_ID", "SLURM_PROCID", "SUBMITIT_EXECUTOR")) and \
        int(os.environ.get("WORLD_SIZE", os.environ.get("SLURM_NTASKS", "1"))) > 1
    if args.nproc is not None or launched or cfg.world_size > 1:
        from .run import run_distributed_training

        record = run_distributed_training(cfg, nproc=args.nproc)
    else:
        try:
            record = run_training(cfg)
        except MemoryError as exc:  # while loading the data or building the model
            from .train import out_of_memory

            raise out_of_memory(exc, cfg, 0, "setup (loading the data, building the model)") from exc
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

        paths = shard_command(graph, args.grid, args.out, permute=args.permute, seed=args.seed)
        print(f"wrote {len(paths)} shard files to {args.out}")
        return 0
    raise AssertionError(args.data_command)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if getattr(args, "log_level", None):
            from .progress import configure_logging

            configure_logging(args.log_level)
        if args.command == "train":
            return _cmd_train(args)
        if args.command == "data":
            return _cmd_data(args)
        if args.command == "bench":
            from benchmarks.peers import run_bench_command

            return run_bench_command(args)
        if args.command in ("sweep", "report", "plan"):
            from sweeps.cli import run as run_harness_command

            return run_harness_command(args)
        if args.command == "demo":
            from .demo import run_demo

            return run_demo(args.out, args.data_root, args.epochs)
    except (ValueError, FileNotFoundError) as exc:  # user errors: one clear line, no traceback
        print(f"scalegnn: error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - an out-of-memory or a failed distributed job
        from .parallel.launch import WorkerError
        from .train import OutOfMemory

        if not isinstance(exc, (OutOfMemory, WorkerError)):
            raise
        print(f"scalegnn: error: {exc}", file=sys.stderr)
        if getattr(exc, "record_path", None):
            print(f"record: {exc.record_path}")
        return 1
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
