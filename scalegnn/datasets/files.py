"""Graphs from user files: edge lists, Matrix Market, and bring-your-own arrays.

Graph files (``edgelist:<path>``, ``mtx:<path>``, and the papers' named graphs
``isolate-3-8m``, ``products-14m``, ``europe-osm`` found as ``<root>/<name>.mtx|.txt``
or ``<root>/<name>/<name>.mtx``, ``-`` or ``_``) are symmetrized, self loops dropped,
with a seeded 50/25/25 split. Node data is read from files beside the graph file
(:data:`BESIDE`: ``<stem>.features.npy|npz``, ``<stem>.labels.npy``, row v = vertex v);
what is missing follows the papers' protocol (``_core.featureless_graph``: 128-d
N(0,1) features, 32 balanced degree classes), stated in ``meta["stand_in"]`` for a
user's file.

Edge list: one pair per line, separated by whitespace or a comma; extra columns
(weights, timestamps) are not read, and a user's file says so (``meta["unread"]``,
logged and in the run record); lines starting with ``#`` or ``%`` are comments; a
non-numeric first line is a header. Vertex ids need not be contiguous: the vertices are
the distinct ids, renumbered 0..N-1 in increasing id order (so an isolated vertex cannot
appear in an edge list). Matrix Market: coordinate format, general or symmetric, any
field (the values of a user's file not read, and said so, as an edge list's extra
columns); vertex i is row i-1, so N comes
from the header and isolated vertices are kept. A non-square matrix is rejected.

Bring your own (``npz:<file.npz>`` or ``dir:<folder>`` of ``<key>.npy`` files):

=============  ===============  =========================================================
key            shape / dtype    meaning
=============  ===============  =========================================================
edge_index     (2, E) int       edges src -> dst (an (E, 2) array is accepted too), or:
indptr         (N+1,) int       CSR row pointers ...
indices        (nnz,) int       ... and column ids
values         (nnz,) or (E,)   optional edge weights (>= 0; all ones: unweighted)
x              (N, F) float     node features, dense; or, kept sparse (CSR), the four arrays
x_indptr       (N+1,) int       ... of a scipy csr_matrix: indptr,
x_indices      (nnz,) int       ... indices (columns),
x_data         (nnz,) float     ... data,
x_shape        (2,) int         ... shape (N, F); a dir: holds x.npz (scipy.sparse.save_npz)
y              (N,) int         class ids, -1 (or NaN) = unlabeled; or (N, C) multi-hot
train_idx      (k,) int         vertex ids; or ``train_mask`` (N,) bool
val_idx        (k,) int         or ``val_mask`` (``valid_idx`` / ``valid_mask`` also accepted)
test_idx       (k,) int         or ``test_mask``
num_classes    () int           optional; default max(y)+1, or C for multi-hot y
undirected     () bool          optional, default true: symmetrize (see below)
=============  ===============  =========================================================

The three splits are given together or not at all: without any, the labeled vertices
get the seeded random 50/25/25 split of ``--seed`` (``meta["split"]`` says so).
Self loops are dropped in both cases (the trainer adds I); duplicates are merged
(weights summed). Made undirected, an edge given in one direction only gets both, a
weighted pair the mean of the weights given for its two directions, and a graph that
was not symmetric says so (``meta["symmetrized"]``, the input's ``input_edges``, logged
and in the run record); ``meta["weighted"]`` marks weights, which the systems that
cannot use them refuse (:func:`scalegnn.systems.check_graph`). Arrays are read with
``allow_pickle=False`` (an object array is refused by name, arrays under unknown keys
are never read) after their headers' sizes are checked against the file and the
memory budget (:func:`read_npy`, :func:`read_npz`); each key is checked for its type,
shape and finite values before the graph is built.
"""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import numpy as np
import torch

from scalegnn.csr import csr_matrix
from scalegnn.fileio import check_declared_size
from scalegnn.graph import csr_from_edges, random_split, undirected_edges

from ._core import (DATA_ROOT_HINT, SPLIT_FRACTIONS, DatasetError, featureless_graph, make_graph, reading,
                    undirected_csr, vertex_ids)

__all__ = [
    "BYO_KEYS", "FEATURELESS_NAMED", "byo_sources", "compact_ids", "featureless_from_file",
    "load_byo", "named_featureless_file", "npz_keys", "path_tag", "read_edgelist", "read_mtx", "read_npy", "read_npz",
]  # fmt: skip

FEATURELESS_NAMED = {
    "isolate-3-8m": "the HipMCL protein-similarity data repository (Azad et al.; Plexus Table 2)",
    "products-14m": "the Amazon product network of Ni et al. 2019 (Plexus Table 2), saved as Matrix Market",
    "europe-osm": "https://sparse.tamu.edu/DIMACS10/europe_osm (Matrix Market .tar.gz)",
}
_EXTS = (".mtx", ".txt", ".edges", ".el", ".tsv", ".csv")
BYO_KEYS = (
    "edge_index", "indptr", "indices", "values", "x", "y", "num_classes", "undirected",
    "train_idx", "val_idx", "valid_idx", "test_idx", "train_mask", "val_mask", "valid_mask", "test_mask",
    "x_indptr", "x_indices", "x_data", "x_shape",
)  # fmt: skip
# Sparse features: the four arrays of a CSR matrix (scipy's csr_matrix convention)
# under these keys in an npz, or one ``x.npz`` written by scipy.sparse.save_npz in a
# folder (whose own keys are the names without ``x_``).
SPARSE_X_KEYS = ("x_indptr", "x_indices", "x_data", "x_shape")


