"""``scalegnn bench kernels`` (benchmarks/kernels.py): the rates of the ``[compute]`` constants
from shapes and times, the SpMM bytes as the device model charges them, the command end to
end on the CPU at a toy size (JSON, the table, a snippet that parses), the comparison with a
cluster profile, and bad requests refused in one line before any work. Timings are not
asserted: only their structure, their units and that the rates follow from them."""

from __future__ import annotations

import json
import math
import tomllib
from types import SimpleNamespace

import pytest
import torch

from scalegnn import perfmodel
from scalegnn.benchmarks import kernels
from scalegnn.benchmarks.kernels import (KERNELS, check_arguments, compute_snippet, copy_bytes, elementwise_bytes,
                                         gemm_flops, kernel_rates, operand_bytes, profile_comparison,
                                         random_csr_operand, snippet_toml, spmm_flops, spmm_model_bytes)
from scalegnn.benchmarks.roofline import device_spec
from scalegnn.cli import main
from scalegnn.sweeps import load_profile
from tests.runs import one_line_error

TOY = ["--batch", "2000", "--hidden", "32", "--reps", "2"]


def _args(**over) -> SimpleNamespace:
    """The parser's namespace for ``scalegnn bench kernels`` (its defaults), with ``over``."""
    base = dict(device="cpu", batch=2000.0, hidden=32, nnz=None, reps=2, profile=None)
    return SimpleNamespace(**{**base, **over})


# --------------------------------------------------------------------------- arithmetic
def test_rates_follow_from_the_shapes_and_times():
    assert gemm_flops(1000, 10) == 2e5 and spmm_flops(300, 10) == 6e3
    assert copy_bytes(1e6) == 8e6 and elementwise_bytes(1e6) == 16e6
    # B = 1e4, H = 100 (a gathered row of 400 bytes > a sector), nnz = 1e5, E = 1e6; times picked to give round rates.
    median = {"gemm": 2e8 / 1e12, "spmm": 2e7 / 1e9, "copy": 8e6 / 1e10, "elementwise": 16e6 / 2e10}
    rates = kernel_rates(median, 1e4, 100, 1e5, 1e6)
    assert rates["gemm_tflops"] == pytest.approx(1.0)  # 2 B H H = 2e8 FLOPs in 2e-4 s
    assert rates["spmm_gflops"] == pytest.approx(1.0)  # 2 nnz H = 2e7 FLOPs in 0.02 s
    assert rates["copy_GBps"] == pytest.approx(10.0) and rates["elementwise_GBps"] == pytest.approx(20.0)
    spmm_bytes = 1e5 * (12 + 400) + 4 * 1e4 * 100  # entries (value, int64 column, a gathered row) + output
    assert rates["spmm_effective_GBps"] == pytest.approx(spmm_bytes / 0.02 / 1e9)


def test_a_narrow_spmm_row_is_charged_a_whole_sector():
    assert spmm_model_bytes(10, 5, 2) == 10 * (12 + perfmodel.SECTOR_BYTES) + 4 * 5 * 2


def test_the_spmm_bytes_are_those_the_device_model_charges():
    """Two workloads that differ only in nnz (full graph, one layer, one rank): the device
    model's forward and backward each grow by exactly the per-entry bytes counted here."""
    machine = perfmodel.Machine(gpus_per_node=1, intra_Bps=1.0, inter_Bps=1.0, latency_s=0.0, spmm_flops=1.0,
                                gemm_flops=1e30, step_overhead_s=0.0, hbm_Bps=1.0)  # seconds = bytes
    n, hidden = 1000, 64
    small, large = (perfmodel.Workload(num_nodes=n, nnz=nnz, num_features=8, num_classes=4, hidden=hidden, layers=1)
                    for nnz in (5000, 9000))
    a, b = (perfmodel._device_terms(w, (1, 1, 1, 1), machine) for w in (small, large))
    grown = spmm_model_bytes(9000, n, hidden) - spmm_model_bytes(5000, n, hidden)
    assert b["forward"] - a["forward"] == pytest.approx(grown)
    assert b["backward"] - a["backward"] == pytest.approx(grown)


def test_the_operands_counted_for_the_memory_check():
    dense, csr, buffers = 3 * 4 * 100 * 10 + 4 * 10 * 10, 8 * 101 + 12 * 1000, 4 * 4 * 5000
    scratch = kernels.GENERATION_BYTES_PER_ENTRY * 1000
    assert operand_bytes(batch=100, hidden=10, nnz=1000, elements=5000) == dense + csr + buffers + scratch


