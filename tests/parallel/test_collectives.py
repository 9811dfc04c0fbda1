"""Collectives over named axes with accounting (scalegnn/parallel/collectives.py).

Collectives are checked with rank-valued inputs whose results have a closed form
(Megatron's test_mappings style); all values are small integers, exact in float32
and bfloat16, so equality is exact. ``bucketed_all_reduce`` (fewer, larger collectives):
every member holds the closed-form sum after one call, its bytes and calls are counted
per kind; over 2 ranks a bucket equals separate calls bit for bit, over 3 to float32
rounding (a chunked ring may add in another order).
"""

from __future__ import annotations

import pytest
import torch

from scalegnn.device import resolve_device
from scalegnn.launch.job import spawn
from scalegnn.parallel.collectives import CommStats, all_gather_uneven, all_reduce, broadcast, bucketed_all_reduce
from scalegnn.parallel.grid import AXES, ProcessGrid
from tests.devices import DEVICES


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


# ----------------------------------------------------------------------------- collectives, closed form
def _closed_form_worker(rank, world, shape):
    grid = ProcessGrid(*shape)
    out = {}
    for axis in ("x", "y", "z"):
        i = grid.axis_index(axis)
        stats = CommStats(timing=False)
        a = torch.full((4, 3), float(i + 1))
        b = torch.arange(5, dtype=torch.float32) * (i + 1)
        empty = torch.empty(0)
        assert bucketed_all_reduce([(a, f"pmm_{axis}"), (b, "norm"), (empty, "norm")], grid, axis, stats) is None
        hi = torch.full((2,), float(i + 1), dtype=torch.float64)
        bucketed_all_reduce([(hi, "loss"), (hi.clone(), "loss")], grid, axis, stats, op="max")
        out[axis] = {"a": a, "b": b, "max": hi, "bytes": dict(stats.bytes), "calls": dict(stats.calls)}
    # Asynchronous, BF16 wire for 3D-PMM kinds (small integers: exact in BF16).
    stats = CommStats(timing=False)
    i = grid.axis_index("x")
    a, b = torch.full((3, 2), float(i + 1)), torch.full((7,), float(2 * i))
    handle = bucketed_all_reduce([(a, "pmm_x"), (b, "pmm_x")], grid, "x", stats, comm_dtype=torch.bfloat16,
                                 async_op=True)
    handle.wait()
    out["bf16"] = {"a": a, "b": b, "bytes": dict(stats.bytes), "calls": dict(stats.calls)}
    # Against separate calls: random members, the same every run.
    gen = torch.Generator().manual_seed(rank)
    members = [torch.randn(n, generator=gen) for n in (17, 1, 64)]
    for axis in ("x", "y"):
        sep = [m.clone() for m in members]
        for m in sep:
            all_reduce(m, grid, axis, None, "norm")
        buck = [m.clone() for m in members]
        bucketed_all_reduce([(m, "norm") for m in buck], grid, axis, None)
        out[f"vs_{axis}"] = (sep, buck)
    # Bad buckets fail on every rank before any communication.
    errors = []
    for bad in ([(torch.ones(2), "norm")], [(torch.ones(2), "pmm_x"), (torch.ones(2, dtype=torch.float64), "pmm_x")]):
        try:
            bucketed_all_reduce(bad, grid, "x", None, comm_dtype=torch.bfloat16 if len(bad) == 1 else None)
        except ValueError as exc:
            errors.append(str(exc))
    out["errors"] = errors
    out["sizes"] = {ax: grid.axis_size(ax) for ax in ("x", "y", "z")}
    return out


def test_bucketed_all_reduce_closed_form_accounting_and_errors():
    """Rank-valued members (axis index + 1): every member holds the closed-form sum (max)
    after one call; bytes per member kind, one call under the kind with most bytes;
    nothing over an axis of size 1; BF16 only for 3D-PMM kinds; one dtype a bucket."""
    for res in spawn(_closed_form_worker, 6, (1, 3, 2, 1), timeout_s=120):
        for axis, n in res["sizes"].items():
            r, tri = res[axis], n * (n + 1) / 2
            assert torch.equal(r["a"], torch.full((4, 3), tri)), axis
            assert torch.equal(r["b"], torch.arange(5, dtype=torch.float32) * tri), axis
            assert torch.equal(r["max"], torch.full((2,), float(n), dtype=torch.float64)), axis
            if n == 1:
                assert r["bytes"] == {} and r["calls"] == {}
            else:  # 48 bytes of pmm, 20 of norm: the call counts under pmm_<axis>; the max bucket under loss
                assert r["bytes"] == {f"pmm_{axis}": 48, "norm": 20, "loss": 32}, axis
                assert r["calls"] == {f"pmm_{axis}": 1, "loss": 1}, axis
        bf = res["bf16"]
        assert torch.equal(bf["a"], torch.full((3, 2), 6.0)) and torch.equal(bf["b"], torch.full((7,), 6.0))
        assert bf["bytes"] == {"pmm_x": 13 * 2} and bf["calls"] == {"pmm_x": 1}
        sep, buck = res["vs_y"]  # 2 ranks: a + b, bit for bit
        assert all(torch.equal(s, b) for s, b in zip(sep, buck))
        sep, buck = res["vs_x"]  # 3 ranks: the ring may add in another order
        for s, b in zip(sep, buck):
            torch.testing.assert_close(b, s, rtol=1e-6, atol=1e-6)
        assert len(res["errors"]) == 2
        assert "only for 3D-PMM partial sums" in res["errors"][0] and "one dtype" in res["errors"][1]
