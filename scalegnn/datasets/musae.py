"""MUSAE social graphs (Rozemberczki et al.): Facebook page-page and Twitch users.

Facebook (folder ``facebook_pagepage``, also ``facebook`` or ``facebook_large``):
``edges.csv`` (header ``id_1,id_2``), ``features.json`` (vertex id -> list of
active feature ids) and ``new_target.csv`` (``id,target``). If ``new_target.csv``
is absent, ``target.csv`` / ``musae_facebook_target.csv`` (``page_type``
column) is mapped with the same coding: company 0, tvshow 1, politician 2,
government 3. Features: multi-hot, width max feature id + 1 (4,714), built as CSR
(0.3 % ones; Twitch's 0.6 %): the dense matrix is never made. No official
split: seeded random 50/25/25 from ``seed``.

Twitch (folder ``twitch_musae/<C>`` or ``twitch/<C>``, C in DE ENGB ES FR PT RU):
``musae_<C>_edges.csv`` (``from,to``), ``musae_<C>_features.json`` (ids < 3,170)
and ``musae_<C>_target.csv``. Vertex i is the row with ``new_id == i`` (the first
one: FR repeats rows, as LINKX handles it); label = ``mature`` (0/1). Split: for DE,
LINKX split K (``twitch-de:split=K``, K in 0..4, default 0) from
``twitch_musae/linkx_splits/twitch-e-DE-splits.npy`` when that file exists, else a
seeded random 50/25/25; other countries always use the seeded random split. LINKX
pickled that file (an object array of dicts of int lists); it is read by a restricted
unpickler that admits only numpy's array types (:mod:`scalegnn.datasets.safe_pickle`).

Edges are undirected: stored in both directions, duplicates and self loops dropped
(Facebook's ``edges.csv`` has 179 self loops among its 171,002 rows).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from scalegnn.graph import random_split

from ._core import (SPLIT_FRACTIONS, DatasetError, find_dir, make_graph, missing_files_error, multihot_features,
                    reading, undirected_csr, vertex_ids)
from .safe_pickle import LINKX_TYPES, load_object_npy

FACEBOOK_CLASSES = {"company": 0, "tvshow": 1, "politician": 2, "government": 3}
TWITCH_COUNTRIES = ("DE", "ENGB", "ES", "FR", "PT", "RU")
TWITCH_FEATURES = 3170
LINKX_SPLITS = "twitch_musae/linkx_splits/twitch-e-DE-splits.npy"

_FB_SOURCE = (
    "Get facebook_large/{edges.csv,features.json,new_target.csv} from https://github.com/benedekrozemberczki/datasets"
)
_LINKX_SOURCE = "data/splits/twitch-e-DE-splits.npy of https://github.com/CUAI/Non-Homophily-Large-Scale"
_TW_SOURCE = (
    "Get twitch/<C>/musae_<C>_* from https://github.com/benedekrozemberczki/datasets "
    "(or data/twitch/<C> of https://github.com/CUAI/Non-Homophily-Large-Scale)"
)


# ---------------------------------------------------------------- file reading
def _read_edges(path: Path) -> np.ndarray:
    with reading(path):
        e = pd.read_csv(path).to_numpy()
        if e.ndim != 2 or e.shape[1] != 2 or not np.issubdtype(e.dtype, np.integer):
            raise ValueError(f"expected two integer columns, got shape {e.shape} dtype {e.dtype}")
    return e.astype(np.int64)


def _read_multihot(path: Path, n: int, width: int | None) -> torch.Tensor:
    """features.json -> (N, F) float32 with 1 at every listed feature id, built as CSR
    (:func:`._core.multihot_features`: the dense N x F matrix is never made)."""
    with reading(path):
        with open(path, encoding="utf-8") as f:
            feats = json.load(f)
        rows = np.fromiter((int(k) for k, v in feats.items() for _ in v), dtype=np.int64)
        cols = np.fromiter((int(c) for v in feats.values() for c in v), dtype=np.int64)
    if rows.size and (rows.max() >= n or rows.min() < 0):
        raise DatasetError(f"{path}: vertex id {int(rows.max())} is outside the {n} vertices of the target file")
    if cols.size and cols.min() < 0:
        raise DatasetError(f"{path}: feature id {int(cols.min())} is negative; re-copy the file")
    width = max(width or 0, int(cols.max()) + 1 if cols.size else 1)
    return multihot_features(rows, cols, (n, width), str(path))


def _finish(name, files, edges, x, y, split, num_classes, meta):
    n = x.shape[0]
    if edges.size and edges.max() >= n:
        raise DatasetError(
            f"{files[0]}: vertex id {int(edges.max())} is outside the {n} vertices of the target file; "
            "the files do not belong together, re-copy them"
        )
    indptr, indices, values, counts = undirected_csr(edges[:, 0], edges[:, 1], n)
    train, val, test = split
    return make_graph(
        name,
        indptr=indptr,
        indices=indices,
        values=values,
        x=x,
        y=torch.from_numpy(y),
        train_idx=train,
        val_idx=val,
        test_idx=test,
        num_classes=num_classes,
        name=name,
        meta={"source": str(files[0].parent), **meta, **counts},
    )


# ------------------------------------------------------------------- facebook
def facebook_files(root: Path) -> list[Path]:
    layouts = ["facebook_pagepage", "facebook", "facebook_large", "."]
    for names in (
        ("edges.csv", "features.json", "new_target.csv"),
        ("edges.csv", "features.json", "target.csv"),
        ("musae_facebook_edges.csv", "musae_facebook_features.json", "musae_facebook_target.csv"),
    ):
        folder, partial = find_dir(root, layouts, names)
        if folder is not None:
            return [folder / f for f in names]
    raise missing_files_error(
        "facebook",
        root,
        root / "facebook_pagepage" / "edges.csv",
        [],
        ["facebook_pagepage/{features.json,new_target.csv}", "facebook_large/musae_facebook_*.csv"],
        _FB_SOURCE,
    )


def load_facebook(name: str, files: list[Path], seed: int):
    edges_f, feats_f, target_f = files
    with reading(target_f):
        t = pd.read_csv(target_f)  # page names contain commas: a real CSV parser is needed
        if "target" in t.columns:
            y = np.array(t["target"], dtype=np.int64)
        else:
            unknown = set(t["page_type"]) - set(FACEBOOK_CLASSES)
            if unknown:
                raise ValueError(f"unknown page_type values {sorted(unknown)}")
            y = np.array(t["page_type"].map(FACEBOOK_CLASSES), dtype=np.int64)
        ids = t["id"].to_numpy(np.int64)
    if not np.array_equal(ids, np.arange(len(ids))):
        order = np.argsort(ids)
        if not np.array_equal(ids[order], np.arange(len(ids))):
            raise DatasetError(f"{target_f}: ids are not 0..{len(ids) - 1}; re-copy the file")
        y = y[order]
    n = len(y)
    x = _read_multihot(feats_f, n, None)
    split = random_split(n, SPLIT_FRACTIONS, seed=seed)
    meta = {"split": f"random 50/25/25 seed {seed}"}
    return _finish(name, files, _read_edges(edges_f), x, y, split, int(y.max()) + 1, meta)


# --------------------------------------------------------------------- twitch
def twitch_files(country: str, root: Path) -> list[Path]:
    c = country.upper()
    names = [f"musae_{c}_edges.csv", f"musae_{c}_features.json", f"musae_{c}_target.csv"]
    layouts = [f"twitch_musae/{c}", f"twitch/{c}", c]
    folder, partial = find_dir(root, layouts, names)
    if folder is None:
        raise missing_files_error(
            f"twitch-{c.lower()}", root, root / "twitch_musae" / c / names[0], partial, layouts[1:], _TW_SOURCE
        )
    return [folder / f for f in names]


def linkx_split_file(root: Path) -> Path | None:
    for rel in (LINKX_SPLITS, "twitch/linkx_splits/twitch-e-DE-splits.npy", "splits/twitch-e-DE-splits.npy"):
        if (root / rel).is_file():
            return root / rel
    return None


def load_twitch(name: str, country: str, files: list[Path], seed: int, split: int | None):
    """``split``: LINKX split id (DE only); None means "LINKX 0 if available, else random"."""
    edges_f, feats_f, target_f = files[:3]
    with reading(target_f):
        t = pd.read_csv(target_f).drop_duplicates("new_id", keep="first")
        ids = t["new_id"].to_numpy(np.int64)
        mature = t["mature"]
        mature = mature.astype(str).str.lower().map({"true": 1, "false": 0, "1": 1, "0": 0})
        if mature.isna().any():
            raise ValueError("column 'mature' holds values other than True/False")
    n = len(ids)
    if not np.array_equal(np.sort(ids), np.arange(n)):
        raise DatasetError(f"{target_f}: new_id is not a permutation of 0..{n - 1}; re-copy the file")
    y = np.empty(n, dtype=np.int64)
    y[ids] = mature.to_numpy(np.int64)
    x = _read_multihot(feats_f, n, TWITCH_FEATURES)

    linkx = files[3] if len(files) > 3 else None
    if linkx is not None:
        k = 0 if split is None else split
        fix = f"replace it with {_LINKX_SOURCE}"
        splits = load_object_npy(linkx, LINKX_TYPES, "a LINKX split file", fix)
        with reading(linkx, fix):
            if not 0 <= k < len(splits):
                raise DatasetError(f"twitch-de: split={k} is out of range; {linkx} has splits 0..{len(splits) - 1}")
            parts = tuple(torch.as_tensor(np.sort(vertex_ids(f"{linkx} split {k}", s, splits[k][s]).reshape(-1)))
                          for s in ("train", "valid", "test"))
        split_meta = f"linkx {k}"
    else:
        parts = random_split(n, SPLIT_FRACTIONS, seed=seed)
        split_meta = f"random 50/25/25 seed {seed}"
    return _finish(name, files, _read_edges(edges_f), x, y, parts, 2, {"split": split_meta, "country": country})
