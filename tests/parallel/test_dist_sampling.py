"""Distributed sampling (Algorithm 2, scalegnn/parallel/dist_sampling.py): the union of
every rank's shards is the serial sampled matrix, no collective is called, the full-graph
batch built from the stored planes is the extracted full graph bit for bit, and a
property over random graphs and random 4D grids (hypothesis; virtual ranks, axes longer
than the graph, so some shards are empty): the rank shards tile the serial sample."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from scalegnn.launch.job import spawn
from scalegnn.model import ModelConfig
from scalegnn.parallel.context import ParallelContext
from scalegnn.parallel.dist_sampling import DistributedSampler
from scalegnn.parallel.grid import PMM_AXES, ProcessGrid
from scalegnn.parallel.sharding import build_rank_shard, build_shard
from tests.graphs import grid_coords, grid_id, parallel_graph, tile_rank_samples
from tests.strategies import edge_lists, graph_of


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


# --------------------------------------------------------------- the full-graph batch
@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (1, 2, 1, 1), (1, 2, 2, 2), (1, 1, 2, 3)], ids=grid_id)
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
    for rank, c in enumerate(grid_coords(shape)):
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


# ----------------------------------------------------------------------------- properties (hypothesis)
grid_shapes = st.tuples(st.integers(1, 2), st.integers(1, 3), st.integers(1, 3), st.integers(1, 3))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(edge_lists(min_nodes=2, max_nodes=16, max_edges=50), grid_shapes, st.data())
def test_rank_shards_tile_the_serial_sample_on_random_grids(data, shape, draw):
    """Communication-free sampling on every rank of a random 4D grid (virtual ranks:
    sampling needs no process group). Axes may be longer than N: empty shards."""
    n, edges = data
    world = shape[0] * shape[1] * shape[2] * shape[3]
    assume(world > 1)
    g = graph_of(n, edges).gcn_normalize()
    b = draw.draw(st.integers(2, n), label="B")
    seed, step = draw.draw(st.integers(0, 1000), label="seed"), draw.draw(st.integers(0, 1000), label="step")
    for dp in range(shape[0]):
        ref, planes, ranks = tile_rank_samples(g, shape, b, seed, step, dp)
        for _, sb in ranks:
            for ax in PMM_AXES:
                lo, hi = sb.rows.block(ax)
                assert torch.equal(sb.y[ax], ref.y[lo:hi])
        dense = _dense(ref.adj)
        for p in range(3):
            assert torch.equal(planes[p], dense), f"plane {p}, grid {shape}, B={b}"


# ----------------------------------------------------------------------------- padded to a capacity
def _padded_pairs(sparse: bool, shape, use_index_map: bool, steps=range(3)):
    """(unpadded batch, padded sampler, step) for every rank of ``shape``: the torch kernel both ways."""
    graph = parallel_graph(n=300, m=3000, sparse=sparse)
    for rank, c in enumerate(grid_coords(shape)):
        grid = ProcessGrid.virtual(*shape, rank)
        shard = build_shard(graph, shape, c)
        exact = DistributedSampler(shard, grid, 40, seed=0, backend="torch", padded=False,
                                   use_index_map=use_index_map)
        padded = DistributedSampler(shard, grid, 40, seed=0, backend="torch", padded=True,
                                    use_index_map=use_index_map)
        for step in steps:
            yield exact.sample(step), padded, step


def _same_products(exact, padded) -> None:
    for e, p in zip(exact.adj, padded.adj):
        assert torch.equal(e.adj.to_dense(), p.adj.to_dense()) and torch.equal(e.adj_t.to_dense(), p.adj_t.to_dense())
        assert p.adj.values().numel() == p.adj_t.values().numel() == p.capacity >= e.adj.values().numel()
        assert int(p.kept) == e.adj.values().numel() and not bool(p.overflowed())
        gen = torch.Generator().manual_seed(1)
        x, g = torch.randn(e.shape[1], 7, generator=gen), torch.randn(e.shape[0], 7, generator=gen)
        assert torch.equal(e.adj @ x, p.adj @ x) and torch.equal(e.adj_t @ g, p.adj_t @ g)  # bit for bit
    assert torch.equal(exact.x.to_dense(), padded.x.to_dense())


@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (1, 2, 2, 2), (2, 1, 2, 3)], ids=grid_id)
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
@pytest.mark.parametrize("use_index_map", [True, False], ids=["map", "search"])
def test_a_padded_batch_multiplies_as_the_unpadded_one_bit_for_bit(shape, sparse, use_index_map):
    """Padded to its capacity (the kept entries, then explicit zeros in the last row and
    column), every block stores exactly ``capacity`` entries in both directions, is the
    same matrix, and its products with the forward's and the backward's operands are
    bit-identical to the unpadded block's."""
    for exact, sampler, step in _padded_pairs(sparse, shape, use_index_map):
        _same_products(exact, sampler.sample(step))
        assert sampler.overflows == 0


def test_a_block_that_overflows_its_capacity_is_drawn_again_with_more_room(monkeypatch):
    """A capacity too small for the entries kept (planted: room for ``slack`` entries)
    is caught by the flag read; the batch is drawn again with the slack doubled until
    it fits, counted in ``overflows``, and equals the unpadded batch."""
    import scalegnn.parallel.dist_sampling as DS

    monkeypatch.setattr(DS, "sample_capacity", lambda entries, rows, scale, slack: min(entries, int(slack)))
    for exact, sampler, step in _padded_pairs(False, (1, 1, 1, 1), True, steps=[0, 1]):
        _same_products(exact, sampler.sample(step))
    assert sampler.overflows >= 5 and sampler.slack >= 32  # 1, 2, 4, ... entries of room were too few


def test_capacity_bounds_the_kept_entries_and_never_exceeds_the_gathered_ones():
    """sample_capacity: at least the expected kept entries (p * entries + (1 - p) *
    rows) plus its margin, at most the gathered entries (which cannot overflow), and
    grows with the slack."""
    from scalegnn.sampling import sample_capacity

    p = 0.1
    for entries, rows in [(0, 0), (10, 3), (10_000, 500), (60_000_000, 240_000)]:
        cap = sample_capacity(entries, rows, p)
        expected = p * entries + (1 - p) * min(rows, entries)
        assert cap <= entries and (cap == entries or cap >= 1.01 * expected)
        assert sample_capacity(entries, rows, p, slack=4.0) >= cap
    assert sample_capacity(60_000_000, 240_000, p) < 1.02 * (p * 60_000_000 + 0.9 * 240_000)  # +1 % at scale
