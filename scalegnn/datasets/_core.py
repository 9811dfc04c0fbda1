"""Shared pieces of the dataset layer: the error type, file lookup, edge-list to CSR,
multi-hot features as CSR, and the featureless-graph protocol (random features, degree classes, random split).

Shape legend:
    N   vertices    E   input edge pairs    nnz   stored adjacency entries
    F   feature dim C   classes
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from scalegnn.csr import csr_matrix, feature_layout, unique_keys
from scalegnn.graph import Graph, GraphValidationError, random_split
from scalegnn.sections.data import SPLIT_FRACTIONS, split_flag, split_fractions  # the --split flag's parser

__all__ = [
    "DatasetError",
    "vertex_ids",
    "FEATURELESS_CLASSES",
    "FEATURELESS_FEATURE_DIM",
    "degree_classes",
    "featureless_graph",
    "find_dir",
    "make_graph",
    "multihot_features",
    "missing_files_error",
    "reading",
    "rng_for",
    "undirected_csr",
    "split_flag",
    "apply_split",
    "draw_split",
]

# The papers' protocol for graphs without node data (ScaleGNN VII-A, Plexus Table 2).
FEATURELESS_FEATURE_DIM = 128
FEATURELESS_CLASSES = 32

# Independent random streams derived from the user seed, one per purpose, so that e.g.
# changing the feature dimension never changes the graph or the labels.
_STREAMS = {"graph": 1, "features": 2, "labels": 3, "perm": 4}

DATA_ROOT_HINT = "pass data_root (CLI: --data-root) or set SCALEGNN_DATA_ROOT"


class DatasetError(ValueError):
    """A dataset cannot be loaded; the message names the dataset or file and the fix."""


def rng_for(seed: int, stream: str) -> np.random.Generator:
    """A numpy Generator for one purpose ('graph', 'features', 'labels', 'perm')."""
    return np.random.default_rng(np.random.SeedSequence([int(seed), _STREAMS[stream]]))


def vertex_ids(where: str, key: str, v) -> np.ndarray:
    """Vertex ids (or CSR offsets) as int64. Floats are accepted when every value is a
    whole number (arrays saved from float tensors); a fractional or NaN id is refused
    instead of being truncated to another vertex."""
    v = np.asarray(v)
    if v.dtype == np.bool_ or not (np.issubdtype(v.dtype, np.integer) or np.issubdtype(v.dtype, np.floating)):
        raise DatasetError(f"{where}: '{key}' must hold integer vertex ids, got dtype {v.dtype}; "
                           f"save it as an int64 array")
    if np.issubdtype(v.dtype, np.floating):
        bad = ~np.isfinite(v) | (v != np.round(v))
        if bad.any():
            raise DatasetError(f"{where}: '{key}' holds non-integer vertex ids (first: {v[bad].flat[0]}); "
                               f"save it as an int64 array of the intended ids")
    return v.astype(np.int64)


@contextmanager
def reading(path, fix: str = "re-copy it from its source"):
    """Re-raise any parse error while reading ``path`` as a DatasetError naming it."""
    try:
        yield
    except (DatasetError, KeyboardInterrupt):
        raise
    except MemoryError as e:  # a size in the file that no check caught: still one line naming the file
        raise DatasetError(f"could not read {path}: out of memory ({e or 'MemoryError'}); the file declares more "
                           f"data than this machine holds: if it is not that large, it is corrupt; {fix}") from e
    except Exception as e:  # noqa: BLE001 - any parser error means a bad file
        raise DatasetError(
            f"could not read {path}: {type(e).__name__}: {e}. "
            f"The file is corrupt, truncated or not in the expected format; {fix}"
        ) from e


def find_dir(root: Path, candidates, required) -> tuple[Path | None, list[Path]]:
    """The first folder among ``root / c`` (c in candidates) holding all ``required`` files.

    Folder names match case-insensitively (PyG writes ``Cora/raw``, others ``cora``).
    Returns (folder or None, missing files of the best partial match, for the error).
    """
    best_missing: list[Path] = []
    for rel in candidates:
        d = _resolve_ci(root, rel)
        if d is None:
            continue
        missing = [d / f for f in required if not (d / f).is_file()]
        if not missing:
            return d, []
        if len(missing) < len(required) and not best_missing:
            best_missing = missing
    return None, best_missing


def _resolve_ci(root: Path, rel: str) -> Path | None:
    d = Path(root)
    for part in Path(rel).parts if rel not in ("", ".") else ():
        if (d / part).is_dir():
            d = d / part
            continue
        try:
            match = [e for e in os.listdir(d) if e.casefold() == part.casefold() and (d / e).is_dir()]
        except OSError:
            return None
        if not match:
            return None
        d = d / sorted(match)[0]
    return d if d.is_dir() else None


def missing_files_error(name: str, root: Path, expected: Path, partial: list[Path], also: list[str], how: str):
    """The DatasetError for a dataset whose files are absent under the data root."""
    if partial:
        listing = ", ".join(str(p) for p in partial)
        return DatasetError(f"{name}: incomplete copy, missing {listing}. {how}")
    alts = f" (also accepted under the data root: {', '.join(also)})" if also else ""
    rel = expected.relative_to(root).as_posix() if expected.is_relative_to(root) else expected.name
    return DatasetError(
        f"{name}: file not found: {expected}{alts}. {how}, and {DATA_ROOT_HINT} pointing to a folder containing {rel}"
    )


def apply_split(graph: Graph, split: str, seed: int) -> Graph:
    """``graph`` with the ``--split`` random split of its labeled vertices (seeded by
    ``seed``) in place of its own; ``meta["split"]`` says so and names the split it
    replaced. Raises a DatasetError when a split would come out empty."""
    labeled = None if graph.multilabel else (graph.y >= 0).nonzero().flatten().numpy()
    before = graph.meta.get("split", "the dataset's own")
    parts, note = draw_split(split, seed, graph.num_nodes, labeled, graph.name, before)
    return graph.replace(train_idx=parts[0], val_idx=parts[1], test_idx=parts[2], meta={**graph.meta, "split": note})


def draw_split(split: str, seed: int, num_nodes: int, labeled, name: str, before: str) -> tuple[list, str]:
    """The ``--split`` random split of ``labeled`` (ids; None: every vertex) seeded by
    ``seed``: its three index tensors and the provenance note that says it replaces
    ``before``. A split that would come out empty is a DatasetError naming ``name``. What
    :func:`apply_split` gives a graph, and out-of-core staging its shards."""
    fractions = split_fractions(split)
    parts = random_split(num_nodes, fractions, seed=seed, labeled=labeled)
    if any(p.numel() == 0 for p in parts):
        sizes = "/".join(str(p.numel()) for p in parts)
        raise DatasetError(f"--split {split} leaves a split empty on {name} ({sizes} of "
                           f"{num_nodes if labeled is None else labeled.size} labeled vertices); "
                           "give larger fractions")
    shown = "/".join(f"{100 * f:g}" for f in fractions)
    return parts, f"random {shown} seed {seed} (--split {split}; replaces: {before})"


# ---------------------------------------------------------------- edges to CSR
def _to_long(a) -> torch.Tensor:
    t = torch.as_tensor(np.ascontiguousarray(a)) if not isinstance(a, torch.Tensor) else a
    if t.dtype.is_floating_point or t.dtype == torch.bool:
        raise DatasetError(f"edge ids must be integers, got dtype {t.dtype}")
    return t.to(torch.int64).reshape(-1)


def undirected_csr(src, dst, n: int, *, users: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict]:
    """Simple undirected CSR of an edge list: both directions, unit weights, no loops.

    Self loops are dropped and duplicate pairs merged, so every dataset reaches the
    trainer in one form; the trainer adds I itself (``Graph.gcn_normalize``).
    Returns (indptr (N+1,), indices (nnz,), values (nnz,), counts for ``Graph.meta``).
    ``users``: a user's file, whose symmetrizing is stated (``graph.symmetrized`` and the
    input's edge count ``input_edges`` in the counts, when some edge had no reverse).
    Cost: one sort of 2E int64 keys (torch.sort, multi-threaded); a user's file, one more of E.
    """
    s, d = _to_long(src), _to_long(dst)
    if s.numel() != d.numel():
        raise DatasetError(f"edge sources and targets differ in length: {s.numel()} vs {d.numel()}")
    if s.numel():
        lo, hi = int(torch.minimum(s.min(), d.min())), int(torch.maximum(s.max(), d.max()))
        if lo < 0 or hi >= n:
            raise DatasetError(
                f"edge endpoint {hi if hi >= n else lo} is outside [0, {n}) for a graph with {n} vertices"
            )
    loop = s == d
    n_loops = int(loop.sum())
    if n_loops:
        keep = ~loop
        s, d = s[keep], d[keep]
    key = torch.cat([s * n + d, d * n + s])
    given = _distinct(key[: s.numel()]) if users else None  # the directed pairs given, for the statement
    del s, d
    key = _distinct(key)
    rows = torch.div(key, n, rounding_mode="floor")
    cols = key - rows * n
    indptr = torch.zeros(n + 1, dtype=torch.int64)
    torch.cumsum(torch.bincount(rows, minlength=n), 0, out=indptr[1:])
    counts = {"input_edge_pairs": int(loop.numel()), "self_loops_dropped": n_loops}
    if given is not None and given.numel() < key.numel():
        counts.update(symmetrized=True, input_edges=int(loop.numel()))
    return indptr, cols, torch.ones(cols.numel(), dtype=torch.float32), counts


def _distinct(key: torch.Tensor) -> torch.Tensor:
    """The distinct values of ``key``, sorted (one sort and a mask: torch.unique's sort is slower)."""
    key = torch.sort(key).values
    if key.numel():
        first = torch.ones(key.numel(), dtype=torch.bool)
        torch.ne(key[1:], key[:-1], out=first[1:])
        key = key[first]
    return key


# ---------------------------------------------------------------- features
def multihot_features(rows: np.ndarray, cols: np.ndarray, shape: tuple[int, int], what: str) -> torch.Tensor:
    """(N, F) float32 features with a 1 at every (rows[k], cols[k]), a pair listed twice
    still 1 (Twitch lists some feature ids twice), in the layout of the one feature rule
    (:func:`scalegnn.csr.sparse_enough`): CSR when under 5 % ones, as every built-in
    multi-hot dataset is, else dense.

    Built as CSR from the pairs: one sort of the nnz keys ``row * F + col``, so memory
    follows the nonzeros (about 40 bytes each while building, 12 kept) and the dense
    N x F matrix is never made unless the rule asks for it. ``what`` names the file
    in errors (an id outside the shape).
    """
    n, width = (int(s) for s in shape)
    rows, cols = np.asarray(rows, dtype=np.int64), np.asarray(cols, dtype=np.int64)
    for name, ids, size in (("vertex", rows, n), ("feature", cols, width)):
        if ids.size and (ids.min() < 0 or ids.max() >= size):
            bad = int(ids.max()) if ids.max() >= size else int(ids.min())
            raise DatasetError(f"{what}: {name} id {bad} is outside [0, {size}); the files do not belong together, "
                               "re-copy them")
    key = unique_keys(rows * max(width, 1) + cols)  # sorted by (row, col), repeats once
    rows_k = key // max(width, 1)
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows_k, minlength=n), out=indptr[1:])
    x = csr_matrix(torch.from_numpy(indptr), torch.from_numpy(key - rows_k * max(width, 1)),
                   torch.ones(key.size, dtype=torch.float32), (n, width), what)
    return feature_layout(x)


