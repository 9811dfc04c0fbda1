"""The ``perf`` section: the switches that change how fast a run goes, never what it
computes (read by :mod:`scalegnn.perf`, whose docstring says what each guarantees)."""

from __future__ import annotations

from dataclasses import dataclass

from ..settings import setting
from .sampling import SAMPLER_BACKENDS

__all__ = ["PerfConfig"]


@dataclass(kw_only=True)
class PerfConfig:
    """Optimization and measurement switches (paper V): how fast, never what (:mod:`scalegnn.perf`).

    prefetch      sample step t+1 while step t trains (V-A)
    compile       fuse RMSNorm + ReLU + dropout with torch.compile (V-C); compile time
                  is recorded apart and excluded from training time
    comm_overlap  asynchronous all-reduces in backward: feature gradient overlapped with
                  the weight-gradient GEMM, weight-gradient sync overlapped with the rest
                  of backward (V-D)
    bucket_collectives
                  fewer, larger collectives where several go the same way: the weight
                  and RMSNorm-gain gradient reductions of a step, one call per axis and
                  wire dtype; the grad-clip norm in one call instead of three
                  (scalegnn.parallel.collectives.bucketed_all_reduce)
    profile       folder for a torch.profiler trace of a few steps (one file per rank)
    sampler       sampler kernel: "auto", "torch" or "numba" (see scalegnn.sampling)
    cuda_graphs   capture the step after its sample as a CUDA graph and replay it
                  (scalegnn.parallel.step_graph); GPU only
    instrument    per-component timers (bytes are always counted); off costs nothing
    compile_backend  torch.compile backend ("inductor"; tests use "aot_eager")
    """

    prefetch: bool = setting(False, scope="scalegnn",
                             help="sample step t+1 while step t trains (background thread; CUDA side stream on GPU)")
    compile: bool = setting(False, scope="scalegnn", action="store_true",
                            help="fuse RMSNorm + ReLU + dropout with torch.compile (compile time recorded apart)")
    comm_overlap: bool = setting(False, scope="scalegnn", action="store_true",
                                 help="asynchronous gradient all-reduces in backward, overlapped with the "
                                 "weight-gradient GEMM")
    # rare: on by default; --no-bucket-collectives only measures what bucketing saves
    bucket_collectives: bool = setting(True, scope="scalegnn", rare=True,
                                       help="reduce the weight and norm gradients of a step in one all-reduce per "
                                       "axis (and the clip norm in one call); --no-bucket-collectives: one call each")
    # rare: a diagnostic (a trace to read in a profiler), not a setting of a measured run
    profile: str | None = setting(None, scope="scalegnn", metavar="DIR", output=True, rare=True,
                                  help="write a torch.profiler trace of a few training steps per rank to DIR")
    # rare: auto takes the fastest kernel here; naming one is for the sampler's benchmarks and tests
    sampler: str = setting("auto", scope="scalegnn", rare=True, choices=SAMPLER_BACKENDS,
                           help="Algorithm 2 kernel: numba on CPU when installed (auto), else vectorized torch")
    # rare: GPU only, and only with one rank per data-parallel group (scalegnn.parallel.step_graph)
    cuda_graphs: bool = setting(False, scope="scalegnn", rare=True, action="store_true",
                                help="capture the training step (forward, backward, all-reduce, AdamW) as a CUDA "
                                "graph once per batch capacity and replay it; where it cannot be captured, one "
                                "line says why and the run goes on uncaptured")
    instrument: bool = True
    compile_backend: str = "inductor"

    def __post_init__(self):
        if self.sampler not in SAMPLER_BACKENDS:
            raise ValueError(f"sampler must be one of {SAMPLER_BACKENDS}, got {self.sampler!r}")
