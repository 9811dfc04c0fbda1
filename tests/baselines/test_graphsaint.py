"""GraphSAINT (baselines/graphsaint.py): induced subgraphs with their normalization, and the
exact normalization against the sampler's frequencies."""

from __future__ import annotations

import warnings

import pytest
import torch

from scalegnn.launch.environment import single_env
from tests.runs import cfg_for, edge_set

pytest.importorskip("torch_geometric")
pytest.importorskip("torch_sparse")

warnings.filterwarnings("ignore", message=".*pyg-lib.*")


def test_graphsaint_subgraphs_are_induced_with_normalization(tiny, data_root, tmp_path):
    from scalegnn.baselines.graphsaint import GraphSAINTTrainer

    cfg = cfg_for("graphsaint", data_root, tmp_path, node_budget=80, sample_coverage=10, normalization="sampled")
    trainer = GraphSAINTTrainer(cfg, tiny, single_env(cfg.parallel))
    edges = edge_set(tiny)
    for _, sub in zip(range(3), trainer.sampler):
        nodes = sub.n_id
        assert nodes.unique().numel() == nodes.numel() <= 80
        got = set(zip(nodes[sub.edge_index[0]].tolist(), nodes[sub.edge_index[1]].tolist()))
        inside = set(nodes.tolist())
        induced = {(u, v) for (u, v) in edges if u in inside and v in inside}
        assert got == induced  # every edge exists, and all edges among the sampled vertices are kept
        assert bool((sub.node_norm > 0).all()) and bool((sub.edge_norm > 0).all())
    # full-graph evaluation (one SpMM over the weighted adjacency) = the edge-list form
    trainer.model.eval()
    with torch.no_grad():
        ref = trainer.model(tiny.features, trainer.pyg.edge_index, trainer.pyg.edge_weight)
    torch.testing.assert_close(trainer.full_logits(), ref, rtol=1e-5, atol=1e-5)


def test_graphsaint_exact_normalization_matches_the_samplers_frequencies():
    """The closed-form inclusion probabilities of PyG's node sampler agree with how
    often its subgraphs actually contain each vertex and each edge (5 sigma), and the
    weights built from them are the unbiased estimator's."""
    from torch_geometric.data import Data

    from scalegnn.baselines.graphsaint import node_sampler_norms, saint_sampler

    gen = torch.Generator().manual_seed(3)
    n, budget, draws = 40, 12, 3000
    src = torch.randint(0, n, (150,), generator=gen)
    dst = torch.randint(0, n, (150,), generator=gen)
    pairs = torch.unique(torch.cat([torch.stack([src, dst]), torch.stack([dst, src])], 1), dim=1)
    pairs = torch.cat([pairs, torch.tensor([[5], [5]])], 1)  # a self loop too
    pairs = torch.unique(pairs, dim=1)
    e = pairs.shape[1]
    data = Data(edge_index=pairs, num_nodes=n, n_id=torch.arange(n), e_id=torch.arange(e))
    torch.manual_seed(0)
    sampler = saint_sampler(data, budget, draws, 0)
    node_hits = torch.zeros(n, dtype=torch.float64)
    edge_hits = torch.zeros(e, dtype=torch.float64)
    for sub in sampler:
        node_hits[sub.n_id] += 1
        edge_hits[sub.e_id] += 1
    edge_norm, node_norm = node_sampler_norms(pairs, n, budget)
    p_node = 1.0 / (n * node_norm.double())
    p_node[node_norm == 0] = 0.0
    p_edge = p_node[pairs[1]] / edge_norm.double()

    def within_5_sigma(hits, p):
        sigma = (draws * p * (1 - p)).sqrt().clamp(min=1.0)
        return bool(((hits - draws * p).abs() <= 5 * sigma).all())

    assert within_5_sigma(node_hits, p_node)
    assert within_5_sigma(edge_hits, p_edge)
    assert p_edge.max() <= 1 and bool((edge_norm >= 1 - 1e-6).all())  # p(edge) <= p(its target)
    loop = int(((pairs[0] == 5) & (pairs[1] == 5)).nonzero())
    assert abs(float(edge_norm[loop]) - 1.0) < 1e-6
