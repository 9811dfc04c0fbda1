"""Distributed sampling (Algorithm 2) and sharding: the union of every rank's shards
is the serial sampled matrix, no collective is called, shard files round-trip."""

from __future__ import annotations

import json

import pytest
import torch
import torch.distributed as dist

from scalegnn.parallel.dist_sampling import DistributedSampler
from scalegnn.parallel.grid import PMM_AXES, ProcessGrid
from scalegnn.launch.job import spawn
from scalegnn.parallel.sharding import build_rank_shard, build_shard, load_shard, save_shards, shard_command
from scalegnn.sampling import UniformVertexSampler
from tests.graphs import parallel_graph, tile_rank_samples

pytestmark = pytest.mark.distributed


def _dense(csr) -> torch.Tensor:
    return csr.to_dense()


@pytest.mark.parametrize("shape", [(1, 2, 2, 2), (1, 3, 2, 1), (2, 1, 1, 3), (1, 1, 1, 1)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("seed,step,batch", [(0, 0, 23), (1, 7, 10), (5, 3, 37), (2, 11, 2)])
def test_union_of_rank_shards_is_the_serial_sampled_matrix(shape, seed, step, batch):
    """Every plane's blocks, placed at their row/col offsets, tile the serial (B, B)
    matrix exactly (same arithmetic: one division by p per entry, so bit-equal), the
    transposes match, and features / labels / masks are the serial slices.
    Sharding and sampling need no process group, so virtual grids are enough here."""
    graph = parallel_graph(n=37, m=160)
    for dp in range(shape[0]):
        ref, planes, ranks = tile_rank_samples(graph, shape, batch, seed, step, dp)
        for shard, sb in ranks:
            for blk in sb.adj:
                assert torch.equal(_dense(blk.adj_t), _dense(blk.adj).t())
            lo, hi = sb.rows.block("x")
            f0, f1 = shard.feature_range
            assert torch.equal(sb.x, ref.x[lo:hi, f0:f1])
            for ax in PMM_AXES:
                lo, hi = sb.rows.block(ax)
                assert torch.equal(sb.y[ax], ref.y[lo:hi])
                assert torch.equal(sb.train_mask[ax], ref.train_mask[lo:hi])
        dense = _dense(ref.adj)
        for p in range(3):
            assert torch.equal(planes[p], dense), f"plane {p}"


_COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "broadcast",
                "broadcast_object_list", "reduce", "reduce_scatter", "reduce_scatter_tensor", "all_to_all",
                "all_to_all_single", "barrier", "send", "recv", "isend", "irecv", "gather", "scatter",
                "gather_object", "scatter_object_list", "monitored_barrier", "batch_isend_irecv")


def _no_collective_worker(rank, world, shape):
    grid = ProcessGrid(*shape)  # real process groups exist: a collective would succeed if called
    graph = parallel_graph(n=37, m=160)
    calls = []
    saved = {}
    import torch.distributed.distributed_c10d as c10d

    def trap(name):
        def fn(*args, **kwargs):
            calls.append(name)
            raise AssertionError(f"collective {name} called during sampling")
        return fn

    for mod in (dist, c10d):
        for name in _COLLECTIVES:
            if hasattr(mod, name):
                saved[(mod, name)] = getattr(mod, name)
                setattr(mod, name, trap(name))
    try:
        shard = build_rank_shard(graph, grid)
        sampler = DistributedSampler(shard, grid, 17, seed=4, use_index_map=rank % 2 == 0)
        nodes = [sampler.sample(step).nodes for step in range(5)]
        sampler.full_batch()
    finally:
        for (mod, name), fn in saved.items():
            setattr(mod, name, fn)
    # the trap is live: the same patching makes a real collective fail
    return calls, nodes


def test_distributed_sampling_calls_no_collective():
    """Every torch.distributed collective is patched to record and raise while 8 ranks
    shard the graph and sample 5 steps (with and without the tagged index map)."""
    results = spawn(_no_collective_worker, 8, (2, 2, 2, 1), timeout_s=60)
    for rank, (calls, nodes) in enumerate(results):
        assert calls == []
        dp = ProcessGrid.virtual(2, 2, 2, 1, rank).axis_index("dp")
        # every rank of a data-parallel group derived its group's sample
        assert all(torch.equal(n, results[(rank // 4) * 4][1][s]) for s, n in enumerate(nodes))
        if dp == 1:
            assert not torch.equal(nodes[0], results[0][1][0])  # groups draw different samples


def test_save_and_load_shards_round_trip(tmp_path):
    graph = parallel_graph(n=37, m=160, multilabel=True)
    shape = (2, 2, 1, 2)
    paths = save_shards(graph, shape, tmp_path / "shards")
    assert len(paths) == 2 * 1 * 2 + 1 and paths[-1].name == "manifest.json"
    assert not list((tmp_path / "shards").glob("*.tmp"))  # atomic writes leave no temp files
    manifest = json.loads(paths[-1].read_text())
    assert manifest["grid_shape"] == list(shape) and manifest["num_nodes"] == 37
    for rank in range(8):
        grid = ProcessGrid.virtual(*shape, rank)
        got = load_shard(tmp_path / "shards", rank, grid_shape=shape)
        want = build_shard(graph, shape, grid.coords)
        assert got.coords == {a: grid.axis_index(a) for a in PMM_AXES}  # dp replicas share the x,y,z file
        assert got.multilabel and got.num_classes == graph.num_classes
        for a, b in zip(got.adj, want.adj):
            assert torch.equal(a.indptr, b.indptr) and torch.equal(a.indices, b.indices)
            assert torch.equal(a.values, b.values)
            assert (a.row_start, a.row_end, a.col_start, a.col_end) == (b.row_start, b.row_end, b.col_start, b.col_end)
        assert torch.equal(got.x, want.x)
        for ax in PMM_AXES:
            assert torch.equal(got.y[ax], want.y[ax]) and torch.equal(got.test_mask[ax], want.test_mask[ax])
    with pytest.raises(ValueError, match="written for grid"):
        load_shard(tmp_path / "shards", 0, grid_shape=(1, 2, 1, 2))
    with pytest.raises(FileNotFoundError, match="scalegnn data shard"):
        load_shard(tmp_path / "nothing", 0)


@pytest.mark.parametrize("damage", ["random bytes", "truncated", "missing", "not a shard", "bad manifest"])
def test_a_damaged_shard_is_one_line_naming_the_file_and_the_fix(tmp_path, damage):
    """A shard file that is damaged, missing, or not one scalegnn wrote: one line that
    names the file and how to re-write it (torch's own message spans six lines and
    suggests weights_only=False)."""
    paths = save_shards(parallel_graph(n=37, m=160), (1, 1, 1, 2), tmp_path)
    victim = paths[1]
    if damage == "random bytes":
        victim.write_bytes(bytes(range(256)) * 8)
    elif damage == "truncated":
        victim.write_bytes(victim.read_bytes()[:200])
    elif damage == "missing":
        victim.unlink()
    elif damage == "not a shard":
        torch.save({"format": torch.load(victim, weights_only=True)["format"], "x": torch.zeros(2)}, victim)
    else:
        victim = paths[-1]
        victim.write_text('{"grid_shape": [1, 1')
    with pytest.raises((ValueError, FileNotFoundError)) as err:
        load_shard(tmp_path, 1)
    message = str(err.value)
    assert "\n" not in message and str(victim) in message and "scalegnn data shard" in message
    assert "weights_only=False" not in message


def test_coinciding_planes_are_one_block_stored_and_extracted_once(tmp_path):
    """Planes with the same row and column ranges (all three on 1x1x1x1; the diagonal
    ranks of 1x2x2x2) are one block in memory, still one after a round trip through
    the shard files, and one extraction per sample; other ranks keep three."""
    graph = parallel_graph(n=37, m=160)
    single = build_shard(graph, (1, 1, 1, 1), {"x": 0, "y": 0, "z": 0})
    assert single.adj[0] is single.adj[1] is single.adj[2]
    diag = build_shard(graph, (1, 2, 2, 2), {"x": 1, "y": 1, "z": 1})
    assert diag.adj[0] is diag.adj[1] is diag.adj[2]
    off = build_shard(graph, (1, 2, 2, 2), {"x": 1, "y": 0, "z": 0})
    assert len({id(b) for b in off.adj}) == 3
    save_shards(graph, (1, 1, 1, 1), tmp_path / "s")
    loaded = load_shard(tmp_path / "s", 0)
    assert len({b.indices.data_ptr() for b in loaded.adj}) == 1  # torch.save keeps the sharing
    for shard in (single, loaded):
        sampler = DistributedSampler(shard, ProcessGrid.single(), 15, seed=0)
        assert len({id(m) for m in sampler.index_maps}) == 1
        batch = sampler.sample(3)
        assert batch.adj[0] is batch.adj[1] is batch.adj[2]
        ref = UniformVertexSampler(graph, 15, seed=0).sample(3)
        assert torch.equal(batch.adj[0].adj.to_dense(), ref.adj.to_dense())


def test_shard_command_normalizes_a_raw_graph_and_sampler_checks_its_shard(tmp_path):
    raw = parallel_graph().replace(meta={})
    with pytest.raises(ValueError, match="gcn_normalize"):
        build_shard(raw, (1, 1, 1, 1), {"x": 0, "y": 0, "z": 0})
    paths = shard_command(raw, (1, 1, 2, 1), tmp_path)
    assert [p.name for p in paths] == ["shard_x0_y0_z0.pt", "shard_x0_y1_z0.pt", "manifest.json"]
    shard = load_shard(tmp_path, 1)
    with pytest.raises(ValueError, match="given to rank 0"):
        DistributedSampler(shard, ProcessGrid.virtual(1, 1, 2, 1, 0), 10)


def test_double_permuted_shard_files_train_like_the_in_memory_double_permutation(tmp_path):
    """`scalegnn data shard --permute double` writes what the engine builds in memory
    for --permute double: the same steps and evaluation; a run with another --permute
    or --seed, or with the residual on, is refused with the fix named."""
    from scalegnn.model import ModelConfig
    from scalegnn.optim import OptimConfig
    from scalegnn.parallel.engine import ParallelEngine
    from scalegnn.numerics import NumericsConfig
    from scalegnn.parallel.sharding import check_shard_manifest
    from scalegnn.permutation import random_permutation

    raw = parallel_graph(n=41, m=170).replace(meta={})
    shard_command(raw, (1, 1, 1, 1), tmp_path, permute="double", seed=3)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["permute"] == "double" and manifest["seed"] == 3
    model = ModelConfig(hidden=8, layers=3, dropout=0.2, residual=False)
    numerics = NumericsConfig(permute="double")
    grid = ProcessGrid.single()
    from_files = ParallelEngine(None, model, OptimConfig(lr=1e-2), 13, seed=3, epochs=1, grid=grid,
                                shard=load_shard(tmp_path, 0), numerics=numerics)
    prepared = raw.permute(random_permutation(raw.num_nodes, 3)).gcn_normalize()
    in_memory = ParallelEngine(prepared, model, OptimConfig(lr=1e-2), 13, seed=3, epochs=1, grid=grid,
                               numerics=numerics)
    for step in range(3):
        a, b = from_files.train_step(step), in_memory.train_step(step)
        assert (a.loss, a.correct, a.count) == (b.loss, b.correct, b.count)
    assert from_files.evaluate().as_dict() == in_memory.evaluate().as_dict()
    from_files.close(), in_memory.close()
    check_shard_manifest(manifest, "double", 3, where="d")
    with pytest.raises(ValueError, match="--permute double but the run asks for --permute none"):
        check_shard_manifest(manifest, "none", 3, where="d")
    with pytest.raises(ValueError, match="re-shard with --seed 0"):
        check_shard_manifest(manifest, "double", 0, where="d")
    with pytest.raises(ValueError, match="--no-residual"):
        ParallelEngine(None, ModelConfig(hidden=8, layers=3, residual=True), OptimConfig(), 13, seed=3, grid=grid,
                       shard=load_shard(tmp_path, 0), numerics=numerics)
