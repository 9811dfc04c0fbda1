"""The performance model: volumes against a real run, placement (Eq. 4.6), the fit, planning."""

import math

import numpy as np
import pytest

from scalegnn.perfmodel import (TERMS, Machine, Workload, axis_bandwidth, epoch_time_from_rows, fit, predict,
                                predicted_bytes_per_step, predicted_calls_per_step, rank_grids,
                                step_collectives, step_times)
from scalegnn.sweeps import load_profile

PERLMUTTER = Machine.from_profile(load_profile("perlmutter"))


def test_sampled_nnz_matches_induced_subgraphs():
    """E[nnz_S] = B + (nnz - N) B(B-1)/(N(N-1)) (self loops always kept)."""
    from scalegnn.datasets import load_dataset

    g = load_dataset("csbm:n=2000,avg_degree=10,classes=4,feature_dim=8", cache=False).gcn_normalize()
    rows, cols = g.row_ids().numpy(), g.indices.numpy()
    rng = np.random.default_rng(0)
    b = 400
    counts = []
    for _ in range(200):
        keep = np.zeros(g.num_nodes, bool)
        keep[rng.choice(g.num_nodes, b, replace=False)] = True
        counts.append(np.count_nonzero(keep[rows] & keep[cols]))
    w = Workload(g.num_nodes, g.num_edges, 8, 4, batch_size=b)
    assert np.mean(counts) == pytest.approx(w.sampled_nnz, rel=0.02)


def test_placement_bandwidth_plexus_eq_4_6():
    intra, inter = PERLMUTTER.intra_Bps, PERLMUTTER.inter_Bps
    grid = (1, 4, 4, 4)  # z fastest: a z group is one node of 4 GPUs
    # Perlmutter's 4 GPUs are fully connected (intra_links = "full"): a ring of 4 runs over 3 pair links
    assert axis_bandwidth(grid, "z", PERLMUTTER) == (3 * intra, True)
    ring = Machine(**{**PERLMUTTER.to_dict(), "intra_links": "ring"})
    assert axis_bandwidth(grid, "z", ring) == (intra, True)
    assert axis_bandwidth(grid, "y", PERLMUTTER) == (inter / 4, False)  # 4 y groups leave each node
    assert axis_bandwidth(grid, "x", PERLMUTTER) == (inter / 4, False)
    assert axis_bandwidth((1, 2, 2, 16), "z", PERLMUTTER) == (inter, False)  # one z group per node: all NICs
    assert axis_bandwidth((2, 1, 2, 2), "y", PERLMUTTER) == (intra, True)
    assert axis_bandwidth((2, 1, 2, 2), "dp", PERLMUTTER) == (inter / 4, False)


def test_collectives_follow_the_layout_table():
    w = Workload(num_nodes=1000, nnz=11000, num_features=32, num_classes=4, hidden=64, layers=3, batch_size=100)
    kinds = {(c.axis, c.kind) for c in step_collectives(w, (1, 2, 1, 1))}
    assert kinds == {("x", "pmm_x"), ("x", "norm"), ("x", "reshard"), ("x", "loss")}
    none = step_collectives(w, (1, 1, 1, 1))
    assert none == []  # a single rank communicates nothing
    # the BF16 switch halves exactly the 3D-PMM partial sums (paper V-B), nothing else
    bf = Workload(**{**w.__dict__, "pmm_bytes": 2})
    full, half = predicted_bytes_per_step(w, (1, 2, 2, 2)), predicted_bytes_per_step(bf, (1, 2, 2, 2))
    for kind in full:
        assert half[kind] == pytest.approx(full[kind] / 2 if kind.startswith("pmm_") else full[kind])
    # bucketing merges calls, never bytes; the latency term falls with the calls
    unb = Workload(**{**w.__dict__, "bucket": False})
    assert predicted_bytes_per_step(unb, (1, 2, 2, 2)) == full
    calls = {b: sum(predicted_calls_per_step(m, (1, 2, 2, 2)).values()) for b, m in ((False, unb), (True, w))}
    assert calls[True] < calls[False]
    assert step_times(w, (1, 2, 2, 2), PERLMUTTER)["latency"] < step_times(unb, (1, 2, 2, 2), PERLMUTTER)["latency"]


