"""Hypothesis strategies for the property tests: hostile random edge lists (self loops,
duplicates, one-way edges, isolated vertices) and the graph built from one, with the
settings every property test runs under. Imported only by the modules of those tests
(hypothesis is a development dependency)."""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from scalegnn.graph import Graph

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


def graph_of(n: int, edges, symmetric: bool = True, features: int = 3) -> Graph:
    """The raw graph of ``edges`` on ``n`` vertices (symmetrized unless ``symmetric=False``),
    random features and labels, every vertex in every split."""
    src = torch.tensor([u for u, _ in edges], dtype=torch.int64)
    dst = torch.tensor([v for _, v in edges], dtype=torch.int64)
    gen = torch.Generator().manual_seed(n * 1000 + len(edges))
    every = torch.arange(n)
    g = Graph(torch.zeros(n + 1, dtype=torch.long), [], [], torch.randn(n, features, generator=gen),
              torch.randint(0, 3, (n,), generator=gen), every, every, every, 3).with_edges(src, dst)
    return g.symmetrize() if symmetric else g
