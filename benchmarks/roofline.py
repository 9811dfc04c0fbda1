"""Lower bounds of a ScaleGNN training step on one accelerator: each component's FLOPs at
the precision's peak and its compulsory bytes at the device's memory bandwidth.

    spec = device_spec("NVIDIA H200")                    # from torch.cuda.get_device_name()
    bounds = step_bounds(StepWorkload(...), spec, "tf32")
    rows = roofline_rows(bounds, measured_ms)            # component, measured, bound, ratio

A component's bound is ``max(FLOPs / peak, bytes / bandwidth)`` summed over its kernels,
with the *compulsory* traffic only: every operand read once and every result written
once, as a perfect fusion and cache would achieve. The step's bound is the sum of its
components' (one GPU: no communication). Measured over bound says how far a component
is from what the hardware allows; it is not a prediction (the planner's model,
:mod:`scalegnn.perfmodel`, prices a step on a grid for choosing one).

Shape legend: N vertices, B sampled, nnz_S entries of the sampled block A_S (self loops
included), F features, H hidden, C classes, L layers; 4-byte floats and values, 8-byte
indices (torch's CSR), P parameters.

    gemm         W_in: X W_in and dW_in (X needs no gradient); per layer Z = H W, dH, dW;
                 head: O = X W_out, dX, dW_out. 2 m k n FLOPs each, bytes 4 (mk + kn + mn)
    spmm         per layer A_S X and A_S^T dH: the CSR (12 bytes an entry, 8 a row
                 pointer), the dense input read once and the output written once
    elementwise  per layer the tail (norm, ReLU, dropout, residual: read Z and the residual,
                 write the output; backward: read dOut and Z, write dZ; the residual's
                 gradient added to the SpMM's: 2 reads, 1 write): 9 passes over (B, H);
                 the loss: read the logits, write their gradient
    optimizer    fused AdamW: read parameter, gradient and two moments, write three: 28 P bytes
    sampling     Algorithm 2: the sampled rows of A + I scanned (12 bytes an entry), the block
                 and its transpose written (20 bytes an entry each: value, column, row),
                 the features and labels of the sample gathered (read and written)

The device table lists dense (no structured sparsity) peaks from the vendors' data
sheets; :data:`DEVICE_SPECS` names each source.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .common import markdown_table

__all__ = ["DeviceSpec", "DEVICE_SPECS", "device_spec", "StepWorkload", "Bound", "step_bounds", "roofline_rows",
           "roofline_markdown", "COMPONENT_OF"]


@dataclass(frozen=True)
class DeviceSpec:
    """Peak dense throughput (TFLOP/s) per precision and memory bandwidth (TB/s)."""

    name: str
    fp32_tflops: float
    tf32_tflops: float | None  # None: no TF32 (the FP32 peak applies)
    bf16_tflops: float
    hbm_TBps: float
    source: str

    def peak_flops(self, precision: str) -> float:
        tflops = {"fp32": self.fp32_tflops, "tf32": self.tf32_tflops or self.fp32_tflops,
                  "bf16": self.bf16_tflops}[precision]
        return tflops * 1e12


# (pattern matched against torch.cuda.get_device_name(), spec); the first match wins.
DEVICE_SPECS: list[tuple[str, DeviceSpec]] = [
    (r"H200", DeviceSpec("NVIDIA H200 SXM", 67.0, 494.7, 989.4, 4.8,
                         "NVIDIA H200 Tensor Core GPU datasheet (SXM; TF32/BF16 dense = half the sparsity figures)")),
    (r"H100.*(PCIe|PCI)", DeviceSpec("NVIDIA H100 PCIe", 51.0, 378.0, 756.0, 2.0,
                                     "NVIDIA H100 Tensor Core GPU datasheet (PCIe, dense)")),
    (r"H100", DeviceSpec("NVIDIA H100 SXM", 67.0, 494.7, 989.4, 3.35,
                         "NVIDIA H100 Tensor Core GPU datasheet (SXM, dense)")),
    (r"A100.*80GB", DeviceSpec("NVIDIA A100 80GB SXM", 19.5, 156.0, 312.0, 2.039,
                               "NVIDIA A100 Tensor Core GPU datasheet (80GB SXM, dense)")),
    (r"A100", DeviceSpec("NVIDIA A100 40GB SXM", 19.5, 156.0, 312.0, 1.555,
                         "NVIDIA A100 Tensor Core GPU datasheet (40GB SXM, dense; Perlmutter's)")),
    (r"MI300A", DeviceSpec("AMD Instinct MI300A", 122.6, 490.3, 980.6, 5.3,
                           "AMD Instinct MI300A data sheet (dense; TF32 as AMD's XF32 matrix rate)")),
    (r"MI250X|MI250", DeviceSpec("AMD Instinct MI250X, one GCD", 23.95, None, 191.5, 1.6384,
                                 "AMD Instinct MI250X data sheet, halved per GCD (FP32 vector; no TF32)")),
]


def device_spec(name: str) -> DeviceSpec | None:
    """The spec of the device called ``name`` (as torch reports it), or None if unknown."""
    for pattern, spec in DEVICE_SPECS:
        if re.search(pattern, name, re.IGNORECASE):
            return spec
    return None


@dataclass(frozen=True)
class StepWorkload:
    """What one training step processes (one GPU, one data-parallel group)."""

    nodes: int
    batch: int
    sampled_nnz: float  # entries of A_S, self loops included (a mean over steps)
    adjacency_nnz: int  # entries of A + I
    features: int
    hidden: int
    classes: int
    layers: int

    @classmethod
    def expected(cls, nodes: int, batch: int, edges: int, features: int, hidden: int, classes: int,
                 layers: int) -> "StepWorkload":
        """With the expected nnz of A_S: B self loops and each of the ``edges`` (directed)
        entries of A kept when both ends are sampled, B (B - 1) / (N (N - 1))."""
        kept = batch * (batch - 1) / (nodes * (nodes - 1)) if nodes > 1 else 1.0
        return cls(nodes, batch, batch + edges * kept, nodes + edges, features, hidden, classes, layers)

    @property
    def parameters(self) -> int:
        h = self.hidden
        return self.features * h + self.layers * (h * h + h) + h * self.classes


@dataclass(frozen=True)
class Bound:
    flops: float
    bytes: float
    seconds: float


def _gemm(m: float, k: float, n: float, peak: float, bw: float) -> tuple[float, float, float]:
    flops, nbytes = 2.0 * m * k * n, 4.0 * (m * k + k * n + m * n)
    return flops, nbytes, max(flops / peak, nbytes / bw)


def step_bounds(w: StepWorkload, spec: DeviceSpec, precision: str = "fp32") -> dict[str, Bound]:
    """Each component's :class:`Bound` for one step, and ``"step"`` their sum."""
    peak, bw = spec.peak_flops(precision), spec.hbm_TBps * 1e12
    B, F, H, C, L = w.batch, w.features, w.hidden, w.classes, w.layers
    gemms = [(B, F, H), (F, B, H)]  # X W_in, dW_in = X^T dX_h0
    for _ in range(L):
        gemms += [(B, H, H), (B, H, H), (H, B, H)]  # Z = H W, dH = dZ W^T, dW = H^T dZ
    gemms += [(B, H, C), (B, C, H), (H, B, C)]  # O = X W_out, dX, dW_out
    parts = [_gemm(*g, peak, bw) for g in gemms]
    out = {"gemm": Bound(sum(p[0] for p in parts), sum(p[1] for p in parts), sum(p[2] for p in parts))}

    block = 4.0 * B * H
    spmm_bytes = 2 * L * (12.0 * w.sampled_nnz + 8.0 * (B + 1) + 2 * block)  # forward and transpose, per layer
    spmm_flops = 2 * L * 2.0 * w.sampled_nnz * H
    out["spmm"] = Bound(spmm_flops, spmm_bytes, max(spmm_flops / peak, spmm_bytes / bw))

    ew_bytes = L * 9 * block + 2 * 4.0 * B * C
    out["elementwise"] = Bound(0.0, ew_bytes, ew_bytes / bw)
    opt_bytes = 28.0 * w.parameters
    out["optimizer"] = Bound(0.0, opt_bytes, opt_bytes / bw)
    scanned = w.adjacency_nnz * B / w.nodes
    samp_bytes = 12.0 * scanned + 2 * 20.0 * w.sampled_nnz + 2 * 4.0 * B * F + 8.0 * B * 3
    out["sampling"] = Bound(0.0, samp_bytes, samp_bytes / bw)
    out["step"] = Bound(sum(b.flops for b in out.values()), sum(b.bytes for b in out.values()),
                        sum(b.seconds for b in out.values()))
    return out


