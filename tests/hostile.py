"""Hostile inputs as data: the table of bad inputs (and, in the same form, faults) that
``tests/unit/test_hostile.py`` runs, one row per case, so that every bug found adds a
row and the count grows.

A :class:`Case` is: a name, its ``kind`` (``input``: a bad file, value or flag; ``fault``:
something that happens to a running job, run by the fault suites), a ``category``, a
``build`` function that writes whatever the case needs under a fresh folder and returns
the ``scalegnn`` command line (run in-process through :func:`scalegnn.cli.main`), and
``expect``: fragments the one-line error must hold (each naming the file, key or flag,
or the fix). Pickle cases also name a canary file that a crafted payload would create
if any code from the file ran.

The runner asserts for every bad input: a non-zero exit, exactly one line on stderr
(``scalegnn: error: ...``, no traceback), every fragment in it, and the canary absent.

Categories: ``size`` (a declared size checked before memory is spent), ``value``
(non-finite or out-of-range numbers), ``type`` (wrong dtype or shape), ``csr``
(malformed row pointers and column ids), ``layout`` (another file layout, a missing or
unknown key), ``flag`` (a command-line value), ``checkpoint`` (checkpoint metadata),
``pickle`` (a crafted pickle: refused, no code run), ``text`` (edge-list and Matrix
Market text).
"""

from __future__ import annotations

import json
import os
import pickle
import random
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from tests.runs import TINY

CANARY = "CANARY-code-ran"


def _junk(n: int, seed: int) -> bytes:
    """``n`` random bytes, the same every run: a case that fails does so again."""
    return random.Random(seed).randbytes(n)


@dataclass(frozen=True)
class Case:
    name: str
    category: str
    build: Callable[[Path], list[str]]
    expect: tuple[str, ...]
    kind: str = "input"  # or "fault" (the fault suites: signals, disks, locks, ports)
    canary: bool = False  # a crafted payload would create <folder>/CANARY if it ran
    notes: str = ""
    command: str = ""  # the scalegnn command it runs ("train", "data info", "export", ...): the counts' rows
    env: tuple[tuple[str, str], ...] = ()  # environment variables set for the case (a launcher's RANK, ...)

    def __post_init__(self):
        if not self.command:  # the rows of the first rounds: train's flags and checkpoints, else `data info`'s files
            object.__setattr__(self, "command", "train" if self.category in ("flag", "checkpoint") else "data info")


CASES: list[Case] = []


def case(name: str, category: str, build, *expect: str, **kw) -> None:
    CASES.append(Case(name, category, build, tuple(expect), **kw))


# ---------------------------------------------------------------- builders
N = 8


def base_graph() -> dict:
    """A valid bring-your-own graph: a ring of 8 vertices, 4 features, 3 classes."""
    src = np.arange(N)
    return {
        "edge_index": np.stack([src, (src + 1) % N]).astype(np.int64),
        "x": np.random.default_rng(0).standard_normal((N, 4)).astype(np.float32),
        "y": (np.arange(N) % 3).astype(np.int64),
    }


_DROP = object()


def _arrays(changes: dict) -> dict:
    a = base_graph()
    for key, value in changes.items():
        if value is _DROP:
            a.pop(key, None)
        else:
            a[key] = value
    return a


def info(tmp: Path, dataset: str) -> list[str]:
    return ["data", "info", dataset, "--data-root", str(tmp)]


def npz(**changes):
    """Build: the base graph with ``changes`` (``_DROP`` removes a key) as ``npz:``."""
    def build(tmp: Path) -> list[str]:
        path = tmp / "g.npz"
        np.savez(path, **_arrays(changes))
        return info(tmp, f"npz:{path}")
    return build


def _npy_folder(tmp: Path, changes: dict) -> Path:
    """``tmp/g``: the valid graph with ``changes`` (:func:`_arrays`) as a ``dir:`` folder,
    one ``<key>.npy`` per key."""
    d = tmp / "g"
    d.mkdir()
    for key, value in _arrays(changes).items():
        np.save(d / f"{key}.npy", value)
    return d


def folder(**changes):
    """Build: the same as ``dir:``, one ``<key>.npy`` per key."""
    def build(tmp: Path) -> list[str]:
        return info(tmp, f"dir:{_npy_folder(tmp, changes)}")
    return build


def both(name: str, category: str, changes: dict, *expect: str) -> None:
    """One case as ``npz:`` and one as ``dir:``."""
    case(f"npz {name}", category, npz(**changes), *expect)
    case(f"dir {name}", category, folder(**changes), *expect)


def csr_parts(indptr, indices):
    return {"edge_index": _DROP, "indptr": np.asarray(indptr), "indices": np.asarray(indices)}


def sparse_x(indptr=None, indices=None, data=None, shape=None, drop=()):
    """Sparse features (the four ``x_*`` arrays) of a diagonal 8 x 4 matrix, some replaced."""
    parts = {"x": _DROP,
             "x_indptr": np.arange(N + 1, dtype=np.int64) if indptr is None else np.asarray(indptr),
             "x_indices": (np.arange(N) % 4).astype(np.int64) if indices is None else np.asarray(indices),
             "x_data": np.ones(N, dtype=np.float32) if data is None else np.asarray(data),
             "x_shape": np.array([N, 4]) if shape is None else np.asarray(shape)}
    for key in drop:
        parts[key] = _DROP
    return parts


def write(name: str, content, dataset: str):
    """Build: one file ``name`` (text or bytes) and the dataset ``dataset`` (``{path}`` filled in)."""
    def build(tmp: Path) -> list[str]:
        path = tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        (path.write_bytes if isinstance(content, bytes) else path.write_text)(content)
        return info(tmp, dataset.format(path=path))
    return build


def beside(kind: str, array, graph: str = "1 2\n2 3\n3 4\n4 5\n5 6\n6 7\n7 0\n0 1\n"):
    """Build: an edge list with a features or labels file beside it."""
    def build(tmp: Path) -> list[str]:
        path = tmp / "g.txt"
        path.write_text(graph)
        np.save(tmp / f"g.{kind}.npy", array)
        return info(tmp, f"edgelist:{path}")
    return build


class _Payload:
    """Pickles as a call of ``os.system`` that would create the canary file."""

    def __init__(self, folder: Path):
        self.folder = folder

    def __reduce__(self):
        return os.system, (f"touch {self.folder / CANARY}",)


# ---------------------------------------------------------------- bring your own arrays
# features
both("x of strings", "type", {"x": np.array([["a"] * 4] * N)}, "'x'", "numbers")
both("x with 0 columns", "size", {"x": np.zeros((N, 0), np.float32)}, "'x'", "0 columns")
both("x complex", "type", {"x": np.ones((N, 4), np.complex64)}, "'x'", "complex")
both("x with NaN", "value", {"x": np.full((N, 4), np.nan, np.float32)}, "NaN")
both("x with inf", "value", {"x": np.full((N, 4), np.inf, np.float32)}, "NaN or inf")
both("x 1-D", "type", {"x": np.ones(N, np.float32)}, "'x'", "(N, F)")
both("x 3-D", "type", {"x": np.ones((N, 2, 2), np.float32)}, "'x'", "(N, F)")
both("x 0 rows", "size", {"x": np.zeros((0, 4), np.float32)}, "'x'", "0 rows")
both("x rows != y rows", "type", {"x": np.ones((N + 2, 4), np.float32)}, "'y'", "shape")
both("x of timestamps", "type", {"x": np.zeros((N, 4), "datetime64[s]")}, "'x'", "numbers")
both("x void bytes", "type", {"x": np.zeros((N, 4), "V4")}, "'x'", "numbers")
# labels
both("y of strings", "type", {"y": np.array(["a"] * N)}, "'y'", "numbers")
both("y fractional", "value", {"y": np.linspace(0, 1, N)}, "'y'", "non-integer")
both("y complex", "type", {"y": np.ones(N, np.complex64)}, "'y'", "complex")
both("y below -1", "value", {"y": np.full(N, -5)}, "'y'", "-5")
both("y all unlabeled", "value", {"y": np.full(N, -1)}, "'y'", "no vertex is labeled")
both("y 3-D", "type", {"y": np.zeros((N, 2, 2))}, "'y'", "shape")
both("y wrong length", "type", {"y": np.zeros(N + 3, np.int64)}, "'y'", "shape")
both("y inf", "value", {"y": np.full(N, np.inf)}, "'y'", "inf")
both("multi-hot y with NaN", "value", {"y": np.where(np.eye(N, 3) > 0, np.nan, 0)}, "'y'", "NaN")
both("multi-hot y with inf", "value", {"y": np.where(np.eye(N, 3) > 0, np.inf, 0)}, "'y'", "inf")
both("multi-hot y with 2", "value", {"y": np.eye(N, 3) * 2}, "'y'", "0 or 1")
both("multi-hot y with -1", "value", {"y": -np.eye(N, 3)}, "'y'", "0 or 1")
both("multi-hot y 0 columns", "size", {"y": np.zeros((N, 0))}, "'y'", "0 columns")
both("y bool", "type", {"y": np.ones(N, bool)}, "'y'", "bool")
both("y huge class id", "size", {"y": np.array([10**12] + [0] * (N - 1))}, "'y'", "budget")
# num_classes
both("num_classes vector", "type", {"num_classes": np.array([3, 4])}, "'num_classes'", "one integer")
both("num_classes 3.7", "type", {"num_classes": np.array(3.7)}, "'num_classes'", "3.7")
both("num_classes 1e12", "size", {"num_classes": np.array(10**12)}, "'num_classes'", "budget")
both("num_classes 0", "value", {"num_classes": np.array(0)}, "'num_classes'", ">= 1")
both("num_classes -3", "value", {"num_classes": np.array(-3)}, "'num_classes'", ">= 1")
both("num_classes string", "type", {"num_classes": np.array("3")}, "'num_classes'", "one integer")
both("num_classes NaN", "type", {"num_classes": np.array(np.nan)}, "'num_classes'", "nan")
both("num_classes below max(y)+1", "value", {"num_classes": np.array(2)}, "num_classes", "label 2")
both("num_classes bool", "type", {"num_classes": np.array(True)}, "'num_classes'", "one integer")
both("num_classes != multi-hot columns", "value", {"y": np.eye(N, 3), "num_classes": np.array(5)},
     "'num_classes'", "3 columns")
