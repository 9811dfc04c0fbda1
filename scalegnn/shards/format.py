"""The shard files: the on-disk contract between staging and training.

``scalegnn data shard`` writes a shard set once (:mod:`.write`, in memory or out of core:
:mod:`.out_of_core`); each rank of a run maps its part of it (:func:`load_shard`). A
folder holds

    manifest.json   written last (a set without one is incomplete): format, grid_shape,
                    name, sizes, the graph's record info, the --permute / --seed /
                    --split the set was cut for, nonzeros per rank and plane, and the
                    SHA-256 of every file (:func:`read_manifest`, :func:`write_manifest`)
    shard_x{i}_y{j}_z{k}.pt
                    the files layout: one ``RankShard.to_state()`` per (x, y, z)
                    (:func:`shard_file_name`), which every data-parallel replica reads
    blocks/         the blocks layout (manifest ``"layout": "blocks"``): each distinct
                    block of A + I, feature block and the whole-graph label and mask
                    vectors once, as ``.npy`` arrays (:func:`adjacency_file`,
                    :func:`feature_file`, :func:`node_file`), from which a rank's
                    RankShard is built at load; seeded features are computed from their
                    seed at load

:func:`load_shard` maps a rank's file into memory (``mmap=True``, ``weights_only=True``:
plain tensors only; ``.npy`` arrays with ``allow_pickle=False``) after checking its
SHA-256 the first time the file is loaded (:func:`verify_shard_file`). Mapped, a rank's
arrays are pages of the file that the kernel reads when they are first touched and may
drop again (they are clean): its resident memory is what it uses, and ranks of one node
that read the same file (data-parallel replicas) share those pages. On a GPU,
``RankShard.to`` copies each array over once and the mapping is dropped with the state.

No module outside this package opens a manifest, names a shard file or reaches a private
helper of the shards (tests/harness/test_architecture.py checks it).
"""

from __future__ import annotations

import dataclasses
import json
import socket
from pathlib import Path

import torch

from ..fileio import atomic_write, drop_pages, file_sha256, load_error
from ..parallel.grid import PMM_AXES
from ..parallel.sharding import (SHARD_FORMAT, RankShard, check_grid_shape, feature_range, grid_coords, plane_keys,
                                 plane_sharing, shared_blocks, vertex_ranges)
from ..ranges import split_range
from ..sampling import CSRBlock
from .names import (BLOCKS_DIR, MANIFEST, NODE_ARRAYS, adjacency_file, feature_file, has_manifest, node_file,
                    shard_file_name)

__all__ = ["SHARD_FORMAT", "MANIFEST", "BLOCKS_DIR", "NODE_ARRAYS", "shard_file_name", "has_manifest", "redo_hint",
           "read_manifest", "write_manifest", "check_shard_manifest", "shard_nnz_stats", "shard_storage_bytes",
           "stored_blocks", "feature_blocks", "adjacency_file", "feature_file", "node_file",
           "verify_shard_file", "load_shard"]

SEEDED_ROWS_ENTRIES = 1 << 18  # seeded features computed at load this many entries at a time (~50 B of scratch each)


def redo_hint(folder) -> str:
    """What to run when the shard set in ``folder`` is missing or damaged."""
    return f"re-write them with `scalegnn data shard DATASET --grid GRID --out {folder}`"


def read_manifest(folder) -> dict:
    """The manifest of the shard set in ``folder``; a one-line error naming the fix when
    there is none or it is unreadable (not JSON, no grid shape of four sizes)."""
    mpath = Path(folder) / MANIFEST
    if not mpath.is_file():
        raise FileNotFoundError(f"{mpath} not found; write the shards first with `scalegnn data shard`")
    try:
        manifest = json.loads(mpath.read_text())
        shape = tuple(int(g) for g in manifest["grid_shape"])
        if len(shape) != 4:
            raise ValueError(f"grid_shape has {len(shape)} sizes, not 4")
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"shard manifest {mpath} is unreadable ({type(exc).__name__}: {str(exc)[:120]}); "
                         f"{redo_hint(folder)}") from None
    return manifest


