"""The roofline of a training step (benchmarks/roofline.py): closed-form FLOPs and bytes,
each kernel's bound between its compute and its memory time, the device table's lookup
by the names torch reports, and the table beside measured times."""

from __future__ import annotations

import pytest

from scalegnn.benchmarks.roofline import (StepWorkload, device_spec, roofline_markdown, roofline_rows,
                                          step_bounds)

# The products-scale step of the GPU benchmark: N = 2.4 M, 124 M directed edges, B = 0.1 N.
PRODUCTS = StepWorkload.expected(2_400_000, 240_000, 124_000_000, 100, 256, 47, 3)


def test_the_step_flops_and_bytes_are_the_closed_forms():
    w = PRODUCTS
    b = step_bounds(w, device_spec("NVIDIA H200"), "tf32")
    B, F, H, C, L = w.batch, w.features, w.hidden, w.classes, w.layers
    # forward + dH + dW of every layer and the head; W_in forward and dW only
    assert b["gemm"].flops == 2 * (3 * L * B * H * H + 3 * B * H * C + 2 * B * F * H)
    assert b["gemm"].flops == pytest.approx(325.0e9, rel=1e-3)  # the 325 GFLOP
    assert b["elementwise"].bytes == L * 9 * 4 * B * H + 8 * B * C
    assert b["optimizer"].bytes == 28 * (F * H + L * (H * H + H) + H * C)
    assert w.sampled_nnz == pytest.approx(B + 124e6 * B * (B - 1) / (2.4e6 * (2.4e6 - 1)))
    step = b["step"]
    assert step.seconds == pytest.approx(sum(v.seconds for k, v in b.items() if k != "step"))
    assert step.bytes == pytest.approx(sum(v.bytes for k, v in b.items() if k != "step"))


@pytest.mark.parametrize("precision", ["fp32", "tf32", "bf16"])
def test_each_bound_lies_between_compute_and_memory_time(precision):
    spec = device_spec("NVIDIA H100 80GB HBM3")
    peak, bw = spec.peak_flops(precision), spec.hbm_TBps * 1e12
    for name, b in step_bounds(PRODUCTS, spec, precision).items():
        low = max(b.flops / peak, b.bytes / bw)
        assert low * (1 - 1e-12) <= b.seconds <= (b.flops / peak + b.bytes / bw) * (1 + 1e-12), name
    # TF32 tensor cores make the GEMMs faster than FP32 on a device that has them, not on one without
    assert step_bounds(PRODUCTS, spec, "tf32")["gemm"].seconds < step_bounds(PRODUCTS, spec, "fp32")["gemm"].seconds
    mi250 = device_spec("AMD Instinct MI250X")
    assert mi250.peak_flops("tf32") == mi250.peak_flops("fp32")


@pytest.mark.parametrize("name,expected", [
    ("NVIDIA H200", "NVIDIA H200 SXM"), ("NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM"),
    ("NVIDIA H100 PCIe", "NVIDIA H100 PCIe"), ("NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB SXM"),
    ("NVIDIA A100-SXM4-40GB", "NVIDIA A100 40GB SXM"), ("AMD Instinct MI250X", "AMD Instinct MI250X, one GCD"),
    ("AMD Instinct MI300A", "AMD Instinct MI300A"), ("cpu", None), ("NVIDIA GeForce RTX 4090", None)])
def test_devices_are_found_by_the_name_torch_reports(name, expected):
    spec = device_spec(name)
    assert (spec.name if spec else None) == expected


def test_the_table_puts_measured_beside_bound():
    spec = device_spec("NVIDIA H200")
    bounds = step_bounds(PRODUCTS, spec, "tf32")
    measured = {"sampling": 2.2, "spmm": 3.5, "gemm": 7.3, "elementwise": 17.5, "optimizer": 0.1, "pmm_comm": 0.0,
                "dp_comm": 0.0, "other": 0.4}
    rows = roofline_rows(bounds, measured, 28.5)
    by = {r[0]: r for r in rows}
    assert by["gemm"][3] == pytest.approx(7.3 / (bounds["gemm"].seconds * 1e3))
    assert by["communication, other"][1] == pytest.approx(0.4) and by["communication, other"][3] == "-"
    assert by["step"][3] == pytest.approx(28.5 / (bounds["step"].seconds * 1e3))
    md = roofline_markdown(rows, spec, "tf32")
    assert "494.7 TFLOP/s (tf32 GEMMs), 4.8 TB/s" in md and "| step |" in md
