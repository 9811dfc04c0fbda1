"""Reading third-party pickles without running code from them.

Some dataset releases exist only as pickles: the Planetoid ``ind.*`` files (Python 2
pickles of scipy CSR matrices, numpy arrays and a ``defaultdict`` of lists), LINKX's
Twitch-DE splits (an object ``.npy``: a pickled array of dicts of int lists) and ogb's
``processed/data_processed`` (``torch.save`` of numpy arrays, pickle protocol 4, which
``torch.load(weights_only=True)`` cannot parse). A pickle names the callables that
rebuild its objects, so a crafted file can make ``pickle.load`` call ``os.system``.

:class:`_Restricted` resolves a name only if it is one of the few classes and
functions such a file is known to hold (``admitted``: ``(module, name) -> object``,
with the module paths of old and new numpy/scipy releases as aliases of the same
object); anything else raises :class:`DatasetError` naming the file, the refused
name and the fix, before the name is imported or called. With only these callables
reachable the stream can build arrays, CSR matrices, dicts, lists and numbers, nothing
that executes code. Callers still check the types they get back.
"""

from __future__ import annotations

import collections
import io
import pickle
import zipfile
from pathlib import Path

import numpy as np
import scipy.sparse as sp
import torch

from scalegnn.fileio import load_error

from ._core import DatasetError

__all__ = ["LINKX_TYPES", "NUMPY_ARRAY_TYPES", "OGB_TYPES", "PLANETOID_TYPES", "load_object_npy", "load_pickle",
           "load_torch_file"]

_NUMPY_CORE = ("numpy.core.multiarray", "numpy._core.multiarray")  # numpy 1.x / 2.x module paths
# numpy's array and scalar rebuilders, taken from numpy itself (no deprecated module import).
_RECONSTRUCT = np.zeros(0).__reduce__()[0]
_SCALAR = np.int64(0).__reduce__()[0]

NUMPY_ARRAY_TYPES = {
    **{(m, "_reconstruct"): _RECONSTRUCT for m in _NUMPY_CORE},
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
}
# Planetoid: CSR features (scipy.sparse.csr before scipy 1.8, scipy.sparse._csr after),
# one-hot label arrays, and ``graph``: defaultdict(list) (``__builtin__`` in Python 2).
PLANETOID_TYPES = {
    **NUMPY_ARRAY_TYPES,
    ("scipy.sparse.csr", "csr_matrix"): sp.csr_matrix,
    ("scipy.sparse._csr", "csr_matrix"): sp.csr_matrix,
    ("collections", "defaultdict"): collections.defaultdict,
    ("__builtin__", "list"): list,
    ("builtins", "list"): list,
}
LINKX_TYPES = NUMPY_ARRAY_TYPES  # an object array of {"train"|"valid"|"test": list of ints}
# ogb's graph dict: arrays, None, and num_nodes as an int or a numpy int scalar.
OGB_TYPES = {**NUMPY_ARRAY_TYPES, **{(m, "scalar"): _SCALAR for m in _NUMPY_CORE}}


class _HoldsTensors(Exception):
    """The torch file holds tensors: torch's own weights-only loader reads those."""


class _Restricted(pickle.Unpickler):
    """``torch_file``: the pickle of a ``torch.save`` file, where a torch global (a
    tensor rebuilder) hands the file to torch's weights-only loader instead."""

    def __init__(self, file, admitted: dict, path, what: str, fix: str, torch_file: bool = False, **kwargs):
        super().__init__(file, **kwargs)
        self._admitted, self._path, self._what, self._fix = admitted, path, what, fix
        self._torch_file = torch_file

    def find_class(self, module, name):
        if self._torch_file and module.split(".")[0] == "torch":
            raise _HoldsTensors(f"{module}.{name}")
        obj = self._admitted.get((module, name))
        if obj is None:
            raise DatasetError(
                f"{self._path}: refusing to load it: it holds a pickled reference to {module}.{name}, which "
                f"{self._what} never contains, and unpickling it could run code; {self._fix}"
            )
        return obj

    def persistent_load(self, pid):
        if self._torch_file:
            raise _HoldsTensors(pid)  # a tensor's storage
        raise pickle.UnpicklingError(f"the pickle refers to an external object {pid!r}")


def _run(path, file, admitted, what, fix, **kwargs):
    try:
        return _Restricted(file, admitted, path, what, fix, **kwargs).load()
    except (DatasetError, _HoldsTensors):
        raise
    except MemoryError:  # a length field no real file of this kind holds (random bytes do this), or a huge file
        raise DatasetError(
            f"could not read {path}: it asks for more memory than this machine has while unpickling; the file is "
            f"corrupt, truncated or not {what}, or too large for this machine; {fix}"
        ) from None
    except Exception as e:  # noqa: BLE001 - any parse error means a bad file
        raise DatasetError(
            f"could not read {path}: {load_error(e)}. The file is corrupt, truncated or not {what}; {fix}"
        ) from None


