"""``scalegnn bench kernels``: the ``[compute]`` constants of a cluster profile, measured on this device.

The performance model (:mod:`scalegnn.perfmodel`) prices a step's compute with a profile's
``[compute]`` table. This benchmark measures the kernels behind each constant, once per
machine, and prints a ``[compute]`` snippet to paste into the profile::

    scalegnn bench kernels                            # cuda when there is one, else cpu
    OMP_NUM_THREADS=1 scalegnn bench kernels --device cpu --batch 2e4 --hidden 128
    scalegnn bench kernels --profile perlmutter       # beside the profile's values

Legend: B rows of the operands (``--batch``), H hidden dim (``--hidden``), nnz stored
entries of the sparse matrix (``--nnz``, default 30 B; a random CSR built on the device,
:func:`random_csr_operand`), E elements of the bandwidth buffers (``max(B H, 2^26)``: 256 MiB
a buffer, above the last-level caches; less where a quarter of the memory budget is less).
All FP32. A request whose operands need more than half the device's memory (the machine's
RAM on a CPU) is refused before anything is built.

    kernel       operation                        rate                       constant
    GEMM         (B, H) @ (H, H), torch.mm        2 B H H / t   TFLOP/s      gemm_tflops
    SpMM         CSR (B x B, nnz) @ (B, H),       2 nnz H / t   GFLOP/s      spmm_gflops (CPU model)
                 torch.sparse.mm                  bytes / t     GB/s         (checks the device model)
    copy         dst.copy_(src), E floats         8 E / t       GB/s         hbm_GBps (accelerator)
    x * y + z    torch.addcmul(z, x, y, out=w)    16 E / t      GB/s         (a second bandwidth point)

The SpMM's bytes are those the device model charges it (``perfmodel._device_terms``): per
stored entry its value and int64 column (12 bytes) and one gathered input row of H floats,
at least one 32-byte sector; the (B, H) output written once. Its effective GB/s over the
copy's says how far the model's SpMM time (those bytes at ``hbm_GBps``) is from measured.

On a GPU the GEMM runs in strict FP32 (TF32 off, as ``scalegnn train`` has it by default and
as ``gemm_tflops`` means), each repetition is timed with CUDA events after a
``torch.cuda.synchronize()``, and ``hbm_GBps`` and ``gemm_tflops`` go into the snippet. On a
CPU ``spmm_gflops`` and ``gemm_tflops`` do (a CPU profile leaves ``hbm_GBps`` unset: a value
there switches the model to the accelerator terms); the local profiles' constants are one
core's, so measure them with ``OMP_NUM_THREADS=1``. Repetitions interleave the kernels (a
background load hits all alike) after a warm-up; the medians give the rates, the JSON keeps
every repetition.
"""

from __future__ import annotations

import math
import platform
import statistics
import time
import warnings
from contextlib import nullcontext
from dataclasses import dataclass

import torch

from scalegnn.fileio import physical_memory
from scalegnn.parallel.context import cuda_fp32_matmuls
from scalegnn.perfmodel import SECTOR_BYTES

from .common import machine_info, markdown_table

__all__ = ["KernelRun", "check_arguments", "gemm_flops", "spmm_flops", "spmm_model_bytes", "copy_bytes",
           "elementwise_bytes", "kernel_rates", "operand_bytes", "random_csr_operand", "compute_snippet",
           "snippet_toml", "profile_comparison", "kernels_bench", "KERNELS", "RATIO_BAND"]

KERNELS = ("gemm", "spmm", "copy", "elementwise")
NNZ_PER_ROW = 30  # the default --nnz is 30 B: a sampled block's density at the paper's batch sizes
BANDWIDTH_ELEMENTS = 1 << 26  # 256 MiB a float32 buffer: well past any last-level cache, so memory is measured
MEMORY_FRACTION = 0.5  # operands may take at most this share of the device's memory (the machine's RAM on a CPU)
RATIO_BAND = (0.5, 2.0)  # measured / profile outside this band is flagged


