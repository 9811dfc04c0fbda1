"""The 3D PMM products (scalegnn/parallel/products.py): the reshard between layouts moves
every block exactly, and the row chunks of the lean evaluation cover a block once. The
products' parity inside the model is in tests/parallel/test_model.py."""

from __future__ import annotations

import pytest
import torch

from scalegnn.launch.job import spawn
from scalegnn.parallel.collectives import CommStats
from scalegnn.parallel.context import ParallelContext
from scalegnn.parallel.grid import ProcessGrid
from scalegnn.parallel.layout import RowPartition, col_bounds, layer_layout
from scalegnn.parallel.products import reshard, row_chunks
from tests.graphs import nprocs


# ----------------------------------------------------------------------------- reshard
def _reshard_worker(rank, world, shape, n, dim):
    """Reshard a known matrix M[i, j] = 1000 i + j between every pair of layouts used by
    the model (forward (r, c) -> (t, r) and its reverse), forward and backward."""
    grid = ProcessGrid(*shape)
    nodes = torch.sort(torch.randperm(n, generator=torch.Generator().manual_seed(1))[: n - 7]).values
    rows = RowPartition(nodes, n, grid)
    b = nodes.numel()
    full = torch.arange(b, dtype=torch.float32)[:, None] * 1000 + torch.arange(dim, dtype=torch.float32)[None, :]
    gfull = -3.0 * full + 1.0

    def block(m, lay):
        r0, r1 = rows.block(lay[0])
        cb = col_bounds(dim, grid, lay[1])
        j = grid.axis_index(lay[1])
        return m[r0:r1, cb[j]:cb[j + 1]].contiguous()

    pc = ParallelContext(grid, CommStats())
    bad = []
    for layer in range(3):
        lay = layer_layout(layer)
        for src, dst in ((lay.feat, lay.out), (lay.out, lay.feat)):
            x = block(full, src).requires_grad_()
            y = reshard(x, src, dst, rows, dim, pc)
            if not torch.equal(y, block(full, dst)):
                bad.append(("forward", src, dst))
            y.backward(block(gfull, dst))
            if not torch.equal(x.grad, block(gfull, src)):
                bad.append(("backward", src, dst))
    return bad, dict(pc.stats.bytes)


@pytest.mark.parametrize("shape", [(1, 2, 2, 2), (1, 2, 3, 1), (1, 1, 2, 3)], ids=lambda s: "x".join(map(str, s)))
def test_reshard_moves_blocks_exactly(shape):
    """Pure data movement: results are bit-exact (no arithmetic), so equality is exact."""
    for bad, nbytes in spawn(_reshard_worker, nprocs(shape), shape, 29, 11, timeout_s=60):
        assert bad == []
        assert set(nbytes) <= {"reshard"}


def test_chunks_cover_a_block_once():
    for n in (0, 1, 2, 5, 7, 8, 37):
        for rows in (1, 2, 3, 4, 100):
            ch = row_chunks(n, rows)
            assert [r for c in ch for r in range(*c)] == list(range(n))
            assert all(r1 - r0 >= 2 for r0, r1 in ch) or n < 2  # no one-row product (its rounding differs)