def path_tag(path: Path) -> str:
    """A short stable tag of an absolute path, for cache file names."""
    return hashlib.sha1(str(path).encode()).hexdigest()[:10]


# ----------------------------------------------------------------- edge lists
def _sniff(path: Path) -> tuple[str, set[str], int]:
    """(separator, comment chars seen, lines to skip up to and including a header)."""
    with open(path, "rb") as f:
        head = f.read(1 << 16).decode("utf-8", errors="replace").splitlines()
    comments, sep, skip = set(), r"\s+", 0
    for i, line in enumerate(head[:-1] if len(head) > 1 else head):
        s = line.strip()
        if not s:
            continue
        if s[0] in "#%":
            comments.add(s[0])
            continue
        sep = "," if "," in s else r"\s+"
        toks = s.replace(",", " ").split()
        if not (len(toks) >= 2 and all(t.lstrip("-").isdigit() for t in toks[:2])):
            skip = i + 1  # a header line (and the comments before it)
        break
    return sep, comments, skip


def _parse_edgelist_slow(path: Path) -> np.ndarray:
    pairs = []
    with open(path, encoding="utf-8", errors="replace") as f:
        first = True
        for lineno, line in enumerate(f, 1):
            s = line.strip()
            if not s or s[0] in "#%":
                continue
            toks = s.replace(",", " ").split()
            try:
                pair = (int(toks[0]), int(toks[1]))
            except (ValueError, IndexError):
                if first:  # a header line
                    first = False
                    continue
                raise DatasetError(
                    f"{path}, line {lineno}: expected two integer vertex ids, got {s[:80]!r}; fix or remove the line"
                ) from None
            if max(map(abs, pair)) >= 2**63:
                raise DatasetError(f"{path}, line {lineno}: vertex id {max(pair, key=abs)} does not fit in 64 bits; "
                                   "renumber the vertices (ids < 2**63)")
            pairs.append(pair)
            first = False
    return np.asarray(pairs, dtype=np.int64).reshape(-1, 2)


def read_edgelist(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Edge list file -> (src, dst) original ids (E,), int64."""
    import pandas as pd

    with reading(path):
        sep, comments, skip = _sniff(path)
        e = None
        if len(comments) <= 1:
            try:
                e = pd.read_csv(
                    path, sep=sep, comment=next(iter(comments), None), header=None,
                    skiprows=skip, usecols=[0, 1], dtype=np.int64, engine="c",
                    skipinitialspace=True,
                ).to_numpy()  # fmt: skip
            except (ValueError, OverflowError, pd.errors.ParserError, IndexError):
                e = None  # mixed layout: the line-by-line parser finds the bad line
        if e is None:
            e = _parse_edgelist_slow(path)
    if e.shape[0] == 0:
        raise DatasetError(f"{path} contains no edges; expected lines 'src dst'")
    if e.min() < 0:
        raise DatasetError(f"{path} contains a negative vertex id {int(e.min())}; ids must be >= 0")
    return e[:, 0].copy(), e[:, 1].copy()


def unread_values(path: Path, fmt: str) -> str | None:
    """What of a user's graph file is not read, said rather than dropped: an edge list's
    columns after the two ids (weights, timestamps), a Matrix Market file's values (a
    file that is not ``pattern``); None when the file holds nothing more."""
    fix = "the graph is trained unweighted; to train weights, give them as 'values' of an npz: file or dir: folder"
    if fmt == "mtx":
        import scipy.io

        field = scipy.io.mminfo(path)[4]
        return None if field == "pattern" else f"the {field} values of {path.name} are not read: {fix}"
    sep, comments, skip = _sniff(path)
    with open(path, "rb") as f:
        head = f.read(1 << 16).decode("utf-8", errors="replace").splitlines()
    data = [line.strip() for line in head[skip:] if line.strip() and line.strip()[0] not in "#%"]
    columns = len(data[0].replace(",", " ").split()) if data else 2
    return None if columns <= 2 else f"columns 3 to {columns} of {path.name} (weights, timestamps) are not read: {fix}"


def compact_ids(src: np.ndarray, dst: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Renumber the distinct ids to 0..N-1 preserving order; returns (src, dst, N)."""
    s, d = torch.from_numpy(src), torch.from_numpy(dst)
    hi = int(torch.maximum(s.max(), d.max()))
    if hi < 4 * (s.numel() + d.numel()) + 1024:  # dense id space: presence bitmap
        present = torch.zeros(hi + 1, dtype=torch.bool)
        present[s] = True
        present[d] = True
        new_id = torch.cumsum(present, 0) - 1
        return new_id[s], new_id[d], int(present.sum())
    uniq, inverse = torch.unique(torch.cat([s, d]), return_inverse=True)
    return inverse[: s.numel()], inverse[s.numel() :], uniq.numel()


