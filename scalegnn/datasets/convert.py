"""Graphs that arrive as edge lists, streamed into the CSR folder that out-of-core staging
reads (:mod:`scalegnn.shards.out_of_core`), in bounded memory.

Out-of-core staging reads a ``dir:`` folder of CSR ``indptr.npy`` / ``indices.npy`` by
memory map. Three inputs hold their edges as a (2, E) or (E, 2) ``edge_index`` instead,
and are converted here first, into a folder of the same keys (:func:`convert`):

``dir:DIR`` with ``edge_index.npy``
    the project's bring-your-own folder (:mod:`.files`); its other arrays are linked in.
``npz:FILE``
    the same keys in one ``.npz``; each member is read as a stream (stored or
    deflated), never whole.
``ogbn-papers100M`` (``--data-root ROOT``)
    OGB's files as OGB ships them (``ROOT/ogbn_papers100M/raw/data.npz`` with
    ``edge_index`` and ``node_feat``, ``raw/node-label.npz`` with ``node_label``, NaN for
    the unlabeled, ``split/time/{train,valid,test}.csv.gz``), without ogb's
    ``processed/`` step, which holds the whole graph (snap-stanford/ogb#407).

The edges are streamed twice: once to count each source's edges (the row pointers,
every id checked), once to put each target in its row (a counting sort into a mapped
``indices.npy`` whose written pages are dropped after each chunk). The folder's CSR is
A as given (directed, with whatever repeats and self loops it had); staging makes it
what the in-memory reader makes of the same input (A + A^T, loops dropped, repeats
merged: :func:`scalegnn.shards.out_of_core.symmetrize`), so the shards are the ones
in-memory staging writes. Memory: N int64 counts and one chunk of edges.
"""

from __future__ import annotations

import gzip
import json
import os
import zipfile
from pathlib import Path

import numpy as np

from ..csr import runs
from ..fileio import NpyAppender, drop_pages
from ._core import DatasetError

__all__ = ["convert", "input_sizes", "OGB_RAW", "SOURCE_NOTE", "needs_conversion"]

OGB_RAW = {"ogbn-papers100M": ("ogbn_papers100M", "time", 172)}  # name -> (folder under the root, split, classes)
SOURCE_NOTE = "source.json"  # what the converted folder's own split is called in records ({"split": ...})
_NODE_KEYS = ("x", "y", "num_classes", "undirected", "train_idx", "train_mask", "val_idx", "val_mask", "valid_idx",
              "valid_mask", "test_idx", "test_mask")


def needs_conversion(name: str, path: Path | None) -> bool:
    """Whether out-of-core staging of ``name`` (``dir:``, ``npz:``, an OGB name) goes
    through :func:`convert` first."""
    kind = name.partition(":")[0].strip().lower()
    if kind == "dir":
        return path is not None and (path / "edge_index.npy").is_file() and not (path / "indptr.npy").is_file()
    return kind == "npz" or name in OGB_RAW


class _Array:
    """One .npy array read front to back as a stream of rows, from a file or a member of
    a zip (an .npz, stored or deflated): its header parsed first, then ``rows(a, b)``
    chunks in order (a second stream of the same array serves the second row of a (2, E)
    array stored row-major)."""

    def __init__(self, open_stream, where: str):
        self.open_stream, self.where = open_stream, where
        with open_stream() as f:
            version = np.lib.format.read_magic(f)
            read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
                np.lib.format.read_array_header_2_0
            shape, fortran, dtype = read_header(f)
            self.offset = f.tell()
        if dtype.hasobject:
            raise DatasetError(f"{where}: an object array (pickled); save plain numbers")
        self.shape, self.fortran, self.dtype = tuple(shape), bool(fortran), dtype

    def stream(self, skip: int = 0):
        """(file at element ``skip`` of the stored order)."""
        f = self.open_stream()
        f.seek(self.offset + skip * self.dtype.itemsize)
        return f

    def read(self, f, count: int) -> np.ndarray:
        data = f.read(count * self.dtype.itemsize)
        if len(data) != count * self.dtype.itemsize:
            raise DatasetError(f"{self.where}: the file ends early (truncated); re-copy it")
        return np.frombuffer(data, dtype=self.dtype)

    def whole(self) -> np.ndarray:
        with self.stream() as f:
            a = self.read(f, int(np.prod(self.shape)))
        return a.reshape(self.shape, order="F" if self.fortran else "C")


def _file_array(path: Path) -> _Array:
    return _Array(lambda: open(path, "rb"), str(path))


def _npz_arrays(path: Path) -> dict:
    try:
        names = zipfile.ZipFile(path).namelist()
    except (zipfile.BadZipFile, OSError) as exc:
        raise DatasetError(f"{path}: not a readable .npz ({exc}); re-copy it") from None

    def member(name):
        return lambda: zipfile.ZipFile(path).open(name)

    return {n[:-4]: _Array(member(n), f"{path}:{n[:-4]}") for n in names if n.endswith(".npy")}


