"""Shard sets on disk: the contract between staging (``scalegnn data shard``, a sweep's
staging step) and training (each rank of ``scalegnn train --shard-dir`` maps its part).

    names         the files' names and whether a set is complete (no torch: a launcher asks)
    format        the files: the manifest (read and written only here), checksums, the
                  storage a rank maps, and loading a rank's shard
    write         one entry point, :func:`write_shards`, deciding in memory or out of core
    out_of_core   staging within a memory budget, the graph read from disk in chunks

What a shard is and how it is cut from a graph in memory is
:mod:`scalegnn.parallel.sharding` (below this package); the trainer and the benchmarks
above it use the names exported here, each loaded with its module on first use (asking
:func:`has_manifest` loads no torch).
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "names": ("BLOCKS_DIR", "MANIFEST", "NODE_ARRAYS", "adjacency_file", "feature_file", "has_manifest", "node_file",
              "shard_file_name"),
    "format": ("SHARD_FORMAT", "check_shard_manifest", "feature_blocks", "load_shard",
               "read_manifest", "redo_hint", "shard_nnz_stats", "shard_storage_bytes", "stored_blocks",
               "verify_shard_file", "write_manifest"),
    "write": ("save_shards", "shard_command", "source_graph", "write_shards"),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = sorted(_MODULE_OF)


def __getattr__(name: str):
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