def read_mtx(path: Path) -> tuple[np.ndarray, np.ndarray, int]:
    import scipy.io

    with reading(path):
        rows, cols, entries, fmt, _, _ = scipy.io.mminfo(path)
    if fmt == "coordinate":
        # The header's sizes, before scipy allocates them: every entry takes a line of at least 4 bytes
        # ("1 1\n"), and N rows take row pointers (and features) in memory.
        fix = "the header (after the %%MatrixMarket line: rows columns entries) does not match the file; re-create it"
        check_declared_size(str(path), "the header's entries", entries, 4, fix=fix, available=path.stat().st_size,
                            error=DatasetError)
        check_declared_size(str(path), "the header's rows (N, row pointers)", max(rows, cols) + 1, 8, fix=fix,
                            error=DatasetError)
    with reading(path):
        m = scipy.io.mmread(path)
        if not hasattr(m, "tocoo"):
            raise ValueError("a dense Matrix Market 'array' file; expected 'coordinate' (sparse) format")
        m = m.tocoo()
    if m.shape[0] != m.shape[1]:
        raise DatasetError(
            f"{path}: the matrix is {m.shape[0]} x {m.shape[1]}; a graph adjacency must be square "
            "(convert a bipartite graph to a homogeneous one first)"
        )
    return np.asarray(m.row, dtype=np.int64), np.asarray(m.col, dtype=np.int64), int(m.shape[0])


# Node data beside a graph file ``<stem>.<ext>`` (``stem`` = the name without its last
# suffix): features dense (N, F) .npy or a scipy.sparse.save_npz CSR .npz, labels (N,)
# or (N, C) .npy; row v belongs to vertex v.
BESIDE = {"features": (".features.npy", ".features.npz"), "labels": (".labels.npy",)}


def beside_files(path: Path) -> dict[str, Path]:
    """The node-data files found beside the graph file ``path`` (see :data:`BESIDE`)."""
    stem = path.name[: -len(path.suffix)] if path.suffix else path.name
    found = {}
    for kind, suffixes in BESIDE.items():
        hits = [path.parent / f"{stem}{s}" for s in suffixes if (path.parent / f"{stem}{s}").is_file()]
        if len(hits) > 1:
            raise DatasetError(f"{path}: both {hits[0].name} and {hits[1].name} lie beside it; keep one {kind} file")
        if hits:
            found[kind] = hits[0]
    return found


def beside_names(path: Path) -> str:
    stem = path.name[: -len(path.suffix)] if path.suffix else path.name
    return ", ".join(f"{stem}{s}" for suffixes in BESIDE.values() for s in suffixes)


def _read_beside(found: dict[str, Path]) -> tuple[torch.Tensor | None, tuple | None, int | None]:
    """(features, (labels, classes), N) from the files beside a graph file; N from their rows."""
    x = y = None
    if "features" in found:
        f = found["features"]
        if f.suffix == ".npz":
            x = byo_features(read_sparse_npz(f), str(f))
        else:
            x = byo_features({"x": read_npy(f, "x")}, str(f))
    if "labels" in found:
        f = found["labels"]
        raw = read_npy(f, "labels")
        labels, classes = byo_labels(raw, str(f), "the labels file", None if x is None else x.shape[0])
        y = torch.from_numpy(labels), classes
    n = x.shape[0] if x is not None else (y[0].shape[0] if y is not None else None)
    if n == 0:
        raise DatasetError(f"{next(iter(found.values()))}: 0 rows; save one row per vertex")
    return x, y, n


def featureless_from_file(name: str, path: Path, fmt: str, seed: int, announce: bool = False):
    """A graph file with the node data found beside it (:func:`beside_files`), the
    featureless protocol standing in for what is not there. With node data, row v is
    vertex v: N is its row count and edge-list ids are kept (not renumbered); without,
    edge-list ids are renumbered 0..N-1. ``announce``: a user's file (``edgelist:``,
    ``mtx:``), whose stand-in node data is stated in ``meta["stand_in"]`` (logged)."""
    found = beside_files(path)
    x, y, n_data = _read_beside(found)
    if fmt == "mtx":
        src, dst, n = read_mtx(path)
        relabeled = False
        if n_data is not None and n_data != n:
            raise DatasetError(f"{path}: the matrix has {n} rows but {next(iter(found.values())).name} has "
                               f"{n_data}; the files beside it need one row per vertex")
    else:
        src, dst = read_edgelist(path)
        relabeled = n_data is None
        if relabeled:
            src, dst, n = compact_ids(src, dst)
        else:
            n = n_data
            hi = int(max(src.max(), dst.max()))
            if hi >= n:
                raise DatasetError(f"{path}: vertex id {hi} but {next(iter(found.values())).name} has {n} rows; "
                                   f"with node data beside an edge list, row v belongs to vertex v, so ids must be "
                                   f"< {n}")
    indptr, indices, values, counts = undirected_csr(src, dst, n, users=announce)
    meta = {"source": str(path), "format": fmt, "ids_renumbered": relabeled, **counts}
    if announce and (unread := unread_values(path, fmt)):
        meta["unread"] = unread
    for kind, f in found.items():
        meta[kind] = f"from {f}" + (", sparse (CSR)" if kind == "features" and x.layout == torch.sparse_csr else "")
    graph = featureless_graph(name, indptr, indices, values, seed, meta, x=x, y=y)
    missing = [k for k in BESIDE if k not in found]
    if announce and missing:
        stand_in = "; ".join(f"{graph.meta[k]} stand in for the {k}" for k in missing)
        graph.meta["stand_in"] = (f"{stand_in} (no {' or '.join(missing)} file beside {path.name}; "
                                  f"looked for {beside_names(path)})")
        graph.meta["stand_in_for"] = missing
    return graph


