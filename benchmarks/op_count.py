"""Kernels a ScaleGNN training step launches, per phase, counted on any machine.

    python -m scalegnn.benchmarks.op_count [--layers 3] [--out DIR]

On a GPU nearly every top-level ATen operator is one kernel launch, and each launch
reads and writes its tensors once; the element-wise tail of a layer written as a dozen
operators is a dozen passes over a (B, H) block. That cost can be read on a CPU: this
module runs one real ``engine.train_step`` under ``torch.profiler`` and counts, per
phase of the step (the engine's spans: sampling, forward and backward inside
``fwd_bwd`` told apart by the autograd engine's ranges, and the optimizer with the
data-parallel reduction),

  * every top-level ATen operator that does work: one that, with the operators it
    calls, does more than make a view or allocate memory (:data:`NO_KERNEL`), so
    ``detach``, ``unsqueeze`` or ``empty`` count 0 and ``zeros`` (a fill) counts 1;
  * every kernel that a ``torch.compile``-d region launches (inductor's generated
    ``cpp_fused_*`` / ``triton_*`` kernels; the operators it calls outside them, such
    as ``mm``, count as operators);
  * every collective call (``c10d::``);

and lists the counted operators that take a 2-D int64 input (a (B, H) hash on a
device). A profiler, not a ``TorchDispatchMode``: under a dispatch mode
``torch.compile``-d code runs eager, operator by operator, so a mode cannot see what
the compiled step launches.

Prefetch must be off (the sample is then drawn on the step's thread, inside its
sampling span); counts are of the thread that calls the step.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

__all__ = ["NO_KERNEL", "PhaseCount", "count_step", "count_events", "kernel_profiling", "step_counts", "main"]

# Operators that make views or allocate: no kernel on a device.
NO_KERNEL = frozenset(f"aten::{n}" for n in (
    "empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided", "view", "_unsafe_view", "as_strided",
    "expand", "expand_as", "detach", "detach_", "alias", "slice", "select", "narrow", "unsqueeze", "squeeze", "t",
    "transpose", "permute", "reshape", "_reshape_alias", "view_as", "resolve_conj", "resolve_neg", "lift_fresh",
    "unbind", "split", "split_with_sizes", "chunk", "contiguous", "to", "numpy_T", "result_type", "set_",
    "_has_compatible_shallow_copy_type", "is_same_size", "size", "stride", "dim"))
PHASES = ("sampling", "fwd_bwd", "dp", "optimizer")
_BACKWARD = "autograd::engine::evaluate_function"


@dataclass
class PhaseCount:
    """What one phase of a step launched: ``ops`` (name -> calls, operators, compiled
    kernels and collectives together) and ``int64_2d`` (names of counted operators with
    a 2-D int64 input)."""

    ops: Counter = field(default_factory=Counter)
    int64_2d: Counter = field(default_factory=Counter)

    @property
    def total(self) -> int:
        return sum(self.ops.values())

    @property
    def fused_kernels(self) -> int:
        return sum(n for name, n in self.ops.items() if _is_compiled_kernel(name))


def _is_compiled_kernel(name: str) -> bool:
    return "cpp_fused" in name or name.startswith("triton_") or "_triton_" in name


def _does_work(event) -> bool:
    """An ATen operator does work unless it and every operator it calls is in NO_KERNEL."""
    if event.name.startswith("aten::") and event.name not in NO_KERNEL:
        return True
    return any(_does_work(c) for c in event.cpu_children)


def _int64_2d(event) -> bool:
    shapes, dtypes = event.input_shapes or [], getattr(event, "input_dtypes", None) or []
    return any(d == "long int" and len(s) == 2 and min(s) > 1 for s, d in zip(shapes, dtypes))


def count_events(events, thread: int | None = None) -> dict[str, PhaseCount]:
    """Counts per phase ("sample", "forward", "backward", "optimizer", "outside") of a
    profiler's events (``prof.events()``), of one thread (the profiler's thread number;
    None: the thread of the engine's "step" span, else of the first event)."""
    roots = [e for e in events if e.cpu_parent is None]
    if thread is None and roots:
        thread = next((e.thread for e in roots if e.name == "step"), roots[0].thread)
    out = {k: PhaseCount() for k in ("sample", "forward", "backward", "optimizer", "outside")}

    def phase_of(span: str | None, backward: bool) -> str:
        if span == "sampling":
            return "sample"
        if span == "fwd_bwd":
            return "backward" if backward else "forward"
        if span in ("dp", "optimizer"):
            return "optimizer"
        return "outside"

    def walk(e, span, backward):
        name = e.name
        if name.startswith("aten::"):
            if _does_work(e):
                pc = out[phase_of(span, backward)]
                pc.ops[name] += 1
                if _int64_2d(e):
                    pc.int64_2d[name] += 1
            return
        if _is_compiled_kernel(name) or name.startswith("c10d::"):
            out[phase_of(span, backward)].ops[name] += 1
            return
        span = name if name in PHASES else span
        backward = backward or name.startswith(_BACKWARD)
        for c in e.cpu_children:
            walk(c, span, backward)

    for r in roots:
        if r.thread == thread:
            walk(r, None, False)
    return out


