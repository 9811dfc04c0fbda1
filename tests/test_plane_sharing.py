"""Rotation planes that share storage (one block for equal ranges, a row slice for rows
inside another plane's over the same columns) and the full-graph batch built from the
stored planes: the same numbers as separate copies and as Algorithm 2's extraction, bit
for bit, with less memory; shard files keep the sharing, and files whose planes are
separate copies still load (and are shared once loaded)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from scalegnn.model import ModelConfig
from scalegnn.optim import OptimConfig
from scalegnn.parallel.dist_sampling import DistributedSampler
from scalegnn.parallel.engine import ParallelEngine
from scalegnn.parallel.grid import PMM_AXES, ProcessGrid
from scalegnn.parallel.context import ParallelContext
from scalegnn.launch.job import spawn
from scalegnn.parallel.layout import PLANES
from scalegnn.parallel.sharding import (RankShard, build_shard, load_shard, row_slice, save_shards,
                                        share_planes)
from scalegnn.sampling import CSRBlock
from tests.graphs import nprocs, parallel_graph

SHAPES = [(1, 1, 1, 1), (1, 2, 1, 1), (1, 1, 2, 1), (1, 1, 1, 2), (1, 2, 2, 1), (1, 2, 2, 2), (1, 3, 1, 2)]
ids = lambda s: "x".join(map(str, s))  # noqa: E731


def _coords(shape):
    return [{"x": i, "y": j, "z": k} for i in range(shape[1]) for j in range(shape[2]) for k in range(shape[3])]


def _same_block(a: CSRBlock, b: CSRBlock) -> bool:
    return (a.row_start, a.row_end, a.col_start, a.col_end) == (b.row_start, b.row_end, b.col_start, b.col_end) \
        and all(x.dtype == y.dtype and torch.equal(x, y) for x, y in
                zip((a.indptr, a.indices, a.values), (b.indptr, b.indices, b.values)))


def _unshared(blocks) -> tuple:
    """Every plane its own copy of its arrays (what a rank held before sharing)."""
    return tuple(CSRBlock(b.indptr.clone(), b.indices.clone(), b.values.clone(), b.row_start, b.row_end, b.col_start,
                          b.col_end) for b in blocks)


def _unshared_shard(shard: RankShard) -> RankShard:
    alt = shard.alt
    if alt is not None:
        alt = dataclasses.replace(alt, adj=_unshared(alt.adj), adj_t=_unshared(alt.adj_t))
    return dataclasses.replace(shard, adj=alt.adj if alt is not None else _unshared(shard.adj), alt=alt)


def test_row_slice_is_the_block_cut_from_the_graph_and_shares_its_arrays():
    graph = parallel_graph(n=37, m=160)
    whole = CSRBlock.from_graph(graph, (0, 37), (12, 25))
    for r0, r1 in [(0, 37), (0, 12), (12, 25), (25, 37), (30, 30)]:
        got = row_slice(whole, r0, r1)
        assert _same_block(got, CSRBlock.from_graph(graph, (r0, r1), (12, 25)))
        assert got.indices.untyped_storage().data_ptr() == whole.indices.untyped_storage().data_ptr()
        assert got.values.untyped_storage().data_ptr() == whole.values.untyped_storage().data_ptr()
    with pytest.raises(ValueError, match="not inside"):
        row_slice(CSRBlock.from_graph(graph, (5, 20), (0, 37)), 0, 10)


@pytest.mark.parametrize("shape", SHAPES, ids=ids)
def test_planes_equal_the_unshared_blocks_and_hold_each_array_once(shape):
    """On every rank each plane equals the block cut on its own from the graph; the
    arrays held are those of the distinct (row range, column range) blocks that no other
    plane's rows contain, and nothing else: 1 block on 1x1x1x1, and on 1x2x1x1 the
    (x, y) plane is a row slice of the unsplit (y, z) plane."""
    graph = parallel_graph(n=37, m=160)
    for c in _coords(shape):
        shard = build_shard(graph, shape, c)
        vr = shard.vertex_ranges
        want = [CSRBlock.from_graph(graph, vr[r], vr[k]) for r, k in PLANES]
        assert all(_same_block(a, b) for a, b in zip(shard.adj, want))
        keys = {(vr[r], vr[k]) for r, k in PLANES}
        kept = [key for key in keys if not any(o != key and o[1] == key[1] and o[0][0] <= key[0][0]
                                               and key[0][1] <= o[0][1] for o in keys)]
        storage = shard.adjacency_storage()
        assert storage["blocks"] == len(keys)
        nnz_bytes = sum(CSRBlock.from_graph(graph, *key).nnz * 8 for key in kept)  # int32 ids + float32 values
        ptr_bytes = sum((key[0][1] - key[0][0] + 1) * 8 for key in keys)  # every distinct block's own row pointers
        assert storage["bytes"] == nnz_bytes + ptr_bytes
        unshared = _unshared_shard(shard).adjacency_storage()
        assert unshared["blocks"] == 3 and unshared["bytes"] >= storage["bytes"]
    if shape == (1, 1, 1, 1):
        assert storage["storages"] == 3 and unshared["bytes"] == 3 * storage["bytes"]
    if shape == (1, 2, 1, 1):  # the (x, y) plane of either x rank: indices and values are views of (y, z)'s
        assert storage["storages"] == 2 * 3 + 1


@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (1, 2, 1, 1), (1, 2, 2, 1), (1, 2, 2, 2)], ids=ids)
@pytest.mark.parametrize("permute", ["none", "double"])
def test_shard_files_round_trip_with_the_sharing(tmp_path, shape, permute):
    """A shard file holds a shared array once; loaded back, every plane equals the built
    one and holds the same bytes. A file whose planes are separate copies (as written
    before the sharing) loads to the same planes, shared again."""
    from scalegnn.permutation import double_sigma

    graph = parallel_graph(n=37, m=160)
    paths = save_shards(graph, shape, tmp_path / "new", permute=permute, seed=2)
    sigma = double_sigma(37, 2) if permute == "double" else None
    for rank, c in enumerate(_coords(shape)):
        built = build_shard(graph, shape, c, sigma=sigma)
        old = _unshared_shard(built)
        torch.save(old.to_state(), tmp_path / "old.pt")
        for loaded in (load_shard(tmp_path / "new", rank), RankShard.from_state(torch.load(tmp_path / "old.pt",
                                                                                           weights_only=True))):
            assert all(_same_block(a, b) for a, b in zip(loaded.planes(), built.planes()))
            assert loaded.adjacency_storage() == built.adjacency_storage()
            assert torch.equal(loaded.x, built.x)
        if shape == (1, 1, 1, 1) and permute == "none":  # two copies of ids and values fewer
            assert paths[rank].stat().st_size < (tmp_path / "old.pt").stat().st_size - 2 * built.adj[0].nnz * 8


def test_share_planes_keeps_separate_blocks_separate():
    graph = parallel_graph(n=37, m=160)
    a = CSRBlock.from_graph(graph, (0, 18), (0, 37))
    b = CSRBlock.from_graph(graph, (18, 37), (0, 37))
    c = CSRBlock.from_graph(graph, (0, 18), (18, 37))
    assert share_planes((a, b, c)) == (a, b, c) and all(x is y for x, y in zip(share_planes((a, b, c)), (a, b, c)))
    a2 = CSRBlock.from_graph(graph, (0, 18), (0, 37))
    got = share_planes((a, a2, c))
    assert got[0] is got[1] and (got[0] is a or got[0] is a2) and got[2] is c


# --------------------------------------------------------------- the full-graph batch
@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (1, 2, 1, 1), (1, 2, 2, 2), (1, 1, 2, 3)], ids=ids)
@pytest.mark.parametrize("permute", ["none", "double"])
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
def test_full_batch_is_the_extracted_full_graph_bit_for_bit(shape, permute, sparse):
    """The evaluation batch built from the stored planes equals Algorithm 2's extraction
    of the whole graph (every block, rows, features, labels) and gives the same logits,
    bit for bit; its planes share the shard's values (no copy)."""
    from scalegnn.parallel.model import ParallelScaleGNN
    from scalegnn.permutation import double_sigma

    graph = parallel_graph(n=37, m=160, sparse=sparse)
    sigma = double_sigma(37, 1) if permute == "double" else None
    cfg = ModelConfig(hidden=8, layers=4, dropout=0.0, residual=permute == "none")
    for rank, c in enumerate(_coords(shape)):
        grid = ProcessGrid.virtual(*shape, rank)
        shard = build_shard(graph, shape, c, sigma=sigma)
        sampler = DistributedSampler(shard, grid, 5, seed=0)
        full = sampler.full_batch()
        nodes = torch.arange(37)
        extracted = sampler._batch(-1, nodes, 1.0, with_eval_masks=True, host_nodes=nodes)
        pairs = [(full, extracted)] + ([(full.alt, extracted.alt)] if sigma is not None else [])
        for f, e in pairs:
            assert f.rows.bounds == e.rows.bounds
            for name in ("adj",) + (("adj_t",) if f is full.alt else ()):
                for fb, eb in zip(getattr(f, name), getattr(e, name)):
                    if fb is None:
                        assert eb is None
                        continue
                    assert (fb.row_offset, fb.col_offset) == (eb.row_offset, eb.col_offset)
                    assert torch.equal(fb.adj.to_dense(), eb.adj.to_dense()) and fb.adj_t is None
            for key in ("y", "train_mask", "val_mask", "test_mask"):
                assert all(torch.equal(getattr(f, key)[a], getattr(e, key)[a]) for a in PMM_AXES)
        assert torch.equal(full.x.to_dense(), extracted.x.to_dense())
        for blk, sb in zip(shard.planes(), (full.adj if sigma is None else full.alt.adj + full.alt.adj_t)):
            assert sb.adj.values().data_ptr() == blk.values.data_ptr()  # the shard's own values
    if shape == (1, 1, 1, 1):  # the forward (one process: every collective is a no-op)
        model = ParallelScaleGNN(graph.num_features, graph.num_classes, cfg, grid, seed=1).eval()
        with torch.no_grad():
            assert torch.equal(model(full, ParallelContext(grid)), model(extracted, ParallelContext(grid)))


