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
inside another plane's over the same columns. :func:`save_shards` writes
these once per (x, y, z) for ``scalegnn data shard`` (:mod:`.staging` does it out of
core), with every file's SHA-256 in the manifest; :func:`load_shard` maps a rank's file
into memory (``mmap=True``, ``weights_only=True``: plain tensors only) after checking its
SHA-256 the first time the file is loaded (:func:`verify_shard_file`). Mapped, a rank's arrays are pages
of the file that the kernel reads when they are first touched and may drop again (they
are clean): its resident memory is what it uses, and ranks of one node that read the
same file (data-parallel replicas) share those pages. ``RankShard.to`` on the CPU and
``from_state`` copy nothing (a row slice's ``indptr`` is new, ``r1 - r0 + 1`` int64);
on a GPU ``to`` copies each array over once and the mapping is dropped with the state.

Out-of-core staging may write the **blocks layout** instead (manifest ``"layout":
"blocks"``; :func:`stored_blocks`): each distinct block of A + I, each feature block and
the whole-graph label and mask vectors once, as ``.npy`` arrays under ``blocks/``, from
which :func:`load_shard` builds a rank's RankShard (mapped, equal tensor for tensor to its
per-rank file's); seeded features are computed from their seed at load.
"""

from __future__ import annotations

import dataclasses
import json
import socket
from dataclasses import dataclass
from pathlib import Path

import torch

from ..csr import csr_block, is_csr
from ..fileio import atomic_write, drop_pages, file_sha256, load_error
from ..graph import Graph
from ..sampling import CSRBlock, train_mask_of
from ..ranges import split_range
from .grid import PMM_AXES, ProcessGrid
from .layout import PLANES

__all__ = ["RankShard", "AltOrdering", "double_permuted", "build_shard", "build_rank_shard", "save_shards",
           "share_planes", "plane_sharing", "row_slice", "adjacency_storage",
           "check_shard_manifest", "shard_storage_bytes", "stored_blocks", "feature_blocks", "adjacency_file",
           "feature_file", "node_file",
           "load_shard", "verify_shard_file", "shard_command", "shard_nnz_stats", "file_sha256"]

SHARD_FORMAT = 1
BLOCKS_DIR = "blocks"  # the blocks layout's arrays (manifest "layout": "blocks")
NODE_ARRAYS = ("y", "train_mask", "val_mask", "test_mask")
SEEDED_ROWS_ENTRIES = 1 << 18  # seeded features computed at load this many entries at a time (~50 B of scratch each)


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


def _check_normalized(graph: Graph) -> None:
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


def _check_shape(grid_shape) -> tuple[int, int, int, int]:
    shape = tuple(int(g) for g in grid_shape)
    if len(shape) != 4 or min(shape) < 1:
        raise ValueError(f"grid shape must be four positive sizes (Gd, Gx, Gy, Gz), got {grid_shape}")
    return shape


def _planes(graph: Graph, vr: dict) -> tuple[CSRBlock, CSRBlock, CSRBlock]:
    """The three rotation planes of ``graph`` for vertex ranges ``vr``, each distinct block
    cut from the graph once and the others sharing its storage (:func:`share_planes`)."""
    keys = [(vr[rows], vr[cols]) for rows, cols in PLANES]
    made = _shared(keys, lambda key: _own_arrays(CSRBlock.from_graph(graph, *key)))
    return tuple(made[k] for k in keys)


def _own_arrays(block: CSRBlock) -> CSRBlock:
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
    made = _shared(list(given), lambda key: given[key] if convert is None else convert(given[key]))
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


def _shared(keys, make) -> dict:
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
    _check_normalized(graph)
    shape = _check_shape(grid_shape)
    sizes = dict(zip(("dp", "x", "y", "z"), shape))
    n = graph.num_nodes
    vr = {ax: split_range(n, sizes[ax], coords[ax]) for ax in PMM_AXES}
    f0, f1 = split_range(graph.num_features, sizes["z"], coords["z"])
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


def _mp_coords(grid_shape) -> list[dict]:
    _, gx, gy, gz = grid_shape
    return [{"x": i, "y": j, "z": k} for i in range(gx) for j in range(gy) for k in range(gz)]


def _shard_name(c: dict) -> str:
    return f"shard_x{c['x']}_y{c['y']}_z{c['z']}.pt"


def save_shards(graph: Graph, grid_shape, out_dir, *, permute: str = "none", seed: int = 0,
                split: tuple = (None, None)) -> list[Path]:
    """Write one shard file per (x, y, z) (data-parallel replicas share them) and a
    ``manifest.json``; each written atomically (temp file + rename). Returns the paths.

    ``permute`` (none | single | double) and ``seed`` are those of the run that will
    read the shards: ``graph`` must already carry the seed's relabeling P_c when
    ``permute`` is not none (:func:`shard_command` applies it), and double adds the
    seed's sigma ordering to every shard. ``split`` is the (``--split``, ``--split-seed``)
    the graph's split was drawn with ((None, None): the dataset's own). All go into the
    manifest, and a run whose ``--permute``, ``--seed`` or ``--split`` differs is
    refused when it loads the shards."""
    _check_normalized(graph)
    shape = _check_shape(grid_shape)
    if permute not in ("none", "single", "double"):
        raise ValueError(f"permute must be none, single or double, got {permute!r}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    masks = _split_masks(graph)
    sigma = permuted = None
    if permute == "double":
        from ..permutation import double_sigma

        sigma = double_sigma(graph.num_nodes, seed)
        permuted = double_permuted(graph, sigma)  # once, not per shard
    paths, nnz = [], []
    for c in _mp_coords(shape):
        shard = build_shard(graph, shape, c, _masks=masks, sigma=sigma, _permuted=permuted)
        path = out / _shard_name(c)
        atomic_write(path, lambda f, s=shard: torch.save(s.to_state(), f))
        paths.append(path)
        nnz.append([blk.nnz for blk in shard.adj])
    manifest = {
        "format": SHARD_FORMAT, "grid_shape": list(shape), "name": graph.name, "num_nodes": graph.num_nodes,
        "num_edges": graph.num_edges, "num_features": graph.num_features, "num_classes": graph.num_classes,
        "multilabel": graph.multilabel, "files": [p.name for p in paths], "nnz_per_shard": nnz,
        "sha256": {p.name: file_sha256(p) for p in paths}, "permute": permute, "seed": int(seed), "split": list(split), "graph": graph.record_info(),
        "host": socket.gethostname(),  # where it was staged (ranks on other nodes read it from shared storage)
    }
    mpath = out / "manifest.json"
    atomic_write(mpath, lambda f: json.dump(manifest, f, indent=1), text=True)
    return paths + [mpath]


def shard_storage_bytes(n: int, nnz: int, num_features: int, num_classes: int, grid_shape, coords: dict | None = None,
                        *, multilabel: bool = False) -> dict:
    """Bytes of one rank's shard as this implementation holds it (what
    :meth:`RankShard.nbytes` counts, and what a rank maps from its shard file; the memory
    model's shard term, :func:`scalegnn.perfmodel.shard_bytes`), of a graph of ``n``
    vertices and ``nnz`` stored entries of A + I, for the rank at ``coords`` ({"x", "y",
    "z"}), or the largest of the ranks whose axis indices are 0, 1 or 2 (index 0 has the
    longest range, and every way planes share storage occurs among them) when None:

    adjacency  the three planes, rows R x columns C of A + I for vertex ranges
               ``split_range(N, G_axis, index)``; a plane with another's ranges is that
               block, one whose rows lie inside another's over the same columns a row
               slice of it (:func:`plane_sharing`: only its
               ``|R| + 1`` row pointers are its own); a block stored whole holds
               ``(|R| + 1)`` int64 row pointers and ``E`` columns (int32 while N < 2^31,
               else int64) and FP32 values, with ``E = (nnz - N) |R| |C| / N^2 + |R & C|``:
               the off-diagonal entries spread evenly, the N self loops on the diagonal
    features   (|R_x|, |F_z|) FP32 (dense features)
    labels     per axis, y (int64; (|R|, C) FP32 when ``multilabel``) and the three split masks
    total      their sum

    Not modeled: sparse (CSR) features and the double permutation's second labeling."""
    g = dict(zip(("dp", "x", "y", "z"), _check_shape(grid_shape)))
    if coords is None:
        candidates = [{"x": i, "y": j, "z": k} for i in range(min(3, g["x"])) for j in range(min(3, g["y"]))
                      for k in range(min(3, g["z"]))]
        return max((shard_storage_bytes(n, nnz, num_features, num_classes, grid_shape, c, multilabel=multilabel)
                    for c in candidates), key=lambda b: b["total"])
    vr = {a: split_range(n, g[a], coords[a]) for a in ("x", "y", "z")}
    index_bytes = 4 if n < 2**31 else 8
    off_diagonal = max(0, nnz - n) / max(1, n) ** 2
    adjacency = 0.0
    for (rows, cols), src in plane_sharing((vr[r], vr[c]) for r, c in PLANES).items():
        adjacency += 8 * (rows[1] - rows[0] + 1)
        if src is None:
            size = lambda rng: rng[1] - rng[0]  # noqa: E731
            diagonal = max(0, min(rows[1], cols[1]) - max(rows[0], cols[0]))
            adjacency += (off_diagonal * size(rows) * size(cols) + diagonal) * (index_bytes + 4)
    f0, f1 = split_range(num_features, g["z"], coords["z"])
    y_bytes = 4 * num_classes if multilabel else 8
    out = {"adjacency": adjacency, "features": 4.0 * (vr["x"][1] - vr["x"][0]) * (f1 - f0),
           "labels": float(sum((r[1] - r[0]) * (y_bytes + 3) for r in vr.values()))}
    out["total"] = sum(out.values())
    return out