# The engine's components (scalegnn.parallel.engine.COMPONENTS) -> the bound they are held to;
# communication has none on one GPU, "other" (bookkeeping) none at all.
COMPONENT_OF = {"sampling": "sampling", "spmm": "spmm", "gemm": "gemm", "elementwise": "elementwise",
                "optimizer": "optimizer"}


def roofline_rows(bounds: dict[str, Bound], measured_ms: dict[str, float], step_ms: float) -> list[list]:
    """[component, measured ms, bound ms, measured / bound, GFLOP, GB] per component and
    for the whole step (``measured_ms``: per step, the engine's component names)."""
    rows = []
    for comp, key in COMPONENT_OF.items():
        b = bounds[key]
        ms = measured_ms.get(comp, 0.0)
        rows.append([comp, ms, b.seconds * 1e3, ms / (b.seconds * 1e3) if b.seconds else "-", b.flops / 1e9,
                     b.bytes / 1e9])
    rest = sum(v for k, v in measured_ms.items() if k not in COMPONENT_OF)
    rows.append(["communication, other", rest, 0.0, "-", 0.0, 0.0])
    s = bounds["step"]
    rows.append(["step", step_ms, s.seconds * 1e3, step_ms / (s.seconds * 1e3), s.flops / 1e9, s.bytes / 1e9])
    return rows


def roofline_markdown(rows: list[list], spec: DeviceSpec, precision: str) -> str:
    peak = spec.peak_flops(precision) / 1e12
    head = (f"Roofline of one training step on {spec.name}: {peak:g} TFLOP/s ({precision} GEMMs), "
            f"{spec.hbm_TBps:g} TB/s ({spec.source}); bound = max(FLOPs / peak, compulsory bytes / bandwidth) "
            "per kernel (benchmarks/roofline.py).\n\n")
    return head + markdown_table(["component", "measured ms", "bound ms", "measured / bound", "GFLOP", "GB"], rows)