# undirected
both("undirected vector", "type", {"undirected": np.array([True, False])}, "'undirected'", "one boolean")
both("undirected 'false'", "type", {"undirected": np.array("false")}, "'undirected'", "one boolean")
both("undirected 2", "value", {"undirected": np.array(2)}, "'undirected'", "one boolean")
both("undirected 0.5", "value", {"undirected": np.array(0.5)}, "'undirected'", "one boolean")
both("undirected NaN", "value", {"undirected": np.array(np.nan)}, "'undirected'", "one boolean")
# edge_index
both("edge_index strings", "type", {"edge_index": np.array([["0", "1"], ["1", "2"]])}, "'edge_index'", "dtype")
both("edge_index fractional", "value", {"edge_index": np.array([[0.5, 1], [1, 2]])}, "'edge_index'", "non-integer")
both("edge_index NaN", "value", {"edge_index": np.array([[np.nan, 1], [1, 2]])}, "'edge_index'", "non-integer")
both("edge_index negative", "value", {"edge_index": np.array([[-1, 1], [1, 2]])}, "edge", "[0, 8)")
both("edge_index out of range", "value", {"edge_index": np.array([[0, 1], [1, 99]])}, "edge", "[0, 8)")
both("edge_index 3 rows", "type", {"edge_index": np.zeros((3, 5), np.int64)}, "'edge_index'", "(2, E)")
both("edge_index 1-D", "type", {"edge_index": np.zeros(6, np.int64)}, "'edge_index'", "(2, E)")
both("edge_index complex", "type", {"edge_index": np.ones((2, 3), np.complex64)}, "'edge_index'", "dtype")
both("edge_index bool", "type", {"edge_index": np.ones((2, 3), bool)}, "'edge_index'", "dtype")
both("edge_index 2**62", "value", {"edge_index": np.array([[0, 2**62], [1, 2]])}, "edge", "[0, 8)")
both("edge_index 3-D", "type", {"edge_index": np.zeros((2, 2, 2), np.int64)}, "'edge_index'", "(2, E)")
# CSR adjacency
both("indptr decreasing", "csr", csr_parts([0, 2, 1, 3, 3, 3, 3, 3, 3], [1, 2, 3]), "'indptr'",
     "non-decreasing")
both("indptr not from 0", "csr", csr_parts([1, 2, 3, 3, 3, 3, 3, 3, 3], [1, 2, 3]), "'indptr'", "start at 0")
both("indptr wrong length", "csr", csr_parts([0, 1, 2], [1, 2]), "'indptr'", "(9,)")
both("indptr end != nnz", "csr", csr_parts([0, 1, 2, 3, 3, 3, 3, 3, 5], [1, 2, 3]), "indptr[-1]", "'indices'")
both("indptr fractional", "csr", csr_parts(np.array([0, 1.5, 2, 3, 3, 3, 3, 3, 3]), [1, 2, 3]), "'indptr'",
     "non-integer")
both("indptr 2-D", "csr", csr_parts(np.zeros((3, 3), np.int64), [1, 2, 3]), "'indptr'", "(9,)")
both("indptr strings", "csr", csr_parts(np.array(["0"] * 9), [1, 2, 3]), "'indptr'", "dtype")
both("indices out of range", "csr", csr_parts([0, 1, 2, 3, 3, 3, 3, 3, 3], [1, 2, 30]), "[0, 8)")
both("indices negative", "csr", csr_parts([0, 1, 2, 3, 3, 3, 3, 3, 3], [1, -2, 3]), "[0, 8)")
both("indptr without indices", "layout", {"edge_index": _DROP, "indptr": np.arange(N + 1)}, "'indices'")
both("indptr negative", "csr", csr_parts([0, -1, 2, 3, 3, 3, 3, 3, 3], [1, 2, 3]), "'indptr'", "non-decreasing")
# edge weights (kept with undirected=False)
both("values wrong length", "type", {"undirected": np.array(False), "values": np.ones(3, np.float32)},
     "'values'", "8 entries")
both("values NaN", "value", {"undirected": np.array(False), "values": np.full(N, np.nan)}, "'values'", "NaN")
both("values inf", "value", {"undirected": np.array(False), "values": np.full(N, np.inf)}, "'values'", "NaN or inf")
both("values strings", "type", {"undirected": np.array(False), "values": np.array(["1"] * N)}, "'values'",
     "numbers")
both("values 2-D", "type", {"undirected": np.array(False), "values": np.ones((N, 2))}, "'values'", "8 entries")
both("values complex", "type", {"undirected": np.array(False), "values": np.ones(N, np.complex64)}, "'values'",
     "complex")
# sparse features
both("x_shape 1e12 columns", "size", sparse_x(shape=[N, 10**12]), "x_shape", "budget")
both("x_shape 1e12 rows", "size", sparse_x(shape=[10**12, 4]), "x_shape", "budget")
both("x_shape negative", "value", sparse_x(shape=[N, -4]), "x_shape", "two sizes")
both("x_shape three entries", "type", sparse_x(shape=[N, 4, 1]), "x_shape", "two integers")
both("x_shape float", "type", sparse_x(shape=np.array([8.0, 4.0])), "x_shape", "two integers")
both("x_shape 0 columns", "size", sparse_x(shape=[N, 0], indices=np.zeros(0, np.int64),
                                           indptr=np.zeros(N + 1, np.int64), data=np.zeros(0, np.float32)),
     "0 columns")
both("x_indptr decreasing", "csr", sparse_x(indptr=[0, 2, 1, 3, 4, 5, 6, 7, 8]), "'indptr'", "without decreasing")
both("x_indices out of range", "csr", sparse_x(indices=np.full(N, 7)), "column id 7", "[0, 4)")
both("x_data NaN", "value", sparse_x(data=np.full(N, np.nan, np.float32)), "NaN or inf")
both("x_data strings", "type", sparse_x(data=np.array(["1"] * N)), "'x_data'", "numbers")
both("x_data complex", "type", sparse_x(data=np.ones(N, np.complex64)), "'x_data'", "complex")
both("sparse x without x_data", "layout", sparse_x(drop=("x_data",)), "missing x_data")
both("sparse x and dense x", "layout", {**sparse_x(), "x": np.ones((N, 4), np.float32)}, "both 'x'")
both("x_indptr float", "csr", sparse_x(indptr=np.arange(N + 1) * 1.0), "'indptr'", "integers")
# splits
_SPLIT = {"train_idx": np.array([0, 1, 2]), "val_idx": np.array([3, 4]), "test_idx": np.array([5, 6, 7])}
both("train_idx out of range", "value", {**_SPLIT, "train_idx": np.array([0, 99])}, "train_idx", "[0, 8)")
both("train_idx negative", "value", {**_SPLIT, "train_idx": np.array([-1, 2])}, "train_idx", "[0, 8)")
both("train_idx fractional", "value", {**_SPLIT, "train_idx": np.array([0.5, 2])}, "'train_idx'", "non-integer")
both("train_idx strings", "type", {**_SPLIT, "train_idx": np.array(["0", "1"])}, "'train_idx'", "dtype")
both("only one split", "layout", {"train_idx": np.array([0, 1])}, "'val_idx'", "all three splits")
both("train_mask wrong length", "type", {"train_mask": np.ones(3, bool), "val_mask": np.ones(N, bool),
                                         "test_mask": np.ones(N, bool)}, "'train_mask'", "(8,)")
both("empty test split", "value", {**_SPLIT, "test_idx": np.zeros(0, np.int64)}, "test_idx is empty")
both("train vertex unlabeled", "value", {**_SPLIT, "y": np.array([-1, 1, 2, 0, 1, 2, 0, 1])}, "train_idx",
     "unlabeled")
both("train_mask of 2s", "value", {"train_mask": np.full(N, 2), "val_mask": np.ones(N, bool),
                                   "test_mask": np.ones(N, bool)}, "'train_mask'", "bool")
# layouts
both("no edges at all", "layout", {"edge_index": _DROP}, "'edge_index'", "'indptr'")
both("no y", "layout", {"y": _DROP}, "'y'")
both("no x", "layout", {"x": _DROP}, "'x'")