def named_featureless_file(name: str, root: Path) -> Path:
    stems = dict.fromkeys([name, name.replace("-", "_")])
    tried = []
    for stem in stems:
        for ext in _EXTS:
            for cand in (root / f"{stem}{ext}", root / stem / f"{stem}{ext}"):
                tried.append(cand)
                if cand.is_file():
                    return cand
    raise DatasetError(
        f"{name}: no graph file found; expected {root / (name + '.mtx')} (or {name}.txt, "
        f"{name.replace('-', '_')}.mtx, {name}/{name}.mtx, ... under {root}). Get it from "
        f"{FEATURELESS_NAMED[name]} and {DATA_ROOT_HINT} pointing to the folder holding it"
    )


# ----------------------------------------------------------- arrays, sizes checked first
_REMAKE = "the file is corrupt or not what it claims; re-create it (numpy.save / numpy.savez)"
_HEADERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0,
            (3, 0): np.lib.format.read_array_header_2_0}
_DEFLATE_MAX_RATIO = 1100  # deflate expands at most ~1032:1


def _npy_header(f, where: str, key: str, available: int) -> None:
    """Check the .npy stream at ``f`` (``available`` bytes in all) before it is loaded:
    no pickled objects, and the data its header declares is in the stream and within
    the memory budget."""
    start = f.tell()
    try:
        version = np.lib.format.read_magic(f)
        if version not in _HEADERS:
            raise ValueError(f"unsupported .npy format version {version}")
        shape, _, dtype = _HEADERS[version](f)
    except ValueError as e:
        raise DatasetError(f"{where}: '{key}' is not a readable .npy array ({e}); {_REMAKE}") from None
    if dtype.hasobject:
        raise DatasetError(f"{where}: '{key}' holds pickled Python objects (dtype object), which scalegnn never "
                           "loads (unpickling could run code); save it as a numeric array")
    count = int(np.prod(shape, dtype=object)) if shape else 1
    check_declared_size(where, f"'{key}' (its .npy header: shape {shape}, {dtype})", count, dtype.itemsize,
                        fix=_REMAKE, available=available - (f.tell() - start), error=DatasetError)


def read_npy(path: Path, key: str | None = None) -> np.ndarray:
    """One ``.npy`` file, its header checked first (:func:`_npy_header`); never unpickles."""
    key = path.stem if key is None else key
    with open(path, "rb") as f:
        _npy_header(f, str(path), key, path.stat().st_size)
    with reading(path):
        return np.load(path, allow_pickle=False)


def npz_keys(path: Path) -> list[str]:
    """The array names of an npz archive (no array is read)."""
    with reading(path):
        with zipfile.ZipFile(path) as z:
            return [n[:-4] for n in z.namelist() if n.endswith(".npy")]


def read_npz(path: Path, keys=None) -> dict:
    """The arrays ``keys`` (default: all) of an npz archive, each member's declared
    sizes (zip and .npy header) checked before it is read; never unpickles."""
    where = str(path)
    with reading(path), zipfile.ZipFile(path) as z:
        members = {info.filename[:-4]: info for info in z.infolist() if info.filename.endswith(".npy")}
        out = {}
        for key, info in members.items():
            if keys is not None and key not in keys:
                continue
            if info.compress_type != zipfile.ZIP_STORED and \
                    info.file_size > _DEFLATE_MAX_RATIO * info.compress_size + 4096:
                check_declared_size(where, f"'{key}' (its zip entry)", info.file_size, fix=_REMAKE,
                                    available=_DEFLATE_MAX_RATIO * info.compress_size + 4096, error=DatasetError)
            check_declared_size(where, f"'{key}' (its zip entry)", info.file_size, fix=_REMAKE, error=DatasetError)
            with z.open(info) as f:
                _npy_header(f, where, key, info.file_size)
            with z.open(info) as f:
                out[key] = np.lib.format.read_array(f, allow_pickle=False)
        return out


