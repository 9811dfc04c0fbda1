"""The processed-graph cache: a parsed graph saved once, loaded in seconds afterwards.

File: ``<cache dir>/<slug>[-seed<seed>]-v<CACHE_FORMAT_VERSION>.pt`` where the cache
dir is ``$SCALEGNN_CACHE_DIR`` if set, else ``<data_root>/.scalegnn-cache`` when it
is writable (a folder without write permission bits counts as read-only, even for
root), else ``~/.cache/scalegnn/data/.scalegnn-cache``, else no cache. The seed is part of
the name only for datasets whose content depends on it.

Content: ``torch.save`` of a dict of plain tensors, ints and strings (no pickled
objects), loaded with ``torch.load(weights_only=True, mmap=True)``. Features come
back in the layout they were built in, so a run trains on the same matrix whether its
graph was parsed or cached: CSR features (the built-in loaders' multi-hot features, a
sparse feature file) are stored and loaded as CSR, never densified; dense features
that the layout rule (:func:`scalegnn.csr.sparse_enough`) would hold as CSR (a user's
dense bag-of-words array) are stored as CSR too, to save disk, and densified on load.
The ``source`` entry records (path, size, mtime) of every input file; an entry whose
sources changed is rebuilt. Writes go to a temp file then ``os.replace``, so a
reader never sees a partial file, and concurrent writers (ranks) are harmless. A
file that cannot be read or does not form a valid graph is reported with a warning
and rebuilt.
"""

from __future__ import annotations

import json
import os
import re
import uuid
import warnings
from pathlib import Path

import torch

from scalegnn.csr import csr_matrix, is_csr, sparse_if_enough
from scalegnn.fileio import atomic_write
from scalegnn.graph import Graph

__all__ = ["CACHE_FORMAT_VERSION", "cache_dir", "cache_path", "load_cached", "save_cached", "source_signature"]

# 2: CSR features kept CSR; graph meta names the split and any stand-in.
# 3: the built-in loaders build sparse features as CSR (one rule, scalegnn.csr.sparse_enough):
#    a version-2 file holds them as dense and would hand back another layout than a parse.
# 4: a user's graph file states what reading it changed (meta symmetrized, input_edges, weighted):
#    a version-3 file would train it without saying so.
CACHE_FORMAT_VERSION = 4


def _writable(d: Path) -> bool:
    """Whether we may create files in ``d``. A folder (or the nearest existing parent)
    without any write permission bit counts as read-only even for root, who could
    write anyway: shared read-only data folders must stay untouched."""
    existing = d
    while not existing.exists() and existing.parent != existing:
        existing = existing.parent
    try:
        if not existing.stat().st_mode & 0o222:
            return False
        d.mkdir(parents=True, exist_ok=True)
        probe = d / f".probe-{uuid.uuid4().hex}"
        probe.touch()
        probe.unlink()
        return True
    except OSError:
        return False


def cache_dir(root: Path) -> Path | None:
    """The first writable cache folder (see module docstring), or None."""
    env = os.environ.get("SCALEGNN_CACHE_DIR")
    candidates = [Path(env).expanduser()] if env else [root / ".scalegnn-cache"]
    if not env:
        candidates.append(Path("~/.cache/scalegnn/data/.scalegnn-cache").expanduser())
    for d in candidates:
        if _writable(d):
            return d
    return None


def cache_path(directory: Path, slug: str, seed: int | None) -> Path:
    slug = re.sub(r"[^A-Za-z0-9._=+-]+", "_", slug).strip("_")
    seed_part = f"-seed{seed}" if seed is not None else ""
    return directory / f"{slug}{seed_part}-v{CACHE_FORMAT_VERSION}.pt"


def source_signature(files) -> list:
    out = []
    for f in files:
        st = Path(f).stat()
        out.append([str(Path(f).resolve()), st.st_size, st.st_mtime_ns])
    return out


def save_cached(path: Path, graph: Graph, source: list) -> None:
    """Write ``graph`` atomically; a failure only warns (the cache is an optimization)."""
    x = graph.x
    blob = {
        "format": CACHE_FORMAT_VERSION,
        "name": graph.name,
        "num_classes": int(graph.num_classes),
        "meta_json": json.dumps(graph.meta, default=str),
        "source_json": json.dumps(source),
        "indptr": graph.indptr,
        "indices": graph.indices,
        "values": graph.values,
        "y": graph.y,
        "train_idx": graph.train_idx,
        "val_idx": graph.val_idx,
        "test_idx": graph.test_idx,
    }
    stored = sparse_if_enough(x)  # CSR on disk; a dense x comes back dense (no x_layout)
    if is_csr(stored):
        blob.update(x_crow=stored.crow_indices(), x_col=stored.col_indices(), x_val=stored.values(),
                    x_shape=list(x.shape), **({"x_layout": "csr"} if is_csr(x) else {}))
    else:
        blob["x"] = x
    try:
        atomic_write(path, lambda f: torch.save(blob, f))
    except OSError as e:
        warnings.warn(f"could not write the dataset cache {path}: {e}; continuing without it", stacklevel=3)


def load_cached(path: Path, name: str, source: list) -> Graph | None:
    """The cached graph, or None when absent, stale (sources changed) or unusable."""
    if not path.is_file():
        return None
    try:
        blob = torch.load(path, weights_only=True, mmap=True)
        if not isinstance(blob, dict) or blob.get("format") != CACHE_FORMAT_VERSION:
            raise ValueError(f"format {blob.get('format') if isinstance(blob, dict) else type(blob)!r}")
        if blob["name"] != name:
            raise ValueError(f"it holds {blob['name']!r}, not {name!r}")
        if json.loads(blob["source_json"]) != source:
            return None  # input files changed: rebuild quietly
        if "x" in blob:
            x = blob["x"]
        else:
            x = csr_matrix(blob["x_crow"], blob["x_col"], blob["x_val"], blob["x_shape"], f"cache file {path}")
            if blob.get("x_layout") != "csr":  # dense when built: it comes back dense
                x = x.to_dense()
        return Graph(
            indptr=blob["indptr"],
            indices=blob["indices"],
            values=blob["values"],
            x=x,
            y=blob["y"],
            train_idx=blob["train_idx"],
            val_idx=blob["val_idx"],
            test_idx=blob["test_idx"],
            num_classes=int(blob["num_classes"]),
            name=blob["name"],
            meta=json.loads(blob["meta_json"]),
        )
    except Exception as e:  # noqa: BLE001 - any failure (incl. GraphValidationError) means rebuild
        warnings.warn(
            f"dataset cache file {path} is corrupt or unreadable ({type(e).__name__}: {e}); rebuilding it",
            stacklevel=3,
        )
        return None
