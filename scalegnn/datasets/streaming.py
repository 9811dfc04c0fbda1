"""Paper-scale synthetic graphs written straight to disk in chunks, in bounded memory
(``scalegnn data generate KIND:params --out DIR``, read back as ``dir:DIR``).

The paper's strong-scaling graphs (ogbn-papers100M: 111 M vertices, ~3.2 G stored
nonzeros; Products-14M; Isolate-3-8M) do not fit this project's in-memory generators
(:mod:`.generators` holds every edge, and N x 128 features, at once). Here every random
number is a function of (seed, stream, counter) -- a counter-based generator
(splitmix64 of the counter, :func:`hash_uniform`) -- so a chunk of edge draws, or a
block of feature rows, is computed on its own, and the graph written is the same
whatever the chunk size.

Kinds (parameters ``key=value``, comma separated, integers accept ``1e6``):

``csbm:n,avg_degree,classes,homophily,feature_dim,signal``
    contextual SBM. Classes are balanced and scattered: ``y_v = pi(v) mod C`` with the
    affine bijection ``pi(v) = (a v + b) mod N`` (a coprime to N, both from the seed).
    ``M = round(N * avg_degree / 2)`` draws e = 0..M-1: u uniform; with probability
    ``homophily`` v is uniform within u's class (``pi^-1(c + k C)``, k uniform), else
    uniform over the other classes (the t-th vertex, in pi order, of a class other than
    c). Features ``x_v = mu_{y_v} + eps_v``, ``eps_v ~ N(0, I_F)`` per vertex from the
    seed, the means as :func:`.generators.csbm` draws them (orthogonal, norm
    ``signal / sqrt(2)``): only the C x F means are stored.
``powerlaw:n,avg_degree,exponent``
    Chung-Lu graph with a power-law degree profile (the paper's graphs: most vertices
    of small degree, hubs of very large degree): ``M = round(N * avg_degree / 2)`` draws
    of two endpoints, each with ``P(i) ~ (i + 1)^(-1 / (exponent - 1))`` (the continuous
    inverse CDF, no N-sized table), so the expected degree of the i-th vertex follows
    that law and the degree distribution has tail exponent ``exponent`` (> 2); ids
    scattered by ``pi``. Node data: the papers' featureless protocol (below).

Both: both directions stored, self loops dropped, repeated pairs stored once (so the
realized average degree is below ``avg_degree`` by the repeats, many on hub-heavy
power-law graphs: ``graph.json`` gives the counts), rows sorted by column.

**Featureless protocol, streamed** (ScaleGNN VII-A): 128 features
``x_{v,j} ~ N(0, 1)`` from (seed, v, j), never stored; 32 classes by degree rank,
ties spread by a seeded per-vertex uniform ``u_v``:
``class = min(31, floor(32 (L[d] + u_v cnt[d]) / N))`` where ``cnt[d]`` is the number
of vertices of degree d and ``L[d]`` of those of smaller degree. Classes grow with
degree and are balanced in expectation (exactly, up to the ties that
``_core.degree_classes``, the in-memory protocol, breaks by a full sort: that sort
needs N-sized arrays, this needs a degree histogram).

The folder (``dir:`` form, :mod:`.files`)::

    indptr.npy   (N+1,) int64        CSR row pointers
    indices.npy  (nnz,) int32/int64  columns (int32 while N < 2**31)
    y.npy        (N,) int32          classes
    features.json                    the seeded feature protocol (no x.npy): dim, seed,
                                     class means (csbm) -- see :func:`seeded_features`
    graph.json                       what was generated: kind, parameters, seed, counts;
                                     written last (a folder without it is incomplete)

Memory: the edge draws are bucketed by source row range into temporary files of about
``chunk_edges`` entries each, then each bucket is sorted, deduplicated and appended to
``indices.npy``; the labels are computed in row chunks. Peak memory is O(chunk_edges
+ max degree), whatever N and M (``tests/unit/datasets/test_streaming.py``).
"""

from __future__ import annotations

import errno
import json
import math
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..csr import unique_keys
from ..fileio import npy_header
from ._core import DatasetError

__all__ = ["GENERATE_KINDS", "hash_uniform", "seeded_normal", "SeededFeatures", "seeded_features",
           "parse_kind", "generate", "affine_permutation"]

