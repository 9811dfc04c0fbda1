"""Baseline adapters: records end to end, valid samples, SALIENT's cache count, BNS-GCN's exchange."""

from __future__ import annotations

import warnings

import pytest
import torch

from scalegnn import records
from scalegnn.baselines.common import load_data
from scalegnn.cli import main
from scalegnn.config import make_config
from scalegnn.launch import launch
from scalegnn.launch.environment import single_env


pytest.importorskip("torch_geometric")


pytest.importorskip("torch_sparse")


warnings.filterwarnings("ignore", message=".*pyg-lib.*")


TINY = "csbm:n=400,avg_degree=6,classes=3,feature_dim=12"


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    return str(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def tiny(data_root):
    return load_data(make_config("graphsage", dataset=TINY, data_root=data_root))


def edge_set(data):
    src, dst = data.edge_index
    return set(zip(src.tolist(), dst.tolist()))


def cfg_for(system, data_root, tmp_path, **over):
    kw = dict(dataset=TINY, data_root=data_root, epochs=2, out_dir=str(tmp_path), hidden=16, layers=2, dropout=0.0)
    kw.update(over)
    return make_config(system, **kw)


# ----------------------------------------------------------------------------- models
@pytest.mark.parametrize("kind", ["sage", "gcn", "graphconv"])
def test_sparse_input_layer_equals_the_pyg_layer(kind):
    from scalegnn.baselines.models import InputConv

    torch.manual_seed(0)
    x = torch.rand(30, 20) * (torch.rand(30, 20) < 0.2)
    ei = torch.randint(0, 30, (2, 90))
    w = torch.rand(90) if kind != "sage" else None
    layer = InputConv(kind, 20, 7)
    dense = layer(x, ei, w)
    sparse = layer(x.to_sparse_csr(), ei, w)
    torch.testing.assert_close(sparse, dense, rtol=1e-5, atol=1e-5)


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


# ----------------------------------------------------------------------------- records end to end
@pytest.mark.parametrize("system,extra", [
    ("graphsage", ["--batch-size", "64"]),
    ("graphsage", ["--batch-size", "64", "--conv", "gcn", "--eval-mode", "layerwise"]),
    ("graphsaint", ["--node-budget", "100", "--sample-coverage", "5"]),
    ("salient", ["--batch-size", "64"]),
    ("bns-gcn", []),
    ("fullgraph-3d", []),
])
def test_cli_run_writes_a_valid_record(system, extra, data_root, tmp_path, capsys):
    rc = main(["train", "--system", system, "--dataset", TINY, "--data-root", data_root, "--epochs", "2",
               "--hidden", "16", "--layers", "2", "--out", str(tmp_path), "--quiet", "--target-acc", "0.05",
               *extra])
    assert rc == 0, capsys.readouterr()
    [path] = list(tmp_path.glob("*.json"))
    rec = records.read_record(path)
    assert rec["system"] == system and rec["status"] == "ok" and rec["dataset"] == TINY
    assert len(rec["epochs"]) == 2 and rec["epochs"][-1]["test_acc"] is not None
    assert rec["epochs"][-1]["eval_time_s"] is not None
    assert rec["time_to_target_s"] == rec["epochs"][0]["train_time_s"]
    assert rec["summary"]["epochs_run"] == 2
    # every system says where it computed (auto: a GPU where one is visible) and both memory peaks
    assert rec["env"]["device_type"] == ("cuda" if torch.cuda.is_available() else "cpu")
    assert rec["peak_rss_bytes_per_rank"][0] > 0
    cfg = rec["config"]
    assert cfg["model"]["hidden"] == 16 and cfg["optim"]["lr"] == 1e-3
    if system == "graphsage":
        assert cfg["options"]["fanouts"] == [15, 10] and cfg["options"]["batch_size"] == 64
    if system == "graphsaint":
        assert cfg["options"]["node_budget"] == 100 and cfg["options"]["sample_coverage"] == 5
    if system == "bns-gcn":
        assert cfg["options"]["boundary_rate"] == 0.1
    if system == "fullgraph-3d":
        assert rec["batch_size"] == rec["graph"]["num_nodes"]


def test_baseline_flags_are_validated(data_root, tmp_path, capsys):
    rc = main(["train", "--system", "graphsage", "--dataset", TINY, "--data-root", data_root,
               "--fanouts", "5,5,5", "--layers", "2", "--out", str(tmp_path)])
    assert rc == 2 and "--layers is 2" in capsys.readouterr().err
    rc = main(["train", "--system", "salient", "--dataset", TINY, "--grid", "1x2x1x1", "--out", str(tmp_path)])
    assert rc == 2 and "data parallel only" in capsys.readouterr().err


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


def test_salient_and_graphsage_two_processes_write_records(data_root, tmp_path):
    rec = launch(cfg_for("salient", data_root, tmp_path, nproc=2, epochs=2, batch_size=64))
    assert rec["status"] == "ok" and rec["world_size"] == 2 and rec["grid"]["dp"] == 2
    assert 0 <= rec["cache_hit_rate"] <= 1 and rec["epochs"][0]["cache"]["hits"] >= 0
    assert len(rec["peak_memory_bytes_per_rank"]) == 2
    records.read_record(rec["path"])


def test_bns_gcn_at_rate_one_matches_the_single_process_run(data_root, tmp_path):
    """p = 1: partition-parallel training with the all_to_all exchange (forward and
    backward) is exactly full-graph training: the same losses epoch after epoch."""
    one = launch(cfg_for("bns-gcn", data_root, tmp_path, epochs=3, boundary_rate=1.0))
    two = launch(cfg_for("bns-gcn", data_root, tmp_path, epochs=3, nproc=2, boundary_rate=1.0))
    assert two["status"] == "ok" and two["epochs"][0]["comm_bytes"]["boundary"] > 0
    la = [r["loss"] for r in one["epochs"]]
    lb = [r["loss"] for r in two["epochs"]]
    assert la == pytest.approx(lb, rel=1e-4)
    assert two["epochs"][0]["boundary_sampled_fraction"] == 1.0