def expanded_size(obj) -> int:
    """The container slots a walk over ``obj`` visits when every reference is followed: a list
    shared by many rows counts once per row. A pickle stores a shared object once and
    refers to it by its memo, so a small file can expand to billions of entries; this
    counts them in time proportional to the distinct objects. A cycle counts as
    unbounded."""
    sizes: dict[int, int] = {}
    active: set[int] = set()

    def walk(o) -> int:
        if isinstance(o, (list, tuple, dict, set, frozenset)) or (isinstance(o, np.ndarray) and o.dtype.hasobject) \
                or isinstance(o, sp.spmatrix):
            key = id(o)
            if key in sizes:
                return sizes[key]
            if key in active:
                raise OverflowError("a container holds itself")
            active.add(key)
            if isinstance(o, dict):
                children = [*o.keys(), *o.values()]
            elif isinstance(o, np.ndarray):
                children = o.reshape(-1).tolist()
            elif isinstance(o, sp.spmatrix):
                children = list(vars(o).values())
            else:
                children = list(o)
            total = len(children) + sum(walk(c) for c in children)
            active.discard(key)
            sizes[key] = total
            return total
        return 0  # a number, a string, a numeric array: its bytes are in the file

    try:
        return walk(obj)
    except (OverflowError, RecursionError):
        return 1 << 62


def load_pickle(path: Path, admitted: dict, what: str, fix: str, encoding: str = "ASCII"):
    """Unpickle ``path`` admitting only ``admitted`` globals (see module docstring); an
    object that expands far beyond the file (shared, memoized containers, or a cycle)
    is refused before anyone walks it (:func:`expanded_size`)."""
    with open(path, "rb") as f:
        return _bounded(path, _run(path, f, admitted, what, fix, encoding=encoding), what, fix)


def _bounded(path: Path, obj, what: str, fix: str):
    """``obj``, unpickled from ``path``, unless it expands far beyond the file."""
    size = Path(path).stat().st_size
    entries = expanded_size(obj)
    if entries >= 1 << 62:
        raise DatasetError(f"{path}: its pickle holds a container that contains itself (a cycle), which "
                           f"{what} never does; {fix}")
    if entries > 4 * size + 100_000:  # a genuine file stores every entry (>= 1 byte each)
        raise DatasetError(f"{path}: its pickle expands to {entries:,} entries from a {size:,}-byte file (the same "
                           f"containers referenced over and over); {what} stores each entry; {fix}")
    return obj


def load_object_npy(path: Path, admitted: dict, what: str, fix: str) -> np.ndarray:
    """A ``.npy`` file; an object array (stored as a pickle after the header) is read
    through the restricted unpickler, any other dtype by ``np.load(allow_pickle=False)``."""
    with open(path, "rb") as f:
        try:
            version = np.lib.format.read_magic(f)
            read_header = {(1, 0): np.lib.format.read_array_header_1_0,
                           (2, 0): np.lib.format.read_array_header_2_0}.get(version)
            if read_header is None:
                raise ValueError(f"unsupported .npy format version {version}")
            shape, _, dtype = read_header(f)
        except ValueError as e:
            raise DatasetError(f"could not read {path}: {e}; {fix}") from None
        if not dtype.hasobject:
            f.seek(0)
            return np.load(f, allow_pickle=False)
        arr = _bounded(path, _run(path, f, admitted, what, fix), what, fix)
    if not isinstance(arr, np.ndarray) or arr.shape != tuple(shape):
        raise DatasetError(f"could not read {path}: its pickle is not the {shape} array its header announces; {fix}")
    return arr


def load_torch_file(path, admitted: dict, what: str, fix: str):
    """A ``torch.save`` file that holds numpy arrays and plain containers (the pickle
    of its ``data.pkl``, any protocol, through the restricted unpickler); a file that
    holds tensors, or in torch's pre-1.6 format, goes to ``torch.load(weights_only=True)``
    with the same ``admitted`` globals allowed."""
    try:
        with zipfile.ZipFile(path) as z:
            pickles = [n for n in z.namelist() if n.endswith("/data.pkl")]
            if len(pickles) == 1:
                return _run(path, io.BytesIO(z.read(pickles[0])), admitted, what, fix, torch_file=True)
    except (_HoldsTensors, zipfile.BadZipFile):
        pass
    allowed = [(obj, f"{module}.{name}") for (module, name), obj in admitted.items()]
    try:
        with torch.serialization.safe_globals(allowed):
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any failure means a file that is not what it should be
        raise DatasetError(f"could not read {path} safely ({load_error(e)}); {fix}") from None