# ------------------------------------------------------------------ blocks layout
# Per-rank files repeat every block of A in each rank that holds it: a 4x4x4 grid keeps
# its 16 distinct blocks of A 12 times over (three planes on 64 ranks), 417 GB for
# ogbn-papers100M's 3.2 G entries against 27 GB once. The blocks layout
# (:mod:`.staging`, ``--layout blocks``) stores each distinct block of A + I, feature
# block and the whole-graph label and mask vectors once, as plain .npy arrays, and
# :func:`load_shard` builds a rank's RankShard from the ones it needs, equal tensor for
# tensor to the per-rank file's.

def _rank_keys(shape: tuple, n: int, coords: dict) -> list:
    sizes = dict(zip(("dp", "x", "y", "z"), shape))
    vr = {ax: split_range(n, sizes[ax], coords[ax]) for ax in PMM_AXES}
    return [(vr[rows], vr[cols]) for rows, cols in PLANES]


def stored_blocks(grid_shape, n: int) -> list:
    """The blocks of A + I ((rows, cols) vertex ranges) the blocks layout stores: every
    block some rank keeps whole (:func:`plane_sharing` of its three planes), once."""
    shape = _check_shape(grid_shape)
    keys = {k for c in _mp_coords(shape) for k, src in plane_sharing(_rank_keys(shape, n, c)).items() if src is None}
    return sorted(keys)


