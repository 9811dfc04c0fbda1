"""The settings that change what a run computes: its arithmetic's precision and its vertices' order.

    NumericsConfig  the run configuration's ``numerics`` section (``cfg.numerics``)

What this section guarantees. Its defaults are the paper's computation: FP32
everywhere (local products, collectives, norms, weights, optimizer state) on the
vertices in the dataset's order. Every other value computes something else: the
losses, accuracies and weights of a run that sets one are not those of the run
without it, and the record (``config.numerics``) says which was run. A checkpoint is
resumed only with the same values. Each setting, and what it does to the numbers:

    comm_dtype  "bf16": the 3D-PMM partial sums are cast to BF16 for their all-reduce
                and back (paper V-B); each such sum is rounded to BF16, so every
                layer's output moves by that rounding. RMSNorm statistics, the loss,
                the reshard and the data-parallel gradient reductions stay FP32.
                PMM bytes are exactly half; tests bound the losses' drift.
    gemm_dtype  "bf16": the dense GEMMs' operands (layers and head, forward, dH and
                dW) are rounded to BF16, each product returned to FP32 before its
                all-reduce; SpMM, the sparse input projection, norms, weights and
                AdamW state stay FP32. Not in the paper (it keeps all local compute in
                FP32); for CPUs with bf16 matrix units (AMX) and GPU tensor cores.
                "tf32": the same GEMMs with FP32 operands multiplied on the tensor cores
                in TF32 (10-bit mantissa products, FP32 accumulation): a CUDA GPU's
                matmul precision set for those products only (SpMM and everything else
                as in FP32). A CPU has no TF32: refused there in one line.
    permute     "single": the graph's vertices relabeled once by the seed's random
                permutation before sharding (Plexus 5.1), for shard load balance. The
                same graph and model, but step s samples other vertices, its dropout
                masks fall on other vertices and every rank holds another shard: a
                different run (the same distribution of batches), not the same
                numbers. "double": relabeled the same way, then two adjacency
                versions per plane, the layers alternating between the labelings;
                it equals the single-permuted serial run up to float rounding
                (tested to 2e-5), and needs ``--no-residual``.

The switches that only change how fast the same numbers come are
:class:`scalegnn.perf.PerfConfig` (``cfg.perf``).
"""

from __future__ import annotations

from dataclasses import dataclass

from .settings import setting

__all__ = ["NumericsConfig", "COMM_DTYPES", "GEMM_DTYPES", "PERMUTATIONS"]

# Each value's torch dtype, by name (the configuration loads no torch: scalegnn.sections). None: as is (the
# operands' own dtype); tf32 keeps FP32 operands (the products' precision is a GPU setting)
COMM_DTYPES = {"fp32": None, "bf16": "bfloat16"}
GEMM_DTYPES = {**COMM_DTYPES, "tf32": None}
PERMUTATIONS = ("none", "single", "double")


@dataclass(kw_only=True)
class NumericsConfig:
    """What is computed beyond the model and the data: wire and GEMM precision, vertex
    order (module doc: what each value changes). The defaults are the paper's FP32
    computation on the dataset's vertex order."""

    comm_dtype: str = setting("fp32", scope="scalegnn", choices=tuple(COMM_DTYPES),
                              help="wire dtype of the 3D-PMM partial-sum all-reduces (RMSNorm/loss stay fp32)")
    gemm_dtype: str = setting("fp32", scope="scalegnn", choices=tuple(GEMM_DTYPES),
                              help="precision of the dense layer GEMMs (fp32 results; SpMM, norms, weights and "
                              "optimizer stay fp32): bf16 operands for AMX CPUs and tensor cores, or tf32 tensor-core "
                              "products (CUDA GPUs only)")
    permute: str = setting("none", scope="scalegnn", choices=PERMUTATIONS,
                           help="vertex permutation for shard load balance (Plexus 5.1); double needs --no-residual")

    def __post_init__(self):
        if self.comm_dtype not in COMM_DTYPES:
            raise ValueError(f"comm_dtype must be one of {sorted(COMM_DTYPES)}, got {self.comm_dtype!r}")
        if self.gemm_dtype not in GEMM_DTYPES:
            raise ValueError(f"gemm_dtype must be one of {sorted(GEMM_DTYPES)}, got {self.gemm_dtype!r}")
        if self.permute not in PERMUTATIONS:
            raise ValueError(f"permute must be one of {PERMUTATIONS}, got {self.permute!r}")

    @property
    def pmm_comm_dtype(self) -> torch.dtype | None:
        return _torch_dtype(COMM_DTYPES[self.comm_dtype])

    @property
    def local_gemm_dtype(self) -> torch.dtype | None:
        return _torch_dtype(GEMM_DTYPES[self.gemm_dtype])

    @property
    def tf32(self) -> bool:
        """The dense GEMMs' FP32 products in TF32 on the tensor cores (``gemm_dtype`` "tf32")."""
        return self.gemm_dtype == "tf32"

    def check_device(self, device: str) -> None:
        """Refuse a setting the device cannot compute, before any work: TF32 exists on
        CUDA GPUs only (tensor cores, Ampere and later)."""
        if self.tf32 and device == "cpu":
            raise ValueError("--gemm-dtype tf32 needs a CUDA GPU (TF32 is a tensor-core format; a CPU has none): "
                             "use --gemm-dtype fp32 or bf16 on the CPU, or --device cuda")


def _torch_dtype(name: str | None) -> torch.dtype | None:
    """``torch.<name>`` (None stays None), looked up when a run computes, not when it is configured."""
    if name is None:
        return None
    import torch

    return getattr(torch, name)