def _full_logits_worker(rank, world, shape, permute):
    from scalegnn.parallel.model import ParallelScaleGNN
    from scalegnn.permutation import double_sigma

    grid = ProcessGrid(*shape)
    graph = parallel_graph(n=41, m=170)
    sigma = double_sigma(41, 1) if permute == "double" else None
    shard = build_shard(graph, shape, grid.coords, sigma=sigma)
    sampler = DistributedSampler(shard, grid, 5, seed=0)
    nodes = torch.arange(41)
    cfg = ModelConfig(hidden=10, layers=4, dropout=0.0, residual=permute == "none")
    model = ParallelScaleGNN(graph.num_features, graph.num_classes, cfg, grid, seed=1).eval()
    with torch.no_grad():
        a = model(sampler.full_batch(), ParallelContext(grid))
        b = model(sampler._batch(-1, nodes, 1.0, with_eval_masks=True, host_nodes=nodes), ParallelContext(grid))
    return torch.equal(a, b)


@pytest.mark.distributed
@pytest.mark.parametrize("shape", [(1, 2, 2, 2), (1, 2, 1, 1)], ids=ids)
@pytest.mark.parametrize("permute", ["none", "double"])
def test_full_graph_logits_from_the_stored_planes_equal_the_extracted_ones(shape, permute):
    assert all(spawn(_full_logits_worker, nprocs(shape), shape, permute, timeout_s=120))


