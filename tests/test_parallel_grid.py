"""Process grid, collectives over named axes, launch helpers and the spawn utility.

Collectives are checked with rank-valued inputs whose results have a closed form
(Megatron's test_mappings style); all values are small integers, exact in float32
and bfloat16, so equality is exact.
"""

from __future__ import annotations

import os
import time

import pytest
import torch

from scalegnn.device import resolve_device
from scalegnn.launch.environment import detect_env, first_host
from scalegnn.launch.job import SpawnTimeout, WorkerError, spawn
from scalegnn.parallel.collectives import CommStats, all_gather_uneven, all_reduce, broadcast
from scalegnn.parallel.grid import AXES, ProcessGrid, parse_grid
from tests.devices import DEVICES


pytestmark = pytest.mark.distributed


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


def _collectives_worker(rank, world, device="cpu"):
    dev = resolve_device(device, rank)
    out = {}
    for shape in ((1, 2, 2, 2), (2, 1, 2, 2), (2, 2, 2, 1), (8, 1, 1, 1)):
        grid = ProcessGrid(*shape)
        stats = CommStats()
        res = {}
        for ax in AXES:
            t = torch.full((3,), float(rank), device=dev)
            all_reduce(t, grid, ax, stats, "pmm_" + ax if ax != "dp" else "dp")
            res[f"sum_{ax}"] = t[0].item()
            m = torch.full((1,), float(rank), device=dev)
            all_reduce(m, grid, ax, stats, "loss", op="max")
            res[f"max_{ax}"] = m.item()
            b = torch.full((2,), float(rank), dtype=torch.float32, device=dev)
            all_reduce(b, grid, ax, stats, "pmm_" + ax if ax != "dp" else "pmm_x", comm_dtype=torch.bfloat16)
            res[f"bf16_{ax}"] = (b.dtype, b[0].item())
            # uneven all-gather: the member with axis index i contributes i + 1 rows of value rank
            i = grid.axis_index(ax)
            sizes = [k + 1 for k in range(grid.axis_size(ax))]
            piece = torch.full((i + 1, 2), float(rank), device=dev)
            res[f"gather_{ax}"] = all_gather_uneven(piece, sizes, grid, ax, stats, "reshard")[:, 0].tolist()
            c = torch.full((1,), float(rank), device=dev)
            broadcast(c, grid, ax, grid.axis_size(ax) - 1, stats, "eval")
            res[f"bcast_{ax}"] = c.item()
        res["bytes"] = stats.snapshot()["bytes"]
        res["groups"] = {ax: grid.group_ranks(ax) for ax in AXES}
        out[shape] = res
    return out


@pytest.mark.parametrize("device", DEVICES)
def test_axis_collectives_have_closed_form_results(device):
    """For rank-valued inputs: sum over an axis group = sum of its ranks, max = the
    largest, an uneven gather lists each member's rank (index i + 1 times), a
    broadcast from the last member gives its rank; bytes are counted only for axes of
    size > 1, and a BF16 all-reduce counts half the bytes of FP32. On a GPU the
    tensors are the GPU's (eight ranks sharing it through gloo)."""
    results = spawn(_collectives_worker, 8, device, timeout_s=180)
    for shape in ((1, 2, 2, 2), (2, 1, 2, 2), (2, 2, 2, 1), (8, 1, 1, 1)):
        for rank, per in enumerate(results):
            res = per[shape]
            grid = ProcessGrid.virtual(*shape, rank)
            for ax in AXES:
                members = grid.group_ranks(ax)
                assert res["groups"][ax] == members
                assert res[f"sum_{ax}"] == sum(members)
                assert res[f"max_{ax}"] == max(members)
                assert res[f"bf16_{ax}"] == (torch.float32, sum(members))
                assert res[f"gather_{ax}"] == [float(r) for k, r in enumerate(members) for _ in range(k + 1)]
                assert res[f"bcast_{ax}"] == members[-1]
            active = [ax for ax in AXES if shape[AXES.index(ax)] > 1]
            b = res["bytes"]
            assert b.get("dp", 0) == (3 * 4 if "dp" in active else 0)
            for ax in ("x", "y", "z"):
                # 3 fp32 elements + 2 bf16 elements (+ the dp bf16 call booked under pmm_x)
                want = (3 * 4 + 2 * 2 if ax in active else 0) + (2 * 2 if ax == "x" and "dp" in active else 0)
                assert b.get("pmm_" + ax, 0) == want, (shape, ax, b)


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