def _edge_count(arr: _Array) -> tuple[int, bool]:
    """(E, whether the array is (2, E) rather than (E, 2)) of an edge_index, or a one-line error."""
    if len(arr.shape) != 2 or 2 not in arr.shape or arr.dtype.kind not in "iu":
        raise DatasetError(f"{arr.where}: 'edge_index' must be a (2, E) int array, got {arr.dtype} of shape "
                           f"{arr.shape}")
    wide = arr.shape[0] == 2
    return (arr.shape[1] if wide else arr.shape[0]), wide


def _edges(arr: _Array, chunk: int):
    """(src, dst) int64 chunks of an edge_index of shape (2, E) or (E, 2), in edge order."""
    e, wide = _edge_count(arr)
    interleaved = wide == arr.fortran  # (2, E) Fortran or (E, 2) C: pairs side by side
    if interleaved:
        with arr.stream() as f:
            for a in range(0, e, chunk):
                pair = arr.read(f, 2 * (min(e, a + chunk) - a)).reshape(-1, 2)
                yield pair[:, 0].astype(np.int64), pair[:, 1].astype(np.int64)
    else:  # all sources, then all targets: two streams
        with arr.stream() as fs, arr.stream(skip=e) as fd:
            for a in range(0, e, chunk):
                k = min(e, a + chunk) - a
                yield arr.read(fs, k).astype(np.int64), arr.read(fd, k).astype(np.int64)


def coo_to_csr(edges, n: int, out: Path, where: str) -> int:
    """``indptr.npy`` and ``indices.npy`` in ``out`` for the edges ``edges()`` yields
    ((src, dst) chunks; called twice), rows = sources; returns the entries."""
    counts = np.zeros(n, dtype=np.int64)
    for src, dst in edges():  # pass 1: each row's length, the ids checked
        for ids in (src, dst):
            if ids.size and (ids.min() < 0 or ids.max() >= n):
                bad = int(ids.min()) if ids.min() < 0 else int(ids.max())
                raise DatasetError(f"{where}: edge endpoints must be in [0, {n}) (N = rows of the node data), "
                                   f"'edge_index' holds {bad}")
        counts += np.bincount(src, minlength=n)
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    del counts
    nnz = int(indptr[-1])
    indices = np.lib.format.open_memmap(out / "indices.npy", mode="w+", dtype=np.int32 if n < 2**31 else np.int64,
                                        shape=(nnz,))
    cursor = indptr[:-1].copy()
    for src, dst in edges():  # pass 2: each target into its row, in edge order (a stable counting sort)
        order = np.argsort(src, kind="stable")
        src, dst = src[order], dst[order]
        rows, first, k = runs(src)
        indices[cursor[src] + np.arange(src.size) - np.repeat(first, k)] = dst
        cursor[rows] += k
        drop_pages(indices)  # written pages stay in the page cache (a shared map), not in this process
    indices.flush()
    del indices, cursor
    np.save(out / "indptr.npy", indptr)
    return nnz


