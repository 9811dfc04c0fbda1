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

Device. The shard lives on the run's device and so does every batch. The sample is
drawn on the host (a CPU generator: the same S on every device) and copied over
once, pinned; the block boundaries of phase 1 are found in that host copy, and so
are the sizes of the gathers (the shard's row pointers are kept on the host too).
The one size the host cannot know, how many entries a block keeps, is bounded by a
capacity instead (``padded``, the default on a device: the block is padded with
zeros to :func:`scalegnn.sampling.sample_capacity`), so building a batch
(:meth:`DistributedSampler.draw`) reads nothing back from the device. One flag read
per batch then checks that every block fitted (:meth:`DistributedSampler.sample`,
which the prefetch thread runs: it waits for the side stream, never for training);
a block that did not is extracted again with more room, and counted (``overflows``).
The double permutation's blocks (``--permute double``) are not padded: their sample
lives in a second labeling, found on the device, so they still read their sizes back.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..device import to_device
from ..csr import _csr, csr_transpose, is_csr, row_entries, select_rows
from ..sampling import (CompactIndexMap, SampledBlock, block_bounds, extract_block, inclusion_probability,
                        resolve_batch_size, sample_capacity, sample_vertices, training_features)
from .grid import PMM_AXES, ProcessGrid
from .layout import RowPartition
from .sharding import RankShard

__all__ = ["ShardedBatch", "DistributedSampler"]


@dataclass
class ShardedBatch:
    """This rank's part of one mini-batch (or of the full graph).

    nodes (B,) sorted global ids, the same on every rank of the group; rows the
    row blocks along x, y, z; adj[p] the sampled A shard of plane p (local CSR of
    shape (Br_rows, Br_cols) and its transpose; no transpose in the full-graph batch,
    which is evaluated without autograd); x (Br_x, Fz); y / train_mask /
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
    alt: "AltBatch | None" = None  # double permutation only
    x_t: torch.Tensor | None = None  # (Fz, Br_x) CSR of x^T when x is sparse (the input projection's dW)

    @property
    def batch_size(self) -> int:
        return self.nodes.numel()


@dataclass
class AltBatch:
    """The batch in the second labeling of the double permutation: ``nodes`` (B,) the
    sorted sigma ids of the sample, ``rows`` their row blocks, ``adj[p]`` / ``adj_t[p]``
    the sampled plane-p shards of A with rows / columns in sigma ids (even / odd
    layers), ``ids`` the vertex (id labeling) of every entry of ``nodes``; labels and
    masks per axis for rows in sigma order."""

    nodes: torch.Tensor
    rows: RowPartition
    adj: tuple
    adj_t: tuple
    ids: torch.Tensor
    y: dict
    train_mask: dict
    val_mask: dict | None = None
    test_mask: dict | None = None


class DistributedSampler:
    """Per-rank uniform vertex sampler over a :class:`RankShard` (Algorithm 2).

    ``use_index_map`` keeps one persistent compact map per plane over that plane's
    column range (Alg. 2 line 14; 4 bytes per vertex of the range) for the torch
    kernel; without it the column remap is a binary search in the sorted sample.
    The numba kernel (``backend``, see :func:`scalegnn.sampling.extract_block`)
    needs neither. ``padded`` (default: on a device, not on the CPU) pads the torch
    kernel's blocks to a capacity so that no size is read back (module doc). All
    choices give the same products: bit-identical shards, or those shards followed by
    explicit zeros.
    """

    def __init__(self, shard: RankShard, grid: ProcessGrid, batch_size: int, seed: int = 0,
                 dp_index: int | None = None, use_index_map: bool = True, backend: str = "auto",
                 padded: bool | None = None):
        if tuple(shard.coords[a] for a in PMM_AXES) != tuple(grid.axis_index(a) for a in PMM_AXES):
            raise ValueError(f"shard for coords {shard.coords} given to rank {grid.rank} at {grid.coords}")
        if tuple(shard.grid_shape[1:]) != tuple(grid.axis_size(a) for a in PMM_AXES):
            raise ValueError(f"shard was cut for grid {shard.grid_shape}, the process grid is {grid.spec()}")
        self.shard, self.grid = shard, grid
        self.device = shard.x.device
        self.num_nodes = shard.num_nodes
        self.batch_size = resolve_batch_size(self.num_nodes, batch_size=batch_size)
        self.seed = seed
        self.dp_index = grid.axis_index("dp") if dp_index is None else dp_index
        self.scale = inclusion_probability(self.num_nodes, self.batch_size)
        self.features = training_features(shard.x)  # CSR when sparse, as the serial sampler
        self.backend = backend
        self.padded = self.device.type != "cpu" if padded is None else bool(padded)
        self.slack = 1.0  # sample_capacity's; doubled by each overflow
        # A captured step (scalegnn.parallel.step_graph) reads fixed shapes: each block's
        # capacity is then the largest asked so far, so it changes only when it grows.
        self.hold_capacity = False
        self._held: dict[int, int] = {}  # id of a shard block -> its capacity
        self.overflows = 0  # batches extracted again because a padded block overflowed
        # Host row pointers of CSR features: the size of their row gather, counted on the host.
        self._feature_ptr = self.features.crow_indices().cpu() if self.padded and is_csr(self.features) else None

        def maps(blocks):
            if not use_index_map:
                return [None] * 3
            made = {}  # planes that are one block (CSRBlock.storage_key) share their map
            for b in blocks:
                if b.storage_key() not in made:
                    made[b.storage_key()] = CompactIndexMap(b.col_end - b.col_start, b.col_start, b.indices.device)
            return [made[b.storage_key()] for b in blocks]

        self.index_maps = maps(shard.adj) if shard.alt is None else [None] * 3  # alt: sh.adj is not sampled
        self.alt_maps = (maps(shard.alt.adj), maps(shard.alt.adj_t)) if shard.alt is not None else None
        self._full: ShardedBatch | None = None

    def nodes(self, step: int) -> torch.Tensor:
        """The shared sorted sample S of ``step`` (Alg. 2 line 1), in host memory: drawn
        on the CPU generator, so it is the same S whatever the device."""
        return sample_vertices(self.num_nodes, self.batch_size, self.seed, step, self.dp_index)

    def _slice(self, nodes: torch.Tensor, rows: RowPartition, table: dict) -> dict:
        out = {}
        for ax in PMM_AXES:
            lo, hi = rows.block(ax)
            v0 = self.shard.vertex_ranges[ax][0]
            out[ax] = table[ax][nodes[lo:hi] - v0]
        return out

    def _alt_batch(self, nodes: torch.Tensor, scale: float, maps, with_eval_masks: bool,
                   host_nodes: torch.Tensor | None) -> AltBatch:
        """Double permutation: even layers' shards have rows in sigma ids and columns in
        ids, odd layers' the reverse; self loops are found by vertex (``keys``). Without
        ``host_nodes`` the sample is the whole graph: the stored blocks are the batch."""
        alt = self.shard.alt
        nodes_alt = torch.sort(alt.sigma[nodes]).values
        ids = alt.sigma_inv[nodes_alt]
        if host_nodes is None:
            rows = RowPartition.full(nodes_alt, self.grid)
            adj, adj_t = _whole_blocks(alt.adj), _whole_blocks(alt.adj_t)
        else:
            rows = RowPartition(nodes_alt, self.num_nodes, self.grid)
            rmaps, cmaps = maps
            adj = tuple(extract_block(blk, nodes_alt, scale, m, backend=self.backend, col_sample=nodes,
                                      keys=(ids, nodes)) for blk, m in zip(alt.adj, rmaps))
            adj_t = tuple(extract_block(blk, nodes, scale, m, backend=self.backend, col_sample=nodes_alt,
                                        keys=(nodes, ids)) for blk, m in zip(alt.adj_t, cmaps))
        sl = lambda table: self._slice(nodes_alt, rows, table)  # noqa: E731
        return AltBatch(nodes=nodes_alt, rows=rows, adj=adj, adj_t=adj_t, ids=ids, y=sl(alt.y),
                        train_mask=sl(alt.train_mask), val_mask=sl(alt.val_mask) if with_eval_masks else None,
                        test_mask=sl(alt.test_mask) if with_eval_masks else None)

    def _batch(self, step: int, nodes: torch.Tensor, scale: float, with_eval_masks: bool,
               host_nodes: torch.Tensor | None = None) -> ShardedBatch:
        """The batch of the sorted sample ``nodes`` (on the device). ``host_nodes``, its
        host copy, gives phase 1's bounds without reading the device; without it the
        sample is the whole graph (evaluation), whose bounds are the ranges themselves
        and whose blocks are the stored planes (:func:`_whole_blocks`)."""
        sh = self.shard
        if host_nodes is not None:
            rows = RowPartition(nodes, self.num_nodes, self.grid, host_nodes=host_nodes)
        else:
            rows = RowPartition.full(nodes, self.grid)
        alt = None
        if sh.alt is not None:  # even layers use the alternative shards; sh.adj is not needed
            alt = self._alt_batch(nodes, scale, self.alt_maps, with_eval_masks, host_nodes)
            adj = (None, None, None)
        elif host_nodes is None:
            adj = _whole_blocks(sh.adj)
        else:
            done: dict = {}  # a block shared by several planes is extracted once
            for blk, m in zip(sh.adj, self.index_maps):
                if blk.storage_key() not in done:
                    done[blk.storage_key()] = self._extract(blk, m, nodes, host_nodes, scale)
            adj = tuple(done[blk.storage_key()] for blk in sh.adj)
        lo, hi = rows.block("x")
        v0 = sh.vertex_ranges["x"][0]
        # The whole graph's rows of the feature block are all of it: the block itself, no copy.
        x = self.features if host_nodes is None else select_rows(
            self.features, nodes[lo:hi] - v0,
            entries=None if self._feature_ptr is None else row_entries(self._feature_ptr, host_nodes[lo:hi] - v0))
        return ShardedBatch(
            step=step, nodes=nodes, rows=rows, adj=adj, x=x,
            x_t=csr_transpose(x) if x.is_sparse_csr and host_nodes is not None else None,  # dW's; none in evaluation
            y=self._slice(nodes, rows, sh.y),
            train_mask=self._slice(nodes, rows, sh.train_mask), scale=scale,
            val_mask=self._slice(nodes, rows, sh.val_mask) if with_eval_masks else None,
            test_mask=self._slice(nodes, rows, sh.test_mask) if with_eval_masks else None, alt=alt,
        )

    def _extract(self, blk, index_map, nodes: torch.Tensor, host_nodes: torch.Tensor, scale: float) -> SampledBlock:
        """One plane block of the batch; padded (module doc) with its sizes counted on the host."""
        bounds = block_bounds(blk, host_nodes)
        host_ptr = blk.host_pointers()
        if not self.padded or host_ptr is None:
            return extract_block(blk, nodes, scale, index_map, backend=self.backend, bounds=bounds)
        r_lo, r_hi = bounds[:2]
        entries = row_entries(host_ptr, host_nodes[r_lo:r_hi] - blk.row_start)
        capacity = sample_capacity(entries, r_hi - r_lo, scale, self.slack)
        if self.hold_capacity:  # more room than this sample needs is explicit zeros
            capacity = self._held[id(blk)] = max(capacity, self._held.get(id(blk), 0))
        return extract_block(blk, nodes, scale, index_map, backend=self.backend, bounds=bounds, entries=entries,
                             capacity=capacity)

    def draw(self, step: int, host_nodes: torch.Tensor | None = None) -> ShardedBatch:
        """The batch of ``step`` from its host sample (drawn here if not given), its
        blocks padded when ``padded``: nothing is read back from the device."""
        host = self.nodes(step) if host_nodes is None else host_nodes
        return self._batch(step, to_device(host, self.device, non_blocking=True), self.scale,
                           with_eval_masks=False, host_nodes=host)

    def sample(self, step: int) -> ShardedBatch:
        """This rank's shard of the rescaled sampled subgraph of ``step`` (Alg. 2). A
        padded batch costs one read of a device flag (did every block fit?); a batch
        that did not fit is drawn again with twice the slack (``overflows`` counts them)."""
        host = self.nodes(step)
        batch = self.draw(step, host)
        while True:
            flags = [f for blk in batch.adj if blk is not None and (f := blk.overflowed()) is not None]
            if not flags or not bool(torch.stack(flags).any()):
                return batch
            self.overflows += 1
            self.slack *= 2.0
            batch = self.draw(step, host)

    def full_batch(self) -> ShardedBatch:
        """The full graph as a batch (B = N, no rescaling) for evaluation; built once."""
        if self._full is None:
            nodes = torch.arange(self.num_nodes, dtype=torch.int64, device=self.device)
            self._full = self._batch(-1, nodes, 1.0, with_eval_masks=True)
        return self._full


def _whole_blocks(blocks) -> tuple:
    """The planes ``blocks`` as the batch of the whole graph (B = N: p = 1, nothing is
    rescaled and every column is sampled, so Algorithm 2 would return each block itself
    in local column ids). Built from the stored arrays instead of by extraction: the
    values are the shard's own (no copy), and so are the column ids of a block starting
    at column 0; the row pointers and other column ids are copied in the stored index
    width (int32 when the ids and nnz fit). No transpose (``adj_t`` is None): this batch
    is evaluated without autograd. Planes that are one block stay one."""
    done: dict = {}
    for blk in blocks:
        if blk.storage_key() not in done:
            narrow = blk.indices.dtype == torch.int32 and blk.nnz < 2**31
            cols = blk.indices if narrow else blk.indices.long()
            if blk.col_start:
                cols = cols - blk.col_start
            crow = blk.indptr.to(cols.dtype)
            adj = _csr(crow, cols, blk.values, (blk.row_end - blk.row_start, blk.col_end - blk.col_start))
            done[blk.storage_key()] = SampledBlock(adj=adj, adj_t=None, row_offset=blk.row_start,
                                                   col_offset=blk.col_start)
    return tuple(done[blk.storage_key()] for blk in blocks)