def _boom_worker(rank, world):
    if rank == 2:
        time.sleep(0.2)
        raise KeyError("rank two exploded")
    torch.distributed.barrier()  # would wait forever for rank 2
    return rank


def _exit_worker(rank, world):
    if rank == 1:
        os._exit(3)
    torch.distributed.barrier()
    return rank


def _sleep_worker(rank, world):
    time.sleep(60)


def _ok_worker(rank, world, payload):
    return rank, world, payload * (rank + 1)


def test_spawn_returns_results_in_rank_order():
    out = spawn(_ok_worker, 3, torch.arange(3.0), timeout_s=60)
    assert [r for r, _, _ in out] == [0, 1, 2] and all(w == 3 for _, w, _ in out)
    assert torch.equal(out[2][2], torch.tensor([0.0, 3.0, 6.0]))


def test_spawn_raises_worker_error_naming_the_failed_rank_promptly():
    t0 = time.monotonic()
    with pytest.raises(WorkerError) as info:
        spawn(_boom_worker, 4, timeout_s=60)
    assert info.value.rank == 2
    assert "KeyError" in info.value.traceback_text and "rank two exploded" in info.value.traceback_text
    assert time.monotonic() - t0 < 20  # not the 60 s deadline: the others were terminated


def test_spawn_reports_a_worker_that_dies_without_an_exception():
    with pytest.raises(WorkerError) as info:
        spawn(_exit_worker, 3, timeout_s=60)
    assert info.value.rank == 1 and "code 3" in str(info.value)


def test_spawn_times_out_instead_of_hanging():
    t0 = time.monotonic()
    with pytest.raises(SpawnTimeout, match="did not finish"):
        spawn(_sleep_worker, 2, timeout_s=3)
    assert time.monotonic() - t0 < 15


# ----------------------------------------------------------------------------- launch env
def test_first_host_of_slurm_nodelists():
    assert first_host("nid[001-004,007]") == "nid001"
    assert first_host("gpu12") == "gpu12"
    assert first_host("a[3-4],b[1-2]") == "a3"
    assert first_host("node-[09,11]-ib") == "node-09-ib"


def _clear_launch_env(monkeypatch):
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SUBMITIT_EXECUTOR",
              "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NODELIST", "SLURM_JOB_NODELIST",
              "SLURM_STEP_NODELIST", "SLURM_JOB_ID"):
        monkeypatch.delenv(k, raising=False)


def test_detect_env_torchrun_slurm_single(monkeypatch):
    _clear_launch_env(monkeypatch)
    assert detect_env().source == "single" and detect_env().world_size == 1
    monkeypatch.setenv("SLURM_PROCID", "5")
    monkeypatch.setenv("SLURM_NTASKS", "8")
    monkeypatch.setenv("SLURM_LOCALID", "1")
    monkeypatch.setenv("SLURM_NODELIST", "nid[010-011]")
    monkeypatch.setenv("SLURM_JOB_ID", "123456")
    env = detect_env()
    assert (env.source, env.rank, env.world_size, env.local_rank, env.master_addr) == ("slurm", 5, 8, 1, "nid010")
    assert 20000 <= env.master_port < 40000
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29501")
    env = detect_env()  # torchrun takes precedence over the SLURM variables
    assert (env.source, env.rank, env.world_size, env.master_addr, env.master_port) == \
        ("torchrun", 3, 4, "10.0.0.1", 29501)
    monkeypatch.delenv("MASTER_PORT")
    with pytest.raises(ValueError, match="MASTER_ADDR/MASTER_PORT"):
        detect_env()