def write_manifest(folder, *, grid_shape, name: str, num_nodes: int, num_edges: int, num_features: int,
                   num_classes: int, multilabel: bool, files: list, nnz_per_shard: list, sha256: dict, permute: str,
                   seed: int, split: tuple, graph: dict, **staging) -> Path:
    """Write the manifest of the shard set in ``folder`` atomically (last: it marks the set
    complete): its format and grid, the graph's name, sizes and record info, the files with
    their nonzeros per rank and SHA-256, the ``--permute`` / ``--seed`` / ``--split`` it was
    cut for, the host that staged it (ranks on other nodes read it from shared storage),
    then ``staging``'s entries (how out-of-core staging wrote it, its layout)."""
    manifest = {
        "format": SHARD_FORMAT, "grid_shape": list(grid_shape), "name": name, "num_nodes": num_nodes,
        "num_edges": num_edges, "num_features": num_features, "num_classes": num_classes, "multilabel": multilabel,
        "files": files, "nnz_per_shard": nnz_per_shard, "sha256": sha256, "permute": permute, "seed": int(seed),
        "split": list(split), "graph": graph, "host": socket.gethostname(), **staging,
    }
    mpath = Path(folder) / MANIFEST
    atomic_write(mpath, lambda f: json.dump(manifest, f, indent=1), text=True)
    return mpath


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
    g = dict(zip(("dp", "x", "y", "z"), check_grid_shape(grid_shape)))
    if coords is None:
        candidates = [{"x": i, "y": j, "z": k} for i in range(min(3, g["x"])) for j in range(min(3, g["y"]))
                      for k in range(min(3, g["z"]))]
        return max((shard_storage_bytes(n, nnz, num_features, num_classes, grid_shape, c, multilabel=multilabel)
                    for c in candidates), key=lambda b: b["total"])
    vr = vertex_ranges(grid_shape, n, coords)
    index_bytes = 4 if n < 2**31 else 8
    off_diagonal = max(0, nnz - n) / max(1, n) ** 2
    adjacency = 0.0
    for (rows, cols), src in plane_sharing(plane_keys(vr)).items():
        adjacency += 8 * (rows[1] - rows[0] + 1)
        if src is None:
            size = lambda rng: rng[1] - rng[0]  # noqa: E731
            diagonal = max(0, min(rows[1], cols[1]) - max(rows[0], cols[0]))
            adjacency += (off_diagonal * size(rows) * size(cols) + diagonal) * (index_bytes + 4)
    f0, f1 = feature_range(grid_shape, num_features, coords)
    y_bytes = 4 * num_classes if multilabel else 8
    out = {"adjacency": adjacency, "features": 4.0 * (vr["x"][1] - vr["x"][0]) * (f1 - f0),
           "labels": float(sum((r[1] - r[0]) * (y_bytes + 3) for r in vr.values()))}
    out["total"] = sum(out.values())
    return out


# ------------------------------------------------------------------ blocks layout
# Per-rank files repeat every block of A in each rank that holds it: a 4x4x4 grid keeps
# its 16 distinct blocks of A 12 times over (three planes on 64 ranks), 417 GB for
# ogbn-papers100M's 3.2 G entries against 27 GB once. The blocks layout
# (:mod:`.out_of_core`, ``--layout blocks``) stores each distinct block of A + I, feature
# block and the whole-graph label and mask vectors once, as plain .npy arrays, and
# :func:`load_shard` builds a rank's RankShard from the ones it needs, equal tensor for
# tensor to the per-rank file's.

def stored_blocks(grid_shape, n: int) -> list:
    """The blocks of A + I ((rows, cols) vertex ranges) the blocks layout stores: every
    block some rank keeps whole (:func:`plane_sharing` of its three planes), once."""
    shape = check_grid_shape(grid_shape)
    keys = {k for c in grid_coords(shape) for k, src in plane_sharing(plane_keys(vertex_ranges(shape, n, c))).items()
            if src is None}
    return sorted(keys)


def feature_blocks(grid_shape, n: int, num_features: int) -> list:
    """The (rows, feature columns) blocks of X the ranks of ``grid_shape`` hold, once."""
    _, gx, _, gz = check_grid_shape(grid_shape)
    return sorted({(split_range(n, gx, i), split_range(num_features, gz, k)) for i in range(gx) for k in range(gz)})


def _load_blocks(out: Path, manifest: dict, coords: dict, run_shape: tuple, verify: str, redo: str) -> RankShard:
    """The RankShard of the rank at ``coords`` from a blocks-layout folder: its stored
    blocks mapped (copy-on-write: pages read when touched, never written back), row slices
    cut from them as :func:`scalegnn.parallel.sharding.share_planes` cuts them, its label and mask ranges copied out
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

    vr = vertex_ranges(shape, n, coords)
    keys = plane_keys(vr)
    parts = ("indptr", "indices", "values")
    adj = shared_blocks(keys, lambda key: CSRBlock(*(array(adjacency_file(key, p)) for p in parts), *key[0], *key[1]))
    f0, f1 = feature_range(shape, num_features, coords)
    nodes = {key: mapped(node_file(key)) for key in NODE_ARRAYS}
    labels = {key: {ax: copied(m, *vr[ax]) for ax in PMM_AXES} for key, m in nodes.items()}
    x0, x1 = vr["x"]
    if manifest.get("features", {}).get("kind") == "seeded":
        from ..datasets.streaming import seeded_features

        feats = seeded_features(manifest["features"]["protocol"], f"{out}/{MANIFEST}")
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
    redo = redo_hint(out)
    manifest = read_manifest(out)
    shape = tuple(int(g) for g in manifest["grid_shape"])
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
        return _load_blocks(out, manifest, grid_coords(shape)[rank % mp], run_shape, verify, redo)
    path = out / shard_file_name(grid_coords(shape)[rank % mp])
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
