"""Shard sets on disk: the contract between staging (``scalegnn data shard``, a sweep's
staging step) and training (each rank of ``scalegnn train --shard-dir`` maps its part).

    format        the files: their names, the manifest (read and written only here),
                  checksums, the storage a rank maps, and loading a rank's shard
    write         one entry point, :func:`write_shards`, deciding in memory or out of core
    out_of_core   staging within a memory budget, the graph read from disk in chunks

What a shard is and how it is cut from a graph in memory is
:mod:`scalegnn.parallel.sharding` (below this package); the trainer and the benchmarks
above it use the names exported here.
"""

from .format import (BLOCKS_DIR, MANIFEST, NODE_ARRAYS, SHARD_FORMAT, adjacency_file, check_shard_manifest,
                     feature_blocks, feature_file, has_manifest, load_shard, node_file, rank_plane_keys,
                     read_manifest, redo_hint, shard_file_name, shard_nnz_stats, shard_storage_bytes, stored_blocks,
                     verify_shard_file, write_manifest)
from .write import save_shards, shard_command, source_graph, write_shards

__all__ = ["BLOCKS_DIR", "MANIFEST", "NODE_ARRAYS", "SHARD_FORMAT", "adjacency_file", "check_shard_manifest",
           "feature_blocks", "feature_file", "has_manifest", "load_shard", "node_file", "rank_plane_keys",
           "read_manifest", "redo_hint", "shard_file_name", "shard_nnz_stats", "shard_storage_bytes", "stored_blocks",
           "verify_shard_file", "write_manifest", "save_shards", "shard_command", "source_graph", "write_shards"]
