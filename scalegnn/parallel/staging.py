"""Out-of-core staging: ``scalegnn data shard dir:DIR --memory-budget SIZE`` writes the
per-rank shard files of :mod:`.sharding` without holding the graph in memory.

The in-memory path (:func:`.sharding.shard_command`) loads the whole ``Graph``, adds the
self loops, normalizes and cuts every (x, y, z)'s planes from it: ogbn-papers100M
(3.2 G stored nonzeros) does not fit a node that way. Here the CSR arrays of a folder
written by ``scalegnn data generate`` (:mod:`scalegnn.datasets.streaming`) are read by
memory map, a block of rows at a time, and each plane of each rank is built from the
rows it needs:

    A_hat[r, c] = d_r^-1/2 d_c^-1/2  for c in row r of A + I,  d = deg(A) + 1   (paper Eq. 3)

computed exactly as ``Graph.gcn_normalize`` does (float64 ``rsqrt`` of the degree, the
product rounded once to float32), so the shard files are byte for byte those of the
in-memory path on a graph that fits (``tests/parallel/test_staging.py`` compares their
checksums). Features come from ``features.json`` (a seed per vertex: only the rank's
rows are computed) or a memory-mapped ``x.npy``.

Memory: O(N) small vectors (the degrees' ``d^-1/2`` in float64, labels, split masks:
about 12 bytes per vertex), the rank's own shard (what it writes), and rows read in
chunks of ``memory_budget / 40`` stored entries (the int64 keys, their sort and the
values of a chunk). Work is split over ``workers`` processes, one (x, y, z) file at a
time each (each holds its own N-sized vectors; the budget's chunk is divided among them). A killed staging resumes: a shard file whose ``.sha256`` sidecar matches it
is kept, and the manifest (written last) lists every file's SHA-256, which
:func:`.sharding.load_shard` verifies.

``--permute single`` relabels by the seed's P_c on the fly (new row i is old row
``perm[i]``, its columns mapped by ``perm^-1``: one N-sized int64 array each); ``double``
adds sigma's two relabelings of the normalized matrix (rows by sigma for even layers,
columns for odd ones: :class:`.sharding.AltOrdering`), read the same way.

Not yet (issue 26 item 2): ``--split``, folders other than
``scalegnn data generate``'s (the npz form, a user's CSR folder, OGB's papers100M files as
OGB ships them); those go through the in-memory path.
"""

from __future__ import annotations

import json
import re
import socket
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import numpy as np
import torch

from ..fileio import atomic_write
from ..sampling import CSRBlock
from ..ranges import split_range
from .grid import PMM_AXES
from .layout import PLANES
from .sharding import SHARD_FORMAT, AltOrdering, RankShard, _check_shape, _mp_coords, _own_arrays, _shard_name, _shared, file_sha256

__all__ = ["parse_size", "stage_out_of_core", "file_sha256"]

BYTES_PER_ENTRY = 40  # a chunk's int64 key, its sort, the int64 column and two float64 factors