@pytest.mark.distributed
def test_predicted_bytes_match_a_recorded_run(tmp_path):
    """Bytes per step per collective kind of a real 4-rank run (2 x 1 x 2 x 1) vs the model."""
    from scalegnn.model import ModelConfig
    from scalegnn.config import make_config
    from scalegnn.launch import launch

    cfg = make_config(dataset="csbm:n=1200,avg_degree=8,classes=4,feature_dim=16", data_root=str(tmp_path / "d"),
                    batch_ratio=0.25, epochs=1, out_dir=str(tmp_path), progress=False, grid=(2, 1, 2, 1), nproc=4,
                    model=ModelConfig(hidden=16, layers=3, dropout=0.0))
    rec = launch(cfg, timeout_s=180)
    w = Workload.from_record(rec)
    pred = predicted_bytes_per_step(w, (2, 1, 2, 1))
    got = {k: v / rec["steps_per_epoch"] for k, v in rec["epochs"][0]["comm_bytes"].items()}
    assert pred["dp"] == got["dp"]  # gradient shards: exact
    # row blocks of a sampled batch vary around B / G_t: within 15% per kind
    for kind in ("pmm_y", "norm", "reshard"):
        assert pred[kind] == pytest.approx(got[kind], rel=0.15), kind
    # calls do not depend on the sample: exact, per kind, with the gradient buckets
    assert w.bucket
    calls = {k: v / rec["steps_per_epoch"] for k, v in rec["epochs"][0]["comm_calls"].items()}
    assert predicted_calls_per_step(w, (2, 1, 2, 1)) == calls


def test_fit_recovers_known_coefficients_and_predicts():
    rng = np.random.default_rng(1)
    truth = dict(zip(TERMS, [1.3, 0.7, 2.0, 0.5, 1.1]))
    samples = []
    for _ in range(12):
        parts = {t: float(rng.uniform(0.01, 1.0)) for t in TERMS}
        samples.append((parts, sum(truth[t] * parts[t] for t in TERMS)))
    coef = fit(samples)
    assert coef.fitted_on == 12
    for t in TERMS:
        assert coef[t] == pytest.approx(truth[t], rel=1e-6)
    with pytest.raises(ValueError, match="at least"):
        fit(samples[:3])