def test_the_random_csr_has_exactly_nnz_sorted_entries_and_multiplies_like_its_dense_form():
    adj = random_csr_operand(50, 400, "cpu", seed=3)
    crow, col = adj.crow_indices(), adj.col_indices()
    assert adj.shape == (50, 50) and crow.dtype == col.dtype == torch.int64 and adj.values().dtype == torch.float32
    assert int(crow[0]) == 0 and int(crow[-1]) == col.numel() == 400 and bool((crow[1:] >= crow[:-1]).all())
    assert bool(((col >= 0) & (col < 50)).all())
    for r in range(50):
        row = col[crow[r]:crow[r + 1]]
        assert bool((row[1:] >= row[:-1]).all())
    x = torch.randn(50, 7)
    torch.testing.assert_close(torch.sparse.mm(adj, x), adj.to_dense() @ x)
    assert torch.equal(random_csr_operand(50, 400, "cpu", seed=3).col_indices(), col)  # seeded


def test_the_snippet_carries_the_constants_the_model_reads_on_each_device():
    rates = {"gemm_tflops": 51.234, "spmm_gflops": 3.2109, "copy_GBps": 4012.6, "spmm_effective_GBps": 1.0,
             "elementwise_GBps": 1.0}
    gpu, cpu = compute_snippet(rates, accelerator=True), compute_snippet(rates, accelerator=False)
    assert gpu == {"gemm_tflops": 51.2, "hbm_GBps": 4010.0}  # SpMM priced in bytes there: no spmm_gflops
    assert cpu == {"gemm_tflops": 51.2, "spmm_gflops": 3.21}  # no hbm_GBps: it would switch the model
    for values, accelerator in ((gpu, True), (cpu, False)):
        text = snippet_toml(values, "some device", accelerator)
        assert tomllib.loads(text)["compute"] == values


def test_the_profile_comparison_flags_a_ratio_outside_half_to_double():
    compute = load_profile("perlmutter").compute
    rows = {r["constant"]: r for r in profile_comparison({"gemm_tflops": 9.0, "hbm_GBps": 1555.0 * 2.5,
                                                          "spmm_gflops": 150.0}, compute)}
    assert rows["gemm_tflops"]["ratio"] == pytest.approx(9.0 / 19.5) and rows["gemm_tflops"]["outside"]
    assert rows["hbm_GBps"]["ratio"] == pytest.approx(2.5) and rows["hbm_GBps"]["outside"]
    assert rows["spmm_gflops"]["ratio"] == pytest.approx(0.75) and not rows["spmm_gflops"]["outside"]
    local = {r["constant"]: r for r in profile_comparison({"hbm_GBps": 10.0}, load_profile("local").compute)}
    assert local["hbm_GBps"]["profile"] is None and not local["hbm_GBps"]["outside"]  # a CPU profile has none


def test_the_vendor_peak_is_compared_in_the_same_units():
    lines, vendor = kernels._vendor_lines(device_spec("NVIDIA H200"), {"gemm_tflops": 33.5, "copy_GBps": 2400.0})
    assert vendor["gemm_of_peak"] == pytest.approx(0.5) and vendor["copy_of_peak"] == pytest.approx(0.5)
    assert "67 TFLOP/s" in lines[0] and "4800 GB/s" in lines[0]


# --------------------------------------------------------------------------- the command
def test_the_command_on_the_cpu_writes_every_repetition_rates_and_the_snippet(tmp_path):
    assert main(["bench", "--out", str(tmp_path), "kernels", "--device", "cpu", *TOY]) == 0
    data = json.loads((tmp_path / "kernels.json").read_text())
    md = (tmp_path / "kernels.md").read_text()
    assert data["bench"] == "kernels" and data["device"] == "cpu" and data["dtype"] == "float32"
    assert data["batch"] == 2000 and data["hidden"] == 32 and data["nnz_requested"] == data["nnz"] == 30 * 2000
    assert data["elements"] >= 2000 * 32 and data["machine"]["cpus"] >= 1
    for k in KERNELS:
        assert len(data["times_s"][k]) == 2 and all(t > 0 for t in data["times_s"][k])
        assert data["median_ms"][k] == pytest.approx(sorted(data["times_s"][k])[0] * 500 +
                                                     sorted(data["times_s"][k])[1] * 500)  # median of two
    rates = data["rates"]
    assert all(math.isfinite(v) and v > 0 for v in rates.values())
    medians = {k: v / 1e3 for k, v in data["median_ms"].items()}
    assert rates == pytest.approx(kernel_rates(medians, 2000, 32, data["nnz"], data["elements"]))
    assert data["snippet"] == compute_snippet(rates, accelerator=False)
    assert data["vendor"] is None and data["profile"] is None
    # The Markdown: the table, and the snippet as TOML that parses to the payload's values.
    for row in ("| GEMM FP32 | (2,000, 32) @ (32, 32) |", "| SpMM FP32 |", "| copy |", "| x * y + z |"):
        assert row in md
    toml = md.split("```toml\n")[1].split("```")[0]
    assert tomllib.loads(toml)["compute"] == data["snippet"] and toml.strip() == data["snippet_toml"]
    assert data["command"].startswith("scalegnn bench")


