"""GraphSAGE (baselines/graphsage.py): its batches are subgraphs with the seeds first, and
its layer-wise inference is the full-graph forward."""

from __future__ import annotations

import warnings

import pytest
import torch

from scalegnn.launch.environment import single_env
from tests.runs import cfg_for, edge_set

pytest.importorskip("torch_geometric")
pytest.importorskip("torch_sparse")

warnings.filterwarnings("ignore", message=".*pyg-lib.*")


# ----------------------------------------------------------------------------- samples
def test_graphsage_batches_are_subgraphs_with_seeds_first(tiny, data_root, tmp_path):
    from scalegnn.baselines.graphsage import GraphSAGETrainer

    cfg = cfg_for("graphsage", data_root, tmp_path, batch_size=50)
    trainer = GraphSAGETrainer(cfg, tiny, single_env(cfg.parallel))
    edges = edge_set(tiny)
    seeds = trainer._rank_seeds(1)
    seen = []
    for batch in trainer.train_loader(1):
        n_id = batch.n_id
        assert torch.equal(n_id[: batch.batch_size], seeds[len(seen): len(seen) + batch.batch_size])
        seen += n_id[: batch.batch_size].tolist()
        assert n_id.unique().numel() == n_id.numel()
        src, dst = n_id[batch.edge_index[0]], n_id[batch.edge_index[1]]
        assert all(e in edges for e in zip(src.tolist(), dst.tolist()))
        # fanout bound: each target receives at most max(fanouts) sampled in-edges per hop
        assert torch.bincount(batch.edge_index[1]).max() <= sum(trainer.opts.fanouts)
    assert sorted(seen) == sorted(seeds.tolist())


def test_graphsage_layerwise_inference_is_the_full_graph_forward(tiny, data_root, tmp_path):
    from scalegnn.baselines.graphsage import GraphSAGETrainer

    for conv in ("sage", "gcn"):
        cfg = cfg_for("graphsage", data_root, tmp_path, conv=conv)
        trainer = GraphSAGETrainer(cfg, tiny, single_env(cfg.parallel))
        trainer.model.eval()
        with torch.no_grad():
            ref = trainer.model(tiny.features.to_dense() if tiny.features.layout != torch.strided
                                else tiny.features, tiny.edge_index)
        torch.testing.assert_close(trainer.layerwise_inference(), ref, rtol=1e-4, atol=1e-5)
