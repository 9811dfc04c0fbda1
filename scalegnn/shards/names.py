"""The names of a shard set's files (:mod:`.format` describes them), where no torch loads:
a launcher asks whether a set is complete without importing the training stack."""

from __future__ import annotations

from pathlib import Path

__all__ = ["MANIFEST", "BLOCKS_DIR", "NODE_ARRAYS", "shard_file_name", "has_manifest", "adjacency_file", "feature_file",
           "node_file"]

MANIFEST = "manifest.json"  # written last: a folder without it holds no complete shard set
BLOCKS_DIR = "blocks"  # the blocks layout's arrays (manifest "layout": "blocks")
NODE_ARRAYS = ("y", "train_mask", "val_mask", "test_mask")


def shard_file_name(coords: dict) -> str:
    """The files layout's file of the rank at ``coords`` ({"x", "y", "z"})."""
    return f"shard_x{coords['x']}_y{coords['y']}_z{coords['z']}.pt"


def has_manifest(folder) -> bool:
    """Whether ``folder`` holds a complete shard set (its manifest is written last)."""
    return (Path(folder) / MANIFEST).is_file()


def adjacency_file(key: tuple, part: str) -> str:
    """Relative path of array ``part`` (indptr, indices, values) of block ``key``."""
    (r0, r1), (c0, c1) = key
    return f"{BLOCKS_DIR}/A_r{r0}-{r1}_c{c0}-{c1}.{part}.npy"


def feature_file(key: tuple) -> str:
    """Relative path of the feature block ``key`` ((rows, feature columns))."""
    (r0, r1), (f0, f1) = key
    return f"{BLOCKS_DIR}/X_r{r0}-{r1}_f{f0}-{f1}.npy"


def node_file(key: str) -> str:
    """Relative path of the whole-graph vector ``key`` (labels, a split mask, ids)."""
    return f"{BLOCKS_DIR}/{key}.npy"
