"""Communication-free distributed subgraph construction (paper IV-B, Algorithm 2).

Shape legend:
    B    sampled vertices per step (N for a full-graph batch)
    Br_a sampled vertices inside this rank's vertex range along axis a
    Fz   input features in this rank's range along z

Every rank derives the same sorted sample ``S = sample_vertices(N, B, seed, step,
dp_index)`` (Algorithm 2, line 1), so ranks of one data-parallel group agree on it
and different groups (``dp_index``) draw different ones. Each rank then runs
:func:`scalegnn.sampling.extract_block` on its three plane shards with
``p = (B-1)/(N-1)`` (Eq. 23), and slices its feature block, labels and masks.
Row blocks are the sampled vertices inside each axis' vertex range, so their
uneven sizes are known to every rank. **No collective is called here** (a test
patches every torch.distributed collective to prove it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..sampling import (CompactIndexMap, SampledBlock, extract_block, inclusion_probability, resolve_batch_size,
                        sample_vertices, select_rows, training_features)
from .grid import PMM_AXES, ProcessGrid
from .layout import RowPartition
from .sharding import RankShard

__all__ = ["ShardedBatch", "DistributedSampler"]


@dataclass
class ShardedBatch:
    """This rank's part of one mini-batch (or of the full graph).

    nodes (B,) sorted global ids, the same on every rank of the group; rows the
    row blocks along x, y, z; adj[p] the sampled A shard of plane p (local CSR of
    shape (Br_rows, Br_cols) and its transpose); x (Br_x, Fz); y / train_mask /
    val_mask / test_mask per axis, for the rows of that axis' block.
    """

    step: int
    nodes: torch.Tensor
    rows: RowPartition
    adj: tuple[SampledBlock, SampledBlock, SampledBlock]
    x: torch.Tensor
    y: dict
    train_mask: dict
    scale: float
    val_mask: dict | None = None
    test_mask: dict | None = None

    @property
    def batch_size(self) -> int:
        return self.nodes.numel()


class DistributedSampler:
    """Per-rank uniform vertex sampler over a :class:`RankShard` (Algorithm 2).

    ``use_index_map`` keeps one persistent step-tagged compact map per plane
    (Alg. 2 line 14; 16 bytes x N per plane); without it the column remap is a
    binary search in the sorted sample (no N-sized state).
    """

    def __init__(self, shard: RankShard, grid: ProcessGrid, batch_size: int, seed: int = 0,
                 dp_index: int | None = None, use_index_map: bool = False):
        if tuple(shard.coords[a] for a in PMM_AXES) != tuple(grid.axis_index(a) for a in PMM_AXES):
            raise ValueError(f"shard for coords {shard.coords} given to rank {grid.rank} at {grid.coords}")
        if tuple(shard.grid_shape[1:]) != tuple(grid.axis_size(a) for a in PMM_AXES):
            raise ValueError(f"shard was cut for grid {shard.grid_shape}, the process grid is {grid.spec()}")
        self.shard, self.grid = shard, grid
        self.num_nodes = shard.num_nodes
        self.batch_size = resolve_batch_size(self.num_nodes, batch_size=batch_size)
        self.seed = seed
        self.dp_index = grid.axis_index("dp") if dp_index is None else dp_index
        self.scale = inclusion_probability(self.num_nodes, self.batch_size)
        self.features = training_features(shard.x)  # CSR when sparse, as the serial sampler
        self.index_maps = [CompactIndexMap(self.num_nodes) for _ in range(3)] if use_index_map else [None] * 3
        self._full: ShardedBatch | None = None

    def nodes(self, step: int) -> torch.Tensor:
        """The shared sorted sample S of ``step`` (Alg. 2 line 1)."""
        return sample_vertices(self.num_nodes, self.batch_size, self.seed, step, self.dp_index)

    def _slice(self, nodes: torch.Tensor, rows: RowPartition, table: dict) -> dict:
        out = {}
        for ax in PMM_AXES:
            lo, hi = rows.block(ax)
            v0 = self.shard.vertex_ranges[ax][0]
            out[ax] = table[ax][nodes[lo:hi] - v0]
        return out

    def _batch(self, step: int, nodes: torch.Tensor, scale: float, index_maps, with_eval_masks: bool) -> ShardedBatch:
        sh = self.shard
        rows = RowPartition(nodes, self.num_nodes, self.grid)
        adj = tuple(extract_block(blk, nodes, scale, m) for blk, m in zip(sh.adj, index_maps))
        lo, hi = rows.block("x")
        x = select_rows(self.features, nodes[lo:hi] - sh.vertex_ranges["x"][0])
        return ShardedBatch(
            step=step, nodes=nodes, rows=rows, adj=adj, x=x, y=self._slice(nodes, rows, sh.y),
            train_mask=self._slice(nodes, rows, sh.train_mask), scale=scale,
            val_mask=self._slice(nodes, rows, sh.val_mask) if with_eval_masks else None,
            test_mask=self._slice(nodes, rows, sh.test_mask) if with_eval_masks else None,
        )

    def sample(self, step: int) -> ShardedBatch:
        """This rank's shard of the rescaled sampled subgraph of ``step`` (Alg. 2)."""
        return self._batch(step, self.nodes(step), self.scale, self.index_maps, with_eval_masks=False)

    def full_batch(self) -> ShardedBatch:
        """The full graph as a batch (B = N, no rescaling) for evaluation; built once."""
        if self._full is None:
            nodes = torch.arange(self.num_nodes, dtype=torch.int64)
            self._full = self._batch(-1, nodes, 1.0, [None] * 3, with_eval_masks=True)
        return self._full
