"""Property-based tests (hypothesis) over hostile random graphs and random grids.

Graphs are drawn with everything real data throws at a loader: empty rows
(isolated vertices), self loops, duplicate edges, one-directional edges,
non-contiguous vertex ids, comments, headers and extra columns in edge lists.
Properties checked against dense references built independently here:

- ``csr_from_edges`` / ``Graph.symmetrize``: sorted, duplicate-free CSR whose
  pattern is exactly the edge set (resp. its symmetric closure);
- ``Graph.gcn_normalize``: equals D^-1/2 (A+I) D^-1/2 computed densely in float64;
  finite, and every isolated vertex gets exactly its self loop (weight 1);
- loaders (``edgelist:`` files, ``npz:`` arrays): the graph is the undirected,
  self-loop-free pattern of the input over the renumbered ids; or a DatasetError
  (a ValueError with a message), never another exception;
- the sampler: a sorted unique sample of B vertices; the sampled matrix is the
  induced subgraph of the normalized A with off-diagonal entries divided by
  p = (B-1)/(N-1) (Eq. 24); and over random 4D grids (including axes longer than
  the graph, so some shards are empty), the rank shards tile that matrix exactly.
"""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from scalegnn.graph import Graph
from scalegnn.parallel.grid import PMM_AXES
from tests.graphs import tile_rank_samples


SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def edge_lists(draw, max_nodes: int = 14, max_edges: int = 40, min_nodes: int = 1):
    """(n, edges): ids in [0, n), with self loops, duplicates and one-way edges likely."""
    n = draw(st.integers(min_nodes, max_nodes))
    node = st.integers(0, n - 1)
    base = draw(st.lists(st.tuples(node, node), max_size=max_edges))
    loops = draw(st.lists(node, max_size=3))
    dups = draw(st.lists(st.sampled_from(base), max_size=5)) if base else []
    edges = base + [(v, v) for v in loops] + dups
    return n, draw(st.permutations(edges))


def make_graph(n: int, edges, symmetric: bool = True, features: int = 3) -> Graph:
    src = torch.tensor([u for u, _ in edges], dtype=torch.int64)
    dst = torch.tensor([v for _, v in edges], dtype=torch.int64)
    gen = torch.Generator().manual_seed(n * 1000 + len(edges))
    every = torch.arange(n)
    g = Graph(torch.zeros(n + 1, dtype=torch.long), [], [], torch.randn(n, features, generator=gen),
              torch.randint(0, 3, (n,), generator=gen), every, every, every, 3).with_edges(src, dst)
    return g.symmetrize() if symmetric else g


def assert_csr_invariants(g: Graph) -> None:
    n = g.num_nodes
    assert g.indptr[0] == 0 and g.indptr[-1] == g.indices.numel()
    assert bool((g.indptr[1:] >= g.indptr[:-1]).all())
    for r in range(n):
        row = g.indices[g.indptr[r]: g.indptr[r + 1]]
        assert bool((row[1:] > row[:-1]).all()), f"row {r} not strictly increasing: {row}"
        assert bool(((row >= 0) & (row < n)).all())


# ----------------------------------------------------------------------------- sampler
def _dense(csr) -> torch.Tensor:
    return csr.to_dense()


grid_shapes = st.tuples(st.integers(1, 2), st.integers(1, 3), st.integers(1, 3), st.integers(1, 3))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(edge_lists(min_nodes=2, max_nodes=16, max_edges=50), grid_shapes, st.data())
def test_rank_shards_tile_the_serial_sample_on_random_grids(data, shape, draw):
    """Communication-free sampling on every rank of a random 4D grid (virtual ranks:
    sampling needs no process group). Axes may be longer than N: empty shards."""
    n, edges = data
    world = shape[0] * shape[1] * shape[2] * shape[3]
    assume(world > 1)
    g = make_graph(n, edges).gcn_normalize()
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
