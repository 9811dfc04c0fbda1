"""The process grid (scalegnn/parallel/grid.py): parsing, rank order, the single and the
virtual grid, a mismatched world, and the grid as a DeviceMesh."""

from __future__ import annotations

import pytest
import torch

from scalegnn.launch.job import spawn
from scalegnn.parallel.collectives import CommStats, all_gather_uneven, all_reduce
from scalegnn.parallel.grid import AXES, ProcessGrid, parse_grid


def test_parse_grid():
    assert parse_grid("1x2x2x2") == (1, 2, 2, 2)
    assert parse_grid(" 2x1x4x1 ") == (2, 1, 4, 1)
    with pytest.raises(ValueError, match="4 factors"):
        parse_grid("2x2x2")
    with pytest.raises(ValueError, match="axis y must be a positive integer, got '0'"):
        parse_grid("1x2x0x2")
    with pytest.raises(ValueError, match="axis dp must be a positive integer"):
        parse_grid("ax2x2x2")


def test_rank_order_dp_slowest_z_fastest():
    coords = [ProcessGrid.virtual(2, 2, 3, 2, r).coords for r in range(24)]
    assert coords[0] == dict(dp=0, x=0, y=0, z=0)
    assert coords[1] == dict(dp=0, x=0, y=0, z=1)
    assert coords[2] == dict(dp=0, x=0, y=1, z=0)
    assert coords[6] == dict(dp=0, x=1, y=0, z=0)
    assert coords[12] == dict(dp=1, x=0, y=0, z=0)
    g = ProcessGrid.virtual(2, 2, 3, 2, 17)
    assert g.rank_of(*(g.coords[a] for a in AXES)) == 17
    assert g.group_ranks("y") == [13, 15, 17] and g.group_ranks("dp") == [5, 17]
    assert g.mp_size == 12 and g.mp_rank == 5


def test_single_grid_short_circuits_without_torch_distributed():
    g = ProcessGrid.single()
    assert g.world_size == 1 and all(g.group(a) is None for a in AXES)
    stats = CommStats()
    t = torch.arange(4.0)
    assert all_reduce(t, g, "x", stats, "pmm_x") is t and torch.equal(t, torch.arange(4.0))
    assert torch.equal(all_gather_uneven(t[:3], [3], g, "y", stats, "reshard"), t[:3])
    assert dict(stats.bytes) == {}
    assert g.gather_object(5) == [5] and g.backend == "none"


def test_virtual_grid_refuses_collectives_on_real_axes():
    g = ProcessGrid.virtual(1, 2, 1, 1, 0)
    with pytest.raises(RuntimeError, match="no process groups"):
        all_reduce(torch.ones(2), g, "x", None, "pmm_x")


# ----------------------------------------------------------------------------- distributed
def _mismatch_worker(rank, world):
    try:
        ProcessGrid(1, 2, 2, 1)
    except ValueError as e:
        return str(e)
    return None


def test_grid_product_mismatch_is_a_clear_error():
    msgs = spawn(_mismatch_worker, 2, timeout_s=60)
    for msg in msgs:
        assert "1x2x2x1" in msg and "4" in msg and "world size is 2" in msg and "launch 4 processes" in msg


def _mesh_worker(rank, world):
    import torch.distributed as dist

    grid = ProcessGrid(1, 2, 2, 1)
    mesh = grid.device_mesh("cpu")
    out = {"names": mesh.mesh_dim_names, "shape": tuple(mesh.shape)}
    for ax in AXES:
        group = mesh.get_group(ax)
        t = torch.tensor([float(rank)])
        dist.all_reduce(t, group=group)
        out[ax] = (dist.get_process_group_ranks(group), grid.group_ranks(ax), t.item())
    return out


def test_grid_as_a_device_mesh_uses_the_same_groups():
    """``ProcessGrid.device_mesh`` names the dims dp, x, y, z, has the grid's shape and
    hands out, per dim, this rank's axis group (collectives over it sum its members)."""
    for rank, res in enumerate(spawn(_mesh_worker, 4, timeout_s=60)):
        assert res["names"] == AXES and res["shape"] == (1, 2, 2, 1)
        for ax in AXES:
            mesh_ranks, grid_ranks, total = res[ax]
            assert sorted(mesh_ranks) == sorted(grid_ranks) and total == sum(grid_ranks)
    with pytest.raises(ValueError, match="initialized torch.distributed world"):
        ProcessGrid.single().device_mesh("cpu")