def make_graph(what: str, **fields) -> Graph:
    """Construct a Graph, turning a validation failure into a DatasetError about ``what``."""
    try:
        return Graph(**fields)
    except GraphValidationError as e:
        raise DatasetError(f"{what}: the loaded arrays do not form a valid graph: {e}") from e


# ------------------------------------------------------ featureless protocol
def degree_classes(deg: np.ndarray, num_classes: int, seed: int) -> np.ndarray:
    """Balanced classes by degree: class = floor(C * rank / N).

    ``rank`` orders vertices by degree, ties broken by a seeded random order, so the C
    classes have equal sizes (within one) and class grows with degree: the papers'
    "32 synthetic classes proportional to vertex degree". Plain degree-value quantile
    bins would collapse on power-law graphs, where most vertices share a few degrees.
    """
    n = deg.shape[0]
    tiebreak = rng_for(seed, "labels").random(n)
    order = np.lexsort((tiebreak, np.asarray(deg)))
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n, dtype=np.int64)
    return rank * num_classes // max(n, 1)


def featureless_graph(
    name: str,
    indptr: torch.Tensor,
    indices: torch.Tensor,
    values: torch.Tensor,
    seed: int,
    meta: dict,
    feature_dim: int = FEATURELESS_FEATURE_DIM,
    num_classes: int = FEATURELESS_CLASSES,
    x: torch.Tensor | None = None,
    y: tuple[torch.Tensor, int] | None = None,
) -> Graph:
    """Attach the papers' synthetic node data to a bare graph, where it has none.

    x ~ N(0, 1)^(N x feature_dim) (seeded) unless ``x`` is given, y =
    :func:`degree_classes` unless ``y`` = (labels, num_classes) is given, and a seeded
    random 50/25/25 train/val/test split of the labeled vertices
    (``scalegnn.graph.random_split``). ``meta["features"]`` / ``["labels"]`` say which
    are synthetic (a given one's description comes in ``meta``).
    """
    n = indptr.numel() - 1
    deg = (indptr[1:] - indptr[:-1]).numpy()
    meta = dict(meta)
    if x is None:
        x = torch.from_numpy(rng_for(seed, "features").standard_normal((n, feature_dim), dtype=np.float32))
        meta["features"] = f"random N(0,1), dim {feature_dim}"
    if y is None:
        y = torch.from_numpy(degree_classes(deg, num_classes, seed)), num_classes
        meta["labels"] = f"{num_classes} balanced degree classes"
    y, num_classes = y
    labeled = (y >= 0).nonzero().flatten().numpy() if y.dim() == 1 else None
    train, val, test = random_split(n, SPLIT_FRACTIONS, seed=seed, labeled=labeled)
    meta["split"] = f"random 50/25/25 seed {seed}"
    return make_graph(
        name,
        indptr=indptr,
        indices=indices,
        values=values,
        x=x,
        y=y,
        train_idx=train,
        val_idx=val,
        test_idx=test,
        num_classes=num_classes,
        name=name,
        meta=meta,
    )
