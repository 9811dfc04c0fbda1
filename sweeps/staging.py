"""Data staged once per sweep: every rank reads only its shard.

Without staging, every rank of every run loads the whole graph and cuts its own
shard out of it: on ogbn-papers100M four ranks per node each hold the full graph.
A sweep therefore shards each (dataset, 3D grid, permutation, seed, split) that its runs need
once, with ``scalegnn data shard``, and every run gets ``--shard-dir`` (its rank's file
only) and the data root. Staging is CPU work: one task, before the runs, on the
profile's ``[staging]`` resources (Perlmutter's shared CPU nodes, one Frontier node) --
a job the runs depend on (SLURM ``afterok``, Flux ``--dependency=afterok``), a job of its
own locally. The sets that read one graph (same dataset, data root, seed and split) are
one task (:func:`group_stages`): it loads the graph once and writes each of their grids. The seed is
part of the key because the split, and the permutation when there is one, depend on
it; so is ``--split`` (with ``--split-seed``) when a run gives one (the shards remember
it and a run with another is refused). Of the grid only the 3D part (Gx, Gy, Gz) is:
a shard is the data of one (x, y, z) coordinate, the same for every data-parallel
replica, so a set is staged for ``1xGxxGyxGz`` and read by the runs of every Gd
(:func:`scalegnn.shards.load_shard` checks the 3D part only). The Fig. 7
sweep on Perlmutter stages 4 sets this way, not 22 (one per 4D grid).

Which runs can read shards is the trainer's business: it is read from their
configuration (:meth:`scalegnn.sweeps.spec.RunSpec.config`, so ``fullgraph-3d``'s implied
``--permute double`` is seen), and only ScaleGNN runs (``scalegnn``,
``fullgraph-3d``) with more than one rank are staged: the baselines and one-rank
runs load the graph as before, with the same data root and offline switch.

Layout: ``OUT/shards/<dataset>-1x<Gx>x<Gy>x<Gz>-<permute>-s<seed>-<hash>/`` (the hash
covers the data root too; a set staged before the key dropped Gd kept the same name
when its runs had Gd = 1). A folder is complete when its ``manifest.json`` exists
(written last by ``scalegnn data shard``); complete folders are never rewritten.
"""

from __future__ import annotations

import hashlib
import json
import math
import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

from scalegnn.config import RunConfig
from scalegnn.systems import SCALEGNN_SYSTEMS as STAGED_SYSTEMS  # the systems whose trainer reads --shard-dir

__all__ = ["StageSet", "StageTask", "resolve_data_root", "stage_for", "with_data", "group_stages", "STAGED_SYSTEMS"]


def resolve_data_root(data_root: str | os.PathLike | None = None, site: str | None = None) -> str:
    """The data root every task of a sweep gets, as an absolute path fixed at submission:
    ``data_root`` (``--data-root``), else ``$SCALEGNN_DATA_ROOT`` of the submitting shell,
    else ``site`` (the profile's ``data_root``: scratch on the clusters), else scalegnn's
    default (``~/.cache/scalegnn/data``)."""
    from scalegnn.datasets import default_data_root

    if data_root:
        root = Path(data_root).expanduser()
    elif site and not os.environ.get("SCALEGNN_DATA_ROOT"):
        root = Path(site).expanduser()
    else:
        root = default_data_root()
    return str(root.resolve())


@dataclass(frozen=True)
class StageSet:
    """One set of shard files: ``scalegnn data shard`` of (dataset, grid, permute, seed,
    split, split seed); ``grid`` is ``(1, Gx, Gy, Gz)`` for a sweep's sets (:func:`stage_for`)."""

    dataset: str
    grid: tuple[int, int, int, int]
    permute: str
    seed: int
    data_root: str
    folder: str
    split: str | None = None
    split_seed: int | None = None
    stand_in_labels: bool = False  # the run's --stand-in-labels (a labels file, when there is one, wins anyway)
    memory_budget: str = ""  # the profile's [staging] memory_budget: out of core where the input allows it

    @property
    def out_of_core(self) -> bool:
        """Staged out of core (``--memory-budget``, blocks layout): a budget is set and the
        dataset is an input out-of-core staging reads (dir:, npz:, OGB's raw files)."""
        from scalegnn.datasets.convert import OGB_RAW

        kind = self.dataset.partition(":")[0].strip().lower()
        return bool(self.memory_budget) and not self.stand_in_labels and (kind in ("dir", "npz")
                                                                          or self.dataset in OGB_RAW)

    @property
    def grid_str(self) -> str:
        return "x".join(map(str, self.grid))

    @staticmethod
    def key_of(dataset: str, grid, permute: str, seed: int, data_root: str, split: str | None = None,
               split_seed: int | None = None) -> str:
        from .spec import _slug

        # Without --split the identity is what it was before the flag existed: staged folders keep their names.
        ident = json.dumps([dataset, list(grid), permute, int(seed), data_root] +
                           ([split, split_seed] if split is not None else []))
        digest = hashlib.sha1(ident.encode()).hexdigest()[:10]
        return f"{_slug(dataset, 32)}-{'x'.join(map(str, grid))}-{permute}-s{seed}-{digest}"

    @property
    def layout(self) -> str:
        """Out of core, the blocks layout (each block once), but for the double permutation,
        whose two labelings only the files layout holds."""
        return "files" if self.permute == "double" else "blocks"

    def argv(self) -> list[str]:
        """``scalegnn`` arguments that write this set."""
        split = (["--split", self.split] if self.split is not None else []) + \
            (["--split-seed", str(self.split_seed)] if self.split_seed is not None else [])
        ooc = ["--memory-budget", self.memory_budget, "--layout", self.layout] if self.out_of_core else []
        return ["data", "shard", self.dataset, "--grid", self.grid_str, "--out", self.folder, "--seed",
                str(self.seed), "--permute", self.permute, "--data-root", self.data_root, *split,
                *(["--stand-in-labels"] if self.stand_in_labels else []), *ooc]

    def done(self) -> bool:
        from scalegnn.shards.names import has_manifest

        return has_manifest(self.folder)


