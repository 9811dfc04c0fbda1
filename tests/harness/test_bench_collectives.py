"""``scalegnn bench collectives`` (benchmarks/collectives.py): the fit of the performance
model's ring constants recovers known (alpha, beta) from times the model itself generates;
the report turns a profile's own times back into that profile's [network] values; the
command runs two gloo ranks end to end with tiny sizes and writes consistent JSON and
Markdown; bad input is one line before any rank starts. No timing is asserted."""

from __future__ import annotations

import json
import math
import statistics

import pytest

from scalegnn.benchmarks import collectives as coll
from scalegnn.cli import main
from scalegnn.perfmodel import collective_cost
from scalegnn.sweeps import load_profile

SIZES = [4 * 2**10, 64 * 2**10, 2**20, 16 * 2**20]


def _model_seconds(op, nbytes, n, beta, alpha, tree=False):
    bw, lat, _ = collective_cost(op, nbytes, n, beta, alpha, tree)
    return bw + lat


def test_ring_terms_are_the_models_ring_formulas():
    for n in (2, 3, 8):
        assert coll.ring_terms("all_reduce", 1000, n) == pytest.approx((2 * (n - 1) / n * 1000, 2 * (n - 1)))
        assert coll.ring_terms("all_gather", 1000, n) == pytest.approx(((n - 1) * 1000, n - 1))
    assert coll.bus_factor("all_reduce", 4) == pytest.approx(1.5)
    assert coll.bus_factor("all_gather", 4) == pytest.approx(0.75)
    with pytest.raises(ValueError, match="none of"):
        coll.ring_terms("broadcast", 1000, 2)


@pytest.mark.parametrize("n", [2, 4, 8])
def test_the_fit_recovers_alpha_and_beta_of_the_models_own_times(n):
    alpha, beta = 12e-6, 23e9
    points = {op: [(op, s, _model_seconds(op, s, n, beta, alpha)) for s in SIZES for _ in range(3)]
              for op in coll.OPS}
    for fit in (coll.fit_ring(points["all_reduce"], n), coll.fit_ring(points["all_gather"], n),
                coll.fit_ring(points["all_reduce"] + points["all_gather"], n)):
        assert fit.alpha_s == pytest.approx(alpha, rel=1e-9)
        assert fit.beta_Bps == pytest.approx(beta, rel=1e-9)
        assert fit.residual < 1e-9
    # 3% multiplicative noise, alternating: the constants move by about that much, not by orders
    noisy = [(op, s, t * (1.03 if i % 2 else 0.97)) for i, (op, s, t) in enumerate(points["all_reduce"])]
    fit = coll.fit_ring(noisy, n)
    assert fit.alpha_s == pytest.approx(alpha, rel=0.2) and fit.beta_Bps == pytest.approx(beta, rel=0.2)
    assert 0.01 < fit.residual < 0.05


def test_the_fit_keeps_its_terms_non_negative_and_needs_two_sizes():
    n = 4
    # Times that fall with size (noise on tiny messages): no bandwidth term, a latency-only fit.
    points = [("all_reduce", 4096, 2e-4), ("all_reduce", 65536, 1.8e-4)]
    fit = coll.fit_ring(points, n)
    assert fit.alpha_s > 0 and fit.beta_Bps == math.inf and fit.to_dict()["beta_Bps"] is None
    with pytest.raises(ValueError, match="two or more different sizes"):
        coll.fit_ring([("all_reduce", 4096, 1e-4), ("all_reduce", 4096, 1.1e-4)], n)
    with pytest.raises(ValueError, match="positive and finite"):
        coll.fit_ring([("all_reduce", 4096, 0.0), ("all_reduce", 8192, 1e-4)], n)


def test_sizes_parse_in_powers_of_1024_and_refuse_what_cannot_be_fitted():
    assert coll.parse_sizes("64K, 4K,1M,1m,1G") == [4096, 65536, 2**20, 2**30]
    assert coll.parse_sizes("4,8") == [4, 8]
    for bad, why in [("12Q", "no size"), ("4K,5G", "outside"), ("2,4K", "outside"), ("6,4K", "multiple of 4"),
                     ("1M", "one size"), ("1M,1024K", "one size")]:
        with pytest.raises(ValueError, match=why):
            coll.parse_sizes(bad)


