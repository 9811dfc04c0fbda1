"""SALIENT (baselines/salient.py): its batches are subgraphs with the seeds first, and its
cache's hit rate equals an independent count."""

from __future__ import annotations

import warnings

import pytest
import torch

from tests.runs import cfg_for, edge_set

pytest.importorskip("torch_geometric")
pytest.importorskip("torch_sparse")

warnings.filterwarnings("ignore", message=".*pyg-lib.*")


def test_salient_batches_are_subgraphs_with_seeds_first(tiny):
    from scalegnn.baselines.salient import NeighborSampler

    sampler = NeighborSampler(tiny)
    edges = edge_set(tiny)
    seeds = tiny.graph.train_idx[:40]
    b = sampler.sample(seeds, (5, 3))
    assert torch.equal(b.n_id[:40], seeds)
    assert b.n_id.unique().numel() == b.n_id.numel()
    src, dst = b.n_id[b.edge_index[0]], b.n_id[b.edge_index[1]]
    assert all(e in edges for e in zip(src.tolist(), dst.tolist()))


# ----------------------------------------------------------------------------- distributed
def _salient_rank(rank, world, cfg):
    from scalegnn.baselines.common import load_data
    from scalegnn.baselines.salient import SalientTrainer
    from scalegnn.launch.environment import local_rank_env

    trainer = SalientTrainer(cfg, load_data(cfg), local_rank_env(rank, world, cfg.parallel, "gloo"))
    st = trainer.train_epoch(1)
    return {"log": trainer.batch_log, "part": trainer.part, "cache": trainer.store.cache_ids,
            "reported": st.extra["cache"]}


def test_salient_cache_hit_rate_equals_an_independent_count(data_root, tmp_path):
    from scalegnn.baselines.salient import SalientOptions
    from scalegnn.launch.job import spawn

    cfg = cfg_for("salient", data_root, tmp_path, nproc=2, options=SalientOptions(
        batch_size=40, cache_budget=0.1, partition="random", record_batches=True))  # record_batches: tests only
    out = spawn(_salient_rank, 2, cfg, timeout_s=240)
    hits = misses = local = 0
    for rank, res in enumerate(out):
        part, cache = res["part"], set(res["cache"].tolist())
        assert 0 < len(cache) <= 40 and all(part[v] != rank for v in cache)
        for n_id in res["log"]:
            for v in n_id.tolist():
                if part[v] == rank:
                    local += 1
                elif v in cache:
                    hits += 1
                else:
                    misses += 1
    rep = out[0]["reported"]
    assert (rep["local"], rep["hits"], rep["misses"]) == (local, hits, misses)
    assert rep["hit_rate"] == pytest.approx(hits / (hits + misses))
    assert 0 < rep["hit_rate"] < 1