_PPNP = {"adj_matrix.data": np.ones(3, np.float32), "adj_matrix.indices": np.array([1, 2, 0]),
         "adj_matrix.indptr": np.array([0, 1, 2, 3]), "adj_matrix.shape": np.array([3, 3]),
         "attr_matrix.data": np.ones(3, np.float32), "attr_matrix.indices": np.array([0, 1, 2]),
         "attr_matrix.indptr": np.array([0, 1, 2, 3]), "attr_matrix.shape": np.array([3, 3]),
         "labels": np.array([0, 1, 0]), "idx_to_node": np.array([{"a": 1}], dtype=object),
         "class_names": np.array(["x", "y"], dtype=object)}


def _npz_of(arrays: dict):
    def build(tmp: Path) -> list[str]:
        path = tmp / "g.npz"
        np.savez(path, **arrays)
        return info(tmp, f"npz:{path}")
    return build


case("npz in PPNP's layout (adj_matrix.*, attr_matrix.*, pickled metadata)", "layout", _npz_of(_PPNP),
     "expected keys", "adj_matrix.data", "found")
case("npz with only unknown keys", "layout", _npz_of({"a": np.ones(3), "b": np.ones(3)}), "expected keys",
     "found: a, b")
case("npz with an object array under a known key", "pickle",
     lambda tmp: _npz_of({**base_graph(), "y": np.array([_Payload(tmp)], dtype=object)})(tmp), "'y'", "pickled",
     canary=True)
case("empty npz", "layout", _npz_of({}), "expected keys")
case("npz of random bytes", "layout", write("g.npz", _junk(256, 1), "npz:{path}"), "g.npz")
case("npz truncated", "layout", lambda tmp: _truncated_npz(tmp), "g.npz")
case("npz with an npy header claiming 1e12 rows", "size", lambda tmp: _npz_bomb(tmp), "'x'", "declares")
case("dir: .npy header claiming 1e12 rows", "size", lambda tmp: _npy_bomb(tmp), "x.npy", "declares")
case("dir: empty folder", "layout", lambda tmp: info(tmp, f"dir:{(tmp / 'e').mkdir() or tmp / 'e'}"),
     "none of the expected files")
case("dir: x.npy of a pickled object", "pickle", lambda tmp: _dir_pickle(tmp), "x.npy", "pickled", canary=True)
case("npz zip bomb (member declares 1e12 bytes)", "size", lambda tmp: _zip_bomb(tmp), "declares")


def _truncated_npz(tmp: Path) -> list[str]:
    path = tmp / "g.npz"
    np.savez(path, **base_graph())
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return info(tmp, f"npz:{path}")


def _npy_header(shape, dtype="<f4") -> bytes:
    import io

    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": dtype, "fortran_order": False, "shape": shape})
    return buf.getvalue()


def _npz_bomb(tmp: Path) -> list[str]:
    import zipfile

    path = tmp / "g.npz"
    with zipfile.ZipFile(path, "w") as z:
        for key, value in base_graph().items():
            if key == "x":
                z.writestr("x.npy", _npy_header((10**12, 4)) + b"\0" * 64)
            else:
                import io

                buf = io.BytesIO()
                np.save(buf, value)
                z.writestr(f"{key}.npy", buf.getvalue())
    return info(tmp, f"npz:{path}")


def _npy_bomb(tmp: Path) -> list[str]:
    d = _npy_folder(tmp, {})
    (d / "x.npy").write_bytes(_npy_header((10**12, 4)) + b"\0" * 64)
    return info(tmp, f"dir:{d}")


def _zip_bomb(tmp: Path) -> list[str]:
    import zipfile

    path = tmp / "g.npz"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for key, value in base_graph().items():
            import io

            buf = io.BytesIO()
            np.save(buf, value)
            z.writestr(f"{key}.npy", buf.getvalue())
    # Patch the central directory's uncompressed size of the first member to 1e12 - 1.
    data = bytearray(path.read_bytes())
    at = data.rfind(b"PK\x01\x02")
    first = data.find(b"PK\x01\x02")
    assert at >= 0 and first >= 0
    import struct

    data[first + 24: first + 28] = struct.pack("<I", 0xFFFFFFFE)
    path.write_bytes(bytes(data))
    return info(tmp, f"npz:{path}")


def _dir_pickle(tmp: Path) -> list[str]:
    d = _npy_folder(tmp, {})
    np.save(d / "x.npy", np.array([_Payload(tmp)], dtype=object), allow_pickle=True)
    return info(tmp, f"dir:{d}")


def _dir_sparse_x(**members):
    """Build: ``dir:`` whose features are ``x.npz`` (scipy.sparse.save_npz's keys), some
    members replaced (bytes: the raw member written as is)."""
    def build(tmp: Path) -> list[str]:
        import io
        import zipfile

        d = _npy_folder(tmp, {"x": _DROP})
        parts = {"format": np.array(b"csr"), "shape": np.array([N, 4]), "indptr": np.arange(N + 1),
                 "indices": np.arange(N) % 4, "data": np.ones(N, np.float32)}
        parts.update(members)
        with zipfile.ZipFile(d / "x.npz", "w") as z:
            for key, value in parts.items():
                if isinstance(value, bytes):
                    z.writestr(f"{key}.npy", value)
                    continue
                buf = io.BytesIO()
                np.save(buf, value, allow_pickle=True)
                z.writestr(f"{key}.npy", buf.getvalue())
        return info(tmp, f"dir:{d}")
    return build


case("dir: x.npz in COO format", "layout", _dir_sparse_x(format=np.array(b"coo")), "x.npz", "save_npz")
case("dir: x.npz without data", "layout", lambda tmp: _drop_member(tmp), "x.npz", "save_npz")
case("dir: x.npz member header claiming 1e12 entries", "size",
     _dir_sparse_x(data=_npy_header((10**12,)) + b"\0" * 64), "x.npz", "declares")
case("dir: x.npz with a pickled member", "pickle",
     lambda tmp: _dir_sparse_x(data=np.array([_Payload(tmp)], dtype=object))(tmp), "x.npz", "pickled", canary=True)
case("dir: x.npz shape 1e12 columns", "size", _dir_sparse_x(shape=np.array([N, 10**12])), "x_shape", "budget")
case("dir: x.npz data NaN", "value", _dir_sparse_x(data=np.full(N, np.nan, np.float32)), "NaN or inf")
case("dir: x.npz of random bytes", "layout", lambda tmp: _random_x_npz(tmp), "x.npz")


def _drop_member(tmp: Path) -> list[str]:
    argv = _dir_sparse_x()(tmp)
    import zipfile

    src = tmp / "g" / "x.npz"
    data = {n: zipfile.ZipFile(src).read(n) for n in zipfile.ZipFile(src).namelist() if n != "data.npy"}
    with zipfile.ZipFile(src, "w") as z:
        for n, b in data.items():
            z.writestr(n, b)
    return argv


def _random_x_npz(tmp: Path) -> list[str]:
    argv = _dir_sparse_x()(tmp)
    (tmp / "g" / "x.npz").write_bytes(_junk(200, 2))
    return argv


# ---------------------------------------------------------------- node data beside a graph file
case("features beside: 0 columns", "size", beside("features", np.zeros((N, 0), np.float32)), "features", "0 columns")
case("features beside: strings", "type", beside("features", np.array([["a"]] * N)), "features", "numbers")
case("features beside: NaN", "value", beside("features", np.full((N, 3), np.nan, np.float32)), "NaN")
case("features beside: complex", "type", beside("features", np.ones((N, 3), np.complex64)), "features", "complex")
case("features beside: 1-D", "type", beside("features", np.ones(N, np.float32)), "features", "(N, F)")
case("features beside: too few rows", "value", beside("features", np.ones((3, 2), np.float32)), "vertex id",
     "3 rows")
case("features beside: header claiming 1e12 rows", "size",
     lambda tmp: _beside_bomb(tmp), "declares")
case("labels beside: strings", "type", beside("labels", np.array(["a"] * N)), "labels", "numbers")
case("labels beside: fractional", "value", beside("labels", np.linspace(0, 1, N)), "labels", "non-integer")
case("labels beside: NaN multi-hot", "value", beside("labels", np.where(np.eye(N, 3) > 0, np.nan, 0)), "labels",
     "NaN")
case("labels beside: 3-D", "type", beside("labels", np.zeros((N, 2, 2))), "labels", "shape")
case("labels beside: all -1", "value", beside("labels", np.full(N, -1)), "labels", "no vertex is labeled")
case("labels beside: object array", "pickle",
     lambda tmp: _beside_pickle(tmp), "labels.npy", "pickled", canary=True)


def _beside_bomb(tmp: Path) -> list[str]:
    path = tmp / "g.txt"
    path.write_text("0 1\n1 2\n")
    (tmp / "g.features.npy").write_bytes(_npy_header((10**12, 4)) + b"\0" * 64)
    return info(tmp, f"edgelist:{path}")