# --------------------------------------------------------------------------- the arithmetic (pure)
def gemm_flops(batch: float, hidden: float) -> float:
    """FLOPs of the layer GEMM (B, H) @ (H, H): 2 B H H."""
    return 2.0 * batch * hidden * hidden


def spmm_flops(nnz: float, hidden: float) -> float:
    """FLOPs of a CSR SpMM with nnz entries times a dense (., H): 2 nnz H (the CPU model's count)."""
    return 2.0 * nnz * hidden


def spmm_model_bytes(nnz: float, rows: float, cols: float) -> float:
    """Bytes the device model charges one CSR SpMM (``perfmodel._device_terms``): per entry
    12 bytes (FP32 value, int64 column) and one gathered input row of ``cols`` floats, at
    least a sector; the (rows, cols) output written once. Row pointers are not counted."""
    return nnz * (12.0 + max(SECTOR_BYTES, 4.0 * cols)) + 4.0 * rows * cols


def copy_bytes(elements: float) -> float:
    """Bytes a float32 copy of ``elements`` moves: each read once and written once."""
    return 8.0 * elements


def elementwise_bytes(elements: float) -> float:
    """Bytes of ``w = x * y + z`` over ``elements`` float32s in one pass: three reads, one write."""
    return 16.0 * elements


def kernel_rates(median_s: dict, batch: float, hidden: float, nnz: float, elements: float) -> dict:
    """Rates from the median seconds per kernel (keys of :data:`KERNELS`) and the sizes:
    ``gemm_tflops``, ``spmm_gflops``, ``spmm_effective_GBps`` (the model's SpMM bytes / t),
    ``copy_GBps`` and ``elementwise_GBps`` (GB = 1e9 bytes)."""
    return {"gemm_tflops": gemm_flops(batch, hidden) / median_s["gemm"] / 1e12,
            "spmm_gflops": spmm_flops(nnz, hidden) / median_s["spmm"] / 1e9,
            "spmm_effective_GBps": spmm_model_bytes(nnz, batch, hidden) / median_s["spmm"] / 1e9,
            "copy_GBps": copy_bytes(elements) / median_s["copy"] / 1e9,
            "elementwise_GBps": elementwise_bytes(elements) / median_s["elementwise"] / 1e9}


GENERATION_BYTES_PER_ENTRY = 40  # random_csr_operand's scratch: drawn keys, sorted keys and sort scratch, rows


def operand_bytes(batch: int, hidden: int, nnz: int, elements: int) -> int:
    """Bytes the run asks of the device, counted high: X, the GEMM's and the SpMM's (B, H)
    outputs and W (H, H); the CSR (8 bytes a row pointer, 12 an entry); the four bandwidth
    buffers of E floats; and the CSR's generation scratch (:data:`GENERATION_BYTES_PER_ENTRY`),
    as if a caching allocator still held it."""
    dense = 3 * 4 * batch * hidden + 4 * hidden * hidden
    csr = 8 * (batch + 1) + 12 * nnz
    return dense + csr + 4 * 4 * elements + GENERATION_BYTES_PER_ENTRY * nnz


def random_csr_operand(n: int, nnz: int, device, seed: int = 0) -> torch.Tensor:
    """A random (n, n) CSR tensor of exactly ``nnz`` entries, built on ``device``: nnz uniform
    draws of a position ``row * n + col``, sorted (so rows ascend and columns ascend within a
    row), int64 row pointers and columns, float32 values in [0, 1). A repeated draw (chance
    about nnz / n^2 each) stays a second entry, which an SpMM sums like any other; a sort, not
    a unique, keeps the count exact and the generation cheap."""
    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(seed)
    key = torch.sort(torch.randint(0, n * n, (nnz,), generator=gen, device=device)).values
    rows = torch.div(key, n, rounding_mode="floor")
    cols = key - rows * n
    del key
    crow = torch.zeros(n + 1, dtype=torch.int64, device=device)
    crow[1:] = torch.cumsum(torch.bincount(rows, minlength=n), 0)
    del rows
    values = torch.rand(nnz, generator=gen, device=device)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*Sparse CSR tensor support is in beta.*")
        return torch.sparse_csr_tensor(crow, cols, values, (n, n), check_invariants=False)