def feature_blocks(grid_shape, n: int, num_features: int) -> list:
    """The (rows, feature columns) blocks of X the ranks of ``grid_shape`` hold, once."""
    _, gx, _, gz = _check_shape(grid_shape)
    return sorted({(split_range(n, gx, i), split_range(num_features, gz, k)) for i in range(gx) for k in range(gz)})


def adjacency_file(key: tuple, part: str) -> str:
    """Relative path of array ``part`` (indptr, indices, values) of block ``key``."""
    (r0, r1), (c0, c1) = key
    return f"{BLOCKS_DIR}/A_r{r0}-{r1}_c{c0}-{c1}.{part}.npy"


def feature_file(key: tuple) -> str:
    (r0, r1), (f0, f1) = key
    return f"{BLOCKS_DIR}/X_r{r0}-{r1}_f{f0}-{f1}.npy"


def node_file(key: str) -> str:
    return f"{BLOCKS_DIR}/{key}.npy"


def _load_blocks(out: Path, manifest: dict, coords: dict, run_shape: tuple, verify: str, redo: str) -> RankShard:
    """The RankShard of the rank at ``coords`` from a blocks-layout folder: its stored
    blocks mapped (copy-on-write: pages read when touched, never written back), row slices
    cut from them as :func:`share_planes` cuts them, its label and mask ranges copied out
    of the whole-graph vectors, its feature block mapped or, for seeded features, computed
    from the seed (:class:`scalegnn.datasets.streaming.SeededFeatures`)."""
    import numpy as np

    shape = tuple(int(g) for g in manifest["grid_shape"])
    n, num_features = int(manifest["num_nodes"]), int(manifest["num_features"])
    sums = manifest.get("sha256") or {}

    def mapped(rel: str) -> np.ndarray:
        path = out / rel
        if not path.exists():
            raise FileNotFoundError(f"shard array {path} is missing (the manifest lists it); {redo}")
        if rel in sums and not verify_shard_file(path, sums[rel], always=verify == "always"):
            raise ValueError(f"shard array {path} does not match the SHA-256 its manifest lists (damaged, or "
                             f"written by another staging); {redo}")
        try:
            return np.load(path, mmap_mode="c", allow_pickle=False)
        except (ValueError, OSError) as exc:
            raise ValueError(f"shard array {path} is unreadable ({load_error(exc)}); {redo}") from None

    def array(rel: str) -> torch.Tensor:
        return torch.from_numpy(mapped(rel))

    def copied(m: np.ndarray, a: int, b: int) -> torch.Tensor:  # rows [a, b) of a whole-graph vector, its own
        return torch.from_numpy(np.array(m[a:b]))

    sizes = dict(zip(("dp", "x", "y", "z"), shape))
    vr = {ax: split_range(n, sizes[ax], coords[ax]) for ax in PMM_AXES}
    keys = _rank_keys(shape, n, coords)
    adj = _shared(keys, lambda key: CSRBlock(*(array(adjacency_file(key, p)) for p in ("indptr", "indices", "values")),
                                              *key[0], *key[1]))
    f0, f1 = split_range(num_features, sizes["z"], coords["z"])
    nodes = {key: mapped(node_file(key)) for key in NODE_ARRAYS}
    labels = {key: {ax: copied(m, *vr[ax]) for ax in PMM_AXES} for key, m in nodes.items()}
    x0, x1 = vr["x"]
    if manifest.get("features", {}).get("kind") == "seeded":
        from ..datasets.streaming import seeded_features

        feats = seeded_features(manifest["features"]["protocol"], f"{out}/manifest.json")
        ids = mapped(node_file("ids")) if manifest["features"].get("ids") else None
        x = torch.empty((x1 - x0, f1 - f0), dtype=torch.float32)
        step = max(1, SEEDED_ROWS_ENTRIES // max(1, f1 - f0))  # bounded temporaries, whatever the rank's rows
        for a in range(x0, x1, step):
            b = min(x1, a + step)
            y_rows = None if feats.means is None else nodes["y"][a:b]
            x[a - x0:b - x0] = torch.from_numpy(feats.rows(np.arange(a, b) if ids is None else ids[a:b], None, y_rows,
                                                           cols=(f0, f1)))
            drop_pages(ids, nodes["y"])
    else:
        x = array(feature_file(((x0, x1), (f0, f1))))
    drop_pages(*nodes.values())  # the whole-graph vectors' pages read for the copies leave this rank's resident set
    return RankShard(
        grid_shape=run_shape, coords={ax: int(coords[ax]) for ax in PMM_AXES}, num_nodes=n,
        num_features=num_features, num_classes=int(manifest["num_classes"]), multilabel=bool(manifest["multilabel"]),
        adj=tuple(adj[k] for k in keys), x=x, feature_range=(f0, f1), vertex_ranges=vr,
        name=manifest["name"], **labels)


def _file_identity(path: Path) -> list:
    st = path.stat()
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


def verify_shard_file(path, sha256: str, *, always: bool = False) -> bool:
    """Whether the shard file ``path`` has the SHA-256 ``sha256`` (its manifest's).

    Hashing reads the whole file, an extra read for a rank that maps it and touches only
    what it uses, paid again by every data-parallel replica and every run. So once a file
    has matched, a marker beside it (``<file>.verified``) records the checksum with the
    file's identity (size, modification and change times in ns, inode, device); a later
    call whose file still has that identity trusts it and reads nothing. What the
    checksum guards against -- a partial write, a truncated copy, a file of another
    staging (every write of ``scalegnn data shard`` is a new file renamed into place), a
    change in place -- each changes that identity (the change time cannot be set back by
    a user), so the file is hashed again and refused if it no longer matches. Bit rot
    under an unchanged identity is the filesystem's to catch. Where the folder is read
    only, no marker is written and each call hashes. ``always``: hash regardless."""
    path = Path(path)
    marker = path.with_name(path.name + ".verified")
    identity = _file_identity(path)
    if not always:
        try:
            seen = json.loads(marker.read_text())
            if seen.get("sha256") == sha256 and seen.get("identity") == identity:
                return True
        except (OSError, ValueError, AttributeError):  # none yet, or unreadable: hash
            pass
    if file_sha256(path) != sha256:
        return False
    try:  # two ranks may race here: each writes the same marker, atomically
        atomic_write(marker, lambda f: json.dump({"sha256": sha256, "identity": identity}, f), text=True)
    except OSError:  # a read-only shard folder: every load hashes
        pass
    return True


def load_shard(out_dir, rank: int, grid_shape=None, *, verify: str = "once") -> RankShard:
    """Map global ``rank``'s shard into memory (rank order dp, x, y, z; replicas share files).

    ``verify``: ``once`` checks the file's SHA-256 against the manifest unless this very
    file was checked before (:func:`verify_shard_file`), ``always`` reads it through each time.

    A shard depends only on the 3D part (Gx, Gy, Gz) of the grid: its file is named by
    the rank's (x, y, z) coordinate, and every data-parallel replica reads the same one.
    So shards written for ``1xGxxGyxGz`` serve a run on ``GdxGxxGyxGz`` for any Gd: the
    manifest's 3D part must equal ``grid_shape``'s, its Gd need not, and the shard comes
    back with the run's ``grid_shape``."""
    if verify not in ("once", "always"):
        raise ValueError(f"verify must be once or always, got {verify!r}")
    out = Path(out_dir)
    mpath = out / "manifest.json"
    if not mpath.exists():
        raise FileNotFoundError(f"{mpath} not found; write the shards first with `scalegnn data shard`")
    redo = f"re-write them with `scalegnn data shard DATASET --grid GRID --out {out}`"
    try:
        manifest = json.loads(mpath.read_text())
        shape = tuple(int(g) for g in manifest["grid_shape"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"shard manifest {mpath} is unreadable ({type(exc).__name__}: {str(exc)[:120]}); "
                         f"{redo}") from None
    run_shape = shape if grid_shape is None else tuple(int(g) for g in grid_shape)
    if run_shape[1:] != shape[1:]:
        three_d = "x".join(map(str, shape[1:]))
        raise ValueError(f"shards in {out} were written for the 3D grid {three_d} (Gx x Gy x Gz of grid {shape}), "
                         f"not {'x'.join(map(str, run_shape[1:]))} of the run's grid {run_shape}; re-shard with "
                         f"`scalegnn data shard DATASET --grid 1x{'x'.join(map(str, run_shape[1:]))} --out DIR`")
    mp = shape[1] * shape[2] * shape[3]
    if not 0 <= rank < run_shape[0] * mp:
        raise ValueError(f"rank {rank} is outside the grid {run_shape} ({run_shape[0] * mp} ranks)")
    if manifest.get("layout") == "blocks":
        return _load_blocks(out, manifest, _mp_coords(shape)[rank % mp], run_shape, verify, redo)
    path = out / _shard_name(_mp_coords(shape)[rank % mp])
    if not path.exists():
        raise FileNotFoundError(f"shard file {path} is missing (the manifest lists grid {shape}); {redo}")
    want = (manifest.get("sha256") or {}).get(path.name)  # shards written before checksums have none
    if want is not None and not verify_shard_file(path, want, always=verify == "always"):
        raise ValueError(f"shard file {path} does not match the SHA-256 its manifest lists (damaged, or written by "
                         f"another staging); {redo}")
    try:  # a damaged or foreign file: one line naming it, never torch's advice to load it unsafely
        state = torch.load(path, weights_only=True, mmap=True)  # pages read when touched (module doc)
    except Exception as exc:  # noqa: BLE001 - torch raises many kinds for a bad file
        raise ValueError(f"shard file {path} is unreadable ({load_error(exc)}); {redo}") from None
    try:
        return dataclasses.replace(RankShard.from_state(state), grid_shape=run_shape)
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"shard file {path} lacks {type(exc).__name__}: {str(exc)[:120]} (not a shard scalegnn "
                         f"wrote); {redo}") from None


def shard_command(graph: Graph, grid_shape, out_dir, *, permute: str = "none", seed: int = 0,
                  split: tuple = (None, None)) -> list[Path]:
    """``scalegnn data shard``: write per-rank shards of the graph once.

    Takes the raw graph as loaded and prepares it exactly as ``scalegnn train`` does
    (:func:`scalegnn.trainer.prepare_graph`: the seed's relabeling P_c when ``permute``
    is single or double, then GCN normalization); returns the written paths. ``split``:
    the (``--split``, ``--split-seed``) already applied to ``graph``, for the manifest.
    """
    if graph.meta.get("normalized") == "gcn":
        if permute != "none":
            raise ValueError("shard_command needs the raw graph to apply the permutation before normalizing")
    else:
        if permute != "none":
            from ..permutation import random_permutation

            graph = graph.permute(random_permutation(graph.num_nodes, seed))
        graph = graph.gcn_normalize()
    return save_shards(graph, grid_shape, out_dir, permute=permute, seed=seed, split=split)


def check_shard_manifest(manifest: dict, permute: str, seed: int, where: str, split: tuple = (None, None)) -> None:
    """Refuse shards written for another ``--permute`` / ``--seed`` / ``--split`` than
    the run's: the vertex labels or the split would differ from the run's, silently."""
    wrote_split = tuple(manifest.get("split") or (None, None))

    def drawn(pair) -> tuple:  # the split actually drawn: --split-seed defaults to the run's --seed
        return (None, None) if pair[0] is None else (pair[0], seed if pair[1] is None else int(pair[1]))

    if drawn(wrote_split) != drawn(tuple(split)):
        def flags(s):
            return " ".join(f"{k} {v}" for k, v in zip(("--split", "--split-seed"), s) if v is not None)
        again = f"`scalegnn data shard ... {flags(split)}`" if split[0] else "`scalegnn data shard` without --split"
        raise ValueError(f"the shards in {where} were written with {flags(wrote_split) or 'no --split'} but the run "
                         f"has {flags(split) or 'no --split'}; give the run the same, or re-shard with {again}")
    wrote = manifest.get("permute", "none")
    if wrote != permute:
        raise ValueError(f"the shards in {where} were written with --permute {wrote} but the run asks for "
                         f"--permute {permute}; pass --permute {wrote} or re-shard with "
                         f"`scalegnn data shard ... --permute {permute}`")
    if permute != "none" and int(manifest.get("seed", 0)) != int(seed):
        raise ValueError(f"the shards in {where} were permuted with --seed {manifest.get('seed')} but the run "
                         f"has --seed {seed}; pass the same seed or re-shard with --seed {seed}")


def shard_nnz_stats(nnz_per_shard: list[list[int]]) -> dict:
    """max/mean nonzeros per shard and their ratio (Plexus Table 3's load balance)."""
    flat = [n for ranks in nnz_per_shard for n in ranks]
    mean = sum(flat) / max(len(flat), 1)
    return {"max": max(flat, default=0), "mean": mean, "imbalance": (max(flat, default=0) / mean) if mean else 1.0}