def _beside_pickle(tmp: Path) -> list[str]:
    path = tmp / "g.txt"
    path.write_text("0 1\n1 2\n")
    np.save(tmp / "g.labels.npy", np.array([_Payload(tmp)], dtype=object), allow_pickle=True)
    return info(tmp, f"edgelist:{path}")


# ---------------------------------------------------------------- Matrix Market and edge lists
MTX = "%%MatrixMarket matrix coordinate pattern general\n"
case("mtx header claiming 1e12 rows (60 bytes)", "size",
     write("g.mtx", MTX + "1000000000000 1000000000000 1\n1 2\n", "mtx:{path}"), "g.mtx", "rows", "declares")
case("mtx header claiming 1e12 entries", "size",
     write("g.mtx", MTX + "4 4 1000000000000\n1 2\n", "mtx:{path}"), "g.mtx", "entries", "declares")
case("mtx header claiming more entries than lines", "size",
     write("g.mtx", MTX + "4 4 5000\n1 2\n2 3\n", "mtx:{path}"), "g.mtx", "entries")
case("mtx non-square", "type", write("g.mtx", MTX + "3 4 1\n1 2\n", "mtx:{path}"), "g.mtx", "square")
case("mtx negative size", "value", write("g.mtx", MTX + "-3 -3 1\n1 2\n", "mtx:{path}"), "g.mtx")
case("mtx array format", "layout",
     write("g.mtx", "%%MatrixMarket matrix array real general\n2 2\n1\n2\n3\n4\n", "mtx:{path}"), "g.mtx",
     "coordinate")
case("mtx garbage header", "layout", write("g.mtx", "hello world\n1 2\n", "mtx:{path}"), "g.mtx")
case("mtx entry out of range", "value", write("g.mtx", MTX + "3 3 1\n1 9\n", "mtx:{path}"), "g.mtx")
case("mtx entry 0 (1-based)", "value", write("g.mtx", MTX + "3 3 1\n0 1\n", "mtx:{path}"), "g.mtx")
case("mtx fractional index", "value", write("g.mtx", MTX + "3 3 1\n1.5 2\n", "mtx:{path}"), "g.mtx")
case("mtx too few entries", "layout", write("g.mtx", MTX + "3 3 3\n1 2\n", "mtx:{path}"), "g.mtx")
case("mtx empty file", "layout", write("g.mtx", "", "mtx:{path}"), "g.mtx")
case("mtx binary junk", "layout", write("g.mtx", _junk(300, 3), "mtx:{path}"), "g.mtx")
case("mtx header of words", "layout", write("g.mtx", MTX + "three three one\n1 2\n", "mtx:{path}"), "g.mtx")
case("edge list of words", "text", write("g.txt", "a b\nc d\ne f\n", "edgelist:{path}"), "g.txt", "line")
case("edge list negative id", "value", write("g.txt", "0 1\n-4 2\n", "edgelist:{path}"), "g.txt", "negative")
case("edge list empty", "text", write("g.txt", "", "edgelist:{path}"), "g.txt", "no edges")
case("edge list one column", "text", write("g.txt", "1\n2\n3\n", "edgelist:{path}"), "g.txt")
case("edge list fractional ids", "text", write("g.txt", "0 1\n1.5 2\n", "edgelist:{path}"), "g.txt", "line")
case("edge list only comments", "text", write("g.txt", "# a\n% b\n", "edgelist:{path}"), "g.txt", "no edges")
case("edge list binary junk", "text", write("g.txt", bytes(range(256)) * 4, "edgelist:{path}"), "g.txt")
case("edge list id 2**70", "value", write("g.txt", f"0 1\n1 {2**70}\n", "edgelist:{path}"), "g.txt", "line 2",
     "64 bits")
case("edgelist: missing file", "layout", lambda tmp: info(tmp, f"edgelist:{tmp / 'nope.txt'}"), "nope.txt")
case("mtx: missing file", "layout", lambda tmp: info(tmp, f"mtx:{tmp / 'nope.mtx'}"), "nope.mtx")
case("npz: missing file", "layout", lambda tmp: info(tmp, f"npz:{tmp / 'nope.npz'}"), "nope.npz")
case("dir: missing folder", "layout", lambda tmp: info(tmp, f"dir:{tmp / 'nope'}"), "nope")


# ---------------------------------------------------------------- Planetoid pickles
def _planetoid(**replace):
    """Build: a valid 6-vertex Planetoid copy ``ind.cora.*`` with some parts replaced
    (a value: the object pickled; bytes: the file's content)."""
    def build(tmp: Path) -> list[str]:
        import scipy.sparse as sp

        d = tmp / "planetoid_cora"
        d.mkdir()
        eye = np.eye(3, dtype=np.float32)
        parts = {"x": sp.csr_matrix(np.ones((2, 3), np.float32)), "tx": sp.csr_matrix(np.ones((2, 3), np.float32)),
                 "allx": sp.csr_matrix(np.ones((4, 3), np.float32)), "y": eye[:2], "ty": eye[:2],
                 "ally": np.vstack([eye, eye[:1]]),
                 "graph": {0: [1], 1: [2], 2: [3], 3: [4], 4: [5], 5: [0]}}
        parts.update(replace)
        for part, value in parts.items():
            data = value if isinstance(value, bytes) else pickle.dumps(value, protocol=4)
            (d / f"ind.cora.{part}").write_bytes(data)
        (d / "ind.cora.test.index").write_text("4\n5\n")
        return info(tmp, "cora")
    return build


def _memo_bomb() -> bytes:
    """A graph dict whose 2,000 rows share one memoized list of 100,000 ids: 2e8 entries
    from a file of a few hundred KiB (the issue's 2 MB file expanded to 2.7e9)."""
    shared = list(range(100_000))
    return pickle.dumps({i: shared for i in range(2_000)}, protocol=2)


def _planetoid_payload(part: str):
    def build(tmp: Path) -> list[str]:
        argv = _planetoid()(tmp)
        (tmp / "planetoid_cora" / f"ind.cora.{part}").write_bytes(pickle.dumps(_Payload(tmp), protocol=2))
        return argv
    return build


case("Planetoid graph of memoized shared lists (pickle expansion)", "size", _planetoid(graph=_memo_bomb()),
     "ind.cora.graph", "expands")
case("Planetoid graph holding itself (a cyclic pickle)", "size", lambda tmp: _planetoid(graph=_cyclic())(tmp),
     "ind.cora.graph",
     "contains itself")
case("Planetoid features CSR declaring 1e6 x 1e6 (dense 4 TB)", "size",
     lambda tmp: _planetoid(allx=_big_csr())(tmp), "ind.cora.allx", "declares")
for _part in ("graph", "x", "allx", "ty"):
    case(f"Planetoid crafted ind.cora.{_part} (os.system)", "pickle", _planetoid_payload(_part),
         f"ind.cora.{_part}", "refusing", canary=True)
case("Planetoid graph of strings", "type", _planetoid(graph={0: ["a"]}), "ind.cora.graph", "dict")
case("Planetoid graph a list", "type", _planetoid(graph=[1, 2, 3]), "ind.cora.graph", "dict")
case("Planetoid ally of strings", "type", _planetoid(ally=np.array([["a"]] * 4)), "ind.cora.ally",
     "not in the expected format")
case("Planetoid truncated pickle", "layout", _planetoid(tx=pickle.dumps(np.ones(3))[:10]), "ind.cora.tx")
case("Planetoid ty rows mismatch", "value", _planetoid(ty=np.eye(3, dtype=np.float32)), "ind.cora.ty", "rows")
case("Planetoid random bytes", "layout", _planetoid(graph=_junk(64, 4)), "ind.cora.graph")
# a pickle whose BINBYTES8 length says 1 TiB: reading it asks for the memory (a MemoryError)
case("Planetoid pickle claiming 1 TiB", "layout",
     _planetoid(graph=b"\x80\x04\x8e" + (1 << 40).to_bytes(8, "little") + b"x" * 8), "ind.cora.graph")
case("Planetoid graph negative id", "value", _planetoid(graph={0: [-5], 1: [0]}), "cora")


def _cyclic() -> bytes:
    row = [1]
    row.append(row)
    return pickle.dumps({0: row, 1: [0]}, protocol=2)


def _big_csr():
    import scipy.sparse as sp

    return sp.csr_matrix((np.ones(1, np.float32), np.array([0]), np.r_[0, np.ones(10**6, np.int64)]),
                         shape=(10**6, 10**6))


# ---------------------------------------------------------------- flags of `scalegnn train`
def train(*flags: str, dataset: str = TINY):
    def build(tmp: Path) -> list[str]:
        return ["train", "--dataset", dataset, "--data-root", str(tmp), "--epochs", "1", "--hidden", "8",
                "--layers", "2", "--out", str(tmp / "runs"), "--quiet", *flags]
    return build