def _significant(value: float, digits: int = 3) -> float:
    return float(f"{value:.{digits}g}")


def compute_snippet(rates: dict, accelerator: bool) -> dict:
    """The ``[compute]`` values the model reads from these rates (3 significant digits):
    ``gemm_tflops`` always; ``hbm_GBps`` (the copy's bandwidth) on an accelerator, where SpMM,
    element-wise work and sampling are priced in bytes; ``spmm_gflops`` on a CPU."""
    out = {"gemm_tflops": _significant(rates["gemm_tflops"])}
    if accelerator:
        out["hbm_GBps"] = _significant(rates["copy_GBps"])
    else:
        out["spmm_gflops"] = _significant(rates["spmm_gflops"])
    return out


def snippet_toml(values: dict, device_name: str, accelerator: bool) -> str:
    """``values`` as a ``[compute]`` table to paste into a profile, with what each measured."""
    why = {"gemm_tflops": "FP32 GEMM (B, H) @ (H, H)", "hbm_GBps": "float32 copy, read + write",
           "spmm_gflops": "CSR SpMM, 2 nnz H / t"}
    lines = [f"[compute]                   # measured by `scalegnn bench kernels` on {device_name}"]
    lines += [f"{k} = {v:g}".ljust(28) + f"# {why[k]}" for k, v in values.items()]
    lines.append("# spmm_gflops: unused on an accelerator (SpMM priced in bytes at hbm_GBps)" if accelerator else
                 "# hbm_GBps: leave unset on a CPU (a value > 0 switches the model to its accelerator terms)")
    return "\n".join(lines)


def profile_comparison(measured: dict, compute) -> list[dict]:
    """Measured constants beside a profile's ``[compute]`` (:class:`scalegnn.sweeps.profiles.Compute`):
    one dict per measured constant with ``measured / profile`` and ``outside`` (the ratio
    outside :data:`RATIO_BAND`); ``profile`` and ``ratio`` None where the profile has no
    value > 0 (a CPU profile's ``hbm_GBps``)."""
    rows = []
    for key, value in measured.items():
        ref = float(getattr(compute, key, 0.0) or 0.0)
        if ref <= 0:
            rows.append({"constant": key, "measured": value, "profile": None, "ratio": None, "outside": False})
            continue
        ratio = value / ref
        rows.append({"constant": key, "measured": value, "profile": ref, "ratio": ratio,
                     "outside": not RATIO_BAND[0] <= ratio <= RATIO_BAND[1]})
    return rows


# --------------------------------------------------------------------------- arguments
@dataclass(frozen=True)
class KernelRun:
    """A checked ``scalegnn bench kernels`` request (:func:`check_arguments`)."""

    device: str  # "cpu" or "cuda:<index>"
    batch: int
    hidden: int
    nnz: int
    reps: int
    elements: int
    profile: object = None  # a ClusterProfile, or None

    @property
    def accelerator(self) -> bool:
        return self.device != "cpu"


def _whole(flag: str, value, low: int, fix: str) -> int:
    if value is None or not math.isfinite(value) or value != int(value) or value < low:
        raise ValueError(f"{flag} must be a whole number >= {low:,}, got {value!r}; {fix}")
    return int(value)


