"""Synthetic graphs, reproducible from the seed and vectorized (no Python loop per edge).

``csbm``: contextual stochastic block model. ``n`` vertices in ``classes`` balanced
classes (a seeded random assignment). ``m = round(n * avg_degree / 2)`` edge draws:
endpoint u uniform; with probability ``homophily`` its partner is uniform within
u's class (vertices sorted by class, an offset into u's block), otherwise uniform
over the vertices of the *other* classes (an offset into the complement, skipping
u's block). So the expected edge homophily (fraction of stored entries joining
equal classes) is ``homophily``, not ``homophily + (1 - homophily) / classes``.
Self loops and repeated pairs are dropped, which lowers the realized average degree
slightly (by ~avg_degree * classes / n, relative). Features:
``x_v = mu_{y_v} + eps_v``, eps ~ N(0, I_F); the class means are orthogonal (when
feature_dim >= classes, else random directions) with norm ``signal / sqrt(2)``,
so any two means are ``signal`` noise standard deviations apart. Defaults give a
task where features alone are weak and the graph helps: measured with a 2-layer
GCN (hidden 64, 200 epochs, Adam lr 0.01), see ``tests/unit/datasets/test_generators.py``.

``rmat``: R-MAT (Chakrabarti et al. 2004; Graph500 parameters a, b, c, d =
0.57, 0.19, 0.19, 0.05). ``N = 2**scale`` and ``edge_factor * N`` draws; each draw
picks one quadrant per bit level, all draws at once per level. Vertex ids are
randomly permuted (as Graph500 does) so that degree is not correlated with id.
Duplicates and self loops are dropped (R-MAT makes many), and zero-degree vertices
are kept. Node data follow the papers' featureless protocol (128-d N(0,1) features,
32 balanced degree classes, seeded 50/25/25 split).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from scalegnn.fileio import check_declared_size
from scalegnn.graph import random_split

from ._core import SPLIT_FRACTIONS, DatasetError, featureless_graph, make_graph, rng_for, undirected_csr

__all__ = ["CSBM_DEFAULTS", "RMAT_DEFAULTS", "csbm", "rmat"]

CSBM_DEFAULTS = {"n": 10000, "avg_degree": 10.0, "classes": 8, "homophily": 0.7, "feature_dim": 64, "signal": 0.75}
RMAT_DEFAULTS = {"scale": 16, "edge_factor": 16, "a": 0.57, "b": 0.19, "c": 0.19, "d": 0.05}


def _check(cond: bool, name: str, msg: str):
    if not cond:
        raise DatasetError(f"{name}: {msg}")


def csbm_class_means(frng: np.random.Generator, feature_dim: int, classes: int, signal: float) -> np.ndarray:
    """The (classes, feature_dim) class means of :func:`csbm`, drawn from ``frng`` (the
    features' stream, which goes on to draw the noise): orthonormal directions when
    there are at least as many features as classes, unit random ones otherwise, scaled
    so that two classes' means lie ``signal`` apart."""
    if feature_dim >= classes:
        q, _ = np.linalg.qr(frng.standard_normal((feature_dim, classes)))
        means = q.T
    else:
        means = frng.standard_normal((classes, feature_dim))
        means /= np.linalg.norm(means, axis=1, keepdims=True)
    return (means * (signal / math.sqrt(2))).astype(np.float32)


def csbm(name: str, seed: int, n, avg_degree, classes, homophily, feature_dim, signal):
    _check(n >= 2, name, f"n={n} must be >= 2")
    _check(2 <= classes <= n, name, f"classes={classes} must be in [2, n={n}]")
    _check(0.0 <= homophily <= 1.0, name, f"homophily={homophily} must be in [0, 1]")
    _check(0 < avg_degree < n, name, f"avg_degree={avg_degree} must be in (0, n)")
    _check(feature_dim >= 1, name, f"feature_dim={feature_dim} must be >= 1")
    _check(signal >= 0, name, f"signal={signal} must be >= 0")
    fix = "choose smaller parameters (or set $SCALEGNN_MEMORY_BUDGET on a larger machine)"
    check_declared_size(name, "n x feature_dim (the features)", n * feature_dim, 4, fix=fix, error=DatasetError)
    check_declared_size(name, "n x avg_degree (the edges)", int(n * avg_degree), 48, fix=fix, error=DatasetError)

    rng = rng_for(seed, "graph")
    y = rng.permutation(np.arange(n, dtype=np.int64) % classes)  # balanced classes
    by_class = np.argsort(y, kind="stable")  # vertices sorted by class: block c is class c
    size = np.bincount(y, minlength=classes)
    start = np.concatenate([[0], np.cumsum(size)[:-1]])

    m = int(round(n * avg_degree / 2))
    u = rng.integers(0, n, m)
    cu = y[u]
    same = rng.random(m) < homophily
    r = rng.random(m)
    pos_in = start[cu] + (r * size[cu]).astype(np.int64)  # uniform inside u's block
    off = (r * (n - size[cu])).astype(np.int64)  # uniform over the complement of u's block
    pos_out = np.where(off < start[cu], off, off + size[cu])
    v = by_class[np.where(same, pos_in, pos_out)]
    del cu, same, r, pos_in, off, pos_out
    indptr, indices, values, counts = undirected_csr(u, v, n)

    frng = rng_for(seed, "features")
    means = csbm_class_means(frng, feature_dim, classes, signal)
    x = frng.standard_normal((n, feature_dim), dtype=np.float32)
    x += means[y]
    train, val, test = random_split(n, SPLIT_FRACTIONS, seed=seed)
    return make_graph(
        name,
        indptr=indptr,
        indices=indices,
        values=values,
        x=torch.from_numpy(x),
        y=torch.from_numpy(y),
        train_idx=train,
        val_idx=val,
        test_idx=test,
        num_classes=classes,
        name=name,
        meta={"generator": "csbm", "split": f"random 50/25/25 seed {seed}", **counts},
    )


def rmat_edges(scale: int, num_edges: int, a: float, b: float, c: float, rng: np.random.Generator):
    """R-MAT edge draws: (src, dst) int64 (num_edges,), vertex ids in [0, 2**scale)."""
    src = np.zeros(num_edges, dtype=np.int64)
    dst = np.zeros(num_edges, dtype=np.int64)
    ab, abc = np.float32(a + b), np.float32(a + b + c)
    a32 = np.float32(a)
    for level in range(scale):
        r = rng.random(num_edges, dtype=np.float32)
        down = r >= ab  # quadrant c or d: row bit 1
        right = (r >= abc) | ((r >= a32) & ~down)  # quadrant b or d: column bit 1
        bit = np.int64(1) << level
        src += down * bit
        dst += right * bit
    return src, dst


def rmat(name: str, seed: int, scale, edge_factor, a, b, c, d):
    _check(1 <= scale <= 40, name, f"scale={scale} must be in [1, 40]")
    _check(edge_factor >= 1, name, f"edge_factor={edge_factor} must be >= 1")
    _check(min(a, b, c, d) >= 0, name, f"a, b, c, d = {a}, {b}, {c}, {d} must be >= 0")
    _check(abs(a + b + c + d - 1.0) < 1e-6, name, f"a + b + c + d = {a + b + c + d:g} must be 1 (set all four)")
    n = 1 << scale
    fix = "choose a smaller scale or edge_factor (or set $SCALEGNN_MEMORY_BUDGET on a larger machine)"
    check_declared_size(name, "2**scale x edge_factor (the edges)", int(edge_factor * n), 48, fix=fix,
                        error=DatasetError)
    rng = rng_for(seed, "graph")
    src, dst = rmat_edges(scale, int(edge_factor * n), a, b, c, rng)
    perm = rng_for(seed, "perm").permutation(n)
    indptr, indices, values, counts = undirected_csr(perm[src], perm[dst], n)
    del src, dst
    meta = {"generator": "rmat", **counts}
    return featureless_graph(name, indptr, indices, values, seed, meta)