def _numbers(where: str, key: str, v, kinds: str = "iuf") -> np.ndarray:
    """``v`` as an array of real numbers (dtype kinds ``kinds``), else one line naming ``key``."""
    v = np.asarray(v)
    if v.dtype.kind == "c":
        raise DatasetError(f"{where}: '{key}' is complex ({v.dtype}); save the real values you mean (numpy.real "
                           "drops the imaginary part)")
    if v.dtype.kind == "b" and "b" not in kinds:
        raise DatasetError(f"{where}: '{key}' is bool; save it as int64 (class ids) or float32 values")
    if v.dtype.kind not in kinds + "b":
        raise DatasetError(f"{where}: '{key}' must hold numbers, got dtype {v.dtype}; save it as a float32 or int64 "
                           "array")
    return v


def _finite(where: str, key: str, v: np.ndarray, fix: str = "clean or impute them first") -> None:
    if v.dtype.kind == "f" and not np.isfinite(v).all():
        first = int(np.flatnonzero(~np.isfinite(v.reshape(-1)))[0])
        raise DatasetError(f"{where}: '{key}' holds NaN or inf (first at flat position {first}); {fix}")


def _scalar(where: str, key: str, v, what: str) -> np.ndarray:
    v = np.asarray(v)
    if v.size != 1 or v.ndim > 1:
        raise DatasetError(f"{where}: '{key}' must be {what}, got an array of shape {v.shape}")
    return v.reshape(())


def byo_num_classes(where: str, v, n: int) -> int:
    """The ``num_classes`` of a file: one integer >= 1 whose N x C logits fit the memory budget."""
    what = "one integer (the number of classes)"
    v = _scalar(where, "num_classes", v, what)
    if v.dtype.kind in "iu":
        c = int(v)
    elif v.dtype.kind == "f" and np.isfinite(v) and float(v) == round(float(v)):
        c = int(v)
    else:
        raise DatasetError(f"{where}: 'num_classes' must be {what}, got {v.item()!r} ({v.dtype}); save it as "
                           "numpy.int64(C)")
    if c < 1:
        raise DatasetError(f"{where}: 'num_classes' must be >= 1, got {c}")
    check_declared_size(where, "'num_classes' (N x C logits)", n * c, 4, error=DatasetError,
                        fix="give the true number of classes (default: max(y) + 1)")
    return c


def byo_undirected(where: str, v) -> bool:
    """``undirected``: one boolean (or 0 / 1); a string or a vector is refused, not read as true."""
    what = "one boolean (True or False; 1 or 0)"
    v = _scalar(where, "undirected", v, what)
    if v.dtype.kind == "b" or (v.dtype.kind in "iuf" and float(v) in (0.0, 1.0)):
        return bool(v)
    raise DatasetError(f"{where}: 'undirected' must be {what}, got {v.item()!r} ({v.dtype}); save it as "
                       "numpy.bool_(False) for a directed, weighted graph")


# ----------------------------------------------------------- bring your own
def byo_sources(kind: str, path: Path) -> list[Path]:
    if kind == "npz":
        if not path.is_file():
            raise DatasetError(f"npz: file not found: {path}; pass npz:<path to an existing .npz file>")
        return [path]
    if not path.is_dir():
        raise DatasetError(f"dir: folder not found: {path}; pass dir:<folder holding x.npy, y.npy, ...>")
    found = [path / f"{k}.npy" for k in BYO_KEYS if (path / f"{k}.npy").is_file()]
    if (path / "x.npz").is_file():  # sparse features (scipy.sparse.save_npz)
        found.append(path / "x.npz")
    if (path / "features.json").is_file():  # features from a seed per vertex (scalegnn data generate)
        found.append(path / "features.json")
    if not found:
        raise DatasetError(
            f"dir: {path} holds none of the expected files ({', '.join(k + '.npy' for k in BYO_KEYS[:6])}, ...)"
        )
    return found


SPLIT_KEYS = {"train": ("train_idx", "train_mask"), "val": ("val_idx", "val_mask", "valid_idx", "valid_mask"),
              "test": ("test_idx", "test_mask")}


def byo_has_split(kind: str, path: Path, files: list[Path]) -> bool:
    """Whether a bring-your-own graph carries any split key (else it gets the seeded
    random split, and its cache entry depends on the seed)."""
    if kind == "npz":
        try:
            keys = set(npz_keys(path))
        except DatasetError:  # a damaged file is reported by the loader itself
            return True
    else:
        keys = {f.stem for f in files}
    return any(k in keys for names in SPLIT_KEYS.values() for k in names)