def _device_memory(device: str) -> int:
    if device == "cpu":
        return physical_memory()
    return int(torch.cuda.get_device_properties(torch.device(device)).total_memory)


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def check_arguments(args) -> KernelRun:
    """The request in ``args`` (the parser's namespace), checked before any work: sizes, the
    device, the cluster profile, and that the operands fit in half the device's memory.
    Raises ValueError with one line naming the flag and the fix."""
    batch = _whole("--batch", args.batch, 1, "pass the rows of the operands, e.g. --batch 2.4e5")
    hidden = _whole("--hidden", args.hidden, 1, "pass the hidden dim, e.g. --hidden 256")
    reps = _whole("--reps", args.reps, 1, "pass the repetitions to take the median of, e.g. --reps 10")
    if args.nnz is None:
        nnz = min(NNZ_PER_ROW * batch, batch * batch)
    else:
        nnz = _whole("--nnz", args.nnz, batch, f"pass at least one entry a row (--batch {batch:,}), or leave "
                     f"--nnz out for {NNZ_PER_ROW} a row")
        if nnz > batch * batch:
            raise ValueError(f"--nnz {nnz:,} is more than the {batch * batch:,} entries of a {batch:,} x {batch:,} "
                             f"matrix; lower --nnz or raise --batch")
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError(f"--device {device}: torch {torch.__version__} sees no CUDA device here; "
                             "run with --device cpu, or on a machine with a GPU")
        index = device.partition(":")[2]
        if index and not (index.isdigit() and int(index) < torch.cuda.device_count()):
            raise ValueError(f"--device {device}: this machine has CUDA devices 0 to {torch.cuda.device_count() - 1}; "
                             "pass one of them, e.g. --device cuda:0")
        device = f"cuda:{int(index) if index else torch.cuda.current_device()}"
    elif device != "cpu":
        raise ValueError(f"--device {device!r} is not a device this benchmark runs on; pass cpu or cuda")
    profile = None
    if args.profile is not None:
        from scalegnn.sweeps import load_profile

        profile = load_profile(args.profile)  # a ProfileError (ValueError) names the known profiles
    budget = MEMORY_FRACTION * _device_memory(device)
    # The bandwidth buffers' floor takes at most a quarter of the budget (4 buffers of 4 bytes):
    # on a small machine a smaller floor, not a refusal of every size.
    elements = max(batch * hidden, min(BANDWIDTH_ELEMENTS, int(budget // 64)))
    need = operand_bytes(batch, hidden, nnz, elements)
    if need > budget:
        where = "this machine's RAM" if device == "cpu" else f"{device}'s memory"
        raise ValueError(f"--batch {batch:,} --hidden {hidden:,} --nnz {nnz:,} needs about {_gib(need)}, more than "
                         f"half of {where} ({_gib(budget / MEMORY_FRACTION)}); lower --batch, --hidden or --nnz")
    return KernelRun(device, batch, hidden, nnz, reps, elements, profile)


# --------------------------------------------------------------------------- measurement
def _device_name(device: str) -> str:
    if device != "cpu":
        return torch.cuda.get_device_name(torch.device(device))
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def _timer(device: str):
    """``time(fn) -> seconds`` of one call of ``fn``: on a GPU between CUDA events recorded
    after a synchronize (the kernels run asynchronously; the events time the device), on a
    CPU by the wall clock."""
    if device == "cpu":
        def time_cpu(fn) -> float:
            t = time.perf_counter()
            fn()
            return time.perf_counter() - t
        return time_cpu

    dev = torch.device(device)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def time_cuda(fn) -> float:
        torch.cuda.synchronize(dev)
        start.record()
        fn()
        stop.record()
        torch.cuda.synchronize(dev)
        return start.elapsed_time(stop) / 1e3  # ms -> s
    return time_cuda


def _operands(run: KernelRun) -> tuple[dict, int]:
    """The kernels to time (name -> a call) on their operands, and the CSR's stored entries."""
    dev = torch.device(run.device)
    adj = random_csr_operand(run.batch, run.nnz, dev, seed=0)
    gen = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(run.batch, run.hidden, generator=gen, device=dev)
    w = torch.randn(run.hidden, run.hidden, generator=gen, device=dev) / math.sqrt(run.hidden)
    y = torch.empty(run.batch, run.hidden, device=dev)
    # Constant fills, not random draws: cheap on 256 MiB, and no denormals to slow a CPU down.
    src, dst = torch.full((run.elements,), 1.0, device=dev), torch.empty(run.elements, device=dev)
    b, c = torch.full((run.elements,), 0.5, device=dev), torch.full((run.elements,), 0.25, device=dev)
    calls = {"gemm": lambda: torch.mm(x, w, out=y),
             "spmm": lambda: torch.sparse.mm(adj, x),
             "copy": lambda: dst.copy_(src),
             "elementwise": lambda: torch.addcmul(c, src, b, out=dst)}
    return calls, adj.values().numel()


def _measure(run: KernelRun) -> tuple[dict, int]:
    """Seconds of every repetition per kernel (interleaved, after a warm-up), and the CSR's entries."""
    # On a GPU its own device is current throughout: the events and the kernels' streams are that device's.
    on_device = torch.cuda.device(torch.device(run.device)) if run.accelerator else nullcontext()
    with on_device, cuda_fp32_matmuls(tf32=False), warnings.catch_warnings():
        calls, nnz = _operands(run)
        time_one = _timer(run.device)
        warmup = 2 if run.accelerator else 1  # first calls: library handles, plan buffers, allocator growth
        times = {k: [] for k in KERNELS}
        warnings.filterwarnings("ignore", message=".*Sparse CSR tensor support is in beta.*")
        for _ in range(warmup):
            for k in KERNELS:
                time_one(calls[k])
        for _ in range(run.reps):
            for k in KERNELS:
                times[k].append(time_one(calls[k]))
    return times, nnz


# --------------------------------------------------------------------------- report
def _vendor_lines(spec, rates: dict) -> tuple[list[str], dict | None]:
    if spec is None:
        return [], None
    vendor = {"name": spec.name, "fp32_tflops": spec.fp32_tflops, "hbm_GBps": spec.hbm_TBps * 1e3,
              "source": spec.source, "gemm_of_peak": rates["gemm_tflops"] / spec.fp32_tflops,
              "copy_of_peak": rates["copy_GBps"] / (spec.hbm_TBps * 1e3)}
    lines = [f"Vendor peak ({spec.name}; {spec.source}): FP32 {spec.fp32_tflops:g} TFLOP/s, memory "
             f"{spec.hbm_TBps * 1e3:g} GB/s; measured / peak: GEMM {vendor['gemm_of_peak']:.2f}, "
             f"copy {vendor['copy_of_peak']:.2f}."]
    return lines, vendor


def _profile_lines(profile, measured: dict, snippet: dict) -> tuple[list[str], dict | None]:
    if profile is None:
        return [], None
    rows = profile_comparison(measured, profile.compute)
    table = []
    for r in rows:
        notes = [] if r["constant"] in snippet else ["not in this device's snippet"]
        if r["profile"] is None:
            table.append([r["constant"], r["measured"], "-", "-", "; ".join(notes + ["the profile has none"])])
            continue
        if r["outside"]:
            notes.insert(0, f"outside [{RATIO_BAND[0]:g}, {RATIO_BAND[1]:g}] of the profile")
        table.append([r["constant"], r["measured"], r["profile"], f"{r['ratio']:.3g}", "; ".join(notes)])
    lines = [f"Against the profile {profile.name!r} ([compute] of its file):", "",
             markdown_table(["constant", "measured", "profile", "measured / profile", "note"], table)]
    return lines, {"name": profile.name, "rows": rows}


def kernels_bench(args) -> tuple[dict, str]:
    """``scalegnn bench kernels``: check the request, time GEMM, SpMM, copy and ``x * y + z``
    on the device, and return the payload (every repetition, medians, rates, the ``[compute]``
    snippet) and its Markdown (the table, the snippet, the vendor's peak and the profile's
    values where known)."""
    run = check_arguments(args)
    machine = machine_info()
    t0 = time.perf_counter()
    times, nnz = _measure(run)
    measure_s = time.perf_counter() - t0
    median_s = {k: statistics.median(v) for k, v in times.items()}
    rates = kernel_rates(median_s, run.batch, run.hidden, nnz, run.elements)
    snippet = compute_snippet(rates, run.accelerator)
    name = _device_name(run.device)
    toml = snippet_toml(snippet, name, run.accelerator)
    from scalegnn.benchmarks.roofline import device_spec

    vendor_md, vendor = _vendor_lines(device_spec(name) if run.accelerator else None, rates)
    measured = {"gemm_tflops": rates["gemm_tflops"], "spmm_gflops": rates["spmm_gflops"],
                "hbm_GBps": rates["copy_GBps"]}
    profile_md, profile = _profile_lines(run.profile, measured, snippet)

    B, H, E = run.batch, run.hidden, run.elements
    shapes = {"gemm": f"({B:,}, {H}) @ ({H}, {H})", "spmm": f"CSR ({B:,} x {B:,}, {nnz:,} nnz) @ ({B:,}, {H})",
              "copy": f"{E:,} float32", "elementwise": f"3 x {E:,} float32 in, {E:,} out"}
    ms = {k: v * 1e3 for k, v in median_s.items()}
    rows = [["GEMM FP32", shapes["gemm"], ms["gemm"], rates["gemm_tflops"], "TFLOP/s"],
            ["SpMM FP32", shapes["spmm"], ms["spmm"], rates["spmm_gflops"], "GFLOP/s"],
            ["SpMM FP32 (model's bytes)", shapes["spmm"], ms["spmm"], rates["spmm_effective_GBps"], "GB/s"],
            ["copy", shapes["copy"], ms["copy"], rates["copy_GBps"], "GB/s"],
            ["x * y + z", shapes["elementwise"], ms["elementwise"], rates["elementwise_GBps"], "GB/s"]]
    threads = "" if run.accelerator else f", {torch.get_num_threads()} torch threads"
    md = [f"Kernel throughput on {name} ({run.device}, float32{threads}; median of {run.reps} repetitions "
          f"after warm-up; benchmarks/kernels.py). Load average {machine['load_avg_1m']}.", "",
          markdown_table(["kernel", "shape", "median ms", "measured rate", "unit"], rows), "",
          f"SpMM bytes as the device model charges them: {spmm_model_bytes(nnz, B, H) / 1e6:.4g} MB "
          f"(12 + max({SECTOR_BYTES}, 4 H) per entry, 4 B H output); effective "
          f"{rates['spmm_effective_GBps']:.3g} GB/s = {rates['spmm_effective_GBps'] / rates['copy_GBps']:.2f} of the "
          "copy's bandwidth.", "",
          "Paste into the profile (sweeps/profiles/<name>.toml):", "", "```toml", toml, "```"]
    if not run.accelerator:
        md += ["", "A CPU profile's constants are one rank's; the local profiles' are one core's "
               "(measure them with OMP_NUM_THREADS=1)."]
    if vendor_md:
        md += [""] + vendor_md
    if profile_md:
        md += [""] + profile_md
    payload = {"bench": "kernels", "device": run.device, "device_name": name, "dtype": "float32",
               "accelerator": run.accelerator, "tf32": False,
               "torch_threads": None if run.accelerator else torch.get_num_threads(),
               "batch": B, "hidden": H, "nnz_requested": run.nnz, "nnz": nnz, "elements": E, "reps": run.reps,
               "shapes": shapes,
               "flops": {"gemm": gemm_flops(B, H), "spmm": spmm_flops(nnz, H)},
               "bytes": {"spmm_model": spmm_model_bytes(nnz, B, H), "copy": copy_bytes(E),
                         "elementwise": elementwise_bytes(E)},
               "times_s": times, "median_ms": ms, "rates": rates, "snippet": snippet, "snippet_toml": toml,
               "vendor": vendor, "profile": profile,
               "memory": {"operand_bytes": operand_bytes(B, H, run.nnz, E), "device_bytes": _device_memory(run.device)},
               "measure_s": measure_s, "machine": machine, "load_avg_1m_after": machine_info()["load_avg_1m"]}
    return payload, "\n".join(md)