def parse_size(text: str) -> int:
    """``512M``, ``2G``, ``1.5GiB``, ``100000`` -> bytes; a one-line error otherwise."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT]?)(i?[bB])?\s*", str(text))
    if not m:
        raise ValueError(f"--memory-budget {text!r} is not a size; give e.g. 512M, 2G or 1048576 (bytes)")
    return int(float(m.group(1)) * 1024 ** " KMGT".index((m.group(2) or " ").upper()))


class _Source:
    """A generated folder's arrays, memory-mapped, and what every rank needs of them."""

    def __init__(self, folder: Path, seed: int, permute: str = "none"):
        from ..datasets._core import SPLIT_FRACTIONS
        from ..datasets.streaming import seeded_features
        from ..graph import random_split

        self.folder = folder
        load = lambda name: np.load(folder / name, mmap_mode="r", allow_pickle=False)  # noqa: E731
        self.indptr, self.indices = load("indptr.npy"), load("indices.npy")
        self.n = self.indptr.shape[0] - 1
        y = np.asarray(load("y.npy"), dtype=np.int64)
        if y.shape != (self.n,):
            raise ValueError(f"{folder}/y.npy has shape {y.shape}, not ({self.n},); write the folder again with "
                             "`scalegnn data generate`")
        self.y = torch.from_numpy(y)
        self.num_classes = int(y.max()) + 1
        self.nnz = int(self.indptr[-1])
        if (folder / "features.json").is_file():
            self.features = seeded_features(json.loads((folder / "features.json").read_text()),
                                            str(folder / "features.json"))
            self.x, self.num_features = None, self.features.dim
        else:
            self.features, self.x = None, load("x.npy")
            self.num_features = self.x.shape[1]
        labeled = np.flatnonzero(y >= 0)
        train, val, test = random_split(self.n, SPLIT_FRACTIONS, seed=seed, labeled=labeled)
        self.masks = {}
        for key, idx in (("train_mask", train), ("val_mask", val), ("test_mask", test)):
            m = torch.zeros(self.n, dtype=torch.bool)
            m[idx] = True
            self.masks[key] = m
        self.masks["train_mask"] &= self.y >= 0
        self.split_note = f"random 50/25/25 seed {seed} (the file has no split)"
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
        self.deg = deg  # of A in the run's labeling (P_c applied), self loops not counted
        self._row_end: dict = {}
        deg_t = torch.from_numpy(deg.astype(np.float64)) + 1.0  # A + I: one self loop per row
        self.inv_sqrt = torch.where(deg_t > 0, deg_t.rsqrt(), torch.zeros_like(deg_t))
        del deg, deg_t

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

    def block(self, rows: tuple, cols: tuple, chunk: int, view: str = "A") -> CSRBlock:
        """Rows ``rows`` x columns ``cols`` of the normalized A + I in the run's labeling --
        or, for the double permutation, of it with rows (``view="rows"``) or columns
        (``view="cols"``) relabeled by sigma (:func:`.sharding.double_permuted`) -- read
        ``chunk`` stored entries at a time; arrays as ``CSRBlock.from_graph`` makes them."""
        (r0, r1), (c0, c1) = rows, cols
        n = self.n
        row_map = self._rows_of(view)
        col_map = self.sigma.numpy() if view == "cols" else None
        row_end = self.row_end(view)
        counts, cols_out, vals_out = [], [], []
        a = r0
        while a < r1:  # rows [a, b) hold about `chunk` entries (at least one row)
            b = int(np.searchsorted(row_end, row_end[a] + chunk, side="right")) - 1
            b = min(r1, max(a + 1, b))
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
            local = np.concatenate([np.repeat(np.arange(b - a, dtype=np.int64), lens), np.arange(b - a, dtype=np.int64)])
            c = np.concatenate([c, g_rows])  # A + I: the self loop (row, row) of A
            w = torch.from_numpy(self.inv_sqrt.numpy()[g_rows][local]) * torch.ones(local.size, dtype=torch.float64)
            vals_all = (w * self.inv_sqrt[torch.from_numpy(c)]).float()  # Eq. 3, rounded once as gcn_normalize does
            out_c = c if col_map is None else col_map[c]
            order = np.argsort(local * n + out_c, kind="stable")  # rows in order, columns sorted
            r_l, c_g, vals_all = local[order], out_c[order], vals_all[torch.from_numpy(order)]
            del local, c, out_c, order, w
            keep = (c_g >= c0) & (c_g < c1)
            counts.append(np.bincount(r_l[keep], minlength=b - a))
            cols_out.append(torch.from_numpy(c_g[keep]))
            vals_out.append(vals_all[torch.from_numpy(keep)])
            del r_l, c_g, keep, vals_all
            a = b
        indptr = torch.zeros(r1 - r0 + 1, dtype=torch.int64)
        if counts:
            indptr[1:] = torch.from_numpy(np.cumsum(np.concatenate(counts)))
        indices = torch.cat(cols_out) if cols_out else torch.zeros(0, dtype=torch.int64)
        values = torch.cat(vals_out) if vals_out else torch.zeros(0, dtype=torch.float32)
        if n < 2**31:
            indices = indices.to(torch.int32)
        return CSRBlock(indptr.contiguous(), indices.contiguous(), values.contiguous(), r0, r1, c0, c1)

    def feature_block(self, rows: tuple, cols: tuple, chunk_rows: int) -> torch.Tensor:
        (x0, x1), (f0, f1) = rows, cols
        out = torch.empty((x1 - x0, f1 - f0), dtype=torch.float32)
        for a in range(x0, x1, max(1, chunk_rows)):
            b = min(x1, a + max(1, chunk_rows))
            ids = np.arange(a, b) if self.perm is None else self.perm[a:b]  # the rows' ids in the folder
            if self.features is not None:
                block = self.features.rows(ids, None, None if self.features.means is None else self.y[a:b].numpy())
            else:
                block = np.asarray(self.x[ids], dtype=np.float32)
            out[a - x0:b - x0] = torch.from_numpy(np.ascontiguousarray(block[:, f0:f1]))
        return out


_SOURCE: dict = {}


def _source(folder: str, seed: int, permute: str = "none") -> _Source:
    key = (folder, seed, permute)
    if key not in _SOURCE:
        _SOURCE.clear()
        _SOURCE[key] = _Source(Path(folder), seed, permute)
    return _SOURCE[key]