def test_the_profile_values_stand_beside_the_measured_ones(tmp_path, capsys):
    assert main(["bench", "--out", str(tmp_path), "kernels", "--device", "cpu", *TOY, "--profile", "perlmutter"]) == 0
    out = capsys.readouterr().out
    data = json.loads((tmp_path / "kernels.json").read_text())
    rows = {r["constant"]: r for r in data["profile"]["rows"]}
    assert data["profile"]["name"] == "perlmutter" and set(rows) == {"gemm_tflops", "spmm_gflops", "hbm_GBps"}
    assert rows["gemm_tflops"]["profile"] == 19.5 and rows["hbm_GBps"]["profile"] == 1555
    assert rows["hbm_GBps"]["measured"] == pytest.approx(data["rates"]["copy_GBps"])
    assert "Against the profile 'perlmutter'" in out
    for r in rows.values():
        assert r["ratio"] == pytest.approx(r["measured"] / r["profile"])
        assert r["outside"] == (not 0.5 <= r["ratio"] <= 2.0)
        line = next(li for li in out.splitlines() if li.startswith(f"| {r['constant']} |"))
        assert ("outside [0.5, 2] of the profile" in line) == r["outside"]


# --------------------------------------------------------------------------- bad requests
@pytest.fixture
def no_work(monkeypatch):
    """Measuring fails the test: a bad request must be refused before any operand is built."""
    def refuse(*a, **k):
        raise AssertionError("the kernels were measured before the request was checked")
    monkeypatch.setattr(kernels, "_measure", refuse)


@pytest.mark.parametrize("flags, fragments", [
    (["--batch", "0"], ["--batch", "whole number >= 1", "got 0.0"]),
    (["--batch", "2.5"], ["--batch", "whole number"]),
    (["--hidden", "0"], ["--hidden", "whole number >= 1"]),
    (["--reps", "0"], ["--reps", "whole number >= 1"]),
    (["--batch", "100", "--nnz", "50"], ["--nnz", ">= 100"]),
    (["--batch", "100", "--nnz", "20000"], ["--nnz 20,000", "100 x 100", "lower --nnz"]),
    (["--device", "mps"], ["--device 'mps'", "pass cpu or cuda"]),
    (["--batch", "1e9", "--hidden", "256"], ["needs about", "more than half of this machine's RAM",
                                              "lower --batch, --hidden or --nnz"]),
    (["--profile", "no-such-cluster"], ["no cluster profile 'no-such-cluster'", "perlmutter"]),
])
def test_a_bad_request_is_one_line(tmp_path, capsys, no_work, flags, fragments):
    err = one_line_error(capsys, ["bench", "--out", str(tmp_path), "kernels", "--device", "cpu", "--reps", "2",
                                  *flags])
    for fragment in fragments:
        assert fragment in err, err
    assert not (tmp_path / "kernels.json").exists()


def test_cuda_without_a_gpu_is_one_line(tmp_path, capsys, no_work, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    err = one_line_error(capsys, ["bench", "--out", str(tmp_path), "kernels", "--device", "cuda", *TOY])
    assert "--device cuda" in err and "no CUDA device" in err and "--device cpu" in err
    # With no --device the benchmark picks the CPU there, and checks the same way.
    assert check_arguments(_args(device=None)).device == "cpu"


def test_an_operand_set_near_the_memory_is_refused_and_one_within_it_is_not(monkeypatch):
    """Half the device's memory is the limit; the bandwidth buffers' floor shrinks on a small machine."""
    monkeypatch.setattr(kernels, "physical_memory", lambda: 2 * 2**30)  # a 2 GiB machine: 1 GiB for the run
    run = check_arguments(_args())
    assert run.elements == 2**30 // 64 and operand_bytes(2000, 32, run.nnz, run.elements) < 2**30
    with pytest.raises(ValueError, match="more than half of this machine's RAM"):
        check_arguments(_args(batch=3e6, hidden=32))  # 3e6 x 32 floats x 3 + the CSR of 9e7 entries: > 1 GiB
