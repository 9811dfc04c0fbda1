"""Dataset loaders and generators: every dataset becomes a raw :class:`~scalegnn.graph.Graph`.

Public API::

    load_dataset(name, data_root=None, seed=0, cache=True, split=None, split_seed=None) -> Graph
    load_graph(data_config, seed, graph=None) -> Graph   # a run's graph: its DataConfig, --split applied
    list_datasets() -> list[str]
    file_forms() -> list[str]          # the <kind>:<path> forms of your own files
    describe(graph) -> dict            # Graph.stats() + isolated, edge homophily, source
    DatasetError(ValueError)           # names the bad name / file and the fix

A loaded graph is *raw*: undirected graphs store both directions, unit weights,
self loops and duplicate pairs dropped, nothing added, not normalized (the trainer
normalizes). ``graph.name`` is the canonical name (it round-trips through
``load_dataset``); ``graph.meta`` holds the source, split, seed and parameters.

Names (case-insensitive, ``_`` and ``-`` interchangeable)
-----------------------------------------------------------
==============================================  ==========================================
``cora`` ``citeseer`` ``pubmed``                 Planetoid, standard 20-per-class split
``facebook`` (``facebook-pagepage``)             MUSAE Facebook, seeded 50/25/25 split
``twitch-de`` ``twitch-de:split=K``              LINKX split K (0..4, default 0) if the file
                                                 exists, else seeded 50/25/25
``twitch-engb|es|fr|pt|ru``                      seeded 50/25/25
``reddit``                                       GraphSAGE npz pair, its fixed split
``ogbn-arxiv`` ``ogbn-products``                 through ``ogb``, ogb's split
``ogbn-papers100M``
``isolate-3-8m`` ``products-14m`` ``europe-osm``  ``<root>/<name>.mtx|.txt``, featureless protocol
``edgelist:<path>`` ``mtx:<path>``               your graph file; node data beside it, else
                                                 the featureless protocol (stated)
``npz:<file.npz>`` ``dir:<folder>``              your arrays (format: ``files.py``, README.md)
``csbm`` ``csbm:n=100000,avg_degree=20``         contextual SBM (params: n, avg_degree,
                                                 classes, homophily, feature_dim, signal)
``rmat`` ``rmat:scale=20,edge_factor=8``         R-MAT (params: scale, edge_factor, a, b, c, d)
==============================================  ==========================================

Parameters follow a colon as ``key=value`` pairs separated by commas; integer
parameters accept ``1e6``; an unknown key raises a DatasetError listing the valid
ones. The canonical name lists only parameters that differ from the defaults.
Featureless protocol (ScaleGNN VII-A, Plexus): 128-d N(0, 1) features, 32 balanced
classes by degree rank (``_core.degree_classes``), seeded 50/25/25 split.

Data root (``data_root``, CLI ``--data-root``; default ``$SCALEGNN_DATA_ROOT``, else
``~/.cache/scalegnn/data``) layout, the shared ``../shared/data`` folder as-is::

    planetoid_cora/ind.cora.*        (also cora/raw/, Cora/raw/ (PyG), cora/)
    planetoid_citeseer/ind.citeseer.*, planetoid_pubmed/ind.pubmed.*
    facebook_pagepage/{edges.csv,features.json,new_target.csv}
    twitch_musae/<C>/musae_<C>_{edges.csv,features.json,target.csv}
    twitch_musae/linkx_splits/twitch-e-DE-splits.npy
    reddit/{reddit_data.npz,reddit_graph.npz}        (also Reddit/raw/ (PyG))
    ogbn_arxiv/, ogbn_products/, ogbn_papers100M/    (ogb's own layout)
    isolate-3-8m.mtx, products-14m.mtx, europe_osm/europe_osm.mtx

Environment: ``SCALEGNN_DATA_ROOT`` (default root), ``SCALEGNN_CACHE_DIR`` (cache
folder, see ``cache.py``), ``SCALEGNN_OFFLINE=1`` (never try to download OGB data).

The processed-graph cache (``cache.py``) stores each parsed graph once under
``<data_root>/.scalegnn-cache`` (or a writable fallback) and is rebuilt when a
source file changes or the file is corrupt.
"""

from ._core import DatasetError, draw_split, split_flag
from .cache import CACHE_FORMAT_VERSION
from .registry import (DataConfig, default_data_root, describe, edge_homophily, file_forms, list_datasets,
                       load_dataset, load_graph)

__all__ = [
    "DataConfig",
    "CACHE_FORMAT_VERSION",
    "DatasetError",
    "default_data_root",
    "describe",
    "draw_split",
    "edge_homophily",
    "file_forms",
    "list_datasets",
    "load_dataset",
    "load_graph",
    "split_flag",
]