def group_stages(stages) -> list[list[StageSet]]:
    """``stages`` grouped by the graph they shard (dataset, data root, seed, split, split
    seed), in their order: one staging task per group loads it once."""
    groups: dict[tuple, list[StageSet]] = {}
    for st in stages:
        groups.setdefault((st.dataset, st.data_root, st.seed, st.split, st.split_seed, st.stand_in_labels), []).append(st)
    return list(groups.values())


def stage_for(cfg: RunConfig, out: str | os.PathLike, data_root: str, memory_budget: str = "") -> StageSet | None:
    """The shard set a run with configuration ``cfg`` reads, or None when it loads the
    graph itself (a baseline, one rank, or shards it names itself). The set is keyed by
    the 3D part of the run's grid: runs that differ only in Gd read one set.
    ``memory_budget``: the profile's [staging] one (how the set is written, not which)."""
    grid = tuple(cfg.parallel.grid)
    if cfg.system not in STAGED_SYSTEMS or math.prod(grid) == 1 or cfg.data.shard_dir:
        return None
    grid = (1, *grid[1:])  # replicas share the shards of their (x, y, z): staged once whatever Gd
    root = str(Path(cfg.data.data_root).expanduser().resolve()) if cfg.data.data_root else data_root
    split = cfg.data.split  # its seed defaults to the run's --seed: one staged set for both ways of saying it
    split_seed = None if split is None else (cfg.data.split_seed if cfg.data.split_seed is not None else int(cfg.seed))
    key = StageSet.key_of(cfg.data.dataset, grid, cfg.numerics.permute, cfg.seed, root, split, split_seed)
    return StageSet(cfg.data.dataset, grid, cfg.numerics.permute, int(cfg.seed), root,
                    str(Path(out).resolve() / "shards" / key), split, split_seed, cfg.data.stand_in_labels,
                    memory_budget)


def with_data(cfg: RunConfig, data_root: str, stage: StageSet | None):
    """``cfg`` with what a sweep adds to the spec's data settings: the data root (unless
    the spec set one) and its shard folder when it is staged."""
    data = cfg.data
    return dataclasses.replace(cfg, data=dataclasses.replace(
        data, data_root=data.data_root or data_root, shard_dir=stage.folder if stage is not None else data.shard_dir))


class StageTask:
    """The staging step: ``scalegnn data shard`` for one :class:`StageSet`, or for the sets
    of one graph (:func:`group_stages`), which it loads once (a submitit callable: one task
    on one node). Skips a set whose manifest exists; with ``offline`` no download is tried
    (``SCALEGNN_OFFLINE=1``). A set that fails does not stop the others (what is written
    stays written); the task then fails naming them. Returns the sets' folders."""

    def __init__(self, stage: StageSet | list[StageSet], offline: bool):
        self.stages = [stage] if isinstance(stage, StageSet) else list(stage)
        self.offline = offline
        if len(group_stages(self.stages)) > 1:
            raise ValueError("one staging task shards one graph: give it the sets of one group (group_stages)")

    def __call__(self) -> list[str]:
        if self.offline:
            os.environ["SCALEGNN_OFFLINE"] = "1"
        from scalegnn.shards import source_graph, write_shards

        for st in self.stages:  # out of core: each set streams the graph from disk, nothing is loaded whole
            if st.out_of_core and not st.done():
                write_shards(st.dataset, st.grid, st.folder, data_root=st.data_root, seed=st.seed, permute=st.permute,
                             split=(st.split, st.split_seed), memory_budget=st.memory_budget,
                             layout=st.layout)
        todo = [st for st in self.stages if not st.done()]
        if todo:
            first = todo[0]  # the group's sets share one graph: loaded once, cut for each grid
            graph = source_graph(first.dataset, data_root=first.data_root, seed=first.seed,
                                 split=(first.split, first.split_seed), stand_in_labels=first.stand_in_labels)
            failed = []
            for st in todo:
                try:
                    write_shards(st.dataset, st.grid, st.folder, seed=st.seed, permute=st.permute,
                                 split=(st.split, st.split_seed), graph=graph)
                    if not st.done():
                        raise RuntimeError("it wrote no manifest")
                except Exception as exc:  # noqa: BLE001 - the other sets are still written; reported below
                    failed.append((st, exc))
            if failed:
                st, exc = failed[0]
                raise RuntimeError(f"staging failed for {len(failed)} of {len(todo)} shard set(s), first "
                                   f"`scalegnn {' '.join(st.argv())}`: {exc}") from exc
        return [st.folder for st in self.stages]
