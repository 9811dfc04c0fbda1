"""Out-of-core staging: ``scalegnn data shard dir:DIR --memory-budget SIZE`` writes the
per-rank shard files of :mod:`.format` without holding the graph in memory.

The in-memory path (:func:`.write.shard_command`) loads the whole ``Graph``, adds the
self loops, normalizes and cuts every (x, y, z)'s planes from it: ogbn-papers100M
(3.2 G stored nonzeros) does not fit a node that way. Here the CSR arrays of a ``dir:``
folder are read by memory map, a block of rows at a time, and each plane of each rank is
built from the rows it needs:

    A_hat[r, c] = d_r^-1/2 d_c^-1/2  for c in row r of A + I,  d = deg(A) + 1   (paper Eq. 3)

computed exactly as ``Graph.gcn_normalize`` does (float64 ``rsqrt`` of the degree, the
product rounded once to float32), so the shard files are byte for byte those of the
in-memory path on a graph that fits (``tests/parallel/test_staging.py`` compares their
checksums). Features come from ``features.json`` (a seed per vertex: only the rank's
rows are computed) or a memory-mapped dense ``x.npy``.

Two kinds of folder (:func:`check_folder`): one written by ``scalegnn data generate``
(:mod:`scalegnn.datasets.streaming`; its CSR is already simple and symmetric, read as
is), and a user's ``dir:`` folder of CSR ``indptr.npy`` and ``indices.npy``, ``x.npy``,
``y.npy`` (class ids, -1 unlabeled; ``num_classes.npy`` optional) and optionally its own
split (``train_idx.npy`` / ``train_mask.npy`` ...; :mod:`scalegnn.datasets.files`). A
user's CSR is first made what the in-memory reader makes of it (``undirected_csr``:
A + A^T, self loops dropped, duplicates merged, columns sorted) by :func:`symmetrize`, on
disk in ``OUT/.symmetric-csr`` (A^T by counting sort, then rows of A and A^T merged a
block at a time; deleted when the manifest is written; a resumed staging makes it
again). ``--split`` / ``--split-seed`` draw the project's random split of the labeled
vertices (``random_split``, O(N)) in place of the folder's own or seeded one, as
``apply_split`` does, and the manifest records them (``check_shard_manifest``).

Memory (:func:`memory_plan`; ``--memory-budget`` bounds the peak above the interpreter
with its imports, about 230 MB, and staging refuses a budget too small before any work):
N-sized vectors (the degrees' ``d^-1/2`` in float64, labels, split masks, and with a
relabeling the permutation, its inverse and the permuted row offsets: VERTEX_BYTES per
vertex at their peak; a user's folder: four int64 row-pointer vectors while it is made
symmetric), with ``--layout files`` the rank's own shard (what it writes, twice while its
planes are joined), and rows read in chunks of stored entries (BYTES_PER_ENTRY each:
their int64 rows, columns, sort keys and order, float64 factors), as many as the rest of
the budget holds and at least the longest row. Pages read from the memory-mapped
inputs are dropped from the resident set after each chunk (:func:`scalegnn.fileio.drop_pages`); outputs
are appended through ``write`` (:class:`scalegnn.fileio.NpyAppender`), never through a
writable map. Work is split over ``workers`` processes, one (x, y, z) file (files) or
one row range of blocks (blocks) at a time each; each holds its own interpreter and
vectors, and the budget's chunks are divided among them. A killed staging resumes: a
shard file whose ``.sha256`` sidecar matches it (files), or a row range whose record
lists the checksums its blocks still have (blocks), is kept, and the manifest (written
last) lists every file's SHA-256, which :func:`.format.load_shard` verifies.

``--permute single`` relabels by the seed's P_c on the fly (new row i is old row
``perm[i]``, its columns mapped by ``perm^-1``: one N-sized int64 array each); ``double``
adds sigma's two relabelings of the normalized matrix (rows by sigma for even layers,
columns for odd ones: :class:`scalegnn.parallel.sharding.AltOrdering`), read the same way.

Other inputs (:func:`stage_source`): a ``dir:`` folder of ``edge_index.npy``, an ``npz:``
file and OGB's ogbn-papers100M files as OGB ships them are first streamed into a CSR
folder (:mod:`scalegnn.datasets.convert`). Refused in one line before any work, naming
the in-memory path: sparse features (``x.npz`` or ``x_*.npy``), a directed weighted
folder (``undirected.npy`` false), multi-hot ``y``, and the other named datasets and
graph files (edge-list text, Matrix Market).
"""

from __future__ import annotations

import json
import math
import re
import shutil
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import numpy as np
import torch

from ..csr import runs, unique_keys
from ..fileio import NpyAppender, atomic_write, drop_pages, file_sha256
from ..parallel.grid import PMM_AXES
from ..parallel.sharding import (AltOrdering, RankShard, check_grid_shape, feature_range, grid_coords, own_arrays,
                                 plane_keys, shared_blocks, vertex_ranges)
from ..sampling import CSRBlock
from .format import (BLOCKS_DIR, adjacency_file, feature_blocks, feature_file, node_file,
                     shard_file_name, shard_storage_bytes, stored_blocks, write_manifest)

__all__ = ["check_folder", "disk_plan", "human_size", "memory_plan", "parse_size", "stage_out_of_core", "stage_source",
           "symmetrize"]

# The memory model of staging (module docstring), from counting the arrays live at each
# peak and measured on generated graphs of 0.3 M and 1.2 M vertices (peak RSS above the
# imported interpreter; tests/parallel/test_staging.py::test_the_memory_budget_bounds_the_peak
# checks the bound in fresh processes):
BYTES_PER_ENTRY = 64  # a chunk: int64 rows, columns, sort keys and order, the float64 factors (measured 47-55)
VERTEX_BYTES = {"none": 40, "single": 80, "double": 104}  # measured 33 and 73 (none, single)
SYMMETRIZE_VERTEX_BYTES = 48  # a user's CSR: A's and A^T's row pointers, their sum, the cursor and the degrees
BASE_BYTES = 64 << 20  # modules imported on first use, allocator slack (measured 42-51 MB)
INTERPRETER_BYTES = 256 << 20  # a spawned worker's python + torch + scalegnn (measured 230 MB)