FLAG_CASES = [
    (("--lr", "inf"), ("--lr", "finite")), (("--lr", "nan"), ("--lr", "finite")), (("--lr", "-inf"), ("--lr",)),
    (("--lr", "0"), ("--lr", "> 0")), (("--lr", "-1"), ("--lr", "> 0")), (("--lr", "1e400"), ("--lr", "finite")),
        (("--grad-clip", "nan"), ("--grad-clip", "finite")), (("--grad-clip", "inf"), ("--grad-clip", "finite")),
    (("--grad-clip", "0"), ("--grad-clip", "> 0")), (("--grad-clip", "-1"), ("--grad-clip", "> 0")),
    (("--weight-decay", "nan"), ("--weight-decay", "finite")),
    (("--weight-decay", "inf"), ("--weight-decay", "finite")),
    (("--weight-decay", "-1"), ("--weight-decay", ">= 0")),
    (("--dropout", "nan"), ("dropout", "[0, 1)")), (("--dropout", "1"), ("dropout", "[0, 1)")),
    (("--dropout", "-0.1"), ("dropout", "[0, 1)")), (("--dropout", "inf"), ("dropout", "[0, 1)")),
    (("--hidden", "1000000000"), ("--hidden", "budget")), (("--hidden", "0"), ("hidden", ">= 1")),
    (("--hidden", "-8"), ("hidden", ">= 1")), (("--hidden", "3000000"), ("--hidden", "budget")),
    (("--layers", "0"), ("layers", ">= 1")), (("--layers", "-1"), ("layers", ">= 1")),
    (("--layers", "100000000000"), ("--layers", "budget")),
    (("--seed", str(2**64)), ("--seed", "2**63")), (("--seed", "-1"), ("--seed", "[0, 2**63)")),
    (("--seed", str(2**63)), ("--seed", "2**63")),
    (("--epochs", "0"), ("epochs", ">= 1")), (("--epochs", "-3"), ("epochs", ">= 1")),
    (("--batch-size", "1"), ("batch size",)), (("--batch-size", "0"), ("batch",)),
    (("--batch-size", "-5"), ("batch",)),
    (("--batch-ratio", "nan"), ("--batch-ratio",)), (("--batch-ratio", "inf"), ("--batch-ratio",)),
    (("--batch-ratio", "0"), ("--batch-ratio",)), (("--batch-ratio", "1.5"), ("--batch-ratio",)),
    (("--collective-timeout", "nan"), ("--collective-timeout",)),
    (("--collective-timeout", "inf"), ("--collective-timeout", "finite")),
    (("--collective-timeout", "-1"), ("--collective-timeout", "> 0")),
    (("--keep-checkpoints", "0"), ("--keep-checkpoints", ">= 1")),
    (("--checkpoint-every", "10"), ("--checkpoint-every", "--checkpoint-dir")),
    (("--resume",), ("--resume", "--checkpoint-dir")),
    (("--nproc", "0"), ("--nproc", ">= 1")), (("--nproc", "-2"), ("--nproc", ">= 1")),
    (("--device", "tpu"), ("--device",)), (("--backend", "nccl", "--device", "cpu"), ("--backend nccl",)),
    (("--backend", "nccl"), ("--backend nccl", "--device cuda")),  # one process, the device auto: the CPU here
    (("--hidden", "2", "--grid", "1x4x1x1"), ("--hidden >= 4",)),
    (("--dataset", "facebok"), ("facebok", "did you mean")),
    (("--dataset", "csbm:n=abc"), ("csbm", "'abc'")),
    (("--dataset", "csbm:n=1000000000000000"), ("csbm", "n")),
    (("--dataset", "csbm:classes=1000000000000"), ("csbm", "classes")),
    (("--dataset", "csbm:feature_dim=1000000000000"), ("csbm", "feature_dim")),
    (("--dataset", "csbm:n=nan"), ("csbm", "n")),
    (("--eval-every", "0"), ("eval",)),
    (("--target-acc", "nan"), ("target",)), (("--target-acc", "2"), ("target",)),
    (("--split", "random:0.9,0.9,0.9"), ("--split",)), (("--split", "random:nan,0.2,0.2"), ("--split",)),
    (("--split", "random", "--split-seed", "-1"), ("--split-seed", ">= 0")),
    (("--split-seed", "3"), ("--split-seed needs --split",)),
    (("--eval-every", "-1"), ("eval_every", ">= 1")), (("--checkpoint-every", "0"), ("--checkpoint-every",)),
    (("--checkpoint-every", "-5"), ("--checkpoint-every",)),
    (("--batch-size", "100000000000000"), ("batch size", "N=400")),
    (("--grid", "1x1x1x1000000000000"), ("grid axis z",)), (("--nproc", "1000000000"), ("--nproc 1000000000",)),
    (("--permute", "bogus"), ("--permute",)), (("--system", "nope"), ("--system",)),
    (("--comm-dtype", "bogus"), ("--comm-dtype",)), (("--target-acc", "-0.5"), ("--target-acc",)),
    (("--collective-timeout", "1e400"), ("--collective-timeout", "finite")),
    (("--threads", "0"), ("--threads",)), (("--threads", "-3"), ("--threads",)), (("--threads", "abc"), ("--threads",)),
    (("--dataset", "csbm:signal=inf"), ("csbm", "signal")), (("--dataset", "csbm:avg_degree=inf"), ("avg_degree",)),
    (("--dataset", "csbm:homophily=inf"), ("homophily",)), (("--dataset", "csbm:homophily=1.5"), ("homophily",)),
    (("--dataset", "csbm:n=3,classes=2,avg_degree=2.5"), ("csbm", "empty")),
    (("--dataset", "rmat:edge_factor=1000000000000"), ("rmat", "budget")),
    (("--dataset", "rmat:scale=40"), ("rmat", "budget")), (("--dataset", "rmat:scale=41"), ("rmat", "scale")),
    (("--dataset", "rmat:a=nan"), ("rmat", "a=")), (("--dataset", "rmat:a=0.9"), ("rmat", "must be 1")),
    (("--dataset", "cora:split=nan"), ("cora", "no parameters")),
    (("--dataset", "npz:"), ("npz",)), (("--dataset", "dir:"), ("dir",)),
]
for _flags, _expect in FLAG_CASES:
    case("train " + " ".join(_flags), "flag", train(*_flags), *_expect)


def _output_at(flag: str, target: str, *more: str):
    """Build: ``train`` with an output folder where none can be (a file in the way, /proc)."""
    def build(tmp: Path) -> list[str]:
        (tmp / "a-file").write_text("")
        return train(flag, target.format(tmp=tmp), *more)(tmp)
    return build


for _flag, _more in (("--out", ()), ("--checkpoint-dir", ("--checkpoint-every", "5")), ("--profile", ())):
    case(f"train {_flag} at a file", "flag", _output_at(_flag, "{tmp}/a-file", *_more), _flag, "a-file")
    case(f"train {_flag} under /proc", "flag", _output_at(_flag, "/proc/scalegnn-x", *_more), _flag, "/proc")


# ---------------------------------------------------------------- outputs of every command
# Where an output cannot be: a file in the way, a folder where a file goes, a symbolic link
# to nothing, a name longer than a file system allows, a place nobody can write (/proc), and
# an output that would overwrite what the command reads. Each refused before any work.
LONG = "x" * 300


def _fake_checkpoint(tmp: Path) -> Path:
    """A checkpoint folder shaped like a real one (the output checks come before it is read)."""
    step = tmp / "ck" / "step-000000004"
    step.mkdir(parents=True)
    (step / "rank-00000.pt").write_bytes(b"")
    (step / "meta.json").write_text("{}")
    return tmp / "ck"


def _out_cases(command: str, argv, flag: str = "--out", proc: bool = True):
    """Rows for one command's output path; ``argv(tmp, out)`` is its command line writing to ``out``."""
    def at(target):
        def build(tmp: Path) -> list[str]:
            (tmp / "a-file").write_text("")
            (tmp / "a-folder").mkdir(exist_ok=True)
            if not (tmp / "dangling").is_symlink():
                (tmp / "dangling").symlink_to(tmp / "nowhere" / "x")
            return argv(tmp, target.format(tmp=tmp))
        return build
    rows = [("a symbolic link to nothing", "{tmp}/dangling", ("dangling", "symbolic link", "does not exist")),
            ("a 300-byte name", "{tmp}/" + LONG, ("300 bytes", "shorter")),
            ("under /proc", "/proc/scalegnn-x", ("/proc",))][:3 if proc else 2]
    for what, target, expect in rows:
        case(f"{command} {flag} {what}", "output", at(target), flag, *expect, command=command)
    return at


def _export(tmp: Path, out: str) -> list[str]:
    return ["export", str(_fake_checkpoint(tmp)), "--out", out]


def _generate(tmp: Path, out: str) -> list[str]:
    return ["data", "generate", "csbm:n=1000", "--out", out]


def _shard(tmp: Path, out: str) -> list[str]:
    return ["data", "shard", TINY, "--grid", "1x1x1x1", "--data-root", str(tmp), "--out", out]


def _demo(tmp: Path, out: str) -> list[str]:
    return ["demo", "--out", out, "--data-root", str(tmp)]


def _train_out(flag, *more):
    return lambda tmp, out: train(flag, out, *more)(tmp)


_at = {command: _out_cases(command, argv) for command, argv in
       (("export", _export), ("data generate", _generate), ("data shard", _shard), ("demo", _demo))}
for _flag, _more in (("--out", ()), ("--checkpoint-dir", ("--checkpoint-every", "5")), ("--profile", ())):
    _out_cases("train", _train_out(_flag, *_more), _flag, proc=False)  # /proc: the rows above
