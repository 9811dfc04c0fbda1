"""Command line: ``scalegnn train``, ``scalegnn export``, ``scalegnn data info|shard``,
``scalegnn demo``, ``scalegnn sweep|report|plan|tune`` (the harness: :mod:`scalegnn.sweeps.cli`).

``python -m scalegnn`` is the same program.
"""

from __future__ import annotations

import argparse
import atexit
import dataclasses
import errno
import json
import os
import signal
import sys
import typing
import warnings
from pathlib import Path

__all__ = ["main", "build_parser"]


class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose error for a flag it does not know names the closest one
    (``--hiden``: did you mean ``--hidden``?), as the Python API does for a setting."""

    def error(self, message: str) -> typing.NoReturn:
        if message.startswith("unrecognized arguments: "):
            import difflib

            known = sorted(_option_strings(self))
            for token in message[len("unrecognized arguments: "):].split():
                flag = token.split("=", 1)[0]
                close = difflib.get_close_matches(flag, known, n=1, cutoff=0.6) if flag.startswith("--") else []
                if close:
                    message += f" (did you mean {close[0]}?)"
                    break
        super().error(message)


def _option_strings(parser: argparse.ArgumentParser) -> set[str]:
    """Every flag of ``parser`` and of its subcommands' parsers."""
    out = set()
    for action in parser._actions:
        out.update(o for o in action.option_strings if o.startswith("--"))
        if isinstance(action, argparse._SubParsersAction):
            for sub in set(action.choices.values()):
                out |= _option_strings(sub)
    return out