@contextmanager
def kernel_profiling():
    """A context under which inductor compiles its CPU kernels with a profiler range
    each (off by default: without it a compiled region's kernels are invisible to the
    profiler): build (compile) the engine under it. It starts from an empty compile
    cache (``torch._dynamo.reset()``, no FX graph or AOTAutograd cache, whose entries
    compiled without the ranges would be reused)."""
    import torch._dynamo
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    torch._dynamo.reset()
    with inductor_config.patch({"cpp.enable_kernel_profile": True, "fx_graph_cache": False}), \
            functorch_config.patch({"enable_autograd_cache": False}):
        yield


def count_step(engine, step: int) -> dict[str, PhaseCount]:
    """Run ``engine.train_step(step)`` under the profiler and count its launches per phase
    (:func:`count_events`). The engine must not prefetch, and a compiled one must have
    been built under :func:`kernel_profiling` for its kernels to be counted."""
    if engine.perf.prefetch:
        raise ValueError("count_step needs an engine without prefetch: the sample is then drawn inside the step")
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        engine.train_step(step)
    return count_events(prof.events())


def _engine(layers: int, compile_backend: str | None, nodes: int, hidden: int, sampler: str = "torch"):
    from scalegnn.datasets.generators import CSBM_DEFAULTS, csbm
    from scalegnn.model import ModelConfig
    from scalegnn.optim import OptimConfig
    from scalegnn.parallel.engine import ParallelEngine
    from scalegnn.perf import PerfConfig

    params = {**CSBM_DEFAULTS, "n": nodes, "avg_degree": 10.0, "feature_dim": 32, "classes": 7}
    graph = csbm("csbm:" + ",".join(f"{k}={v}" for k, v in params.items()), 0, **params).gcn_normalize()
    perf = PerfConfig(prefetch=False, compile=compile_backend is not None,
                      compile_backend=compile_backend or "inductor", sampler=sampler)
    # the torch kernels as a GPU runs them: the sampled blocks padded, no size read back
    return ParallelEngine(graph, ModelConfig(hidden=hidden, layers=layers, dropout=0.5), OptimConfig(),
                          max(2, nodes // 10), seed=0, epochs=1, pad_samples=sampler == "torch", perf=perf)


def step_counts(layers: int, compile_backend: str | None, nodes: int = 2000, hidden: int = 64,
                sampler: str = "torch") -> dict[str, PhaseCount]:
    """The counts of step 1 of an engine on a CSBM graph (step 0 first: lazy setup),
    built and run under :func:`kernel_profiling`, so that a graph compiled at any time,
    a recompile inside a step too, has its kernels counted."""
    with kernel_profiling():
        eng = _engine(layers, compile_backend, nodes, hidden, sampler)
        try:
            eng.train_step(0)
            return count_step(eng, 1)
        finally:
            eng.close()


# (label, compile backend, the CPU's numba kernels on): the torch paths are what a GPU runs
CONFIGS = (("eager, numba kernels (CPU)", None, True), ("eager, torch kernels (a GPU's path)", None, False),
           ("--compile (inductor)", "inductor", False))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--nodes", type=int, default=2000)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--out", type=Path, default=None, help="folder for op_count.json and op_count.md")
    args = ap.parse_args(argv)
    rows, payload = [], {}
    from scalegnn import _elementwise

    for label, backend, numba_on in CONFIGS:
        enabled = _elementwise._ENABLED
        _elementwise._ENABLED = numba_on and enabled
        try:
            counts = step_counts(args.layers, backend, args.nodes, args.hidden, "auto" if numba_on else "torch")
        finally:
            _elementwise._ENABLED = enabled
        payload[label] = {k: {"total": c.total, "fused_kernels": c.fused_kernels, "ops": dict(c.ops),
                              "int64_2d": dict(c.int64_2d)} for k, c in counts.items()}
        rows.append([label] + [f"{counts[k].total} ({counts[k].fused_kernels})" for k in
                               ("sample", "forward", "backward", "optimizer")]
                    + [sum(counts[k].int64_2d.values()) for k in ("forward", "backward")])
    from scalegnn.benchmarks.common import markdown_table

    md = (f"Launches per training step, L = {args.layers}, hidden {args.hidden}, one process, torch "
          f"{torch.__version__}: operators that do work + compiled kernels (of which compiled), per phase; "
          "and the operators with a 2-D int64 input (forward, backward). The numba kernels are invisible "
          "to the profiler (they are not torch operators): that row undercounts the CPU's work.\n\n")
    md += markdown_table(["config", "sample", "forward", "backward", "optimizer", "int64 2-D fwd", "int64 2-D bwd"],
                         rows)
    print(md)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "op_count.json").write_text(json.dumps(payload, indent=1, sort_keys=True))
        (args.out / "op_count.md").write_text(md + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