case("export --out a folder", "output", _at["export"]("{tmp}/a-folder"), "--out", "a-folder", "is a folder",
     command="export")
case("export --out its checkpoint's own rank file", "output",
     _at["export"]("{tmp}/ck/step-000000004/rank-00000.pt"), "--out", "rank-00000.pt", "which this command reads",
     command="export")
case("export --out inside its checkpoint folder", "output", _at["export"]("{tmp}/ck/model.pt"), "--out",
     "inside", "which this command reads", command="export")
case("export --out a file's child", "output", _at["export"]("{tmp}/a-file/model.pt"), "--out", "a-file",
     command="export")
for _command in ("data generate", "data shard", "demo"):
    case(f"{_command} --out a file", "output", _at[_command]("{tmp}/a-file"), "--out", "a-file", "not a folder",
         command=_command)


# ---------------------------------------------------------------- the inputs of the other commands
def _command(*argv: str):
    """Build: a command line; ``{tmp}`` in an argument is the case's folder."""
    def build(tmp: Path) -> list[str]:
        (tmp / "a-file").write_text("")
        (tmp / "empty").mkdir(exist_ok=True)
        return [a.format(tmp=tmp) for a in argv]
    return build


for _argv, _category, _expect in (
        (("data", "generate", "csbm:n=abc"), "value", ("csbm", "'abc'")),
        (("data", "generate", "nope:n=5"), "value", ("unknown generator", "csbm, powerlaw")),
        (("data", "generate", "csbm:n=1000", "--chunk-edges", "0"), "flag", ("--chunk-edges", ">= 1")),
        (("data", "generate", "csbm:n=1000000000000000"), "size", ("csbm", "n=", "3e9")),
        (("data", "generate", "csbm:n=-5"), "value", ("csbm", "n=-5")),
        (("data", "generate", "powerlaw:n=100,exponent=0.5"), "value", ("exponent", "> 2")),
        (("data", "generate", "csbm:n=1000,avg_degree=nan"), "value", ("avg_degree",)),
        (("data", "generate", "csbm:n=1000,classes=0"), "value", ("classes",)),
        (("data", "shard", TINY, "--grid", "1x0x1x1"), "flag", ("--grid", "positive")),
        (("data", "shard", TINY, "--grid", "1x1x1x1", "--memory-budget", "5Q"), "flag", ("--memory-budget", "5Q")),
        (("export", "{tmp}/nowhere"), "checkpoint", ("nowhere", "no such checkpoint folder")),
        (("export", "{tmp}/a-file"), "checkpoint", ("a-file", "checkpoint folder")),
        (("export", "{tmp}/empty"), "checkpoint", ("empty", "no complete checkpoint")),
):
    _name = " ".join(_argv[:2] if _argv[0] == "data" else _argv[:1])
    _out = ("--out", "{tmp}/out" + (".pt" if _argv[0] == "export" else ""))
    case(f"{' '.join(_argv).replace('{tmp}/', '')}", _category, _command(*_argv, *_out), *_expect, command=_name)


# ---------------------------------------------------------------- plan, sweep, report
_BAD_SPEC = ('name = "bad"\nsystems = ["scalegnn"]\n[train]\nhidden = "wide"\n[[experiments]]\ncluster = "local"\n'
             'dataset = "cora"\ngpus = [1]\ngrids = ["1x1x1x1"]\n')


def _files_then(files: dict, *argv: str):
    """Build: ``files`` (name: text or bytes; a name ending in ``/`` a folder) in the case's
    folder, then ``argv`` (``{tmp}`` is the folder)."""
    def build(tmp: Path) -> list[str]:
        (tmp / "a-file").write_text("")
        for name, content in files.items():
            if name.endswith("/"):
                (tmp / name).mkdir(parents=True, exist_ok=True)
            elif isinstance(content, bytes):
                (tmp / name).write_bytes(content)
            else:
                (tmp / name).write_text(content)
        return [a.format(tmp=tmp) for a in argv]
    return build


def _results(tmp: Path) -> None:
    from tests.files import minimal_record

    from scalegnn import records

    records.write_record(minimal_record(), tmp / "results")


_PLAN = ("plan", "--dataset", "ogbn-products", "--cluster", "perlmutter")
for _flags, _expect in (
        (("--gpus", "0"), ("--gpus 0", "[1, 131,072]")), (("--gpus", "-4"), ("--gpus -4", "[1, 131,072]")),
        (("--gpus", "1000000000"), ("--gpus 1000000000", "[1, 131,072]")),
        (("--grid", "1000x1000x1000x1000"), ("--grid 1000x1000x1000x1000", "[1, 131,072]")),
        (("--gpus", "8", "--hidden", "0"), ("--hidden 0", ">= 1")),
        (("--gpus", "8", "--layers", "0"), ("--layers 0", ">= 1")),
        (("--gpus", "8", "--batch-ratio", "nan"), ("--batch-ratio nan", "(0, 1]")),
        (("--gpus", "8", "--batch-ratio", "0"), ("--batch-ratio", "(0, 1]")),
        (("--gpus", "8", "--batch-size", "99999999999999"), ("--batch-size 99999999999999", "N=2449029")),
        (("--gpus", "8", "--gd", "3"), ("--gd 3", "divisor of --gpus 8")),
        (("--gpus", "8", "--top", "0"), ("--top 0", ">= 1")),
        (("--gpus", "8", "--grid", "1x2x2x1"), ("has 4 ranks", "--gpus says 8")),
):
    case("plan " + " ".join(_flags), "flag", _files_then({}, *_PLAN, *_flags), *_expect, command="plan")
for _name, _files, _argv, _expect in (
        ("plan --fit an empty folder", {"empty/": ""}, (*_PLAN, "--gpus", "8", "--fit", "{tmp}/empty"),
         ("--fit", "only 0 ScaleGNN runs")),
        ("plan --fit files that are not records", {"r/": "", "r/a.json": "[1, 2]", "r/b.json": b"\x80"},
         (*_PLAN, "--gpus", "8", "--fit", "{tmp}/r"), ("not run records", "a.json")),
        ("plan --cluster a binary profile", {"bin.toml": b"\xff\xfe"},
         ("plan", "--dataset", "ogbn-products", "--gpus", "8", "--cluster", "{tmp}/bin.toml"),
         ("bin.toml", "not valid TOML")),
        ("sweep /etc", {}, ("sweep", "/etc", "--cluster", "local", "--dry-run", "--out", "{tmp}/o"),
         ("'/etc' is a folder",)),
        ("sweep a missing spec", {}, ("sweep", "{tmp}/missing.toml", "--cluster", "local", "--dry-run"),
         ("does not exist",)),
        ("sweep a binary spec", {"binary.toml": b"\xff\xfe\x00"},
         ("sweep", "{tmp}/binary.toml", "--cluster", "local", "--dry-run"), ("binary.toml", "not valid TOML")),
        ("sweep a spec of the wrong kinds", {"kinds.toml": 'name = "x"\nsystems = 5\nexperiments = []\n'},
         ("sweep", "{tmp}/kinds.toml", "--cluster", "local", "--dry-run"), ("not a sweep spec",)),
        ("sweep --time -5", {}, ("sweep", "demo", "--cluster", "local", "--dry-run", "--out", "{tmp}/o", "--time",
                                 "-5"),
         ("--time", "minutes >= 1", "-5")),
        ("sweep --time 0", {}, ("sweep", "demo", "--cluster", "local", "--dry-run", "--out", "{tmp}/o", "--time", "0"),
         ("--time", "minutes >= 1")),
        ("sweep --time nan", {}, ("sweep", "demo", "--cluster", "local", "--dry-run", "--time", "nan"), ("--time",)),
        ("sweep a task with an unknown dataset", {}, ("sweep", "demo", "--cluster", "local", "--dry-run", "--out",
                                                      "{tmp}/o", "--gpus", "1", "--dataset", "bogus"),
         ("run 1 of", "unknown dataset 'bogus'", "nothing was submitted")),
        ("sweep --epochs 0", {}, ("sweep", "demo", "--cluster", "local", "--dry-run", "--out", "{tmp}/o", "--epochs",
                                  "0"), ("rejects the options of run", "epochs must be >= 1")),
        ("sweep a spec option train refuses", {"bad.toml": _BAD_SPEC},
         ("sweep", "{tmp}/bad.toml", "--cluster", "local", "--dry-run", "--out", "{tmp}/o"),
         ("run 1 of 1", "--hidden", "'wide'")),
        ("sweep --out a file", {}, ("sweep", "demo", "--cluster", "local", "--out", "{tmp}/a-file"),
         ("--out", "a-file")),
        ("sweep a profile of the wrong kinds", {"k.toml": 'name = "x"\nnetwork = 3\n'},
         ("sweep", "demo", "--cluster", "{tmp}/k.toml", "--dry-run"), ("not a cluster profile",)),
):
    case(_name, "flag" if "--" in _name else "layout", _files_then(_files, *_argv), *_expect,
         command=_argv[0])
