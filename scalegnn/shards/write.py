"""Writing a shard set (:mod:`.format`): ``scalegnn data shard`` and a sweep's staging
step both call :func:`write_shards`, which decides in one place whether the graph is
loaded and cut in memory (:func:`save_shards`) or staged out of core within a memory
budget (:func:`scalegnn.shards.out_of_core.stage_source`)."""

from __future__ import annotations

from pathlib import Path

import torch

from ..fileio import atomic_write, file_sha256
from ..graph import Graph
from ..parallel.sharding import check_grid_shape, check_normalized, cut_shards
from .format import shard_file_name, write_manifest

__all__ = ["write_shards", "source_graph", "save_shards", "shard_command"]


def source_graph(dataset: str, *, data_root=None, seed: int = 0, split: tuple = (None, None),
                 stand_in_labels: bool = False) -> Graph:
    """The graph a run with these ``--dataset`` / ``--data-root`` / ``--seed`` /
    ``--split`` / ``--split-seed`` / ``--stand-in-labels`` settings trains on, as loaded
    (raw: :func:`shard_command` prepares it as the run does)."""
    from ..datasets import DataConfig, load_graph

    data = DataConfig(dataset=dataset, data_root=data_root, split=split[0], split_seed=split[1],
                      stand_in_labels=stand_in_labels)
    return load_graph(data, seed)


def write_shards(dataset: str, grid_shape, out_dir, *, data_root=None, seed: int = 0, permute: str = "none",
                 split: tuple = (None, None), stand_in_labels: bool = False, memory_budget: int | str | None = None,
                 workers: int = 1, layout: str = "files", graph: Graph | None = None) -> list[Path]:
    """``scalegnn data shard``: the shard set in ``out_dir`` for runs of ``dataset`` on
    ``grid_shape`` with these settings. Returns the written paths, the manifest last.

    ``memory_budget`` None: in memory, the graph loaded whole (or ``graph``, the graph
    :func:`source_graph` gives for these settings, when the caller has it: a sweep cuts
    one loaded graph for several grids) and cut rank by rank (:func:`shard_command`).
    A size (bytes, or text such as ``2G``): out of core within it, the graph read from
    disk in chunks and never whole, by ``workers`` processes, in the ``files`` or
    ``blocks`` layout (:func:`scalegnn.shards.out_of_core.stage_source`)."""
    if memory_budget is not None:  # out of core: the graph is never loaded whole
        from .out_of_core import parse_size, stage_source

        budget = parse_size(memory_budget) if isinstance(memory_budget, str) else int(memory_budget)
        return stage_source(dataset, grid_shape, out_dir, data_root=data_root, seed=seed, memory_budget=budget,
                            workers=workers, permute=permute, split=split, layout=layout)
    if layout != "files":
        raise ValueError("--layout blocks is written by out-of-core staging; add --memory-budget SIZE (e.g. 2G)")
    if graph is None:
        graph = source_graph(dataset, data_root=data_root, seed=seed, split=split, stand_in_labels=stand_in_labels)
    return shard_command(graph, grid_shape, out_dir, permute=permute, seed=seed, split=split)


def save_shards(graph: Graph, grid_shape, out_dir, *, permute: str = "none", seed: int = 0,
                split: tuple = (None, None)) -> list[Path]:
    """Write one shard file per (x, y, z) (data-parallel replicas share them) and a
    manifest (:func:`.format.write_manifest`, last); each written atomically (temp file + rename).
    Returns the paths.

    ``permute`` (none | single | double) and ``seed`` are those of the run that will
    read the shards: ``graph`` must already carry the seed's relabeling P_c when
    ``permute`` is not none (:func:`shard_command` applies it), and double adds the
    seed's sigma ordering to every shard. ``split`` is the (``--split``, ``--split-seed``)
    the graph's split was drawn with ((None, None): the dataset's own). All go into the
    manifest, and a run whose ``--permute``, ``--seed`` or ``--split`` differs is
    refused when it loads the shards."""
    check_normalized(graph)
    shape = check_grid_shape(grid_shape)
    if permute not in ("none", "single", "double"):
        raise ValueError(f"permute must be none, single or double, got {permute!r}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    sigma = None
    if permute == "double":
        from ..permutation import double_sigma

        sigma = double_sigma(graph.num_nodes, seed)
    paths, nnz = [], []
    for c, shard in cut_shards(graph, shape, sigma=sigma):
        path = out / shard_file_name(c)
        atomic_write(path, lambda f, s=shard: torch.save(s.to_state(), f))
        paths.append(path)
        nnz.append([blk.nnz for blk in shard.adj])
    mpath = write_manifest(out, grid_shape=shape, name=graph.name, num_nodes=graph.num_nodes,
                           num_edges=graph.num_edges, num_features=graph.num_features, num_classes=graph.num_classes,
                           multilabel=graph.multilabel, files=[p.name for p in paths], nnz_per_shard=nnz,
                           sha256={p.name: file_sha256(p) for p in paths}, permute=permute, seed=seed, split=split,
                           graph=graph.record_info())
    return paths + [mpath]


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