def parse_size(text: str) -> int:
    """``512M``, ``2G``, ``1.5GiB``, ``100000`` -> bytes; a one-line error otherwise."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT]?)(i?[bB])?\s*", str(text))
    if not m:
        raise ValueError(f"--memory-budget {text!r} is not a size; give e.g. 512M, 2G or 1048576 (bytes)")
    return int(float(m.group(1)) * 1024 ** " KMGT".index((m.group(2) or " ").upper()))


def memory_plan(budget: int, *, n: int, nnz: int, num_features: int, num_classes: int, shape: tuple, permute: str,
                layout: str, workers: int, user_csr: bool) -> dict:
    """What staging holds (module docstring) within ``budget`` bytes above the
    interpreter: {"fixed": bytes that do not depend on the chunk, "chunk": stored entries
    per worker's chunk, "need": the smallest budget that leaves chunks of 1024 entries}.
    Raises a one-line ValueError naming the smallest budget when ``budget`` is below it."""
    copies = 1 if workers == 1 else workers + 1  # the parent keeps its vectors while the workers run
    vectors = max(VERTEX_BYTES[permute], SYMMETRIZE_VERTEX_BYTES if user_csr else 0) * n
    shard = 0
    if layout == "files":  # the rank's shard, built whole before it is written (twice while planes are joined)
        sb = shard_storage_bytes(n, nnz + n, max(1, num_features), max(1, num_classes), shape)
        shard = 2 * sb["total"] + (2 * sb["adjacency"] if permute == "double" else 0)
    fixed = BASE_BYTES + copies * vectors + workers * int(shard) + (workers * INTERPRETER_BYTES if workers > 1 else 0)
    need = fixed + workers * 1024 * BYTES_PER_ENTRY
    if budget < need:
        raise ValueError(f"--memory-budget {human_size(budget)} is below what staging this graph needs: "
                         f"{human_size(fixed)} for {n:,} vertices' vectors"
                         + (" and each rank's shard" if shard else "")
                         + (f" in {workers} workers" if workers > 1 else "") + f"; give at least {human_size(need)}")
    return {"fixed": fixed, "chunk": int((budget - fixed) // (workers * BYTES_PER_ENTRY)), "need": need}


def human_size(b: float) -> str:
    """Bytes as --memory-budget takes them (1024-based), rounded up: 5.2G, 640M."""
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if b >= scale:
            return f"{math.ceil(b / scale * 10) / 10:g}{unit}"
    return f"{int(b)}"


def _load(path: Path):
    """A stored-entries-sized array (indices, x), memory-mapped: read a block at a time,
    never whole (a test swaps this for a guard that refuses reading it whole)."""
    return np.load(path, mmap_mode="r", allow_pickle=False)


def check_folder(folder: Path) -> str:
    """What out-of-core staging reads in ``folder``: ``"generated"`` (``scalegnn data
    generate``'s) or ``"csr"`` (a user's ``dir:`` folder of CSR ``indptr.npy`` and
    ``indices.npy``, dense ``x.npy`` or ``features.json``, ``y.npy``, split files);
    any other input is refused in one line naming the in-memory path, before any work."""
    memory = "stage it without --memory-budget (in memory)"
    if not folder.is_dir():
        raise ValueError(f"dir: folder not found: {folder}; pass dir:<folder holding indptr.npy, indices.npy, "
                         "x.npy, y.npy>")
    has = lambda name: (folder / name).is_file()  # noqa: E731
    if has("graph.json"):
        return "generated"
    if has("edge_index.npy") and not has("indptr.npy"):
        raise ValueError(f"{folder} holds edge_index.npy, which stage_source streams into CSR first: call it (the "
                         f"CLI does), not stage_out_of_core")
    missing = [k for k in ("indptr.npy", "indices.npy", "y.npy") if not has(k)]
    if not has("x.npy") and not has("features.json"):
        missing.append("x.npy")
    sparse = [k for k in ("x.npz", "x_indptr.npy", "x_indices.npy", "x_data.npy", "x_shape.npy") if has(k)]
    if sparse:
        raise ValueError(f"out-of-core staging reads dense features (x.npy); {folder} holds sparse ones "
                         f"({sparse[0]}): {memory}")
    if missing:
        raise ValueError(f"out-of-core staging reads a dir: folder of CSR indptr.npy and indices.npy, x.npy (or "
                         f"features.json) and y.npy; {folder} has no {', '.join(missing)}: {memory}")
    if has("undirected.npy"):
        from ..datasets.files import byo_undirected, read_npy

        if not byo_undirected(f"{folder}/<key>.npy", read_npy(folder / "undirected.npy")):
            raise ValueError(f"out-of-core staging symmetrizes the graph (undirected, unit weights); {folder}/"
                             f"undirected.npy says directed and weighted: {memory}")
    if has("values.npy"):  # never dropped: refused, as the in-memory reader uses them
        raise ValueError(f"out-of-core staging trains unit weights and {folder} holds edge weights (values.npy): "
                         f"{memory}, or remove values.npy to train unweighted")
    if has("x.npy"):
        x = np.load(folder / "x.npy", mmap_mode="r", allow_pickle=False)
        if x.ndim != 2 or x.dtype.kind not in "iufb" or not x.shape[1]:
            raise ValueError(f"{folder}/x.npy must be an (N, F) array of numbers with F >= 1, got {x.dtype} of shape "
                             f"{x.shape}")
    y = np.load(folder / "y.npy", mmap_mode="r", allow_pickle=False)
    if y.ndim != 1:
        raise ValueError(f"out-of-core staging reads class ids (y.npy of shape (N,)); {folder}/y.npy is multi-hot: "
                         f"{memory}")
    n = x.shape[0] if has("x.npy") else y.shape[0]
    rows = np.load(folder / "indptr.npy", mmap_mode="r", allow_pickle=False).shape
    if rows != (n + 1,):
        raise ValueError(f"{folder}/<key>.npy: 'indptr' must be ({n + 1},) for N={n} rows of x, got shape {rows}")
    from ..datasets.files import byo_labels

    byo_labels(np.asarray(y), f"{folder}/<key>.npy", "'y'", n)  # bad labels found now, not after the CSR pass
    return "csr"


def _sizes(folder: Path, kind: str) -> dict:
    """What :func:`memory_plan` needs of a checked folder, read from headers and json only."""
    shape = lambda name: np.load(folder / name, mmap_mode="r", allow_pickle=False).shape  # noqa: E731
    n = shape("y.npy")[0]
    nnz = int(np.load(folder / "indptr.npy", mmap_mode="r")[-1]) * (2 if kind == "csr" else 1)  # A + A^T at most
    if (folder / "x.npy").is_file():
        f = shape("x.npy")[1]
    else:
        f = int(json.loads((folder / "features.json").read_text()).get("dim", 1))
    return {"n": n, "nnz": nnz, "num_features": f, "num_classes": 32}


def disk_plan(out: Path, *, n: int, nnz: int, num_features: int, num_classes: int, shape: tuple, layout: str,
              seeded: bool, user_csr: bool) -> int:
    """Bytes staging will write under ``out`` (an estimate from the sizes: the blocks of
    A + I once, or every rank's shard, plus the symmetric CSR made on the way for a
    user's folder); refuses in one line, before any work, when the disk holding ``out``
    has less free (files already there, from a staging that is resumed, count as free)."""
    index = 4 if n < 2**31 else 8
    if layout == "blocks":
        need = (nnz + n) * (index + 4) + 8 * sum(r[1] - r[0] + 1 for r, _ in stored_blocks(shape, n)) + 11 * n
        need += 0 if seeded else 4 * n * num_features
    else:
        need = sum(shard_storage_bytes(n, nnz + n, max(1, num_features), max(1, num_classes), shape, c)["total"]
                   for c in grid_coords(shape))
    if user_csr:
        need += (nnz + n) * 8 + 2 * nnz * index  # row pointers, A^T, the symmetric columns
    have = sum(f.stat().st_size for f in out.rglob("*") if f.is_file()) if out.is_dir() else 0
    free = shutil.disk_usage(out if out.exists() else out.parent).free + have
    if need > free:
        raise ValueError(f"staging writes about {human_size(need)} under {out}, but its disk has {human_size(free)} "
                         "free; free space there or pass another --out")
    return int(need)


def _longest_row(folder: Path) -> int:
    """The most stored entries of one row of the CSR in ``folder`` (graph.json's
    max_degree when generated; else one chunked pass over the row pointers)."""
    if (folder / "graph.json").is_file():
        return int(json.loads((folder / "graph.json").read_text())["max_degree"])
    indptr = np.load(folder / "indptr.npy", mmap_mode="r")
    longest = 0
    for a in range(0, indptr.shape[0] - 1, 1 << 22):
        longest = max(longest, int(np.diff(indptr[a:a + (1 << 22) + 1]).max(initial=0)))
    drop_pages(indptr)
    return longest


def _row_chunks(row_end: np.ndarray, r0: int, r1: int, chunk: int):
    """Rows [a, b) of [r0, r1) holding about ``chunk`` entries (at least one row) each."""
    a = r0
    while a < r1:
        b = min(r1, max(a + 1, int(np.searchsorted(row_end, row_end[a] + chunk, side="right")) - 1))
        yield a, b
        a = b


def symmetrize(folder: Path, out: Path, chunk: int) -> dict:
    """A user's CSR (``folder``'s indptr.npy, indices.npy) as the in-memory reader makes
    it (:func:`scalegnn.datasets._core.undirected_csr`: A + A^T, self loops dropped,
    duplicates merged, columns sorted), written to ``out`` (indptr.npy, indices.npy)
    ``chunk`` stored entries at a time: A^T is first written to ``out`` by counting sort
    (one N-sized cursor), then each block of rows merges its rows of A and A^T. Memory:
    O(N) int64 vectors and one chunk; disk: A^T and the result. Returns what the
    in-memory reader says of a user's file that was not symmetric (``symmetrized`` and
    ``input_edges``, for the record), or nothing."""
    where = f"{folder}/<key>.npy"
    indptr = np.load(folder / "indptr.npy", mmap_mode="r", allow_pickle=False)
    indices = _load(folder / "indices.npy")
    if indptr.ndim != 1 or indptr.dtype.kind not in "iu" or indices.ndim != 1 or indices.dtype.kind not in "iu":
        raise ValueError(f"{where}: 'indptr' and 'indices' must be 1-D int arrays, got {indptr.dtype} {indptr.shape} "
                         f"and {indices.dtype} {indices.shape}")
    ip = np.asarray(indptr, dtype=np.int64)
    n = ip.size - 1
    if ip[0] != 0 or (np.diff(ip) < 0).any() or ip[-1] != indices.shape[0]:
        raise ValueError(f"{where}: 'indptr' must start at 0, be non-decreasing and end at len(indices) = "
                         f"{indices.shape[0]} (CSR row pointers); got first {ip[0]}, last {ip[-1]}")
    dtype = np.int32 if n < 2**31 else np.int64
    t_count = np.zeros(n, dtype=np.int64)
    for a, b in _row_chunks(ip, 0, n, chunk):  # pass 1: the columns' counts (A^T's row lengths), ids checked
        c = np.asarray(indices[ip[a]:ip[b]], dtype=np.int64)
        if c.size and (c.min() < 0 or c.max() >= n):
            raise ValueError(f"{where}: edge endpoints must be in [0, {n}) (N = rows of x), 'indices' holds "
                             f"{int(c.min()) if c.min() < 0 else int(c.max())}")
        u, _, k = runs(np.sort(c))
        t_count[u] += k
    t_ip = np.concatenate([[0], np.cumsum(t_count)])
    del t_count
    a_t = np.lib.format.open_memmap(out / "transposed.npy", mode="w+", dtype=dtype, shape=(int(ip[-1]),))
    cursor = t_ip[:-1].copy()
    for a, b in _row_chunks(ip, 0, n, chunk):  # pass 2: row r of A puts r in rows indices[.] of A^T, in order
        c = np.asarray(indices[ip[a]:ip[b]], dtype=np.int64)
        r = np.repeat(np.arange(a, b, dtype=np.int64), np.diff(ip[a:b + 1]))
        order = np.argsort(c, kind="stable")
        c, r = c[order], r[order]
        u, first, k = runs(c)
        a_t[cursor[c] + np.arange(c.size) - np.repeat(first, k)] = r
        cursor[u] += k
        del c, r, order, u, first, k
        drop_pages(a_t, indices)  # written pages stay in the page cache (a shared map), not in this process
    a_t.flush()
    del cursor, a_t
    a_t = _load(out / "transposed.npy")
    both = ip + t_ip  # entries of A and A^T before each row

    def merged(a: int, b: int) -> np.ndarray:  # rows [a, b)'s keys local * n + column, unique and sorted
        lens = np.concatenate([np.diff(ip[a:b + 1]), np.diff(t_ip[a:b + 1])])
        local = np.repeat(np.concatenate([np.arange(b - a, dtype=np.int64)] * 2), lens)
        c = np.concatenate([np.asarray(indices[ip[a]:ip[b]], dtype=np.int64),
                            np.asarray(a_t[t_ip[a]:t_ip[b]], dtype=np.int64)])
        keep = c != local + a  # self loops dropped (the trainer adds I)
        return unique_keys(local[keep] * n + c[keep])

    def given(a: int, b: int) -> int:  # rows [a, b)'s distinct entries of A alone, self loops dropped
        local = np.repeat(np.arange(b - a, dtype=np.int64), np.diff(ip[a:b + 1]))
        c = np.asarray(indices[ip[a]:ip[b]], dtype=np.int64)
        keep = c != local + a
        return unique_keys(local[keep] * n + c[keep]).size

    deg = np.zeros(n, dtype=np.int64)
    pairs = 0  # the directed pairs given: fewer than the symmetric entries when some had no reverse
    for a, b in _row_chunks(both, 0, n, chunk):  # pass 3: the symmetric rows' lengths
        deg[a:b] = np.bincount(merged(a, b) // n, minlength=b - a)
        pairs += given(a, b)
        drop_pages(indices, a_t)
    s_ip = np.concatenate([[0], np.cumsum(deg)])
    del deg
    s_ix = np.lib.format.open_memmap(out / "indices.npy", mode="w+", dtype=dtype, shape=(int(s_ip[-1]),))
    for a, b in _row_chunks(both, 0, n, chunk):  # pass 4: write them
        s_ix[s_ip[a]:s_ip[b]] = merged(a, b) % n
        drop_pages(s_ix, indices, a_t)
    s_ix.flush()
    del s_ix
    a_t = None  # its map closed before the file goes
    (out / "transposed.npy").unlink()
    np.save(out / "indptr.npy", s_ip)
    return {"symmetrized": True, "input_edges": int(ip[-1])} if pairs < s_ip[-1] else {}


class _Source:
    """A generated folder's arrays, memory-mapped, and what every rank needs of them."""

    def __init__(self, folder: Path, seed: int, permute: str = "none", split: tuple = (None, None),
                 topology: Path | None = None):
        from ..datasets import DatasetError, draw_split
        from ..datasets.convert import SOURCE_NOTE
        from ..datasets.files import SPLIT_KEYS, byo_labels, byo_split, read_npy
        from ..datasets.streaming import seeded_features
        from ..graph import GraphValidationError, check_split

        self.folder = folder
        topology = folder if topology is None else Path(topology)  # a user's folder: its symmetric CSR, staged
        self.indptr, self.indices = np.load(topology / "indptr.npy", mmap_mode="r"), _load(topology / "indices.npy")
        where = f"{folder}/<key>.npy"  # as the in-memory reader (datasets.files.load_byo) names the folder
        if (folder / "x.npy").is_file():
            self.features, self.x = None, _load(folder / "x.npy")
            self.n, self.num_features = self.x.shape
        else:
            self.x = None
            self.features = seeded_features(json.loads((folder / "features.json").read_text()),
                                            str(folder / "features.json"))
            self.n, self.num_features = int(np.load(folder / "y.npy", mmap_mode="r").shape[0]), self.features.dim
        if self.indptr.shape != (self.n + 1,):
            raise ValueError(f"{folder}: indptr.npy must be ({self.n + 1},) for N={self.n} rows of x, got shape "
                             f"{self.indptr.shape}")
        classes = read_npy(folder / "num_classes.npy") if (folder / "num_classes.npy").is_file() else None
        y, self.num_classes = byo_labels(np.load(folder / "y.npy", allow_pickle=False), where, "'y'", self.n, classes)
        self.y = torch.from_numpy(y)
        self.nnz = int(self.indptr[-1])
        labeled = np.flatnonzero(y >= 0)
        own = {k: read_npy(folder / f"{k}.npy") for keys in SPLIT_KEYS.values() for k in keys
               if (folder / f"{k}.npy").is_file()}
        parts, self.split_note = byo_split(own, where, self.n, seed, y)  # as the in-memory reader's
        if own:
            if (folder / SOURCE_NOTE).is_file():  # converted from a named dataset: its loader's name for the split
                self.split_note = json.loads((folder / SOURCE_NOTE).read_text())["split"]
            try:  # as the Graph checks them
                check_split(self.n, self.y, *parts)
            except GraphValidationError as exc:
                raise DatasetError(f"{folder}: {exc}") from None
        if split[0] is not None:  # --split in place of it, drawn as datasets._core.apply_split draws it
            split_seed = seed if split[1] is None else int(split[1])
            parts, self.split_note = draw_split(split[0], split_seed, self.n, labeled, f"dir:{folder}",
                                                self.split_note)
        self.masks = {}
        for key, idx in zip(("train_mask", "val_mask", "test_mask"), parts):
            m = torch.zeros(self.n, dtype=torch.bool)
            m[idx] = True
            self.masks[key] = m
        del parts, labeled, own  # N-sized: gone before the degrees'
        self.masks["train_mask"] &= self.y >= 0
        deg = np.diff(self.indptr)
        self.perm = self.new_id = self.sigma = self.sigma_inv = None
        if permute in ("single", "double"):  # the seed's relabeling P_c (Graph.permute: old vertex perm[i] is i)
            from ..permutation import double_sigma, inverse_permutation, random_permutation

            perm_t = random_permutation(self.n, seed)
            self.perm, self.new_id = perm_t.numpy(), inverse_permutation(perm_t).numpy()
            deg = deg[self.perm]
            self.y = self.y[perm_t]
            self.masks = {k: m[perm_t] for k, m in self.masks.items()}
            if permute == "double":  # and the second labeling sigma (sharding.double_permuted)
                self.sigma = double_sigma(self.n, seed)
                self.sigma_inv = inverse_permutation(self.sigma)
        drop_pages(self.indptr)
        self._row_end: dict = {}
        # d^-1/2 of A + I (one self loop per row, so d >= 1), float64 as Graph.gcn_normalize computes it
        self.inv_sqrt = np.add(deg, 1.0, dtype=np.float64)
        torch.from_numpy(self.inv_sqrt).rsqrt_()
        self.deg = deg if self.perm is not None else None  # of A in the run's labeling, for permuted rows' offsets
        del deg

    def _rows_of(self, view: str):
        """Row r of ``view`` is row ``map[r]`` of A (None: row r): "rows" is the double
        permutation's A with rows relabeled by sigma."""
        return self.sigma_inv.numpy() if view == "rows" else None

    def row_end(self, view: str) -> np.ndarray:
        """Stored entries of A (self loops not counted) before each row of ``view``."""
        if view not in self._row_end:
            rows = self._rows_of(view)
            if rows is None and self.perm is None:
                self._row_end[view] = self.indptr
            else:
                deg = self.deg if rows is None else self.deg[rows]
                self._row_end[view] = np.concatenate([[0], np.cumsum(deg)])
        return self._row_end[view]

    def entries(self, a: int, b: int, view: str = "A") -> tuple[np.ndarray, np.ndarray, torch.Tensor]:
        """Rows [a, b) of the normalized A + I in the run's labeling (``view`` as in
        :meth:`block`): (row - a, column, FP32 value) of every stored entry, rows in order
        and columns sorted within a row."""
        n = self.n
        row_map = self._rows_of(view)
        col_map = self.sigma.numpy() if view == "cols" else None
        g_rows = np.arange(a, b, dtype=np.int64) if row_map is None else row_map[a:b]  # rows of A
        if self.perm is None and row_map is None:
            lo, hi = int(self.indptr[a]), int(self.indptr[b])
            lens = np.diff(self.indptr[a:b + 1])
            c = np.asarray(self.indices[lo:hi], dtype=np.int64)
        else:  # rows of A are the folder's rows perm[.], their columns relabeled
            old = g_rows if self.perm is None else self.perm[g_rows]
            starts = np.asarray(self.indptr[old], dtype=np.int64)
            lens = np.asarray(self.indptr[old + 1], dtype=np.int64) - starts
            flat = np.repeat(starts - (np.cumsum(lens) - lens), lens) + np.arange(int(lens.sum()), dtype=np.int64)
            c = np.asarray(self.indices[flat], dtype=np.int64)
            if self.new_id is not None:
                c = self.new_id[c]
            del old, starts, flat
        drop_pages(self.indptr, self.indices)  # read pages leave the resident set (they stay in the page cache)
        local = np.concatenate([np.repeat(np.arange(b - a, dtype=np.int64), lens), np.arange(b - a, dtype=np.int64)])
        c = np.concatenate([c, g_rows])  # A + I: the self loop (row, row) of A
        vals = self.inv_sqrt[g_rows][local]
        vals *= self.inv_sqrt[c]
        vals = vals.astype(np.float32)  # Eq. 3 in float64, rounded once as gcn_normalize does
        if col_map is not None:
            c = col_map[c]
        order = np.argsort(local * n + c, kind="stable")  # rows in order, columns sorted
        return local[order], c[order], torch.from_numpy(vals[order])

    def chunks(self, r0: int, r1: int, chunk: int, view: str = "A"):
        """Rows [a, b) of [r0, r1) of ``view`` holding about ``chunk`` stored entries (at least one row) each."""
        return _row_chunks(self.row_end(view), r0, r1, chunk)

    def block(self, rows: tuple, cols: tuple, chunk: int, view: str = "A") -> CSRBlock:
        """Rows ``rows`` x columns ``cols`` of the normalized A + I in the run's labeling --
        or, for the double permutation, of it with rows (``view="rows"``) or columns
        (``view="cols"``) relabeled by sigma (:func:`scalegnn.parallel.sharding.double_permuted`) -- read
        ``chunk`` stored entries at a time; arrays as ``CSRBlock.from_graph`` makes them."""
        (r0, r1), (c0, c1) = rows, cols
        counts, cols_out, vals_out = [], [], []
        for a, b in self.chunks(r0, r1, chunk, view):
            r_l, c_g, vals_all = self.entries(a, b, view)
            keep = (c_g >= c0) & (c_g < c1)
            counts.append(np.bincount(r_l[keep], minlength=b - a))
            cols_out.append(torch.from_numpy(c_g[keep]))
            vals_out.append(vals_all[torch.from_numpy(keep)])
            del r_l, c_g, keep, vals_all
        indptr = torch.zeros(r1 - r0 + 1, dtype=torch.int64)
        if counts:
            indptr[1:] = torch.from_numpy(np.cumsum(np.concatenate(counts)))
        indices = torch.cat(cols_out) if cols_out else torch.zeros(0, dtype=torch.int64)
        values = torch.cat(vals_out) if vals_out else torch.zeros(0, dtype=torch.float32)
        if self.n < 2**31:
            indices = indices.to(torch.int32)
        return CSRBlock(indptr.contiguous(), indices.contiguous(), values.contiguous(), r0, r1, c0, c1)

    def feature_rows(self, a: int, b: int, cols: tuple) -> np.ndarray:
        """Rows [a, b) x feature columns ``cols`` of X in the run's labeling, float32."""
        f0, f1 = cols
        ids = np.arange(a, b) if self.perm is None else self.perm[a:b]  # the rows' ids in the folder
        if self.features is not None:
            return self.features.rows(ids, None, None if self.features.means is None else self.y[a:b].numpy(),
                                      cols=(f0, f1))
        block = np.asarray(self.x[ids], dtype=np.float32)
        drop_pages(self.x)
        if not np.isfinite(block).all():  # as the in-memory reader refuses them
            raise ValueError(f"{self.folder}/x.npy holds NaN or inf (rows {a}..{b - 1}); clean or impute the "
                             "features first")
        return np.ascontiguousarray(block[:, f0:f1])

    def feature_block(self, rows: tuple, cols: tuple, chunk_rows: int) -> torch.Tensor:
        (x0, x1), (f0, f1) = rows, cols
        out = torch.empty((x1 - x0, f1 - f0), dtype=torch.float32)
        for a in range(x0, x1, max(1, chunk_rows)):
            b = min(x1, a + max(1, chunk_rows))
            out[a - x0:b - x0] = torch.from_numpy(self.feature_rows(a, b, cols))
        return out