def build_parser(system: str = "scalegnn") -> argparse.ArgumentParser:
    """The ``scalegnn`` parser; ``train`` carries the common flags and ``system``'s own
    (:func:`scalegnn.config.add_train_arguments`)."""
    from .config import add_train_arguments

    parser = _Parser(
        prog="scalegnn",
        description="ScaleGNN: mini-batch GCN training with communication-free uniform vertex sampling "
        "and 4D parallelism, plus the harness that compares it with other systems.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="train one model and write a run record",
                       description="Train one configuration and write its run record. Common settings apply to "
                       "every system; `scalegnn train --system NAME --help` lists that system's own.")
    add_train_arguments(t, system)
    from .progress import LOG_LEVELS, default_log_level

    t.add_argument("--log-level", type=str.upper, default=default_log_level(), metavar="|".join(LOG_LEVELS),
                   help="Python logging level of scalegnn's messages, e.g. the one line per epoch (rank 0) "
                   "written when stderr is not a terminal (batch jobs); default $SCALEGNN_LOG_LEVEL or INFO")

    export = sub.add_parser("export", help="consolidate a checkpoint of any grid into one model file",
                            description="Consolidate the newest complete checkpoint in CKPT_DIR (or one step-* "
                            "folder), written by any grid, into one model file that scalegnn.load_model(FILE) "
                            "reads on one process, without torch.distributed.")
    export.add_argument("ckpt_dir", metavar="CKPT_DIR", help="a --checkpoint-dir, or one step-* folder in it")
    export.add_argument("--out", required=True, metavar="FILE", help="the model file to write (e.g. model.pt)")

    demo = sub.add_parser("demo", help="offline demo: a local sweep (ScaleGNN on two grids and the compared "
                          "systems on a generated graph), then its report")
    demo.add_argument("--out", default="results/demo")
    demo.add_argument("--data-root", default=None)
    demo.add_argument("--epochs", type=int, default=None, help="override the demo sweep's epochs "
                      "(default: sweeps/specs/demo.toml)")

    from scalegnn.sweeps.cli import add_commands as add_harness_commands  # sweep, report, plan, tune

    add_harness_commands(sub)

    from scalegnn.benchmarks.cli import add_commands as add_bench_command

    add_bench_command(sub)

    d = sub.add_parser("data", help="dataset utilities")
    dsub = d.add_subparsers(dest="data_command", required=True)
    info = dsub.add_parser("info", help="print a dataset's statistics")
    info.add_argument("name")
    info.add_argument("--data-root", default=None)
    info.add_argument("--seed", type=int, default=0)
    info.add_argument("--json", action="store_true", help="print JSON instead of a table")
    dsub.add_parser("list", help="list the known dataset names")
    gen = dsub.add_parser("generate", help="write a paper-scale synthetic graph to a folder in chunks, in bounded "
                          "memory (read it back as dir:DIR); scalegnn/datasets/streaming.py")
    gen.add_argument("kind", help="csbm:n=..,avg_degree=..,classes=..,homophily=..,feature_dim=..,signal=.. or "
                     "powerlaw:n=..,avg_degree=..,exponent=..")
    gen.add_argument("--out", required=True, help="an empty or new folder")
    gen.add_argument("--seed", type=int, default=0, help="the graph's seed (edges, labels, per-vertex features)")
    gen.add_argument("--chunk-edges", type=int, default=1 << 22,
                     help="edge draws held at once (memory ~ 60 bytes each); the graph does not depend on it")
    shard = dsub.add_parser("shard", help="write per-rank adjacency/feature shards for a grid, once")
    shard.add_argument("name")
    shard.add_argument("--grid", type=_grid_arg, required=True)
    shard.add_argument("--out", required=True, help="output folder for the shard files")
    shard.add_argument("--data-root", default=None)
    shard.add_argument("--seed", type=int, default=0, help="the run's --seed (the dataset's split; the permutation)")
    shard.add_argument("--permute", choices=("none", "single", "double"), default="none",
                       help="write shards for runs with this --permute (Plexus 5.1); the run must use the same")
    from .sections.data import DataConfig

    helps = {f.name: f.metadata["help"] for f in dataclasses.fields(DataConfig)}  # as `scalegnn train` says
    shard.add_argument("--split", type=_split_arg, default=None, help=helps["split"] + "; the run must use the same")
    shard.add_argument("--split-seed", type=int, default=None, help=helps["split_seed"] + "; the run must use the same")
    shard.add_argument("--stand-in-labels", action="store_true", help=helps["stand_in_labels"])
    shard.add_argument("--memory-budget", default=None, metavar="SIZE",
                       help="stage out of core within SIZE (e.g. 4G) above the interpreter, refused before any "
                       "work when too small: the graph is read from disk in chunks, never whole (a dir: CSR folder, "
                       "one written by `scalegnn data generate`, a dir: of edge_index.npy, an npz: file, or "
                       "ogbn-papers100M from OGB's raw files; scalegnn/datasets/README.md)")
    shard.add_argument("--workers", type=int, default=1, help="with --memory-budget: processes writing rank files "
                       "(--layout files) or row ranges of blocks (--layout blocks)")
    shard.add_argument("--layout", choices=("files", "blocks"), default="files",
                       help="with --memory-budget: a file per rank (files), or each distinct block of the graph "
                       "once, read by the ranks that need it (blocks: a 4x4x4 grid stores 1/12 of the files' "
                       "adjacency bytes; --permute none or single)")
    return parser