def test_rank_grids_orders_by_prediction_and_memory():
    w = Workload.for_dataset("ogbn-papers100M", hidden=256, layers=3, batch_ratio=0.1)
    preds = rank_grids(w, 64, PERLMUTTER)
    assert len(preds) == sum(1 for gd in range(1, 65) if 64 % gd == 0 for _ in _factor3(64 // gd))
    fitting = [p for p in preds if p.fits]
    assert [p.epoch_s for p in fitting] == sorted(p.epoch_s for p in fitting)
    pure_dp = next(p for p in preds if p.grid == (64, 1, 1, 1))
    assert not pure_dp.fits and not preds[-1].fits  # the whole graph on every GPU: more than 40 GB, ranked last
    one = predict(w, (1, 4, 4, 4), PERLMUTTER)
    assert one.steps == 10 and math.isclose(one.epoch_s, sum(one.parts.values()))


def _factor3(n):
    return [(a, b) for a in range(1, n + 1) if n % a == 0 for b in range(1, n // a + 1) if (n // a) % b == 0]


def test_epoch_time_from_rows_skips_the_warm_up_epoch():
    assert epoch_time_from_rows([5.0, 6.0, 7.5, 8.5]) == pytest.approx(3.5 / 3)
    assert epoch_time_from_rows([2.0]) == 2.0 and epoch_time_from_rows([]) is None


def test_plan_command(capsys):
    from scalegnn.cli import main

    assert main(["plan", "--dataset", "ogbn-products", "--gpus", "8", "--cluster", "perlmutter", "--top", "3"]) == 0
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if ln.strip()[:1].isdigit()]
    assert len(lines) == 3 and "N=2,449,029" in out and "not fitted" in out
    ms = [float(ln.split()[2]) for ln in lines]
    assert ms == sorted(ms)


# ---------------------------------------------------------------------------- the paper's scale (issue 30)
from scalegnn.perfmodel import collective_cost, comm_time_by_kind, memory_breakdown  # noqa: E402


def test_ring_vs_tree_all_reduce_closed_form():
    """Ring 2(n-1)/n M/beta + 2(n-1) alpha; tree 2 M/beta + 2 ceil(log2 n) alpha: at 512 nodes a
    small message takes the tree (18 latency steps instead of 1022); over 4 ranks a large one the ring."""
    beta, alpha = 25e9, 10e-6
    b, a, algo = collective_cost("all_reduce", 1e3, 512, beta, alpha, tree=True)
    assert algo == "tree" and a == pytest.approx(2 * 9 * alpha) and b == pytest.approx(2 * 1e3 / beta)
    b, a, algo = collective_cost("all_reduce", 1e9, 4, beta, alpha, tree=True)  # 2 (n-1)/n < 2: the ring
    assert algo == "ring" and a == pytest.approx(2 * 3 * alpha) and b == pytest.approx(2 * 3 / 4 * 1e9 / beta)
    assert collective_cost("all_reduce", 1e3, 512, beta, alpha, tree=False)[2] == "ring"
    b, a, _ = collective_cost("all_gather", 1e6, 4, beta, alpha)
    assert (b, a) == (pytest.approx(3e6 / beta), pytest.approx(3 * alpha))


def test_nic_sharing_and_bf16_halving_in_time():
    """Groups leaving a node share its NICs: 4 y-groups of 1x4x4x4 get a quarter of the node's 100 GB/s
    each; BF16 halves exactly the bandwidth time of the 3D-PMM kinds."""
    w = Workload.for_dataset("ogbn-papers100M", hidden=128, batch_ratio=0.05)
    grid = (1, 4, 4, 4)
    assert axis_bandwidth(grid, "y", PERLMUTTER)[0] == pytest.approx(100e9 / 4)
    frontier = Machine.from_profile(load_profile("frontier"))  # 8 GCDs, 4 NICs: 8 z-groups of 1x2x2x16 share
    assert axis_bandwidth((1, 2, 2, 16), "y", frontier)[0] == pytest.approx(100e9 / 8)
    slow = Machine(**{**PERLMUTTER.to_dict(), "latency_s": 0.0, "tree": False})
    full = comm_time_by_kind(w, grid, slow)
    half = comm_time_by_kind(Workload(**{**w.__dict__, "pmm_bytes": 2}), grid, slow)
    for kind in full:
        assert half[kind] == pytest.approx(full[kind] / 2 if kind.startswith("pmm_") else full[kind])


def test_overlap_and_prefetch_hide_only_what_fits():
    w = Workload.for_dataset("ogbn-products", hidden=256, batch_ratio=0.05)
    grid = (4, 2, 2, 2)
    no_lat = Machine(**{**PERLMUTTER.to_dict(), "latency_s": 0.0})
    base = step_times(w, grid, no_lat)
    over = step_times(Workload(**{**w.__dict__, "comm_overlap": True}), grid, no_lat)
    cols = step_collectives(w, grid)
    assert sum(c.nbytes for c in cols if c.backward) > 0 and sum(c.nbytes for c in cols if c.feature_grad) > 0
    assert over["bandwidth"] < base["bandwidth"] and over["compute"] == base["compute"]
    # closed form: the input-gradient all-reduces hide behind the dW GEMMs, the gradient
    # reductions behind what is left of the backward compute
    from scalegnn.perfmodel import _device_terms
    dev = _device_terms(w, grid, no_lat)
    costs = {}
    for flag in ("feature_grad", "backward"):
        costs[flag] = sum(collective_cost(c.op, c.nbytes, dict(zip(("dp", "x", "y", "z"), grid))[c.axis],
                                          axis_bandwidth(grid, c.axis, no_lat)[0], 0.0, no_lat.tree)[0]
                          for c in cols if getattr(c, flag))
    fg_hidden = min(costs["feature_grad"], dev["dw"])
    grad_hidden = min(costs["backward"], dev["backward"] - fg_hidden)
    assert base["bandwidth"] - over["bandwidth"] == pytest.approx(fg_hidden + grad_hidden, rel=1e-9)
    p = predict(w, grid, PERLMUTTER)
    q = predict(Workload(**{**w.__dict__, "prefetch": True}), grid, PERLMUTTER)
    train = sum(v for k, v in p.parts.items() if k != "sampling")
    assert q.parts["sampling"] == pytest.approx(max(0.0, p.parts["sampling"] - train))
    assert q.epoch_s == pytest.approx(max(p.epoch_s - p.parts["sampling"], p.parts["sampling"]))


def test_sampling_on_a_device_closed_form():
    """Alg. 2 on a GPU: a sort of N keys (64 bytes per vertex) plus, per plane, B/G_rows * nnz/N
    gathered entries of 12 bytes and ceil(log2 B) 32-byte probes each, over HBM bandwidth."""
    w = Workload(num_nodes=1_000_000, nnz=11_000_000, num_features=100, num_classes=10, hidden=64,
                 batch_size=50_000)
    grid = (1, 2, 2, 1)
    from scalegnn.parallel.layout import layer_layout
    sizes = {"dp": 1, "x": 2, "y": 2, "z": 1}
    touched = sum(50_000 / sizes[layer_layout(i).adj[0]] * 11.0 for i in range(3))
    expect = (64 * 1_000_000 + touched * (12 + 16 * 32)) / PERLMUTTER.hbm_Bps
    assert step_times(w, grid, PERLMUTTER)["sampling"] == pytest.approx(expect)


def test_memory_breakdown_closed_form_and_misfits():
    w = Workload(num_nodes=1000, nnz=11000, num_features=32, num_classes=4, hidden=64, batch_size=100)
    m = memory_breakdown(w, (1, 1, 1, 1))
    # one block (the three planes coincide on one rank): int64 row pointers, int32 columns and FP32
    # values; the features; per axis, int64 labels and three one-byte masks
    assert m["shard"] == pytest.approx(1001 * 8 + 11000 * (4 + 4) + 1000 * 32 * 4 + 3 * 1000 * (8 + 3))
    params = 32 * 64 + 3 * (64 * 64 + 64) + 64 * 4
    assert m["optimizer"] == pytest.approx(16 * params)
    assert m["evaluation"] == pytest.approx(3 * 4 * 1000 * 64)
    assert m["peak"] == pytest.approx(m["shard"] + m["optimizer"] + max(m["block"] + m["activations"], m["evaluation"]))
    pre = memory_breakdown(Workload(**{**w.__dict__, "prefetch": True}), (1, 1, 1, 1))
    assert pre["block"] == pytest.approx(2 * m["block"])
    big = Workload.for_dataset("ogbn-papers100M", hidden=128, batch_ratio=0.05)
    assert not predict(big, (8, 2, 2, 2), PERLMUTTER).fits  # a 2x2x2 shard of papers100M is over 40 GB
    assert predict(big, (1, 4, 4, 4), PERLMUTTER).fits


def test_plan_grid_and_recommend(capsys):
    from scalegnn.cli import main

    assert main(["plan", "--dataset", "ogbn-papers100M", "--cluster", "perlmutter", "--grid", "1x4x4x4"]) == 0
    out = capsys.readouterr().out
    assert "1x4x4x4" in out and "memory per rank: shard" in out and "fits" in out
    assert main(["plan", "--dataset", "ogbn-papers100M", "--cluster", "perlmutter", "--gpus", "64",
                 "--recommend", "--top", "50"]) == 0  # H 256, B = 0.1 N: only the paper's 4x4x4 fits in 40 GB
    out = capsys.readouterr().out
    assert "exceeds device memory" not in out and "recommended: 1x4x4x4 (the only grid that fits)" in out
    assert main(["plan", "--dataset", "ogbn-papers100M", "--cluster", "perlmutter", "--gpus", "64", "--hidden", "128",
                 "--batch-ratio", "0.05", "--recommend", "--top", "50"]) == 0
    out = capsys.readouterr().out
    assert "exceeds device memory" not in out and " wins over " in out and "inside a node" in out
