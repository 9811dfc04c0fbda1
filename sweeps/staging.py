"""Data staged once per sweep: every rank reads only its shard.

Without staging, every rank of every run loads the whole graph and cuts its own
shard out of it: on ogbn-papers100M four ranks per node each hold the full graph.
A sweep therefore shards each (dataset, grid, permutation, seed) that its runs need
once, with ``scalegnn data shard`` (one task, before the runs: a dependent job on
SLURM, the first steps of the batch script on Flux, a job of its own locally), and
every run gets ``--shard-dir`` (its rank's file only) and the data root. The seed is
part of the key because the split, and the permutation when there is one, depend on
it; the full grid is, because a shard folder is written for one grid shape.

Which runs can read shards is the trainer's business: their ``scalegnn train``
arguments are parsed by the trainer's own parser (so ``fullgraph-3d``'s implied
``--permute double`` is seen), and only ScaleGNN runs (``scalegnn``,
``fullgraph-3d``) with more than one rank are staged: the baselines and one-rank
runs load the graph as before, with the same data root and offline switch.

Layout: ``OUT/shards/<dataset>-<grid>-<permute>-s<seed>-<hash>/`` (the hash covers
the data root too). A folder is complete when its ``manifest.json`` exists
(written last by ``scalegnn data shard``); complete folders are never rewritten.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["StageSet", "StageTask", "resolve_data_root", "stage_for", "data_args", "parse_train_argv",
           "STAGED_SYSTEMS"]

STAGED_SYSTEMS = ("scalegnn", "fullgraph-3d")  # the systems whose trainer reads --shard-dir


def resolve_data_root(data_root: str | os.PathLike | None = None) -> str:
    """The data root every task of a sweep gets, as an absolute path fixed at submission:
    ``data_root``, else ``$SCALEGNN_DATA_ROOT`` of the submitting shell, else
    scalegnn's default (``~/.cache/scalegnn/data``)."""
    from scalegnn.datasets import default_data_root

    root = Path(data_root).expanduser() if data_root else default_data_root()
    return str(root.resolve())


def parse_train_argv(argv: list[str], parser=None):
    """A run's ``scalegnn train`` arguments as the trainer parses them (``fullgraph-3d``
    adjusted as ``scalegnn train`` adjusts it). A spec option the trainer rejects is
    reported here, at submission, not in a job hours later."""
    from scalegnn.cli import build_parser

    from .launcher import _train_parser

    train = parser if parser is not None else _train_parser(build_parser())
    if argv[:1] == ["train"]:
        argv = argv[1:]
    try:
        args = train.parse_args(argv)
    except SystemExit:
        from .spec import SpecError

        raise SpecError(f"`scalegnn train` rejects the run's options (see the message above): {' '.join(argv)}") \
            from None
    if args.system == "fullgraph-3d":
        from baselines.cli import adjust_fullgraph_args

        adjust_fullgraph_args(args)
    return args


@dataclass(frozen=True)
class StageSet:
    """One set of shard files: ``scalegnn data shard`` of (dataset, grid, permute, seed)."""

    dataset: str
    grid: tuple[int, int, int, int]
    permute: str
    seed: int
    data_root: str
    folder: str

    @property
    def grid_str(self) -> str:
        return "x".join(map(str, self.grid))

    @staticmethod
    def key_of(dataset: str, grid, permute: str, seed: int, data_root: str) -> str:
        from .spec import _slug

        ident = json.dumps([dataset, list(grid), permute, int(seed), data_root])
        digest = hashlib.sha1(ident.encode()).hexdigest()[:10]
        return f"{_slug(dataset, 32)}-{'x'.join(map(str, grid))}-{permute}-s{seed}-{digest}"

    def argv(self) -> list[str]:
        """``scalegnn`` arguments that write this set."""
        return ["data", "shard", self.dataset, "--grid", self.grid_str, "--out", self.folder, "--seed",
                str(self.seed), "--permute", self.permute, "--data-root", self.data_root]

    def done(self) -> bool:
        return (Path(self.folder) / "manifest.json").is_file()


def stage_for(argv: list[str], out: str | os.PathLike, data_root: str, parser=None) -> StageSet | None:
    """The shard set a run with these ``scalegnn train`` arguments reads, or None when it
    loads the graph itself (a baseline, one rank, or shards it names itself)."""
    args = parse_train_argv(argv, parser)
    if args.system not in STAGED_SYSTEMS or math.prod(args.grid) == 1 or args.shard_dir:
        return None
    root = str(Path(args.data_root).expanduser().resolve()) if args.data_root else data_root
    key = StageSet.key_of(args.dataset, args.grid, args.permute, args.seed, root)
    return StageSet(args.dataset, tuple(args.grid), args.permute, int(args.seed), root,
                    str(Path(out).resolve() / "shards" / key))


def data_args(argv: list[str], data_root: str, stage: StageSet | None) -> list[str]:
    """What a run's arguments get besides the spec's: the data root (unless the spec
    set one) and its shard folder when it is staged."""
    extra = [] if any(a == "--data-root" or a.startswith("--data-root=") for a in argv) else ["--data-root", data_root]
    return extra + (["--shard-dir", stage.folder] if stage is not None else [])


class StageTask:
    """The staging step: ``scalegnn data shard`` for one :class:`StageSet` (a submitit
    callable: one task on one node). Skips a set whose manifest exists; with
    ``offline`` no download is tried (``SCALEGNN_OFFLINE=1``)."""

    def __init__(self, stage: StageSet, offline: bool):
        self.stage, self.offline = stage, offline

    def __call__(self) -> str:
        if self.offline:
            os.environ["SCALEGNN_OFFLINE"] = "1"
        if self.stage.done():
            return self.stage.folder
        from scalegnn.cli import main

        rc = main(self.stage.argv())
        if rc != 0 or not self.stage.done():
            raise RuntimeError(f"staging failed (exit {rc}): scalegnn {' '.join(self.stage.argv())}")
        return self.stage.folder