def _synthetic(n, hosts, beta, alpha, reps=3):
    """What rank 0 of :func:`coll._measure` returns, with the model's own ring times."""
    times = {op: {s: [_model_seconds(op, s, n, beta, alpha)] * reps for s in SIZES} for op in coll.OPS}
    return {"times": times, "hosts": hosts, "devices": [f"cuda:{i % 4}" for i in range(n)],
            "device_names": ["NVIDIA A100-SXM4-40GB"]}


def _report(measured, n, profile):
    machine = {"load_avg_1m": 0.5}
    return coll.collectives_report(measured, SIZES, 3, n, "nccl", profile, machine, 0.5)


def test_a_profiles_own_times_give_back_its_network_values():
    perlmutter = load_profile("perlmutter")  # intra 100 GB/s per pair, intra_links "full"; inter 100; 10 us
    assert perlmutter.network.intra_links == "full"
    # 4 ranks on one node: the model's ring has 3 pair links, 300 GB/s; the pair value is what the profile holds.
    payload, md = _report(_synthetic(4, ["nid1"] * 4, 300e9, 10e-6), 4, perlmutter)
    assert payload["same_node"] and payload["network"]["key"] == "intra_node_GBps"
    assert payload["network"]["value_GBps"] == pytest.approx(100.0, rel=1e-6)
    assert payload["network"]["latency_us"] == pytest.approx(10.0, rel=1e-6)
    assert "intra_node_GBps = 100   #" in md and "latency_us = 10\n" in md
    assert payload["profile"]["bandwidth_ratio"] == pytest.approx(1.0) and "outside" not in md.split("Against")[1] \
        .split("The model's time")[0]
    # 2 nodes of 2 ranks: one ring over the job's ranks uses the node's whole injection bandwidth.
    payload, md = _report(_synthetic(4, ["nid1", "nid1", "nid2", "nid2"], 100e9, 10e-6), 4, perlmutter)
    assert not payload["same_node"] and payload["ranks_per_node"] == 2
    assert "inter_node_GBps = 100   #" in md and payload["profile"]["bandwidth_ratio"] == pytest.approx(1.0)
    # A network 10x slower than the profile says is flagged, latency 3x too.
    payload, md = _report(_synthetic(4, ["nid1"] * 4, 30e9, 30e-6), 4, perlmutter)
    assert payload["profile"]["bandwidth_ratio"] == pytest.approx(0.1)
    assert payload["profile"]["latency_ratio"] == pytest.approx(3.0)
    table = md.split("Against")[1].split("The model's time")[0]
    assert table.count("outside [0.5, 2] of the profile") == 2
    # Without a profile: the ring value, and the pair value a fully connected node would take.
    payload, md = _report(_synthetic(4, ["nid1"] * 4, 300e9, 10e-6), 4, None)
    assert "intra_node_GBps = 300   #" in md and "use intra_node_GBps = 100." in md and "Against" not in md


def _run(tmp_path, *extra):
    return main(["bench", "--out", str(tmp_path), "collectives", "--nproc", "2", "--sizes", "4K,1M", "--reps", "2",
                 *extra])