for _name, _target, _expect in (("report --out a file", "{tmp}/a-file", ("--out", "a-file", "existing file")),
                                ("report --out a 300-byte name", "{tmp}/" + LONG, ("--out", "shorter"))):
    def _report(tmp: Path, target=_target) -> list[str]:
        _results(tmp)
        (tmp / "a-file").write_text("")
        return ["report", str(tmp / "results"), "--out", target.format(tmp=tmp)]
    case(_name, "output", _report, *_expect, command="report")


_TUNE = ("tune", "--dataset", TINY)
for _flags, _expect in (
        (("--target", "2"), ("--target", "(0, 1]")), (("--target", "nan"), ("--target", "(0, 1]")),
        (("--target", "0.5", "--budget", "0"), ("--budget", ">= 1")),
        (("--target", "0.5", "--epochs", "-1"), ("--epochs", ">= 1")),
        (("--target", "0.5", "--space", "lr="), ("--space", "FLAG=V1,V2")),
        (("--target", "0.5", "--space", "hiden=1,2"), ("--space", "--hiden", "did you mean --hidden")),
        (("--target", "0.5", "--space", "lr=0.1,0.01,0.001,0.0001"), ("search space", "budget")),
        (("--target", "0.5", "--out", "{tmp}/a-file"), ("--out", "a-file")),
):
    case("tune " + " ".join(_flags).replace("{tmp}/", ""), "flag", _files_then({}, *_TUNE, *_flags), *_expect,
         command="tune")


# Found by the round-3 probe after the fixes above: a memory budget of infinity, an output onto a
# pipe or a device (the atomic rename replaced /dev/null itself), an export into the checkpoint
# through a step folder that is a link, a --python that runs a second command in the batch script,
# a tuning record nested deeper than the parser's stack.
def _linked_checkpoint(tmp: Path) -> list[str]:
    real = _fake_checkpoint(tmp)
    (tmp / "linked").mkdir()
    (tmp / "linked" / "step-000000004").symlink_to(real / "step-000000004")
    return ["export", str(tmp / "linked"), "--out", str(real / "step-000000004" / "rank-00000.pt")]


def _export_to_fifo(tmp: Path) -> list[str]:
    os.mkfifo(tmp / "fifo.pt")
    return ["export", str(_fake_checkpoint(tmp)), "--out", str(tmp / "fifo.pt")]


case("train with SCALEGNN_MEMORY_BUDGET=inf", "value", train(), "SCALEGNN_MEMORY_BUDGET", "finite",
     env=(("SCALEGNN_MEMORY_BUDGET", "inf"),), command="train")
case("train with SCALEGNN_MEMORY_BUDGET=1e400", "value", train(), "SCALEGNN_MEMORY_BUDGET", "finite",
     env=(("SCALEGNN_MEMORY_BUDGET", "1e400"),), command="train")
case("export --out a FIFO", "output", _export_to_fifo, "--out", "fifo.pt", "not a regular file", command="export")
case("export --out /dev/null", "output", _command("export", "{tmp}/nowhere", "--out", "/dev/null"), "--out",
     "/dev/null", "not a regular file", command="export")
case("export --out through a linked step folder", "output", _linked_checkpoint, "--out", "rank-00000.pt",
     "which this command reads", command="export")
for _python in ("/x\nrm -rf /", "$(rm -rf ~)", "`id`", "/usr/bin/python3; id"):
    _argv = ("sweep", "demo", "--cluster", "perlmutter", "--gpus", "1", "--dry-run", "--account", "a", "--python",
             _python, "--out", "{tmp}/o")
    case(f"sweep --python {_python!r}", "flag", _files_then({}, *_argv), "--python", "batch script", command="sweep")
case("tune over a tuning record nested too deep", "layout",
     _files_then({"tu/": "", "tu/tune.json": "[" * 100000 + "]" * 100000}, *_TUNE, "--target", "0.5", "--out",
                 "{tmp}/tu"), "tune.json", "not a tuning record", command="tune")
case("plan --fit over a record nested too deep", "layout",
     _files_then({"deep/": "", "deep/x.json": '{"a":' * 100000 + "1" + "}" * 100000}, *_PLAN, "--gpus", "8", "--fit",
                 "{tmp}/deep"), "--fit", "not run records", command="plan")