GENERATE_KINDS = {
    "csbm": {"n": 10000, "avg_degree": 10.0, "classes": 8, "homophily": 0.7, "feature_dim": 64, "signal": 0.75},
    "powerlaw": {"n": 10000, "avg_degree": 16.0, "exponent": 2.5},
}
FEATURELESS_DIM, FEATURELESS_CLASSES = 128, 32
FEATURES_FORMAT = 1
_STREAM = {"draw": 11, "features": 12, "labels": 13, "perm": 14}
_M1, _M2, _GOLD = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB), np.uint64(0x9E3779B97F4A7C15)


# ------------------------------------------------------------------ counter-based randomness
def _splitmix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer (Steele et al. 2014), elementwise on uint64 (wrapping)."""
    with np.errstate(over="ignore"):
        z = x + _GOLD
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        return z ^ (z >> np.uint64(31))


def _key(seed: int, stream: str) -> np.uint64:
    return _splitmix64(np.array([(int(seed) * 1_000_003 + _STREAM[stream]) % 2**64], dtype=np.uint64))[0]


def hash_uniform(seed: int, stream: str, counter: np.ndarray) -> np.ndarray:
    """U[0, 1) float64 for each uint64 ``counter``: 53 bits of ``splitmix64(key + counter)``,
    the key from (seed, stream). The same counter gives the same number, whatever else is drawn."""
    with np.errstate(over="ignore"):
        h = _splitmix64(np.asarray(counter, dtype=np.uint64) + _key(seed, stream))
    return (h >> np.uint64(11)).astype(np.float64) * 2.0 ** -53


def seeded_normal(seed: int, rows, dim: int, stream: str = "features", cols: tuple | None = None) -> np.ndarray:
    """Rows ``rows`` ((v0, v1), or an array of vertex ids) of an (N, dim) N(0, 1) float32
    matrix, entry (v, j) by Box-Muller from the uniforms of counters ``2 (v dim + j)`` and
    ``2 (v dim + j) + 1``: any rows equal the same rows of the whole matrix, and
    ``cols`` ((j0, j1); None: all) the same columns of them."""
    ids = np.arange(rows[0], rows[1], dtype=np.uint64) if isinstance(rows, tuple) else np.asarray(rows, np.uint64)
    j0, j1 = (0, dim) if cols is None else cols
    c = (ids[:, None] * np.uint64(dim) + np.arange(j0, j1, dtype=np.uint64)) * np.uint64(2)
    u1 = 1.0 - hash_uniform(seed, stream, c)  # (0, 1]
    u2 = hash_uniform(seed, stream, c + np.uint64(1))
    return (np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)).astype(np.float32)


@dataclass(frozen=True)
class SeededFeatures:
    """Features computed from a seed per vertex (``features.json``): ``x_v = means[y_v] +
    N(0, I)`` (:func:`seeded_normal`), or the noise alone when there are no means."""

    dim: int
    seed: int
    means: np.ndarray | None = None  # (C, dim) float32

    def rows(self, v0: int, v1: int | None = None, y_rows: np.ndarray | None = None,
             cols: tuple | None = None) -> np.ndarray:
        """Feature rows [v0, v1) (float32), or the rows of the ids ``v0`` (an array, ``v1``
        None); ``y_rows``: those rows' classes (needed with means); ``cols``: only the
        feature columns [j0, j1) (None: all)."""
        x = seeded_normal(self.seed, v0 if v1 is None else (v0, v1), self.dim, cols=cols)
        if self.means is not None:
            j0, j1 = (0, self.dim) if cols is None else cols
            x += self.means[np.asarray(y_rows, dtype=np.int64)][:, j0:j1]
        return x

    def matrix(self, y: np.ndarray, block: int = 1 << 14) -> np.ndarray:
        """The whole (N, dim) matrix for labels ``y`` (N,), filled ``block`` rows at a time
        (the counters of a block are 8x its float32 rows)."""
        n = int(np.asarray(y).shape[0])
        x = np.empty((n, self.dim), dtype=np.float32)
        for v0 in range(0, n, block):
            v1 = min(n, v0 + block)
            x[v0:v1] = self.rows(v0, v1, None if self.means is None else y[v0:v1])
        return x

    def to_json(self) -> dict:
        return {"format": FEATURES_FORMAT, "protocol": "seeded-normal", "dim": self.dim, "seed": self.seed,
                "means": None if self.means is None else self.means.tolist()}


def seeded_features(spec: dict, where: str = "features.json") -> SeededFeatures:
    """The :class:`SeededFeatures` a ``features.json`` describes; a bad one is one line
    naming the file and the fix."""
    redo = "write the folder again with `scalegnn data generate`"
    if not isinstance(spec, dict) or spec.get("format") != FEATURES_FORMAT or spec.get("protocol") != "seeded-normal":
        raise DatasetError(f"{where}: not a seeded feature description (format {FEATURES_FORMAT}, protocol "
                           f"seeded-normal); {redo}")
    try:
        dim, seed = int(spec["dim"]), int(spec["seed"])
        means = None if spec.get("means") is None else np.asarray(spec["means"], dtype=np.float32)
    except (KeyError, TypeError, ValueError) as exc:
        raise DatasetError(f"{where}: unreadable ({type(exc).__name__}: {exc}); {redo}") from None
    if dim < 1 or (means is not None and (means.ndim != 2 or means.shape[1] != dim)):
        raise DatasetError(f"{where}: dim {dim} and means of shape {None if means is None else means.shape} "
                           f"disagree; {redo}")
    return SeededFeatures(dim, seed, means)


def affine_permutation(n: int, seed: int) -> tuple[int, int, int]:
    """(a, b, a^-1 mod n) of the bijection ``pi(v) = (a v + b) mod n``, from the seed."""
    if n == 1:
        return 1, 0, 1
    u = hash_uniform(seed, "perm", np.arange(64, dtype=np.uint64))
    b = int(u[0] * n)
    for x in u[1:]:  # a coprime to n, away from 0 and 1 so neighbours scatter
        a = 1 + int(x * (n - 1))
        if math.gcd(a, n) == 1 and a > 1:
            return a, b, pow(a, -1, n)
    return 1, b, 1


def _apply(v: np.ndarray, a: int, b: int, n: int) -> np.ndarray:
    """(a v + b) mod n for 0 <= a, b, v < n < 2**32 without int64 overflow: a is split in
    16-bit halves, so no product exceeds 2**48."""
    v = np.asarray(v, dtype=np.int64)
    hi = ((a >> 16) * v) % n
    return ((hi << 16) + (a & 0xFFFF) * v + b) % n


# ---------------------------------------------------------------------------- parameters
def parse_kind(text: str) -> tuple[str, dict]:
    """``KIND:key=value,...`` -> (kind, parameters with defaults); one-line errors."""
    head, _, rest = str(text).strip().partition(":")
    kind = head.strip().lower()
    if kind not in GENERATE_KINDS:
        raise DatasetError(f"unknown generator {head!r}; use one of {', '.join(GENERATE_KINDS)}, e.g. "
                           f"csbm:n=2000000,avg_degree=50")
    params = dict(GENERATE_KINDS[kind])
    for item in filter(None, (s.strip() for s in rest.split(","))):
        k, eq, v = (s.strip() for s in item.partition("="))
        if not eq or k not in params:
            raise DatasetError(f"{kind}: parameter {item!r} must be key=value with key one of "
                               f"{', '.join(params)}")
        try:
            num = float(v)
        except ValueError:
            raise DatasetError(f"{kind}: {k}={v!r} is not a number") from None
        if isinstance(params[k], int):
            if num != int(num):
                raise DatasetError(f"{kind}: {k}={v!r} must be a whole number")
            num = int(num)
        params[k] = num
    n, deg = params["n"], params["avg_degree"]
    _need(2 <= n < 3_000_000_000, kind, f"n={n} must be in [2, 3e9) (edges are keyed src * n + dst in int64)")
    _need(0 < deg < n, kind, f"avg_degree={deg} must be in (0, n)")
    if kind == "csbm":
        _need(2 <= params["classes"] <= n, kind, f"classes={params['classes']} must be in [2, n]")
        _need(0 <= params["homophily"] <= 1, kind, f"homophily={params['homophily']} must be in [0, 1]")
        _need(params["feature_dim"] >= 1, kind, f"feature_dim={params['feature_dim']} must be >= 1")
        _need(params["signal"] >= 0, kind, f"signal={params['signal']} must be >= 0")
    else:
        _need(params["exponent"] > 2, kind, f"exponent={params['exponent']} must be > 2 (a finite mean degree)")
    return kind, params


def _need(cond: bool, kind: str, msg: str) -> None:
    if not cond:
        raise DatasetError(f"{kind}: {msg}")


# ---------------------------------------------------------------------------- edge draws
def _csbm_draws(p: dict, seed: int, e0: int, e1: int, perm) -> tuple[np.ndarray, np.ndarray]:
    n, c = p["n"], p["classes"]
    a, b, a_inv = perm
    e = np.arange(e0, e1, dtype=np.uint64) * np.uint64(4)
    u = np.minimum((hash_uniform(seed, "draw", e) * n).astype(np.int64), n - 1)
    cu = _apply(u, a, b, n) % c  # u's class
    size = (n - cu + c - 1) // c  # vertices w in [0, n) with w mod C == cu
    same = hash_uniform(seed, "draw", e + np.uint64(1)) < p["homophily"]
    r = hash_uniform(seed, "draw", e + np.uint64(2))
    k = np.minimum((r * size).astype(np.int64), size - 1)
    t = np.minimum((r * (n - size)).astype(np.int64), n - size - 1)  # the t-th w of another class
    q, rem = np.divmod(t, c - 1)
    w = np.where(same, cu + k * c, q * c + np.where(rem < cu, rem, rem + 1))
    return u, _apply(w, a_inv, (-b * a_inv) % n, n)


def _powerlaw_draws(p: dict, seed: int, e0: int, e1: int, perm) -> tuple[np.ndarray, np.ndarray]:
    n = p["n"]
    alpha = 1.0 / (p["exponent"] - 1.0)  # P(i) ~ (i + 1)^-alpha, alpha in (0, 1)
    top = (n + 1.0) ** (1.0 - alpha) - 1.0
    e = np.arange(e0, e1, dtype=np.uint64) * np.uint64(2)
    ends = []
    for slot in range(2):
        x = (1.0 + hash_uniform(seed, "draw", e + np.uint64(slot)) * top) ** (1.0 / (1.0 - alpha))
        ends.append(_apply(np.clip(np.floor(x).astype(np.int64) - 1, 0, n - 1), perm[0], perm[1], n))
    return ends[0], ends[1]


# ------------------------------------------------------------------------------- writing
def generate(text: str, out, *, seed: int = 0, chunk_edges: int = 1 << 22, progress=None) -> dict:
    """Write the graph ``text`` (``KIND:params``) to folder ``out`` in chunks of at most
    ``chunk_edges`` edge draws; returns ``graph.json``'s content. ``out`` must be absent
    or empty; a folder left by a killed run (no graph.json) is written again. A generation
    that does not finish (a stop signal, a full disk) removes what it wrote, and ``out``
    itself if it created it."""
    kind, p = parse_kind(text)
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise DatasetError(f"--out {out} is an existing file, not a folder; pass a new or empty folder")
    if (out / "graph.json").exists():
        raise DatasetError(f"{out} already holds a generated graph (graph.json); pass another --out or delete it")
    if out.exists() and any(f.name not in _OUR_FILES for f in out.iterdir()):
        raise DatasetError(f"{out} is not empty; pass an empty or new folder to --out")
    if chunk_edges < 1:
        raise DatasetError(f"--chunk-edges {chunk_edges}: must be >= 1 (edge draws per chunk)")
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    try:
        return _generate_into(out, kind, p, seed, chunk_edges, progress or (lambda msg: None))
    except BaseException as exc:  # a stop signal, a full disk: no half-written graph, no bucket files left behind
        full = isinstance(exc, OSError) and exc.errno is None and _disk_full(out)  # before the clean-up frees it
        for name in _OUR_FILES:
            path = out / name
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
            (out / f"{name}.tmp").unlink(missing_ok=True)
        if created:
            shutil.rmtree(out, ignore_errors=True)
        if full:
            # numpy's tofile says only "N requested and M written": the full disk it met, said as such
            raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} ({exc})", str(out)) from None
        raise


def _disk_full(folder: Path) -> bool:
    for candidate in (folder, *folder.parents):
        if candidate.exists():
            return shutil.disk_usage(candidate).free < (1 << 20)
    return False


def _generate_into(out: Path, kind: str, p: dict, seed: int, chunk_edges: int, say) -> dict:
    tmp = out / ".buckets"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    n = p["n"]
    m = int(round(n * p["avg_degree"] / 2))
    perm = affine_permutation(n, seed)
    draws = _csbm_draws if kind == "csbm" else _powerlaw_draws
    buckets = max(1, math.ceil(2 * m / chunk_edges))
    rows_per = math.ceil(n / buckets)
    buckets = math.ceil(n / rows_per)

    # 1. draws, both directions, into buckets of source rows (keys src * n + dst)
    for e0 in range(0, m, max(1, chunk_edges // 2)):
        u, v = draws(p, seed, e0, min(m, e0 + max(1, chunk_edges // 2)), perm)
        keep = u != v
        src, dst = np.concatenate([u[keep], v[keep]]), np.concatenate([v[keep], u[keep]])
        del u, v, keep
        bucket = src // rows_per
        order = np.argsort(bucket, kind="stable")
        keys = (src * n + dst)[order]
        bucket = bucket[order]
        del src, dst, order
        bounds = np.searchsorted(bucket, np.arange(buckets + 1))
        for i in np.flatnonzero(np.diff(bounds)):
            with open(tmp / f"{i}.bin", "ab") as f:
                keys[bounds[i]:bounds[i + 1]].tofile(f)
        del keys, bucket
        say(f"drawn {min(m, e0 + chunk_edges // 2):,} of {m:,} edges")

    # 2. each bucket sorted and deduplicated, appended to indices.npy; indptr written by rows
    idx_dtype = np.int32 if n < 2**31 else np.int64
    indptr = np.lib.format.open_memmap(out / "indptr.npy", mode="w+", dtype=np.int64, shape=(n + 1,))
    indptr[0] = 0
    nnz = 0
    max_deg = 0
    with open(out / "indices.npy", "wb") as f:
        f.write(npy_header(idx_dtype, (0,)))
        for i in range(buckets):
            r0, r1 = i * rows_per, min(n, (i + 1) * rows_per)
            path = tmp / f"{i}.bin"
            keys = unique_keys(np.fromfile(path, dtype=np.int64)) if path.exists() else np.zeros(0, np.int64)
            rows, cols = np.divmod(keys, n)
            del keys
            cols.astype(idx_dtype).tofile(f)
            deg = np.bincount(rows - r0, minlength=r1 - r0)
            max_deg = max(max_deg, int(deg.max(initial=0)))
            indptr[r0 + 1:r1 + 1] = nnz + np.cumsum(deg)
            nnz += int(rows.size)
            del rows, cols, deg
            if path.exists():
                path.unlink()
        f.seek(0)
        f.write(npy_header(idx_dtype, (nnz,)))
    indptr.flush()
    shutil.rmtree(tmp, ignore_errors=True)
    say(f"wrote {nnz:,} stored entries")

    # 3. labels (and the features' description)
    rows_chunk = max(1, chunk_edges)
    y = np.lib.format.open_memmap(out / "y.npy", mode="w+", dtype=np.int32, shape=(n,))
    if kind == "csbm":
        for v0 in range(0, n, rows_chunk):
            v1 = min(n, v0 + rows_chunk)
            y[v0:v1] = _apply(np.arange(v0, v1, dtype=np.int64), perm[0], perm[1], n) % p["classes"]
        features = SeededFeatures(p["feature_dim"], seed, _csbm_means(p, seed))
        classes, labels = p["classes"], f"{p['classes']} balanced classes, pi(v) mod C"
    else:
        hist = np.zeros(max_deg + 1, dtype=np.int64)
        for v0 in range(0, n, rows_chunk):
            v1 = min(n, v0 + rows_chunk)
            hist += np.bincount(np.diff(indptr[v0:v1 + 1]), minlength=max_deg + 1)
        below = np.concatenate([[0], np.cumsum(hist)[:-1]])
        for v0 in range(0, n, rows_chunk):
            v1 = min(n, v0 + rows_chunk)
            d = np.diff(indptr[v0:v1 + 1])
            u = hash_uniform(seed, "labels", np.arange(v0, v1, dtype=np.uint64))
            y[v0:v1] = np.minimum(FEATURELESS_CLASSES - 1,
                                  (FEATURELESS_CLASSES * (below[d] + u * hist[d]) / n).astype(np.int64))
        features = SeededFeatures(FEATURELESS_DIM, seed)
        classes, labels = FEATURELESS_CLASSES, f"{FEATURELESS_CLASSES} degree classes (streamed featureless protocol)"
    y.flush()
    del y, indptr
    _write_json(out / "features.json", features.to_json())
    info = {"format": FEATURES_FORMAT, "generator": kind, "params": p, "seed": int(seed), "num_nodes": n,
            "edge_draws": m, "stored_entries": nnz, "max_degree": max_deg, "num_classes": classes,
            "labels": labels, "features": f"seeded N(0,1) per vertex, dim {features.dim}"
            + (" + class means" if features.means is not None else ""), "chunk_edges": int(chunk_edges)}
    _write_json(out / "graph.json", info)
    return info


_OUR_FILES = {".buckets", "indptr.npy", "indices.npy", "y.npy", "features.json", "graph.json"}


def _write_json(path: Path, obj) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1))
    os.replace(tmp, path)


def _csbm_means(p: dict, seed: int) -> np.ndarray:
    """The class means of :func:`.generators.csbm` (the same stream and construction)."""
    from ._core import rng_for
    from .generators import csbm_class_means

    return csbm_class_means(rng_for(seed, "features"), p["feature_dim"], p["classes"], p["signal"])