def _split_arg(text: str) -> str:
    from .sections.data import split_flag

    try:
        return split_flag(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _grid_arg(text: str) -> tuple[int, int, int, int]:
    from .sections.parallel import grid_flag

    try:
        return grid_flag(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _cmd_train(args) -> int:
    from .config import config_from_given
    # What scalegnn.train(config=...) runs (the command line is the Python API with flags), called
    # without the API's graph and model imports, so that the run's first line comes before torch loads.
    from .launch import launch
    from .records import summary_line
    from .signals import Interrupted

    given = {k: v for k, v in vars(args).items() if k not in ("command", "log_level")}
    try:
        record = launch(config_from_given(given))
    except Interrupted as stop:  # recorded as interrupted: one line, the shell's exit status for the signal
        record = stop.run_record
        print(summary_line(record))
        print(f"record: {record['path']}")
        print(f"scalegnn: {record['error']}", file=sys.stderr)
        return stop.exit_code
    if record is None:  # a rank other than 0 of an externally launched job
        return 0
    print(summary_line(record))
    if record.get("path"):
        print(f"record: {record['path']}")
    if record.get("model_file"):
        print(f"model: {record['model_file']}")
    asked = record.get("config", {}).get("loop", {}).get("out_dir")
    if record.get("path") and asked and Path(record["path"]).parent.resolve() != Path(asked).resolve():
        return 1  # rescued to another folder (records.write_record said where, on stderr): not where it was asked
    return 0 if record["status"] == "ok" else 1


def _cmd_export(args) -> int:
    from .fileio import check_output_file
    from .trained import export_checkpoint, load_model

    # never over the checkpoint it reads, nor over a step folder of it that is a link to another place
    steps = sorted(Path(args.ckpt_dir).glob("step-*")) if Path(args.ckpt_dir).is_dir() else []
    check_output_file(args.out, "--out", inputs=(args.ckpt_dir, *(step.resolve() for step in steps)))
    path = export_checkpoint(args.ckpt_dir, args.out)
    try:
        about = load_model(path).about  # read back: the file is whole and loads
    except ValueError:  # not a model anyone could use (weights gone non-finite before that checkpoint): not kept
        path.unlink(missing_ok=True)
        raise
    print(f"wrote {path}: the model of run {about['run_id']} at step {about['step']} (epoch {about['epoch']}), "
          f"consolidated from the grid {about['grid']}")
    return 0


def _cmd_data(args) -> int:
    from . import datasets

    if args.data_command == "list":
        print("\n".join(datasets.list_datasets()))
        print("\nyour own files (--dataset <kind>:<path>; scalegnn/datasets/README.md):")
        print("\n".join(f"  {line}" for line in datasets.file_forms()))
        return 0
    if args.data_command == "generate":
        from .datasets.streaming import generate
        from .fileio import check_output_folder
        from .signals import Interrupted, stop_on_signals

        check_output_folder(args.out, "--out")
        try:
            with stop_on_signals():
                info = generate(args.kind, args.out, seed=args.seed, chunk_edges=args.chunk_edges)
        except Interrupted as stop:  # generate removed what it had written
            print(f"scalegnn: {stop}: nothing was left in {args.out}; run the command again", file=sys.stderr)
            return stop.exit_code
        print(f"wrote {info['num_nodes']:,} vertices, {info['stored_entries']:,} stored entries to {args.out}; "
              f"read it as dir:{args.out}")
        return 0
    if args.data_command == "shard":
        from .fileio import check_output_folder
        from .shards import write_shards

        check_output_folder(args.out, "--out")  # before loading: a bad --out is found in a second, not an hour
        paths = write_shards(args.name, args.grid, args.out, data_root=args.data_root, seed=args.seed,
                             permute=args.permute, split=(args.split, args.split_seed),
                             stand_in_labels=args.stand_in_labels, memory_budget=args.memory_budget,
                             workers=args.workers, layout=args.layout)
        where = " (out of core)" if args.memory_budget is not None else ""
        print(f"wrote {len(paths)} shard files to {args.out}{where}")
        return 0
    if args.data_command == "info":
        graph = datasets.load_dataset(args.name, data_root=args.data_root, seed=args.seed)
        stats = graph.stats()
        if args.json:
            print(json.dumps(stats, indent=1))
        else:
            width = max(map(len, stats))
            for key, value in stats.items():
                print(f"{key:<{width}}  {value:,}" if isinstance(value, int) and not isinstance(value, bool)
                      else f"{key:<{width}}  {value}")
        return 0
    raise AssertionError(args.data_command)


def _system_of(argv: list[str]) -> str:
    """``--system`` of a ``train`` command line (it decides which flags exist)."""
    from . import systems as registry

    if not argv or argv[0] != "train":
        return "scalegnn"
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--system", default="scalegnn")
    system = pre.parse_known_args(argv[1:])[0].system
    return system if system in registry.names(available=True) else "scalegnn"


def main(argv: list[str] | None = None) -> int:
    """Run one ``scalegnn`` command and return its exit status. ``argv`` None: this
    process's own command line (the ``scalegnn`` program, ``python -m scalegnn``), which
    then ends the process once the command's output is out (:func:`_end_process`)."""
    if argv is not None:
        return _main(list(argv))
    from .signals import defer_stops

    defer_stops()  # a stop while the command starts is acted on once it can be (a run records it)
    _end_process(_main(sys.argv[1:]))


def _end_process(code: int) -> typing.NoReturn:
    """End this process with ``code`` once the command is done: the ``atexit`` handlers run
    (logging's flush, multiprocessing's), stdout and stderr are flushed, and the
    interpreter's teardown is skipped. After a run, that teardown (freeing torch's and
    torch._dynamo's objects, module by module, with a last garbage collection) kept the
    process alive 0.7-1.2 s after its record line with nothing left to do."""
    atexit._run_exitfuncs()  # what the interpreter's own exit runs first (CPython)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed, or a pipe whose reader left
            pass
    os._exit(code)


# The errors of writing an output that the checks before the work cannot rule out (a disk
# that fills while the command runs): one line naming the file and what to do, not a traceback.
_OUTPUT_ERRORS = {errno.ENOSPC: "free space there, or pass an output on another disk, and run the command again",
                  errno.EDQUOT: "your quota there is used up: free some, or pass an output elsewhere",
                  errno.ENAMETOOLONG: "pass a shorter path", errno.EROFS: "pass an output on a writable file system",
                  errno.EACCES: "pass an output you can write to", errno.EPERM: "pass an output you can write to"}


def _one_line_warning(message, category, filename, lineno, line=None) -> str:
    """A warning as the command line shows it: one line, its message (Python's default adds
    the file, the line number and the source line that warned, which say nothing to a user)."""
    return f"scalegnn: warning: {message}\n"


def _quiet_stdout() -> None:
    """Point stdout at /dev/null: once its reader has left, the interpreter's last flush
    would raise BrokenPipeError again, as a traceback, at exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # a stdout with no descriptor (pytest's capture)
        pass


def _main(argv: list[str]) -> int:
    from .threads import prepare_process

    prepare_process()  # first: OpenMP reads its wait policy once, when torch (imported below) loads it
    from .signals import Interrupted, release_deferred

    parser = build_parser(_system_of(argv))
    args = parser.parse_args(argv)
    warnings.formatwarning = _one_line_warning
    try:
        if args.command != "train":  # only a run records a stop; any other command ends on it, in one line
            release_deferred()
        if getattr(args, "log_level", None):
            from .progress import configure_logging

            configure_logging(args.log_level)
        if args.command == "train":
            return _cmd_train(args)
        if args.command == "data":
            return _cmd_data(args)
        if args.command == "export":
            return _cmd_export(args)
        if args.command == "bench":
            from scalegnn.benchmarks.bench_command import run_bench_command

            return run_bench_command(args)
        from scalegnn.sweeps.cli import COMMANDS as HARNESS_COMMANDS

        if args.command in HARNESS_COMMANDS:
            from scalegnn.sweeps.cli import run as run_harness_command

            return run_harness_command(args)
        if args.command == "demo":
            from .demo import run_demo
            from .fileio import check_output_folder

            check_output_folder(args.out, "--out")
            return run_demo(args.out, args.data_root, args.epochs)
    except (ValueError, FileNotFoundError) as exc:  # user errors: one clear line, no traceback
        print(f"scalegnn: error: {exc}", file=sys.stderr)
        return 2
    except Interrupted as stop:  # a stop signal outside a run (a run records its own, in _cmd_train)
        print(f"scalegnn: {stop}", file=sys.stderr)
        return stop.exit_code
    except KeyboardInterrupt:  # Ctrl-C in a command that is not a run (plan, report, data shard)
        print(f"scalegnn: {Interrupted(signal.SIGINT)}", file=sys.stderr)
        return 128 + signal.SIGINT
    except BrokenPipeError:  # stdout's reader left (`scalegnn ... | head`): the work and its files are done
        _quiet_stdout()
        return 128 + 13  # as a process ended by SIGPIPE
    except OSError as exc:
        if exc.errno not in _OUTPUT_ERRORS:
            raise
        print(f"scalegnn: error: {exc.filename or 'an output'}: {exc.strerror}; {_OUTPUT_ERRORS[exc.errno]}",
              file=sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001 - an out-of-memory or a failed distributed job
        from .launch.job import WorkerError
        from .session import OutOfMemory

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