def _write_rank(folder: str, seed: int, shape: tuple, coords: dict, out_dir: str, name: str, chunk: int,
                permute: str = "none") -> dict:
    """One (x, y, z)'s shard file (kept when its ``.sha256`` sidecar matches it): its name,
    checksum and nonzeros per plane."""
    path = Path(out_dir) / _shard_name(coords)
    side = path.with_name(path.name + ".sha256")
    if path.exists() and side.exists():
        digest, nnz = side.read_text().split()[0], json.loads(side.read_text().split(maxsplit=1)[1])
        if file_sha256(path) == digest:
            return {"file": path.name, "sha256": digest, "nnz": nnz, "resumed": True}
    src = _source(folder, seed, permute)
    sizes = dict(zip(("dp", "x", "y", "z"), shape))
    vr = {ax: split_range(src.n, sizes[ax], coords[ax]) for ax in PMM_AXES}
    f0, f1 = split_range(src.num_features, sizes["z"], coords["z"])
    keys = [(vr[rows], vr[cols]) for rows, cols in PLANES]
    def planes(view: str) -> tuple:  # sharding._planes, from the rows read in chunks
        made = _shared(keys, lambda key: _own_arrays(src.block(*key, chunk, view)))
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


def stage_out_of_core(folder, grid_shape, out_dir, *, seed: int = 0, memory_budget: int = 512 << 20,
                      workers: int = 1, permute: str = "none", split: tuple = (None, None),
                      chunk_entries: int | None = None) -> list[Path]:
    """``scalegnn data shard dir:FOLDER --memory-budget SIZE``: the shard files and
    manifest of :func:`.sharding.save_shards` for the generated graph in ``folder``,
    written rank file by rank file from memory-mapped arrays (see the module docstring).
    Returns the written paths, the manifest last. ``chunk_entries`` overrides the stored
    entries read at a time (default: from the budget; tests make it small)."""
    folder = Path(folder).expanduser().resolve()
    if not (folder / "graph.json").is_file():
        raise ValueError(f"out-of-core staging reads folders written by `scalegnn data generate` ({folder} has no "
                         "graph.json); stage this graph without --memory-budget (in memory)")
    if permute not in ("none", "single", "double"):
        raise ValueError(f"permute must be none, single or double, got {permute!r}")
    if split[0] is not None:
        raise ValueError("out-of-core staging does not apply --split yet; stage without --memory-budget (in memory) "
                         "for it")
    if memory_budget < 1 << 20:
        raise ValueError(f"--memory-budget {memory_budget} bytes is below 1M; give at least 1M, e.g. 512M")
    if workers < 1:
        raise ValueError(f"--workers {workers} must be >= 1")
    shape = _check_shape(grid_shape)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    name = f"dir:{folder}"
    chunk = chunk_entries or max(1024, memory_budget // (BYTES_PER_ENTRY * workers))
    coords = _mp_coords(shape)
    args = [(str(folder), int(seed), shape, c, str(out), name, chunk, permute) for c in coords]
    if workers == 1 or len(coords) == 1:
        done = [_write_rank(*a) for a in args]
    else:
        with ProcessPoolExecutor(max_workers=min(workers, len(coords)), mp_context=get_context("spawn")) as pool:
            done = list(pool.map(_write_rank, *zip(*args)))
    src = _source(str(folder), int(seed), permute)
    _SOURCE.clear()
    info = {"num_nodes": src.n, "num_edges": src.nnz, "adjacency_nnz": src.nnz + src.n, "num_features": src.num_features,
            "num_classes": src.num_classes, "sparse_features": False, "split": src.split_note}
    manifest = {
        "format": SHARD_FORMAT, "grid_shape": list(shape), "name": name, "num_nodes": src.n,
        "num_edges": src.nnz + src.n, "num_features": src.num_features, "num_classes": src.num_classes,
        "multilabel": False, "files": [d["file"] for d in done], "nnz_per_shard": [d["nnz"] for d in done],
        "sha256": {d["file"]: d["sha256"] for d in done}, "permute": permute, "seed": int(seed),
        "split": list(split), "graph": info, "host": socket.gethostname(),
        "staged": {"out_of_core": True, "memory_budget": int(memory_budget), "workers": int(workers),
                   "resumed": sum(d["resumed"] for d in done)},
    }
    mpath = out / "manifest.json"
    atomic_write(mpath, lambda f: json.dump(manifest, f, indent=1), text=True)
    for d in done:
        (out / (d["file"] + ".sha256")).unlink(missing_ok=True)
    return [out / d["file"] for d in done] + [mpath]