def _check_payload(payload, md):
    n = payload["ranks"]
    assert n == 2 and len(payload["hosts"]) == 2 and payload["same_node"] is True
    assert payload["backend"] == "gloo" and payload["device"] == "cpu" and payload["sizes"] == [4096, 2**20]
    assert payload["machine"]["cpus"] >= 1 and "load_avg_1m" in payload["machine"]
    for op in coll.OPS:
        factor = payload["bus_factor"][op]
        assert factor == pytest.approx(1.0 if op == "all_reduce" else 0.5)
        rows = payload["ops"][op]
        assert [r["bytes_per_rank"] for r in rows] == [4096, 2**20]
        for r in rows:
            assert len(r["times_s"]) == 2 and all(math.isfinite(t) and t > 0 for t in r["times_s"])
            assert r["median_s"] == pytest.approx(statistics.median(r["times_s"]))
            assert r["algbw_bytes"] == r["bytes_per_rank"] * (1 if op == "all_reduce" else n)
            assert r["algbw_GBps"] == pytest.approx(r["algbw_bytes"] / r["median_s"] / 1e9)
            assert r["algbw_GBps"] > 0 and math.isfinite(r["algbw_GBps"])
            assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] * factor)
        fit = payload["fit"][op]
        assert fit["alpha_s"] >= 0 and fit["points"] == 4 and math.isfinite(fit["residual"])
        assert fit["beta_Bps"] is None or fit["beta_Bps"] > 0
        assert f"\n{op} (" in md
    joint = payload["fit"]["both"]
    assert payload["network"]["key"] == "intra_node_GBps"
    assert payload["network"]["latency_us"] == pytest.approx(joint["alpha_s"] * 1e6)
    assert "```toml\n[network]\n" in md and "latency_us = " in md
    if joint["beta_Bps"] is not None:  # resolved: the value to paste is the fitted ring bandwidth
        assert payload["network"]["value_GBps"] == pytest.approx(joint["beta_Bps"] / 1e9)
        assert "\nintra_node_GBps = " in md
    else:
        assert "# intra_node_GBps: not resolved" in md


def test_the_command_runs_two_gloo_ranks_and_writes_consistent_json_and_markdown(tmp_path, capsys):
    assert _run(tmp_path) == 0
    payload = json.loads((tmp_path / "collectives.json").read_text())
    md = (tmp_path / "collectives.md").read_text()
    _check_payload(payload, md)
    assert payload["markdown"].strip() == md.strip() and "profile" not in payload
    assert payload["command"].startswith("scalegnn bench")
    assert "intra_node_GBps" in capsys.readouterr().out


def test_the_profile_comparison_sets_the_profiles_values_beside_the_measured(tmp_path, capsys):
    assert _run(tmp_path, "--profile", "perlmutter") == 0
    out = capsys.readouterr().out
    payload = json.loads((tmp_path / "collectives.json").read_text())
    _check_payload(payload, payload["markdown"])
    prof = payload["profile"]
    assert prof["name"] == "perlmutter" and "Against profile 'perlmutter'" in out
    assert prof["model_ring_GBps"] == pytest.approx(100.0)  # 2 ranks of a fully connected node: one pair link
    assert prof["latency_ratio"] == pytest.approx(payload["fit"]["both"]["alpha_s"] * 1e6 / 10.0)
    table = out.split("Against profile")[1].split("The model's time")[0]
    rows = [line for line in table.splitlines() if line.startswith("| ring bandwidth") or line.startswith("| latency")]
    assert len(rows) == 2
    for line, ratio in zip(rows, (prof["bandwidth_ratio"], prof["latency_ratio"])):
        assert ("outside [0.5, 2] of the profile" in line) == (ratio is not None and not 0.5 <= ratio <= 2)
    for op in coll.OPS:
        for model, row in zip(prof["model_times"][op], payload["ops"][op]):
            assert model["ratio"] == pytest.approx(row["median_s"] / model["model_s"])


@pytest.mark.parametrize("argv, why", [
    (["--nproc", "1"], "--nproc 1: a collective needs at least 2 ranks"),
    (["--sizes", "12Q"], "'12Q' is no size"),
    (["--reps", "0"], "--reps 0"),
    (["--backend", "mpi"], "--backend 'mpi' is none of gloo, nccl"),
    (["--profile", "no-such-cluster"], "no cluster profile 'no-such-cluster'"),
])
def test_bad_input_is_one_line_before_any_rank_starts(tmp_path, capsys, monkeypatch, argv, why):
    import scalegnn.launch.job as job

    def no_ranks(*args, **kwargs):
        raise AssertionError("ranks were started")

    monkeypatch.setattr(job, "spawn", no_ranks)
    assert main(["bench", "--out", str(tmp_path), "collectives", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("scalegnn: error: ") and why in err and len(err.splitlines()) == 1
    assert not (tmp_path / "collectives.json").exists()
