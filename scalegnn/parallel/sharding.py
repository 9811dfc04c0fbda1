"""Per-rank data of the 3D grid: adjacency shards (one per rotation plane), the input
feature block, labels and split masks (paper IV-B/C).

Shape legend:
    N  vertices    F  input features    C  classes
    Nx, Ny, Nz     vertices in this rank's vertex range along x, y, z
    Fz             input features in this rank's feature range along z

A rank at (x, y, z) holds, for every data-parallel replica alike:

    adj[0]  A rows: vertex range of z, cols: vertex range of x   (layers 0, 3, ...)
    adj[1]  A rows: vertex range of y, cols: vertex range of z   (layers 1, 4, ...)
    adj[2]  A rows: vertex range of x, cols: vertex range of y   (layers 2, 5, ...)
    x       X_in rows: vertex range of x, cols: feature range of z      (Nx, Fz)
    y, train/val/test masks, for the vertex range of each axis (the loss rows are on
            the row axis of the last layer's output, which depends on L)

with vertex ranges ``split_range(N, G_axis, index)``. Planes share storage where their
ranges allow (:func:`share_planes`): one block for equal ranges, a row slice for rows
inside another plane's over the same columns. ``RankShard.to`` on the CPU and
``from_state`` copy nothing (a row slice's ``indptr`` is new, ``r1 - r0 + 1`` int64); on
a GPU ``to`` copies each array over once.

This module cuts shards from a graph in memory (:func:`build_shard`, and
:func:`cut_shards` for a whole grid); how they are written to disk, checked and mapped
back, in memory or out of core, is :mod:`scalegnn.shards`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from ..csr import csr_block, is_csr
from ..graph import Graph
from ..sampling import CSRBlock, train_mask_of
from ..ranges import split_range
from .grid import PMM_AXES, ProcessGrid
from .layout import PLANES

__all__ = ["RankShard", "AltOrdering", "double_permuted", "build_shard", "build_rank_shard", "cut_shards",
           "grid_coords", "vertex_ranges", "feature_range", "plane_keys", "check_grid_shape", "check_normalized",
           "share_planes", "plane_sharing", "shared_blocks", "own_arrays", "row_slice", "adjacency_storage",
           "SHARD_FORMAT"]

SHARD_FORMAT = 1  # of RankShard.to_state, the state a shard file holds


@dataclass
class AltOrdering:
    """Double permutation (Plexus 5.1, :mod:`scalegnn.permutation`): the second vertex
    labeling ``sigma`` (``sigma[v]`` = new id of vertex v) and this rank's data in it.

    adj[p]   plane p of ``A`` with ROWS relabeled by sigma   (even layers: in id order, out sigma order)
    adj_t[p] plane p of ``A`` with COLUMNS relabeled by sigma (odd layers: in sigma order, out id order)
    y, masks per axis, for the rows of that axis' vertex range in sigma order (the
    logits' rows when the last layer leaves sigma order, i.e. L odd)
    """

    sigma: torch.Tensor
    sigma_inv: torch.Tensor
    adj: tuple
    adj_t: tuple
    y: dict
    train_mask: dict
    val_mask: dict
    test_mask: dict


@dataclass
class RankShard:
    """Everything one rank of a data-parallel group needs from the graph."""

    grid_shape: tuple[int, int, int, int]
    coords: dict  # {"x": i, "y": j, "z": k}
    num_nodes: int
    num_features: int
    num_classes: int
    multilabel: bool
    adj: tuple[CSRBlock, CSRBlock, CSRBlock]
    x: torch.Tensor  # (Nx, Fz), dense or CSR (the graph's layout)
    feature_range: tuple[int, int]
    vertex_ranges: dict  # axis -> (v0, v1)
    y: dict  # axis -> (N_axis,) int64 or (N_axis, C) float
    train_mask: dict  # axis -> (N_axis,) bool
    val_mask: dict
    test_mask: dict
    name: str = "graph"
    alt: AltOrdering | None = None  # double permutation only

    def to(self, device) -> "RankShard":
        """This shard with every array on ``device`` (the engine's), the CSR planes,
        features, labels, masks and the second labeling alike."""
        from ..device import to_device

        device = torch.device(device)
        if self.x.device == device:
            return self
        moved: dict = {}  # a block shared by several planes (or with alt.adj) moves once and stays shared

        def move(b: CSRBlock) -> CSRBlock:
            if b.storage_key() not in moved:
                moved[b.storage_key()] = b.to(device)
            return moved[b.storage_key()]

        def blocks(bs):  # only the widest blocks are copied; row slices are sliced again there
            return share_planes(bs, move)

        alt = None
        if self.alt is not None:
            a = self.alt
            alt = AltOrdering(sigma=a.sigma.to(device), sigma_inv=a.sigma_inv.to(device),
                              adj=blocks(a.adj), adj_t=blocks(a.adj_t),
                              **{k: to_device(getattr(a, k), device) for k in ("y", "train_mask", "val_mask",
                                                                              "test_mask")})
        return dataclasses.replace(
            self, adj=blocks(self.adj), x=self.x.to(device), alt=alt,
            **{k: to_device(getattr(self, k), device) for k in ("y", "train_mask", "val_mask", "test_mask")})

    def planes(self) -> tuple:
        """Every adjacency block the rank keeps: the three planes, or with the double
        permutation the planes of both labelings (``adj`` is then ``alt.adj``)."""
        return tuple(self.adj) if self.alt is None else tuple(self.alt.adj) + tuple(self.alt.adj_t)

    def adjacency_storage(self) -> dict:
        """{"blocks", "storages", "bytes"}: distinct CSR blocks among :meth:`planes`, and
        the distinct arrays they hold with their bytes, shared ones counted once."""
        return adjacency_storage(self.planes())

    def nbytes(self) -> dict:
        """Bytes of the arrays this shard holds, each storage once (a shared plane, a row
        slice's columns and values): ``adjacency`` (:meth:`adjacency_storage`),
        ``features`` (x: dense, or CSR's three arrays), ``labels`` (y and the three
        masks of every axis, and the second labeling's sigma and its inverse) and
        ``total``: what :func:`scalegnn.perfmodel.shard_bytes` predicts."""
        feats = [self.x.crow_indices(), self.x.col_indices(), self.x.values()] if is_csr(self.x) else [self.x]
        labels = [t for key in ("y", "train_mask", "val_mask", "test_mask") for t in getattr(self, key).values()]
        if self.alt is not None:
            labels += [self.alt.sigma, self.alt.sigma_inv] + [
                t for key in ("y", "train_mask", "val_mask", "test_mask") for t in getattr(self.alt, key).values()]
        out = {"adjacency": self.adjacency_storage()["bytes"], "features": _storage_bytes(feats),
               "labels": _storage_bytes(labels)}
        out["total"] = sum(out.values())
        return out

    # -------------------------------------------------------------- (de)serialize
    def to_state(self) -> dict:
        """Plain tensors, ints and strings only (loadable with weights_only=True)."""
        state = {
            "format": SHARD_FORMAT, "grid_shape": list(self.grid_shape), "coords": dict(self.coords),
            "num_nodes": self.num_nodes, "num_features": self.num_features, "num_classes": self.num_classes,
            "multilabel": self.multilabel, "name": self.name, "x": self.x,
            "feature_range": list(self.feature_range),
            "vertex_ranges": {a: list(r) for a, r in self.vertex_ranges.items()},
        }
        for p, blk in enumerate(self.adj):  # torch.save writes a storage that planes share once
            state[f"adj{p}"] = _block_state(blk)
        for key in ("y", "train_mask", "val_mask", "test_mask"):
            state[key] = dict(getattr(self, key))
        if self.alt is not None:
            a = self.alt
            state["alt"] = {"sigma": a.sigma, "sigma_inv": a.sigma_inv,
                            "adj": [_block_state(b) for b in a.adj], "adj_t": [_block_state(b) for b in a.adj_t],
                            **{k: dict(getattr(a, k)) for k in ("y", "train_mask", "val_mask", "test_mask")}}
        return state

    @classmethod
    def from_state(cls, state: dict) -> "RankShard":
        if state.get("format") != SHARD_FORMAT:
            raise ValueError(f"shard format {state.get('format')} is not {SHARD_FORMAT}; re-run `scalegnn data shard`")
        adj = share_planes(_block_from_state(state[f"adj{p}"]) for p in range(3))
        return cls(
            grid_shape=tuple(state["grid_shape"]), coords=dict(state["coords"]), num_nodes=state["num_nodes"],
            num_features=state["num_features"], num_classes=state["num_classes"], multilabel=state["multilabel"],
            adj=adj, x=state["x"], feature_range=tuple(state["feature_range"]),
            vertex_ranges={a: tuple(r) for a, r in state["vertex_ranges"].items()},
            y=dict(state["y"]), train_mask=dict(state["train_mask"]), val_mask=dict(state["val_mask"]),
            test_mask=dict(state["test_mask"]), name=state["name"], alt=_alt_from_state(state.get("alt")),
        )


def _block_state(blk: CSRBlock) -> dict:
    return {"indptr": blk.indptr, "indices": blk.indices, "values": blk.values,
            "rows": [blk.row_start, blk.row_end], "cols": [blk.col_start, blk.col_end]}


def _block_from_state(s: dict) -> CSRBlock:
    return CSRBlock(s["indptr"], s["indices"], s["values"], *s["rows"], *s["cols"])


def _alt_from_state(state: dict | None) -> AltOrdering | None:
    if state is None:
        return None
    blocks = lambda key: share_planes(_block_from_state(s) for s in state[key])  # noqa: E731
    return AltOrdering(sigma=state["sigma"], sigma_inv=state["sigma_inv"], adj=blocks("adj"), adj_t=blocks("adj_t"),
                       **{k: dict(state[k]) for k in ("y", "train_mask", "val_mask", "test_mask")})


def double_permuted(graph: Graph, sigma: torch.Tensor) -> tuple[Graph, Graph]:
    """(A with rows relabeled by sigma, A with columns relabeled by sigma) as graphs
    over the new ids (Plexus Eqs. 5.3-5.4 after relabeling by P_c): row r of the
    first is row ``sigma_inv[r]`` of A; column ``sigma[j]`` of the second is column j."""
    from ..graph import csr_from_edges
    from ..permutation import inverse_permutation
    from ..csr import gather_csr_rows

    sigma_inv = inverse_permutation(sigma)
    _, flat = gather_csr_rows(graph.indptr, sigma_inv, graph.indices.numel())
    deg = graph.indptr[1:] - graph.indptr[:-1]
    indptr = torch.zeros_like(graph.indptr)
    indptr[1:] = torch.cumsum(deg[sigma_inv], 0)
    rows_relabeled = graph.replace(indptr=indptr, indices=graph.indices[flat], values=graph.values[flat])
    ip, ix, vals = csr_from_edges(graph.row_ids(), sigma[graph.indices], graph.num_nodes, graph.values)
    cols_relabeled = graph.replace(indptr=ip, indices=ix, values=vals)
    return rows_relabeled, cols_relabeled


def check_normalized(graph: Graph) -> None:
    if graph.meta.get("normalized") != "gcn":
        raise ValueError("sharding needs the GCN-normalized graph: call graph.gcn_normalize() first")


def _split_masks(graph: Graph) -> dict:
    n = graph.num_nodes
    masks = {"train_mask": train_mask_of(graph)}
    for key, idx in (("val_mask", graph.val_idx), ("test_mask", graph.test_idx)):
        m = torch.zeros(n, dtype=torch.bool)
        m[idx] = True
        masks[key] = m
    return masks


def check_grid_shape(grid_shape) -> tuple[int, int, int, int]:
    shape = tuple(int(g) for g in grid_shape)
    if len(shape) != 4 or min(shape) < 1:
        raise ValueError(f"grid shape must be four positive sizes (Gd, Gx, Gy, Gz), got {grid_shape}")
    return shape


def vertex_ranges(grid_shape, n: int, coords: dict) -> dict:
    """{"x", "y", "z": (start, end)}: the vertex range of each axis of the rank at ``coords``
    of a grid of ``grid_shape`` over ``n`` vertices (module doc)."""
    sizes = dict(zip(("dp", "x", "y", "z"), check_grid_shape(grid_shape)))
    return {ax: split_range(n, sizes[ax], coords[ax]) for ax in PMM_AXES}


def feature_range(grid_shape, num_features: int, coords: dict) -> tuple[int, int]:
    """The input features (columns of X_in) of the rank at ``coords``: its range along z."""
    return split_range(num_features, check_grid_shape(grid_shape)[3], coords["z"])


def plane_keys(vr: dict) -> list:
    """The (rows, cols) vertex ranges of the three rotation planes (:data:`.layout.PLANES`)
    of a rank whose vertex ranges are ``vr``."""
    return [(vr[rows], vr[cols]) for rows, cols in PLANES]


def _planes(graph: Graph, vr: dict) -> tuple[CSRBlock, CSRBlock, CSRBlock]:
    """The three rotation planes of ``graph`` for vertex ranges ``vr``, each distinct block
    cut from the graph once and the others sharing its storage (:func:`share_planes`)."""
    keys = plane_keys(vr)
    made = shared_blocks(keys, lambda key: own_arrays(CSRBlock.from_graph(graph, *key)))
    return tuple(made[k] for k in keys)


def own_arrays(block: CSRBlock) -> CSRBlock:
    """``block`` with arrays that hold only its own entries: a block over all columns is
    cut from the graph as views of the graph's arrays, which would keep the whole graph's
    values alive on the rank (and write them all into its shard file: torch.save stores a
    view's whole storage)."""
    def own(t: torch.Tensor) -> torch.Tensor:
        return t.clone() if t.untyped_storage().nbytes() > t.numel() * t.element_size() else t

    return CSRBlock(own(block.indptr), own(block.indices), own(block.values), block.row_start, block.row_end,
                    block.col_start, block.col_end)


def share_planes(blocks, convert=None) -> tuple:
    """The planes ``blocks`` with their storage shared wherever the ranges allow: planes
    with the same row and column ranges are one block (all three on 1x1x1x1, the diagonal
    ranks of a cubic grid), and a plane whose rows lie inside another's over the same
    columns is a row slice of it (1x2x1x1: the (x, y) plane is rows x of the unsplit (y, z)
    plane). Blocks of one graph with equal ranges are equal, so this only drops copies;
    applied to the planes read from a shard file it also shares those of files written
    before the planes were shared there. ``convert`` (e.g. a move to a device) is applied
    to the blocks kept whole, before the others are sliced from them."""
    blocks = tuple(blocks)
    given = {_range_key(b): b for b in blocks}
    made = shared_blocks(list(given), lambda key: given[key] if convert is None else convert(given[key]))
    return tuple(made[_range_key(b)] for b in blocks)


def _range_key(b: CSRBlock) -> tuple:
    return (b.row_start, b.row_end), (b.col_start, b.col_end)


def plane_sharing(keys) -> dict:
    """{((r0, r1), (c0, c1)): the key it is cut from, or None when it is stored whole} for
    the distinct keys, widest row range first: a key whose rows lie inside an already
    stored block's over the same columns is a row slice of it. The rule of
    :func:`share_planes`, on ranges alone (:func:`scalegnn.perfmodel.shard_bytes` counts with it)."""
    plan: dict = {}
    for key in sorted(set(keys), key=lambda k: (k[0][0] - k[0][1], k)):
        (r0, r1), cols = key
        plan[key] = next((k for k, src in plan.items() if src is None and k[1] == cols and k[0][0] <= r0
                          and r1 <= k[0][1]), None)
    return plan


def shared_blocks(keys, make) -> dict:
    """{((r0, r1), (c0, c1)): block} for the distinct keys (:func:`plane_sharing`): a key
    cut from another is that block's :func:`row_slice` (no copy), any other ``make(key)``."""
    made: dict = {}
    for key, src in plane_sharing(keys).items():
        made[key] = make(key) if src is None else row_slice(made[src], *key[0])
    return made


def row_slice(block: CSRBlock, r0: int, r1: int) -> CSRBlock:
    """Rows [r0, r1) of ``block`` (inside its row range) as a block over the same columns:
    ``indices`` and ``values`` are views of the block's arrays, only the (r1 - r0 + 1)
    row pointers are new (the block itself when the rows are all of it). Equal, array for
    array, to ``CSRBlock.from_graph`` of those rows."""
    if not block.row_start <= r0 <= r1 <= block.row_end:
        raise ValueError(f"rows [{r0}, {r1}) are not inside the block's rows [{block.row_start}, {block.row_end})")
    if (r0, r1) == (block.row_start, block.row_end):
        return block
    a, b = r0 - block.row_start, r1 - block.row_start
    lo, hi = int(block.indptr[a]), int(block.indptr[b])
    return CSRBlock(block.indptr[a:b + 1] - lo, block.indices[lo:hi], block.values[lo:hi], r0, r1,
                    block.col_start, block.col_end)


def adjacency_storage(blocks) -> dict:
    """Distinct CSR blocks (:meth:`CSRBlock.storage_key`), distinct array storages and
    their bytes among ``blocks``: what the planes really hold in memory, each shared
    storage counted once."""
    storages: dict = {}
    for b in blocks:
        for t in (b.indptr, b.indices, b.values):
            st = t.untyped_storage()
            storages[(t.device, st.data_ptr())] = st.nbytes()
    return {"blocks": len({b.storage_key() for b in blocks}), "storages": len(storages),
            "bytes": sum(storages.values())}


def _storage_bytes(tensors) -> int:
    """Bytes of the distinct storages under ``tensors`` (views of one storage count once)."""
    seen = {}
    for t in tensors:
        st = t.untyped_storage()
        seen[(t.device, st.data_ptr())] = st.nbytes()
    return sum(seen.values())


def _feature_block(x: torch.Tensor, rows: tuple, cols: tuple) -> torch.Tensor:
    """This rank's block of X_in, in x's own layout: sparse features stay CSR (saved
    as CSR in the shard file, too)."""
    if is_csr(x):
        return csr_block(x, rows, cols)
    return x[rows[0]:rows[1], cols[0]:cols[1]].clone()


def build_shard(graph: Graph, grid_shape, coords: dict, _masks: dict | None = None, sigma: torch.Tensor | None = None,
                _permuted: tuple | None = None) -> RankShard:
    """The :class:`RankShard` of the rank at ``coords`` ({"x", "y", "z"}) of a grid of ``grid_shape``.

    ``sigma`` (new ids, see :func:`scalegnn.permutation.double_sigma`) adds the
    second labeling of the double permutation (:class:`AltOrdering`)."""
    check_normalized(graph)
    shape = check_grid_shape(grid_shape)
    n = graph.num_nodes
    vr = vertex_ranges(shape, n, coords)
    f0, f1 = feature_range(shape, graph.num_features, coords)
    x0, x1 = vr["x"]
    masks = _masks if _masks is not None else _split_masks(graph)
    sl = lambda t: {ax: t[vr[ax][0]: vr[ax][1]].clone() for ax in PMM_AXES}  # noqa: E731
    alt = None
    if sigma is not None:
        from ..permutation import inverse_permutation

        g_rows, g_cols = _permuted if _permuted is not None else double_permuted(graph, sigma)
        inv = inverse_permutation(sigma)
        sl_alt = lambda t: {ax: t[inv[vr[ax][0]: vr[ax][1]]].clone() for ax in PMM_AXES}  # noqa: E731
        alt = AltOrdering(
            sigma=sigma.clone(), sigma_inv=inv, adj=_planes(g_rows, vr), adj_t=_planes(g_cols, vr),
            y=sl_alt(graph.y), train_mask=sl_alt(masks["train_mask"]), val_mask=sl_alt(masks["val_mask"]),
            test_mask=sl_alt(masks["test_mask"]))
        adj = alt.adj  # the plain-id shards are never used: even layers take alt.adj, odd ones alt.adj_t
    else:
        adj = _planes(graph, vr)
    return RankShard(
        grid_shape=shape, coords={ax: int(coords[ax]) for ax in PMM_AXES}, num_nodes=n,
        num_features=graph.num_features, num_classes=graph.num_classes, multilabel=graph.multilabel, adj=adj,
        x=_feature_block(graph.x, (x0, x1), (f0, f1)), feature_range=(f0, f1), vertex_ranges=vr, y=sl(graph.y),
        train_mask=sl(masks["train_mask"]), val_mask=sl(masks["val_mask"]), test_mask=sl(masks["test_mask"]),
        name=graph.name, alt=alt,
    )


def build_rank_shard(graph: Graph, grid: ProcessGrid, sigma: torch.Tensor | None = None) -> RankShard:
    """This rank's shard, cut from the full graph every rank has loaded."""
    return build_shard(graph, grid.shape_tuple, {ax: grid.axis_index(ax) for ax in PMM_AXES}, sigma=sigma)


def grid_coords(grid_shape) -> list[dict]:
    """The (x, y, z) coordinates ({"x", "y", "z"}) of the 3D grid of ``grid_shape``, in
    rank order (the order of a data-parallel group's ranks; every group has them all)."""
    _, gx, gy, gz = check_grid_shape(grid_shape)
    return [{"x": i, "y": j, "z": k} for i in range(gx) for j in range(gy) for k in range(gz)]


def cut_shards(graph: Graph, grid_shape, *, sigma: torch.Tensor | None = None):
    """(coords, :class:`RankShard`) of every (x, y, z) of ``grid_shape``, in
    :func:`grid_coords` order, one at a time: the split masks and, with ``sigma``, the
    double permutation's two relabeled graphs are made once for them all."""
    check_normalized(graph)
    shape = check_grid_shape(grid_shape)
    masks = _split_masks(graph)
    permuted = None if sigma is None else double_permuted(graph, sigma)
    for c in grid_coords(shape):
        yield c, build_shard(graph, shape, c, _masks=masks, sigma=sigma, _permuted=permuted)