def _read_byo(kind: str, path: Path, files: list[Path]) -> dict:
    if kind == "npz":
        keys = npz_keys(path)
        if not set(keys) & set(BYO_KEYS):  # another layout: say what was expected and found, read nothing
            ppnp = any(k.startswith(("adj_matrix.", "attr_matrix.")) for k in keys)
            hint = ("; this is the PPNP / nettack layout: write edge_index (or indptr, indices) from its adj_matrix "
                    "CSR, x from attr_matrix and y = labels" if ppnp else "")
            raise DatasetError(f"{path}: none of the expected keys (edge_index, or indptr and indices; x, or x_indptr, "
                               f"x_indices, x_data, x_shape; y; scalegnn/datasets/README.md); found: "
                               f"{', '.join(sorted(keys)) or 'no arrays'}{hint}")
        return read_npz(path, BYO_KEYS)  # only the known keys: other arrays are never read
    arrays = {}
    for f in files:
        if f.suffix == ".npz":  # x.npz: sparse features as scipy.sparse.save_npz writes them
            arrays.update(read_sparse_npz(f))
        elif f.suffix == ".json":  # features.json: data (json), never code
            import json

            with reading(f):
                try:
                    arrays["features.json"] = json.loads(f.read_text())
                except ValueError as exc:
                    raise DatasetError(f"{f}: not JSON ({exc}); write the folder again with "
                                       "`scalegnn data generate`") from None
        else:
            arrays[f.stem] = read_npy(f)
    return arrays


def read_sparse_npz(path: Path) -> dict:
    """The CSR parts of a ``scipy.sparse.save_npz`` file, under the npz form's keys
    (``x_indptr``, ``x_indices``, ``x_data``, ``x_shape``); read with
    ``allow_pickle=False``, so the file cannot run code."""
    z = read_npz(path, ("format", "indptr", "indices", "data", "shape"))
    fmt = z["format"].item() if "format" in z and z["format"].size == 1 else b"?"
    fmt = fmt.decode(errors="replace") if isinstance(fmt, bytes) else str(fmt)
    if fmt != "csr" or not {"indptr", "indices", "data", "shape"} <= set(z):
        raise DatasetError(f"{path}: expected a CSR matrix saved by scipy.sparse.save_npz, got format {fmt!r} "
                           f"with keys {sorted(npz_keys(path))}; save it with scipy.sparse.save_npz(path, m.tocsr())")
    return {f"x_{k}": z[k] for k in ("indptr", "indices", "data", "shape")}


def byo_features(a: dict, where: str) -> torch.Tensor:
    """The features of a bring-your-own graph: dense ``x`` (N, F), or the CSR parts
    (:data:`SPARSE_X_KEYS`), kept sparse as a canonical CSR tensor."""
    sparse = [k for k in SPARSE_X_KEYS if k in a]
    if sparse and "x" in a:
        raise DatasetError(f"{where}: holds both 'x' and {sparse[0]!r}; give the features once, dense as 'x' or "
                           f"sparse as {', '.join(SPARSE_X_KEYS)}")
    if sparse:
        missing = [k for k in SPARSE_X_KEYS if k not in a]
        if missing:
            raise DatasetError(f"{where}: sparse features need all of {', '.join(SPARSE_X_KEYS)}; missing "
                               f"{', '.join(missing)} (scipy: m = m.tocsr(); x_indptr=m.indptr, x_indices=m.indices, "
                               "x_data=m.data, x_shape=m.shape)")
        shape = np.asarray(a["x_shape"])
        if shape.shape != (2,) or not np.issubdtype(shape.dtype, np.integer):
            raise DatasetError(f"{where}: 'x_shape' must be two integers (N, F), got {shape!r}")
        if shape.min() < 0:
            raise DatasetError(f"{where}: 'x_shape' must be two sizes (N, F) >= 0, got {shape.tolist()}")
        if shape[1] == 0:
            raise DatasetError(f"{where}: 'x_shape' says 0 columns: the features are empty; give at least one "
                               "feature per vertex (a column of ones when the graph has none)")
        fix = "x_shape must be the matrix's (N, F); the file is corrupt or the shape wrong"
        check_declared_size(where, "'x_shape' rows (N, row pointers)", int(shape[0]) + 1, 8, fix=fix,
                            error=DatasetError)
        check_declared_size(where, "'x_shape' columns (F, at least one weight each)", int(shape[1]), 4, fix=fix,
                            error=DatasetError)
        _numbers(where, "x_data", a["x_data"], "iufb")
        try:
            return csr_matrix(*(torch.from_numpy(np.ascontiguousarray(a[k])) for k in SPARSE_X_KEYS[:3]),
                              shape.tolist(), f"{where}: sparse features")
        except ValueError as exc:
            raise DatasetError(str(exc)) from None
    if "x" not in a:
        raise DatasetError(f"{where}: missing key 'x' (an (N, F) float array of node features), or the sparse "
                           f"form {', '.join(SPARSE_X_KEYS)}; see scalegnn/datasets/README.md")
    x = _numbers(where, "x", a["x"], "iufb")
    if x.ndim != 2:
        raise DatasetError(f"{where}: 'x' must be (N, F), got shape {x.shape}")
    if x.shape[1] == 0 and x.shape[0]:
        raise DatasetError(f"{where}: 'x' has 0 columns: the features are empty; give at least one feature per "
                           "vertex (a column of ones when the graph has none)")
    x = np.asarray(x, dtype=np.float32)
    _finite(where, "x", x, "clean or impute the features first")
    return torch.from_numpy(x)