# --------------------------------------------------------------- training, shared vs not
RUN = dict(model=ModelConfig(hidden=10, layers=3, dropout=0.2), optim=OptimConfig(lr=1e-2, grad_clip=0.5), batch=17)


def _shared_vs_unshared_worker(rank, world, shape, steps):
    grid = ProcessGrid(*shape)
    graph = parallel_graph(n=41, m=170)
    shard = build_shard(graph, shape, grid.coords)
    out = []
    for s in (shard, _unshared_shard(shard)):
        eng = ParallelEngine(None, RUN["model"], RUN["optim"], RUN["batch"], seed=3, epochs=2, grid=grid, shard=s)
        results = [eng.train_step(step) for step in range(steps)]
        out.append({"steps": [(r.loss, r.correct, r.count) for r in results], "eval": eng.evaluate().as_dict(),
                    "params": {k: v["value"] for k, v in eng.parameters_for_test().items()},
                    "storage": s.adjacency_storage()})
        eng.close()
    return out


@pytest.mark.distributed
@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (1, 2, 1, 1), (1, 2, 2, 1), (1, 2, 2, 2)], ids=ids)
def test_training_on_shared_planes_equals_training_on_separate_copies(shape):
    """Steps, evaluation and every parameter shard after the steps: bit for bit."""
    for shared, unshared in spawn(_shared_vs_unshared_worker, nprocs(shape), shape, 4, timeout_s=180):
        assert shared["steps"] == unshared["steps"] and shared["eval"] == unshared["eval"]
        assert shared["params"].keys() == unshared["params"].keys()
        assert all(torch.equal(shared["params"][k], unshared["params"][k]) for k in shared["params"])
        assert shared["storage"]["bytes"] <= unshared["storage"]["bytes"]
        if shape == (1, 1, 1, 1):
            assert shared["storage"]["blocks"] == 1 and 3 * shared["storage"]["bytes"] == unshared["storage"]["bytes"]