def _link(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another filesystem
        os.symlink(src.resolve(), dst)


def _save_rows(arr: _Array, out: Path, chunk_bytes: int) -> None:
    """``arr`` (C order) copied to ``out`` a block of rows at a time."""
    if arr.fortran and len(arr.shape) > 1:
        raise DatasetError(f"{arr.where}: a Fortran-ordered feature matrix cannot be streamed by rows; save it in C "
                           "order (np.ascontiguousarray)")
    row = int(np.prod(arr.shape[1:])) if len(arr.shape) > 1 else 1
    w = NpyAppender(out, arr.dtype, arr.shape[1:])
    step = max(1, chunk_bytes // max(1, row * arr.dtype.itemsize))
    with arr.stream() as f:
        for a in range(0, arr.shape[0], step):
            k = min(arr.shape[0], a + step) - a
            w.add(arr.read(f, k * row).reshape((k,) + arr.shape[1:]))
    w.close()


def _ogb_split(root: Path, split: str, out: Path) -> None:
    for ours, theirs in (("train_idx", "train"), ("val_idx", "valid"), ("test_idx", "test")):
        path = root / "split" / split / f"{theirs}.csv.gz"
        if not path.is_file():
            raise DatasetError(f"{path} not found: OGB's split files are missing; re-download the dataset")
        with gzip.open(path, "rt") as f:
            ids = np.loadtxt(f, dtype=np.int64, ndmin=1)
        np.save(out / f"{ours}.npy", ids)


def _inputs(name: str, data_root) -> dict:
    """The arrays :func:`convert` reads for ``name``, headers parsed, nothing else read
    ({key: _Array}: edge_index, x, y, and for OGB its root), or a one-line error."""
    kind, _, rest = name.partition(":")
    kind = kind.strip().lower()
    if name in OGB_RAW:
        from .registry import default_data_root

        root = Path(data_root or default_data_root()).expanduser() / OGB_RAW[name][0]
        raw = root / "raw"
        if not (raw / "data.npz").is_file() or not (raw / "node-label.npz").is_file():
            raise DatasetError(f"{raw}/data.npz and node-label.npz not found: put OGB's {name} files there (as OGB "
                               "ships them) or pass --data-root")
        arrays = _npz_arrays(raw / "data.npz")
        if "edge_index" not in arrays or "node_feat" not in arrays:
            raise DatasetError(f"{raw}/data.npz lacks edge_index or node_feat: not OGB's {name} file; re-download it")
        label = _npz_arrays(raw / "node-label.npz").get("node_label")
        if label is None:
            raise DatasetError(f"{raw}/node-label.npz lacks node_label; re-download it")
        return {"edge_index": arrays["edge_index"], "x": arrays["node_feat"], "y": label, "root": root,
                "where": str(raw / "data.npz")}
    if kind == "npz":
        path = Path(rest.strip()).expanduser()
        if not path.is_file():
            raise DatasetError(f"npz: file not found: {path}; pass npz:<path to an existing .npz file>")
        arrays = _npz_arrays(path)
        if "edge_index" not in arrays:
            raise DatasetError(f"{path}: out-of-core staging streams 'edge_index' (2, E); the file has "
                               f"{', '.join(sorted(arrays)) or 'no arrays'}")
        sparse = [k for k in ("x_indptr", "x_indices", "x_data") if k in arrays]
        if sparse:
            raise DatasetError(f"{path}: out-of-core staging reads dense features (x); the file holds sparse ones "
                               f"({sparse[0]}): stage it without --memory-budget (in memory)")
        if "y" not in arrays:
            raise DatasetError(f"{path}: out-of-core staging needs 'y' (class ids, -1 unlabeled)")
        return {**arrays, "path": path, "where": str(path)}
    if kind == "dir":
        path = Path(rest.strip()).expanduser()
        if not (path / "y.npy").is_file():
            raise DatasetError(f"{path}: out-of-core staging needs y.npy (class ids, -1 unlabeled)")
        found = {k: _file_array(path / f"{k}.npy") for k in ("edge_index", "x", "y") if (path / f"{k}.npy").is_file()}
        return {**found, "path": path, "where": str(path / "edge_index.npy")}
    raise DatasetError(f"{name!r}: out-of-core staging converts dir: folders with edge_index.npy, npz: files and "
                       f"{', '.join(OGB_RAW)}; stage it without --memory-budget (in memory)")


def input_sizes(name: str, data_root=None) -> dict:
    """What :func:`scalegnn.shards.out_of_core.memory_plan` needs of ``name``, from the
    arrays' headers: N, at most 2E stored entries once symmetric, F (1 when the features
    are seeded), C (32: what a count would cost to read)."""
    a = _inputs(name, data_root)
    e = _edge_count(a["edge_index"])[0]
    return {"n": a["y"].shape[0], "nnz": 2 * int(e), "num_features": a["x"].shape[1] if "x" in a else 1,
            "num_classes": 32}


def convert(name: str, out: Path, *, data_root: Path | None = None, chunk: int = 1 << 22) -> Path:
    """The CSR folder (``indptr.npy``, ``indices.npy`` and the node arrays) of ``name`` in
    ``out`` (module docstring), ``chunk`` edges at a time; returns ``out``. Bad input is
    refused before ``out`` is made."""
    a = _inputs(name, data_root)
    edge_index, where = a["edge_index"], a["where"]
    n = a["y"].shape[0]
    out.mkdir(parents=True, exist_ok=True)
    if name in OGB_RAW:
        _, split, classes = OGB_RAW[name]
        _save_rows(a["x"], out / "x.npy", chunk * 8)
        y = a["y"].whole().reshape(-1).astype(np.float64)
        np.save(out / "y.npy", np.where(np.isnan(y), -1, y).astype(np.int64))
        _ogb_split(a["root"], split, out)
        np.save(out / "num_classes.npy", np.int64(classes))
        (out / SOURCE_NOTE).write_text(json.dumps({"split": f"ogb {split}"}))  # as the in-memory loader says it
    elif "path" in a and a["path"].is_file():  # npz: its node arrays written as .npy files
        for key in _NODE_KEYS:
            if key in a:
                if key == "x":
                    _save_rows(a[key], out / "x.npy", chunk * 8)
                else:
                    np.save(out / f"{key}.npy", a[key].whole())
    else:  # a dir: folder's node arrays linked in
        for f in a["path"].iterdir():
            if f.suffix == ".npy" and f.stem in _NODE_KEYS or f.name in ("features.json", "x.npz"):
                _link(f, out / f.name)
    coo_to_csr(lambda: _edges(edge_index, chunk), n, out, where)
    return out