def _byo_split(a: dict, where: str, n: int, split: str, keys: tuple[str, ...]) -> torch.Tensor:
    """One split of a bring-your-own graph: its ids, or its boolean mask, under any of ``keys``."""
    key = next((k for k in keys if k in a), None)
    if key is None:
        raise DatasetError(
            f"{where}: missing key '{split}_idx' (expected a 1-D int array of vertex ids) or '{split}_mask' "
            f"(expected a ({n},) bool array); give all three splits, or none for a seeded random 50/25/25 split"
        )
    v = np.asarray(a[key])
    if key.endswith("_mask"):
        if v.shape != (n,) or not (v.dtype.kind == "b" or (v.dtype.kind in "iu" and np.isin(v, (0, 1)).all())):
            raise DatasetError(f"{where}: '{key}' must be a ({n},) bool array, got {v.dtype} of shape {v.shape}")
        v = np.flatnonzero(v.astype(bool))
    return torch.from_numpy(np.sort(vertex_ids(where, key, v).reshape(-1)))


def byo_split(a: dict, where: str, n: int, seed: int, y: np.ndarray) -> tuple[list[torch.Tensor], str]:
    """(train, val, test ids, provenance note) of a bring-your-own graph of ``n`` vertices
    whose arrays ``a`` hold every split key it has (:data:`SPLIT_KEYS`): its own split,
    or, with none, the seeded random 50/25/25 split by the run's ``seed`` of the vertices
    its labels ``y`` label (class ids >= 0; every vertex for multi-hot labels), as for the
    built-in graphs without one. The one rule for the in-memory reader (:func:`load_byo`)
    and out-of-core staging."""
    if any(k in a for names in SPLIT_KEYS.values() for k in names):
        return [_byo_split(a, where, n, split, keys) for split, keys in SPLIT_KEYS.items()], "the file's own"
    labeled = np.flatnonzero(y >= 0) if y.ndim == 1 else None
    return random_split(n, SPLIT_FRACTIONS, seed=seed, labeled=labeled), \
        f"random 50/25/25 seed {seed} (the file has no split)"


def byo_labels(y, where: str, what: str, n: int | None, num_classes=None) -> tuple[np.ndarray, int]:
    """(labels, number of classes) of a label array: (N,) class ids, -1 or NaN for
    unlabeled, or an (N, C) multi-hot matrix; ``n`` the rows it must have (None: any)."""
    y = _numbers(where, what.strip("'"), y, "iuf" if np.ndim(y) == 1 else "iufb")
    if y.ndim not in (1, 2) or (n is not None and y.shape[0] != n):
        rows = "N" if n is None else n
        raise DatasetError(f"{where}: {what} must be ({rows},) or ({rows}, C) to match the features, got shape "
                           f"{y.shape}")
    if y.shape[0] == 0:
        raise DatasetError(f"{where}: {what} is empty (0 rows); give one label per vertex (-1 for unlabeled)")
    n = y.shape[0]
    if y.ndim == 1:
        if np.issubdtype(y.dtype, np.floating):
            if np.isinf(y).any():
                raise DatasetError(f"{where}: {what} holds inf; class ids are integers, -1 (or NaN) for unlabeled")
            if np.any(np.isfinite(y) & (y != np.round(y))):
                raise DatasetError(f"{where}: {what} holds non-integer class ids; use an (N, C) array for multi-label")
            y = np.where(np.isnan(y), -1, y)
        y = y.astype(np.int64)
        if y.min() < -1:
            raise DatasetError(f"{where}: {what} holds class id {int(y.min())}; class ids are 0..C-1, -1 for "
                               "unlabeled")
        if not (y >= 0).any():
            raise DatasetError(f"{where}: every entry of {what} is -1 or NaN, so no vertex is labeled; "
                               "node classification needs labeled vertices")
        check_declared_size(where, f"{what} (largest class id + 1 classes, N x C logits)", n * (int(y.max()) + 1), 4,
                            fix="class ids must be 0..C-1 for the C classes (renumber them)", error=DatasetError)
        return y, byo_num_classes(where, num_classes, n) if num_classes is not None else int(y.max()) + 1
    if y.shape[1] == 0:
        raise DatasetError(f"{where}: {what} has 0 columns; a multi-hot label matrix needs one column per class")
    y = y.astype(np.float32)
    _finite(where, what.strip("'"), y, "multi-hot labels are 0 or 1")
    if y.min() < 0 or y.max() > 1:
        raise DatasetError(f"{where}: {what} is a multi-hot (N, C) matrix but holds {y.min() if y.min() < 0 else y.max():g}; "
                           "its entries must be 0 or 1 (or a probability in [0, 1])")
    if num_classes is not None and byo_num_classes(where, num_classes, n) != y.shape[1]:
        raise DatasetError(f"{where}: 'num_classes' = {int(np.asarray(num_classes).reshape(-1)[0])} but {what} has "
                           f"{y.shape[1]} columns; drop 'num_classes' (it is C for a multi-hot y) or fix it")
    return y, y.shape[1]