_SOURCE: dict = {}


def _source(folder: str, seed: int, permute: str = "none", split: tuple = (None, None),
            topology: str | None = None) -> _Source:
    key = (folder, seed, permute, tuple(split), topology)
    if key not in _SOURCE:
        _SOURCE.clear()
        _SOURCE[key] = _Source(Path(folder), seed, permute, split, topology)
    return _SOURCE[key]


def _write_rank(folder: str, seed: int, shape: tuple, coords: dict, out_dir: str, name: str, chunk: int,
                permute: str = "none", split: tuple = (None, None), topology: str | None = None) -> dict:
    """One (x, y, z)'s shard file (kept when its ``.sha256`` sidecar matches it): its name,
    checksum and nonzeros per plane."""
    path = Path(out_dir) / shard_file_name(coords)
    side = path.with_name(path.name + ".sha256")
    if path.exists() and side.exists():
        digest, nnz = side.read_text().split()[0], json.loads(side.read_text().split(maxsplit=1)[1])
        if file_sha256(path) == digest:
            return {"file": path.name, "sha256": digest, "nnz": nnz, "resumed": True}
    src = _source(folder, seed, permute, split, topology)
    vr = vertex_ranges(shape, src.n, coords)
    f0, f1 = feature_range(shape, src.num_features, coords)
    keys = plane_keys(vr)
    def planes(view: str) -> tuple:  # as sharding cuts planes, from the rows read in chunks
        made = shared_blocks(keys, lambda key: own_arrays(src.block(*key, chunk, view)))
        return tuple(made[k] for k in keys)

    sl = lambda t: {ax: t[vr[ax][0]: vr[ax][1]].clone() for ax in PMM_AXES}  # noqa: E731
    alt = None
    if src.sigma is not None:  # as sharding.build_shard: even layers take alt.adj, odd ones alt.adj_t
        inv = src.sigma_inv
        sl_alt = lambda t: {ax: t[inv[vr[ax][0]: vr[ax][1]]].clone() for ax in PMM_AXES}  # noqa: E731
        alt = AltOrdering(sigma=src.sigma.clone(), sigma_inv=inv, adj=planes("rows"), adj_t=planes("cols"),
                          y=sl_alt(src.y), train_mask=sl_alt(src.masks["train_mask"]),
                          val_mask=sl_alt(src.masks["val_mask"]), test_mask=sl_alt(src.masks["test_mask"]))
        adj = alt.adj
    else:
        adj = planes("A")
    shard = RankShard(
        grid_shape=shape, coords={ax: int(coords[ax]) for ax in PMM_AXES}, num_nodes=src.n,
        num_features=src.num_features, num_classes=src.num_classes, multilabel=False, adj=adj,
        x=src.feature_block(vr["x"], (f0, f1), max(1, chunk // max(1, 2 * src.num_features))),
        feature_range=(f0, f1), vertex_ranges=vr, y=sl(src.y), train_mask=sl(src.masks["train_mask"]),
        val_mask=sl(src.masks["val_mask"]), test_mask=sl(src.masks["test_mask"]), name=name, alt=alt)
    atomic_write(path, lambda f: torch.save(shard.to_state(), f))
    digest, nnz = file_sha256(path), [blk.nnz for blk in shard.adj]
    atomic_write(side, lambda f: f.write(f"{digest} {json.dumps(nnz)}\n"), text=True)
    return {"file": path.name, "sha256": digest, "nnz": nnz, "resumed": False}


# ------------------------------------------------------------------ blocks layout
def _rows_record(out: Path, rows: tuple) -> Path:
    """Where a finished row range of blocks lists its files' checksums (until the manifest)."""
    return out / BLOCKS_DIR / f".rows-{rows[0]}-{rows[1]}.json"


def _checked(out: Path, record: Path) -> dict | None:
    """A finished group's record ({file: sha256}) when every file it lists still has that
    checksum (a resumed staging keeps it), else None."""
    try:
        done = json.loads(record.read_text())
    except (OSError, ValueError):
        return None
    ok = all((out / f).is_file() and file_sha256(out / f) == h for f, h in done["sha256"].items())
    return done if ok else None


def _write_rows(folder: str, seed: int, permute: str, split: tuple, topology: str | None, out_dir: str,
                rows: tuple, col_ranges: list, chunk: int) -> dict:
    """The stored blocks of A + I over vertex rows ``rows`` (one per column range of
    ``col_ranges``), from one pass over those rows, ``chunk`` entries at a time: each
    block's indptr, indices and values appended to its .npy files. Returns
    {"sha256": {file: checksum}, "nnz": {file of indices: entries}, "resumed": bool}."""
    out = Path(out_dir)
    r0, r1 = rows
    record = _rows_record(out, rows)
    done = _checked(out, record)
    if done is not None:
        return {**done, "resumed": True}
    src = _source(folder, seed, permute, split, topology)
    idx_dtype = np.int32 if src.n < 2**31 else np.int64
    keys = [(rows, cols) for cols in col_ranges]
    parts = {k: {p: NpyAppender(out / adjacency_file(k, p), dt) for p, dt in
                 (("indptr", np.int64), ("indices", idx_dtype), ("values", np.float32))} for k in keys}
    total = dict.fromkeys(keys, 0)
    try:
        for k in keys:
            parts[k]["indptr"].add(np.zeros(1, dtype=np.int64))
        for a, b in src.chunks(r0, r1, chunk):
            r_l, c_g, vals = src.entries(a, b)
            vals = vals.numpy()
            for k in keys:
                (c0, c1) = k[1]
                keep = (c_g >= c0) & (c_g < c1) if (c0, c1) != (0, src.n) else slice(None)
                counts = np.bincount(r_l[keep], minlength=b - a)
                parts[k]["indptr"].add(total[k] + np.cumsum(counts))
                parts[k]["indices"].add(c_g[keep])
                parts[k]["values"].add(vals[keep])
                total[k] += int(counts.sum())
            del r_l, c_g, vals
        paths = [w.close() for k in keys for w in parts[k].values()]
    except BaseException:
        for k in keys:
            for w in parts[k].values():
                w.abort()
        raise
    done = {"sha256": {str(p.relative_to(out)): file_sha256(p) for p in paths},
            "nnz": {adjacency_file(k, "indices"): total[k] for k in keys}}
    atomic_write(record, lambda f: json.dump(done, f), text=True)
    return {**done, "resumed": False}


def _write_features(src: _Source, out: Path, keys: list, chunk_rows: int) -> dict:
    """The dense feature blocks ``keys`` ((rows, feature columns)), ``chunk_rows`` rows at a time."""
    sums = {}
    for key in keys:
        (x0, x1), cols = key
        w = NpyAppender(out / feature_file(key), np.float32, (cols[1] - cols[0],))
        try:
            for a in range(x0, x1, chunk_rows):
                w.add(src.feature_rows(a, min(x1, a + chunk_rows), cols))
        except BaseException:
            w.abort()
            raise
        sums[feature_file(key)] = file_sha256(w.close())
    return sums


def _run(write, jobs: list, workers: int) -> list:
    """``write(*job)`` for each job, in this process, or in ``workers`` spawned ones (each
    builds its own source; this process's is dropped first)."""
    if workers == 1 or len(jobs) == 1:
        return [write(*j) for j in jobs]
    _SOURCE.clear()
    with ProcessPoolExecutor(max_workers=min(workers, len(jobs)), mp_context=get_context("spawn")) as pool:
        return list(pool.map(write, *zip(*jobs)))


def _stage_blocks(src: _Source, args: tuple, shape: tuple, out: Path, chunk: int, workers: int) -> dict:
    """The blocks layout (:func:`.format.stored_blocks`): what the manifest says of it."""
    folder, seed, permute, split, topology = args
    stored = stored_blocks(shape, src.n)
    by_rows: dict = {}
    for rows, cols in stored:
        by_rows.setdefault(rows, []).append(cols)
    done = _run(_write_rows, [(folder, seed, permute, split, topology, str(out), rows, cols, chunk)
                              for rows, cols in by_rows.items()], workers)
    sums = {f: h for d in done for f, h in d["sha256"].items()}
    nnz = {f: k for d in done for f, k in d["nnz"].items()}
    nodes = {"y": src.y.numpy(), **{k: src.masks[k].numpy() for k in ("train_mask", "val_mask", "test_mask")}}
    features: dict = {"kind": "dense"}
    if src.features is not None:  # computed from the seed where the rank loads: nothing stored
        features = {"kind": "seeded", "protocol": src.features.to_json()}
        if src.perm is not None:
            nodes["ids"] = src.perm  # the folder's id of each row, the features' counter
            features["ids"] = True
    for key, arr in nodes.items():
        w = NpyAppender(out / node_file(key), arr.dtype, arr.shape[1:])
        w.add(arr)
        sums[node_file(key)] = file_sha256(w.close())
    if features["kind"] == "dense":
        sums.update(_write_features(src, out, feature_blocks(shape, src.n, src.num_features),
                                    max(1, chunk // max(1, 2 * src.num_features))))

    def plane_nnz(key: tuple) -> int:  # a row slice: the entries of its rows in the block it is cut from
        block = next(k for k in stored if k[1] == key[1] and k[0][0] <= key[0][0] and key[0][1] <= k[0][1])
        if block == key:
            return nnz[adjacency_file(key, "indices")]
        ip = np.load(out / adjacency_file(block, "indptr"), mmap_mode="r")
        return int(ip[key[0][1] - block[0][0]] - ip[key[0][0] - block[0][0]])

    per_rank = [[plane_nnz(k) for k in plane_keys(vertex_ranges(shape, src.n, c))] for c in grid_coords(shape)]
    return {"layout": "blocks", "files": sorted(sums), "sha256": sums, "nnz_per_shard": per_rank,
            "features": features, "resumed": sum(d["resumed"] for d in done),
            "records": [_rows_record(out, rows) for rows in by_rows]}


def stage_source(name: str, grid_shape, out_dir, *, data_root=None, **kwargs) -> list[Path]:
    """``scalegnn data shard NAME --memory-budget SIZE``: :func:`stage_out_of_core` of a
    ``dir:`` CSR folder as it is, or of ``dir:`` (edge_index.npy), ``npz:`` and OGB's raw
    files after :func:`scalegnn.datasets.convert.convert` has streamed them into a CSR
    folder in ``OUT/.converted`` (kept until the manifest is written: a resumed staging
    reuses it)."""
    from ..datasets.convert import convert, input_sizes, needs_conversion

    kind, _, rest = name.partition(":")
    folder = Path(rest.strip()).expanduser() if kind.strip().lower() == "dir" and rest.strip() else None
    if not needs_conversion(name, folder):
        if folder is None:
            raise ValueError(f"--memory-budget stages a dir: folder (CSR indptr.npy, indices.npy; or written by "
                             f"`scalegnn data generate`), an npz: file or OGB's raw files of "
                             f"{', '.join(_ogb_names())}, not {name!r}; drop --memory-budget to stage it in memory")
        return stage_out_of_core(folder, grid_shape, out_dir, **kwargs)
    out = Path(out_dir)
    converted = out / ".converted"
    done = converted / ".complete"
    if not done.is_file():
        budget, workers = kwargs.get("memory_budget", 512 << 20), kwargs.get("workers", 1)
        permute, layout = kwargs.get("permute", "none"), kwargs.get("layout", "files")
        _check_options(permute, budget, workers, layout)
        plan = memory_plan(budget, **input_sizes(name, data_root), shape=check_grid_shape(grid_shape), permute=permute,
                           layout=layout, workers=workers, user_csr=True)  # before the conversion's hours
        convert(name, converted, data_root=data_root, chunk=kwargs.get("chunk_entries") or plan["chunk"] * workers)
        done.write_text(name)
    shown = name if folder is None else f"dir:{folder.resolve()}"
    users = folder is not None or kind.strip().lower() == "npz"  # a named dataset is undirected by definition
    paths = stage_out_of_core(converted, grid_shape, out_dir, name=shown, users=users, **kwargs)
    for f in converted.iterdir():
        f.unlink()
    converted.rmdir()
    return paths


def _check_options(permute: str, memory_budget: int, workers: int, layout: str) -> None:
    if permute not in ("none", "single", "double"):
        raise ValueError(f"permute must be none, single or double, got {permute!r}")
    if memory_budget < 1 << 20:
        raise ValueError(f"--memory-budget {memory_budget} bytes is below 1M; give at least 1M, e.g. 512M")
    if workers < 1:
        raise ValueError(f"--workers {workers} must be >= 1")
    if layout not in ("files", "blocks"):
        raise ValueError(f"--layout must be files or blocks, got {layout!r}")
    if layout == "blocks" and permute == "double":
        raise ValueError("--layout blocks stores the run's one labeling; --permute double needs two: stage it with "
                         "--layout files, or use --permute single")


def _ogb_names() -> tuple:
    from ..datasets.convert import OGB_RAW

    return tuple(OGB_RAW)


def stage_out_of_core(folder, grid_shape, out_dir, *, seed: int = 0, memory_budget: int = 512 << 20,
                      workers: int = 1, permute: str = "none", split: tuple = (None, None),
                      chunk_entries: int | None = None, layout: str = "files", name: str | None = None,
                      users: bool = True) -> list[Path]:
    """``scalegnn data shard dir:FOLDER --memory-budget SIZE``: the shard files and
    manifest of :func:`.write.save_shards` for the graph in ``folder`` (generated, or a
    user's CSR folder: :func:`check_folder`), written rank file by rank file from
    memory-mapped arrays (see the module docstring). Returns the written paths, the
    manifest last. ``chunk_entries`` overrides the stored entries read at a time
    (default: from the budget; tests make it small). ``layout``: ``files`` (a file per
    (x, y, z)) or ``blocks`` (each distinct block once, :func:`.format.stored_blocks`;
    one pass over the graph; single or no permutation). ``users``: a user's graph, whose
    symmetrizing is stated and recorded (a named dataset converted here is undirected by
    its definition, as its in-memory loader reads it)."""
    folder = Path(folder).expanduser().resolve()
    _check_options(permute, memory_budget, workers, layout)
    kind = check_folder(folder)
    if split[0] is not None:
        from ..datasets import split_flag

        split = (split_flag(split[0]), split[1])  # canonical, as the CLI's --split parses it
    shape = check_grid_shape(grid_shape)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    name = name or f"dir:{folder}"
    sizes = _sizes(folder, kind)
    plan = memory_plan(memory_budget, **sizes, shape=shape, permute=permute, layout=layout, workers=workers,
                       user_csr=kind == "csr")
    disk_plan(out, **sizes, shape=shape, layout=layout, seeded=not (folder / "x.npy").is_file(),
              user_csr=kind == "csr")
    chunk = chunk_entries or plan["chunk"]
    topology, symmetrized = None, {}
    if kind == "csr":  # the user's CSR made symmetric (as the in-memory reader does), on disk beside the shards
        topology = out / ".symmetric-csr"
        topology.mkdir(exist_ok=True)
        symmetrized = symmetrize(folder, topology, chunk_entries or plan["chunk"] * workers)
        symmetrized = symmetrized if users else {}
        if symmetrized:
            from ..graph import state_symmetrized

            entries = int(np.load(topology / "indptr.npy", mmap_mode="r")[-1])
            state_symmetrized(name, symmetrized["input_edges"], entries)
        topology = str(topology)
    longest = _longest_row(Path(topology or folder))
    if chunk_entries is None and longest + 1 > chunk:  # a chunk holds at least one row (and its self loop)
        raise ValueError(f"--memory-budget {human_size(memory_budget)} leaves chunks of {chunk:,} entries, below "
                         f"this graph's longest row ({longest:,} entries); give at least "
                         f"{human_size(plan['fixed'] + workers * (longest + 1) * BYTES_PER_ENTRY)}")
    src = _source(str(folder), int(seed), permute, split, topology)  # checks labels and split before the ranks
    if layout == "blocks":
        staged = _stage_blocks(src, (str(folder), int(seed), permute, split, topology), shape, out, chunk, workers)
        _SOURCE.clear()
        files, sums, per_rank, resumed = staged["files"], staged["sha256"], staged["nnz_per_shard"], staged["resumed"]
    else:
        done = _run(_write_rank, [(str(folder), int(seed), shape, c, str(out), name, chunk, permute, split, topology)
                                  for c in grid_coords(shape)], workers)
        _SOURCE.clear()
        files, per_rank, resumed = [d["file"] for d in done], [d["nnz"] for d in done], sum(d["resumed"] for d in done)
        sums = {d["file"]: d["sha256"] for d in done}
    info = {"num_nodes": src.n, "num_edges": src.nnz, "adjacency_nnz": src.nnz + src.n,
            "num_features": src.num_features,
            "num_classes": src.num_classes, "sparse_features": False, "split": src.split_note, **symmetrized}
    blocks = {"layout": "blocks", "features": staged["features"]} if layout == "blocks" else {}
    mpath = write_manifest(out, grid_shape=shape, name=name, num_nodes=src.n, num_edges=src.nnz + src.n,
                           num_features=src.num_features, num_classes=src.num_classes, multilabel=False, files=files,
                           nnz_per_shard=per_rank, sha256=sums, permute=permute, seed=seed, split=split, graph=info,
                           staged={"out_of_core": True, "memory_budget": int(memory_budget), "workers": int(workers),
                                   "resumed": resumed}, **blocks)
    for done_record in [out / (f + ".sha256") for f in files] + (staged["records"] if layout == "blocks" else []):
        done_record.unlink(missing_ok=True)  # after the manifest: a staging killed before it still resumes
    if topology is not None:
        for f in Path(topology).iterdir():
            f.unlink()
        Path(topology).rmdir()
    return [out / f for f in files] + [mpath]