# ---------------------------------------------------------------- the launch environment
# What a launcher (torchrun, srun, flux) or a user's shell sets, checked before any rendezvous:
# a rank outside its job waited for ever; now one line naming the variable and the fix.
_ADDR = (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29555"))
for _name, _env, _expect in (
        ("rank beyond world", (("RANK", "5"), ("WORLD_SIZE", "2"), *_ADDR), ("RANK=5", "0..1", "WORLD_SIZE=2",
                                                                             "torchrun")),
        ("negative rank", (("RANK", "-1"), ("WORLD_SIZE", "2"), *_ADDR), ("RANK=-1", "0..1")),
        ("local rank beyond node", (("RANK", "1"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "99"),
                                    ("LOCAL_WORLD_SIZE", "1"), *_ADDR), ("LOCAL_RANK=99", "LOCAL_WORLD_SIZE=1")),
        ("world 0", (("RANK", "0"), ("WORLD_SIZE", "0"), *_ADDR), ("WORLD_SIZE=0", "at least 1")),
        ("port 70000", (("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "70000")),
         ("MASTER_PORT=70000", "1..65535")),
        ("port text", (("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "abc")),
         ("MASTER_PORT='abc'", "integer")),
        ("empty address", (("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", ""), ("MASTER_PORT", "29555")),
         ("MASTER_ADDR is empty", "host of rank 0")),
        ("srun rank beyond tasks", (("SLURM_PROCID", "4"), ("SLURM_NTASKS", "2"), ("SLURM_STEP_ID", "0"),
                                    ("SLURM_NODELIST", "n1")), ("SLURM_PROCID=4", "SLURM_NTASKS=2", "srun")),
        ("flux rank beyond job", (("FLUX_TASK_RANK", "3"), ("FLUX_JOB_SIZE", "2")),
         ("FLUX_TASK_RANK=3", "FLUX_JOB_SIZE=2", "flux run")),
):
    case(f"train under a launcher: {_name}", "launch", train(), *_expect, command="train", env=_env)


# ---------------------------------------------------------------- checkpoint metadata (--resume)
def _meta(change):
    """Build: a checkpoint folder whose meta.json is a valid-looking one changed by
    ``change(meta)`` (returning the new meta, or bytes for the file), then --resume."""
    def build(tmp: Path) -> list[str]:
        ckpt = tmp / "ckpt" / "step-000000004"
        ckpt.mkdir(parents=True)
        (ckpt / "rank-00000.pt").write_bytes(b"")
        argv = train()(tmp)
        meta = {"format": 1, "step": 4, "epoch": 1, "steps_per_epoch": 4, "world_size": 1,
                "config": {"system": "scalegnn"}, "loop": {"step": 4, "train_time": 0.0},
                "record": {"run_id": "20260101-000000-abcdef123456", "epochs": []}}
        meta = change(meta)
        (ckpt / "meta.json").write_text(meta if isinstance(meta, str) else json.dumps(meta))
        return [*argv, "--checkpoint-dir", str(tmp / "ckpt"), "--resume"]
    return build


def _without(key):
    return lambda m: {k: v for k, v in m.items() if k != key}


def _with(key, value):
    return lambda m: {**m, key: value}


for _key in ("config", "record", "step", "epoch", "steps_per_epoch", "loop"):
    case(f"meta.json without {_key!r}", "checkpoint", _meta(_without(_key)), "meta.json", repr(_key))
for _key, _value in (("config", [1, 2]), ("config", "x"), ("record", None), ("record", []), ("step", "4"),
                     ("step", -1), ("step", 1.5), ("epoch", -2), ("epoch", None), ("steps_per_epoch", 0),
                     ("world_size", "1"), ("format", "1")):
    case(f"meta.json {_key} = {_value!r}", "checkpoint", _meta(_with(_key, _value)), "meta.json", repr(_key))
case("meta.json record without run_id", "checkpoint", _meta(_with("record", {})), "meta.json", "run_id")
case("meta.json record run_id a number", "checkpoint", _meta(_with("record", {"run_id": 5})), "meta.json",
     "run_id")
case("meta.json format from the future", "checkpoint", _meta(_with("format", 99)), "meta.json", "newer")
# Bounded before any allocation or rendezvous (world_size 1e9 grew the process to 7 GB and hung),
# consistent with itself, and the rank files as its list says they are.
_ONE_FILE = {"sha256": "0" * 64, "bytes": 0, "step": 4}
for _name, _change, _expect in (
        ("world_size 1e9", _with("world_size", 10**9), ("meta.json", "'world_size'", "1048576")),
        ("epoch past its step", _with("epoch", 3), ("meta.json", "'epoch'", "'step' 4")),
        ("step past 2**53", _with("step", 10**16), ("meta.json", "'step'", "9007199254740992")),
        ("loop without train_time", _with("loop", {"step": 4}), ("meta.json", "'loop'", "train_time")),
        ("a rank file shorter than listed", _with("files", {"rank-00000.pt": {**_ONE_FILE, "bytes": 5}}),
         ("rank-00000.pt", "0 bytes where meta.json lists 5", "Remove this checkpoint folder")),
        ("a rank file listed at another step", _with("files", {"rank-00000.pt": {**_ONE_FILE, "step": 3}}),
         ("meta.json", "'files'", "rank-00000.pt")),
        ("files a list", _with("files", ["rank-00000.pt"]), ("meta.json", "'files'", "'world_size'")),
):
    case(f"meta.json {_name}", "checkpoint", _meta(_change), *_expect)


# ---------------------------------------------------------------- faults
# What happens to a running job, as rows too: each names the test that does it to a real
# run (its own suite, since a fault needs processes, signals, a small disk) and what that
# test shows. tests/unit/test_hostile.py checks that every named test exists.
@dataclass(frozen=True)
class Fault:
    name: str
    category: str  # signal, process, disk, folder, network
    test: str  # "<file>::<test>" or "<file>::<test>[<param id>]"
    shows: str
    resumed_equal: bool = False  # the test resumes the run and compares epoch rows with ==
    command: str = "train"


# (launch, signal) of the stop-signal runs of tests/integration/test_signals.py (its LAUNCHES' names)
STOPS = [(launch, sig) for launch in ("one process", "--nproc 2") for sig in (signal.SIGINT, signal.SIGTERM,
                                                                              signal.SIGHUP)] \
    + [("--nproc 2", signal.SIGQUIT)]
SIGNALS = "tests/integration/test_signals.py::test_a_stop_signal_leaves_an_interrupted_record_and_resumes_exactly"
FULL_DISK = "tests/integration/test_disk_full.py::test_a_full_disk_is_one_line_before_any_work_on_every_command"
FAULTS = [
    *[Fault(f"{sig} to {who}", "signal", f"{SIGNALS}[{who}-{sig}]",
            "interrupted record, one line, exit 128 + signal; --resume gives the uninterrupted rows", True)
      for who in ("one process", "--nproc 2") for sig in ("SIGHUP", "SIGTERM", "SIGINT")],
    Fault("SIGQUIT to --nproc 2", "signal", f"{SIGNALS}[--nproc 2-SIGQUIT]",
          "interrupted record, one line, exit 131; --resume gives the uninterrupted rows", True),
    Fault("SIGUSR1 to a run", "signal",
          "tests/integration/test_signals.py::test_sigusr1_shows_where_every_thread_is_and_the_run_goes_on",
          "every thread's stack on stderr, the run ends ok"),
    Fault("a stop while loading the data", "signal",
          "tests/integration/test_signals.py::test_a_stop_while_loading_the_data_still_leaves_a_record",
          "an interrupted record with no epochs"),
    Fault("a stop inside a checkpoint write", "signal", "tests/integration/test_signals.py::"
          "test_a_stop_inside_a_checkpoint_save_is_recorded_as_interrupted_not_failed",
          "interrupted, the earlier checkpoint whole, --resume finishes the run", True),
    Fault("SIGTERM to a torchrun job", "signal",
          "tests/integration/test_signals.py::test_sigterm_to_a_torchrun_job_is_recorded_as_a_failure",
          "a failed record naming the signal"),
    Fault("SIGKILL of a rank at a random step", "process",
          "tests/integration/test_resume.py::test_resumed_4d_parallel_run_equals_the_uninterrupted_one",
          "a failed record naming the rank; --resume gives the uninterrupted losses", True),
    Fault("SIGKILL of a rank mid-epoch", "process",
          "tests/integration/test_launch_job.py::test_killing_one_rank_mid_epoch_fails_the_whole_run_within_60s",
          "every rank gone within 60 s, a failed record naming the rank"),
    Fault("SIGSTOP of a rank", "process", "tests/integration/test_launch_job.py::"
          "test_a_rank_that_stops_answering_fails_the_run_after_the_collective_timeout",
          "the run fails after the collective timeout, recorded"),
    Fault("SIGKILL of the launcher", "process",
          "tests/integration/test_launch_job.py::test_killing_the_launcher_leaves_no_orphan_workers",
          "no orphan worker"),
    Fault("SIGKILL of rank 0 under torchrun", "process",
          "tests/integration/test_session.py::test_rank0_killed_under_torchrun_still_leaves_a_failed_record",
          "a surviving rank writes the failed record"),
    Fault("a preemption notice (SIGUSR2)", "signal",
          "tests/integration/test_resume.py::test_preemption_request_saves_at_the_next_step_and_resumes_exactly",
          "checkpoint at the next step; the resumed losses equal the uninterrupted ones", True),
    Fault("the disk fills during the run", "disk",
          "tests/integration/test_disk_full.py::test_a_disk_that_fills_during_the_run_keeps_its_record",
          "the record is written in its own folder (the reserve given back)"),
    Fault("the disk fills at a checkpoint", "disk", "tests/integration/test_disk_full.py::"
          "test_a_full_disk_at_a_checkpoint_keeps_the_previous_one_and_the_run_resumes",
          "failed in one line naming the whole checkpoint; --resume gives the uninterrupted rows", True),
    Fault("no room for the record anywhere in its folder", "disk", "tests/integration/test_disk_full.py::"
          "test_a_record_with_no_room_anywhere_in_its_folder_goes_to_a_rescue_folder",
          "the record in the rescue folder, one line saying where"),
    *[Fault(f"a full disk before `{command}` starts", "disk", f"{FULL_DISK}[{command}]",
            "one line naming the folder and its free space, before any work; nothing written",
            command=command.split(" -")[0])
      for command in ("train", "train --checkpoint-dir", "export", "data generate", "data shard", "demo", "report",
                      "sweep", "tune")],
    Fault("the disk fills during `data generate`", "disk", "tests/integration/test_disk_full.py::"
          "test_a_disk_that_fills_during_data_generate_is_one_line_and_leaves_nothing",
          "one line naming the full disk; the half-written graph removed", command="data generate"),
    Fault("the disk fills during `export`", "disk",
          "tests/integration/test_disk_full.py::test_a_disk_that_fills_during_export_is_one_line",
          "one line naming the full disk; no partial model file", command="export"),
    Fault("stdout's reader leaves (`| head`)", "signal", "tests/integration/test_output_safety.py::"
          "test_a_closed_stdout_ends_the_command_quietly_with_its_record",
          "exit 141, nothing on stderr, the record ok"),
    Fault("SIGTERM while the command imports", "signal", "tests/integration/test_output_safety.py::"
          "test_sigterm_while_the_command_starts_leaves_an_interrupted_record", "an interrupted record, one line"),
    Fault("SIGTERM during `data generate`", "signal", "tests/integration/test_output_safety.py::"
          "test_sigterm_during_data_generate_leaves_nothing_behind", "one line, exit 143, nothing left behind",
          command="data generate"),
    Fault("a rank file edited in place", "disk", "tests/unit/test_checkpoint_whole.py::"
          "test_a_rank_file_edited_in_place_is_refused_naming_it_and_the_fix",
          "its SHA-256 differs from meta.json's list: one line naming the file, before anything is unpickled"),
    Fault("a full disk at the checkpoint folder's lock", "disk",
          "tests/unit/test_checkpoint_whole.py::test_a_full_disk_at_the_folder_lock_is_one_line",
          "one line naming the lock file and the fix"),
    Fault("Ctrl-C in `plan`", "signal", "tests/harness/test_harness_inputs.py::"
          "test_ctrl_c_in_a_command_that_is_not_a_run_is_one_line", "one line, exit 130", command="plan"),
    Fault("records `report` cannot use (NaN, wrong kinds, nested too deep)", "folder",
          "tests/harness/test_harness_inputs.py::test_report_skips_records_it_cannot_use_one_warning_line_each",
          "each skipped in one warning line naming it; the report of the rest written", command="report"),
    Fault("a second run on a checkpoint folder", "folder",
          "tests/integration/test_disk_full.py::test_one_run_per_checkpoint_folder",
          "one line naming the holder's host and pid"),
    Fault("a rank missing at the rendezvous", "network", "tests/integration/test_launch_environment.py::"
          "test_a_missing_peer_ends_the_rendezvous_in_one_line_naming_it",
          "one line naming the ranks that did not come and the fix"),
    Fault("rank 0 never opens the rendezvous", "network", "tests/integration/test_launch_environment.py::"
          "test_a_rank_whose_rank_0_never_opens_the_rendezvous_says_so_in_one_line",
          "one line on the other ranks naming the address and the fix"),
    Fault("a rendezvous port in use", "network",
          "tests/integration/test_launch_environment.py::test_a_rendezvous_port_in_use_is_one_line",
          "one line naming the port and the fix"),
]


def counts() -> dict[str, int]:
    """Bad inputs and faults by category (the summary line the suite prints)."""
    out: dict[str, int] = {}
    for kind, category in [(c.kind, c.category) for c in CASES] + [("fault", f.category) for f in FAULTS]:
        key = f"{kind}:{category}"
        out[key] = out.get(key, 0) + 1
    return out


def counts_by_command() -> dict[str, dict[str, int]]:
    """Cases per command and kind (``input``, ``fault``): every command is in the table."""
    out: dict[str, dict[str, int]] = {}
    for command, kind in [(c.command, c.kind) for c in CASES] + [(f.command, "fault") for f in FAULTS]:
        row = out.setdefault(command, {"input": 0, "fault": 0})
        row[kind] += 1
    return out
