"""The ``data`` section: where a run's graph comes from (read by :mod:`scalegnn.datasets`),
and the ``--split`` flag's parser."""

from __future__ import annotations

from dataclasses import dataclass

from ..settings import setting

__all__ = ["DataConfig", "SPLIT_FRACTIONS", "SPLIT_HELP", "split_flag", "split_fractions"]

SPLIT_FRACTIONS = (0.5, 0.25, 0.25)  # train/val/test of a graph without a split of its own

SPLIT_HELP = ("random:TRAIN,VAL,TEST, fractions > 0 of the labeled vertices summing to at most 1, "
              "e.g. random:0.5,0.25,0.25")


def split_fractions(text: str) -> tuple[float, float, float]:
    """The three fractions of a ``--split`` text (``random`` alone: :data:`SPLIT_FRACTIONS`)."""
    kind, _, rest = str(text).strip().partition(":")
    if kind.strip().lower() != "random":
        raise ValueError(f"--split must be {SPLIT_HELP}; got {text!r} (the only kind is 'random')")
    if not rest.strip():
        return SPLIT_FRACTIONS
    parts = [p.strip() for p in rest.split(",")]
    try:
        fractions = tuple(float(p) for p in parts)
    except ValueError:
        raise ValueError(f"--split must be {SPLIT_HELP}; got {text!r} (not three numbers)") from None
    if len(fractions) != 3:
        raise ValueError(f"--split must be {SPLIT_HELP}; got {text!r} ({len(fractions)} fractions, not 3)")
    if not all(0.0 < f <= 1.0 for f in fractions):
        raise ValueError(f"--split must be {SPLIT_HELP}; got {text!r} (every fraction must be in (0, 1]: "
                         "each split needs vertices)")
    if sum(fractions) > 1 + 1e-9:
        raise ValueError(f"--split must be {SPLIT_HELP}; got {text!r} (they sum to {sum(fractions):g} > 1: "
                         "a vertex would be in two splits)")
    return fractions


def split_flag(text) -> str:
    """``--split``'s parse function: the canonical ``random:TRAIN,VAL,TEST`` of ``text``
    (``random`` alone is ``random:0.5,0.25,0.25``); a ValueError naming the fix for a
    malformed kind, count, range or sum."""
    return "random:" + ",".join(repr(float(f)) for f in split_fractions(text))  # repr: exact when re-parsed


@dataclass(kw_only=True)
class DataConfig:
    """Where a run's graph comes from: a dataset name (``list_datasets``; generator
    parameters in the name), the folder holding dataset files, the train/val/test
    split when it is not the dataset's own, and, for ScaleGNN, per-rank shard files
    written once by ``scalegnn data shard``."""

    dataset: str = setting("csbm", required=True, help="dataset name (see `scalegnn data list`), e.g. facebook, "
                           "twitch-de, cora, ogbn-products, csbm:n=100000,avg_degree=20, rmat:scale=18, "
                           "npz:/path/graph.npz")
    data_root: str | None = setting(None, help="folder holding dataset files (default: $SCALEGNN_DATA_ROOT or "
                                    "~/.cache/scalegnn/data)")
    split: str | None = setting(None, type=split_flag,
                                help="the train/val/test split, replacing the dataset's own: random:TRAIN,VAL,TEST "
                                "fractions of the labeled vertices (> 0, sum <= 1), e.g. random:0.6,0.2,0.2 (default: "
                                "the dataset's split; a file without one gets random:0.5,0.25,0.25)")
    # rare: --seed already seeds the split; a split apart from the weights is a study of its own
    split_seed: int | None = setting(None, rare=True, help="seed of the --split draw (default: --seed)")
    # rare: the featureless protocol for a user's file is a deliberate choice, never a default
    stand_in_labels: bool = setting(False, rare=True,
                                    help="train a graph file (edgelist:, mtx:) that has no labels file beside it on "
                                    "32 balanced degree classes, the featureless protocol of the papers' unlabeled "
                                    "graphs (without this flag a missing labels file is an error)")
    # rare: a sweep stages the shards and passes this itself; by hand, only after `scalegnn data shard`
    shard_dir: str | None = setting(None, scope="scalegnn", rare=True,
                                    help="read this rank's graph shard from files written by `scalegnn data shard` "
                                    "instead of loading the whole graph on every rank")

    def __post_init__(self):
        if not isinstance(self.dataset, str) or not self.dataset.strip():
            raise ValueError(f"--dataset must name a dataset (see `scalegnn data list`), got {self.dataset!r}")
        if self.split is not None:
            self.split = split_flag(self.split)  # checked and canonical, also when set from Python
        if self.split_seed is not None:
            if self.split is None:
                raise ValueError("--split-seed needs --split: it seeds that draw, e.g. --split random:0.5,0.25,0.25 "
                                 f"--split-seed {self.split_seed}")
            if self.split_seed < 0:
                raise ValueError(f"--split-seed must be >= 0, got {self.split_seed}")