def load_byo(name: str, kind: str, path: Path, files: list[Path], seed: int = 0):
    a = _read_byo(kind, path, files)
    where = f"{path}" if kind == "npz" else f"{path}/<key>.npy"

    def need(key, shape):
        if key not in a:
            raise DatasetError(f"{where}: missing key '{key}' (expected {shape}); see scalegnn/datasets/README.md")
        return a[key]

    seeded = a.pop("features.json", None)
    if seeded is not None and not any(k in a for k in ("x", *SPARSE_X_KEYS)):
        from .streaming import seeded_features  # x from a seed per vertex: y gives N (and the class means)

        y_raw = np.asarray(need("y", "an (N,) int array of classes"))
        x = torch.from_numpy(seeded_features(seeded, str(path / "features.json")).matrix(y_raw))
    else:
        x = byo_features(a, where)
    n = x.shape[0]
    if n == 0:
        raise DatasetError(f"{where}: 'x' has 0 rows: the graph has no vertices; save x as an (N, F) array with "
                           "N >= 1 rows, one per vertex")
    y = need("y", f"an (N,) int array of classes with N={n}, -1 = unlabeled, or an (N, C) multi-hot array")
    y, num_classes = byo_labels(y, where, "'y'", n, a.get("num_classes"))
    undirected = byo_undirected(where, a["undirected"]) if "undirected" in a else True

    if "edge_index" in a:
        ei = np.asarray(a["edge_index"])
        if ei.ndim == 2 and ei.shape[0] != 2 and ei.shape[1] == 2:
            ei = ei.T
        if ei.ndim != 2 or ei.shape[0] != 2:
            raise DatasetError(f"{where}: 'edge_index' must be (2, E), got shape {ei.shape}")
        ei = vertex_ids(where, "edge_index", ei)
        src, dst = ei[0], ei[1]
    elif "indptr" in a and "indices" in a:
        indptr = vertex_ids(where, "indptr", a["indptr"])
        if indptr.shape != (n + 1,):
            raise DatasetError(f"{where}: 'indptr' must be ({n + 1},) for N={n} rows of x, got shape {indptr.shape}")
        dst = vertex_ids(where, "indices", a["indices"])
        if indptr[0] != 0:
            raise DatasetError(f"{where}: 'indptr' must start at 0 (row 0's first entry), got {indptr[0]}; it is the "
                               "row pointer array of a CSR matrix")
        if (np.diff(indptr) < 0).any():
            row = int(np.flatnonzero(np.diff(indptr) < 0)[0])
            raise DatasetError(f"{where}: 'indptr' must be non-decreasing (row pointers), but indptr[{row + 1}] = "
                               f"{indptr[row + 1]} < indptr[{row}] = {indptr[row]}")
        if dst.ndim != 1:
            raise DatasetError(f"{where}: 'indices' must be 1-D (nnz,), got shape {dst.shape}")
        if indptr[-1] != dst.shape[0]:
            raise DatasetError(f"{where}: indptr[-1]={indptr[-1]} but 'indices' has {dst.shape[0]} entries")
        src = np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr))
    else:
        raise DatasetError(
            f"{where}: missing key 'edge_index' (expected a (2, E) int array), "
            "or the pair 'indptr' ((N+1,) int) and 'indices' ((nnz,) int)"
        )
    if src.size and (min(src.min(), dst.min()) < 0 or max(src.max(), dst.max()) >= n):
        raise DatasetError(f"{where}: edge endpoints must be in [0, {n}) (N = rows of x)")

    w = None
    if "values" in a:
        w = _numbers(where, "values", a["values"])
        if w.shape != src.shape:
            raise DatasetError(f"{where}: 'values' must hold one weight per edge ({src.size} entries, shape "
                               f"({src.size},)), got shape {w.shape}")
        w = w.astype(np.float32)
        _finite(where, "values", w, "give every edge a finite weight")
        if (w < 0).any():
            raise DatasetError(f"{where}: 'values' holds a negative weight; the GCN normalization D^-1/2 (A+I) D^-1/2 "
                               "needs weights >= 0")
        w = None if (w == 1).all() else w  # all ones: the unweighted graph, which every system trains
    keep = src != dst
    counts = {"input_edge_pairs": int(src.size), "self_loops_dropped": int((~keep).sum())}
    if undirected and w is None:
        indptr_t, indices_t, values_t, counts = undirected_csr(src, dst, n, users=True)
    elif undirected:  # weighted: {i, j} weighs the mean of the weights given for its two directions
        indptr_t, indices_t, values_t, symmetrized = undirected_edges(src, dst, n, w)
        if symmetrized:
            counts.update(symmetrized=True, input_edges=int(src.size))
    else:
        indptr_t, indices_t, values_t = csr_from_edges(src[keep], dst[keep], n, None if w is None else w[keep])
    if w is not None:
        counts["weighted"] = True

    splits, note = byo_split(a, where, n, seed, y)
    split_note = {"split": note}

    return make_graph(
        str(path),
        indptr=indptr_t,
        indices=indices_t,
        values=values_t,
        x=x,
        y=torch.from_numpy(y),
        train_idx=splits[0],
        val_idx=splits[1],
        test_idx=splits[2],
        num_classes=num_classes,
        name=name,
        meta={"source": str(path), "format": kind, "undirected": undirected, **counts, **split_note},
    )
