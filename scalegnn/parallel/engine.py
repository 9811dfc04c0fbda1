"""The training engine: Algorithm 1 on the 4D grid, on the run's device.

There is one engine. A single process is the 1x1x1x1 grid (every collective is a
no-op there); the serial model and sampler of :mod:`scalegnn.model` and
:mod:`scalegnn.sampling` are the references the tests hold it to.

One ``train_step(step)`` on every rank of the ``Gd x Gx x Gy x Gz`` grid:

  1. sample: data-parallel group g draws ``S = sample_vertices(N, B, seed, step, g)``
     and every rank extracts its shards without communicating (Algorithm 2);
  2. forward / backward of the 3D-parallel model (paper IV-C), loss = mean over the
     group's sampled labeled training vertices (Eq. 12), the batch's accuracy counts
     from the loss's own collectives; with ``perf.bucket_collectives`` the weight
     gradients' 3D reductions go in one call per axis (ParallelContext buckets);
  3. data-parallel all-reduce of the weight gradients, averaged over the groups
     whose sample holds at least one labeled training vertex (paper IV-A), fused
     with the loss and accuracy counts into one buffer;
  4. global-norm clipping (each shard counted once: replicas excluded) and AdamW
     on the local shards (element-wise, so it equals the serial update). With
     sparse features and ``--sparse-input-update`` W_in's gradient is row-sparse and
     its update lazy (:mod:`scalegnn.optim`): the rows of the features present in
     the batch, the same rows on every replica of W_in.

With Gd = 1 and the same seed, every step reproduces the serial reference: same
sample, same dropout mask, same loss and same updated weights (up to float
summation order). Steps per epoch: ``ceil(ceil(N / B) / Gd)``.

Device. Everything a step touches lives on the engine's device: the CSR planes of
the shard, the features (dense or CSR), labels and masks, the parameters, the
optimizer state, the sampler's compact maps, the evaluation batch. A step never
reads a device value back on the host: the loss, the accuracy counts and the
"no labeled vertex anywhere" decision stay device tensors (:class:`StepResult`;
the fused AdamW skips its update on the device through ``found_inf``, the same
mechanism as mixed-precision loss scaling), and the per-component times are CUDA
event pairs resolved when the loop reads them, once per epoch. The sampler pads its
blocks to a capacity instead of reading their sizes (:mod:`scalegnn.parallel.dist_sampling`):
its one read per batch, the flag that every block fitted, happens on the prefetch
thread when ``--prefetch`` is on.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections import defaultdict

import torch

from .._compiled import CompiledKernels
from ..csr import is_csr
from ..device import indexed_device, synchronize
from ..graph import Graph
from ..loop import EvalResult, StepResult
from ..model import ModelConfig
from ..numerics import NumericsConfig
from ..optim import OptimConfig, device_lr, make_optimizer, use_sparse_input_update
from ..perf import PerfConfig, Prefetcher, StepProfiler
from ..rowsparse import grad_values, row_sparse_grad
from ..sampling import steps_per_epoch
from ..timing import SpanTimer
from .collectives import CommStats, all_reduce, all_reduce_world
from .context import ParallelContext
from .dist_sampling import DistributedSampler, ShardedBatch
from .grid import PMM_AXES, ProcessGrid
from .losses import parallel_accuracy_counts, parallel_bce, parallel_cross_entropy
from .losses import warm_up_compiled as warm_up_compiled_loss
from .model import ParallelScaleGNN, assemble_shards, full_shapes
from .sharding import RankShard, build_rank_shard
from .step_graph import StepGraphs, capture_obstacle, graph_backend
from .tail import warm_up_compiled

_log = logging.getLogger(__name__)


def compile_preflight(device: torch.device | str, backend: str = "inductor") -> str | None:
    """None when ``torch.compile(backend=...)`` can build kernels for ``device`` here, else
    why not, in one line. Inductor builds its kernels at first use: on a GPU through
    Triton, which compiles a launcher with the system C compiler against Python.h; on the
    CPU with a C++ compiler. A bare GPU image may lack either (the other backends,
    e.g. "aot_eager", build nothing)."""
    import shutil
    import sysconfig
    from pathlib import Path

    if backend != "inductor":
        return None
    if torch.device(device).type == "cuda":
        try:
            import triton  # noqa: F401
        except ImportError:
            return "inductor on a GPU needs Triton, which this environment lacks (pip install triton)"
        compilers = [os.environ.get("CC"), "cc", "gcc", "clang"]
        header = Path(sysconfig.get_paths()["include"]) / "Python.h"
        if not header.is_file():
            return f"Triton builds its launcher against Python.h, which is not at {header} (install python3-dev)"
    else:
        compilers = [os.environ.get("CXX"), "c++", "g++", "clang++"]
    if not any(c and shutil.which(c) for c in compilers):
        return f"no C{'' if torch.device(device).type == 'cuda' else '++'} compiler on PATH (tried " \
               f"{', '.join(c for c in compilers if c)}) to build inductor's kernels"
    return None


__all__ = ["ParallelEngine", "COMPONENTS", "MP_KINDS", "compile_preflight", "read_whole_state"]

# Components reported per epoch (cumulative seconds). They partition the step time:
#   sampling     time the step waited for its batch (all of it without prefetch)
#   spmm, gemm   local sparse / dense products, forward and backward
#   pmm_comm     3D-PMM-group collectives: partial sums, RMSNorm, loss, reshard
#   elementwise  the rest of forward/backward: norm, ReLU, dropout, residual, loss, autograd
#   dp_comm      data-parallel gradient all-reduce (and the clip-norm reduction)
#   optimizer    clipping and AdamW
#   other        what is left of the step's time (bookkeeping)
# On a GPU each is the time between CUDA events on the compute stream, so the parts
# add up to the GPU's time for the step, idle gaps included.
COMPONENTS = ("sampling", "spmm", "gemm", "elementwise", "pmm_comm", "dp_comm", "optimizer", "other")
# Collective kinds that count as 3D-PMM-group communication inside forward/backward.
MP_KINDS = ("pmm_x", "pmm_y", "pmm_z", "norm", "loss", "reshard")


def _release_free_heap() -> None:
    """Hand the C heap's free pages back to the OS (glibc ``malloc_trim``; a no-op where
    the C library has none). Freed tensors below glibc's mmap threshold (which grows up
    to 32 MiB as large blocks are freed) stay in its heap: after ten training steps on a
    500k-vertex graph the process held 0.85 GiB of such free pages, and the full-graph
    evaluation's own peak came on top of them. Called around each evaluation (rare
    enough that the pages the next steps fault back in cost nothing measurable)."""
    global _MALLOC_TRIM
    if _MALLOC_TRIM is None:
        import ctypes
        import ctypes.util

        try:
            _MALLOC_TRIM = ctypes.CDLL(ctypes.util.find_library("c") or None).malloc_trim
        except (OSError, AttributeError, TypeError):
            _MALLOC_TRIM = False
    if _MALLOC_TRIM:
        _MALLOC_TRIM(0)


_MALLOC_TRIM = None  # glibc's malloc_trim once looked up; False where there is none


def _dropout_seed(seed: int, dp_index: int) -> int:
    """Group 0 uses ``seed`` (as the serial reference); other groups get their own stream."""
    return seed if dp_index == 0 else seed + 0x9E3779B1 * dp_index


class ParallelEngine:
    """4D parallel ScaleGNN training on this rank's shards (every rank builds one).

    Args:
        graph: the GCN-normalized full graph (every rank cuts its shard from it), or
            None when ``shard`` is given (loaded with :func:`scalegnn.shards.load_shard`).
        model_cfg, optim_cfg: the model and AdamW settings.
        batch_size: B, sampled vertices per step (N: full-graph training).
        seed: the run's seed (weights, samples, dropout); epochs: for the LR schedule.
        grid: the :class:`ProcessGrid` (default: the single process, 1x1x1x1).
        shard: a prebuilt :class:`RankShard` for this rank (on any device).
        device: where everything lives and runs (``torch.device``; default the CPU).
        pmm_comm_dtype: e.g. ``torch.bfloat16`` for 3D-PMM partial sums (paper V-B);
            overrides ``numerics.comm_dtype``.
        use_index_map: persistent compact column maps for the torch sampler kernel.
        pad_samples: pad the torch sampler kernel's blocks to a capacity, reading no size
            back (default: on a device, not on the CPU; the same products either way).
        perf: :class:`scalegnn.perf.PerfConfig` switches (prefetch, compile, comm
            overlap, bucketing, profile, sampler kernel, instrumentation).
        numerics: :class:`scalegnn.numerics.NumericsConfig` (comm and GEMM dtypes,
            vertex permutation).
    """

    system = "scalegnn"

    def __init__(self, graph: Graph | None, model_cfg: ModelConfig, optim_cfg: OptimConfig, batch_size: int,
                 seed: int = 0, epochs: int = 1, *, grid: ProcessGrid | None = None, shard: RankShard | None = None,
                 device: torch.device | str = "cpu", pmm_comm_dtype: torch.dtype | None = None,
                 use_index_map: bool = True, pad_samples: bool | None = None, perf: PerfConfig | None = None,
                 numerics: NumericsConfig | None = None):
        grid = grid if grid is not None else ProcessGrid.single()
        perf = perf if perf is not None else PerfConfig()
        numerics = numerics if numerics is not None else NumericsConfig()
        device = indexed_device(device)
        numerics.check_device(device.type)
        if numerics.permute == "double" and model_cfg.residual:  # whether the shards are built here or loaded
            raise ValueError("--permute double needs --no-residual: the residual add would need an "
                             "all-to-all row permutation per layer (Plexus' model has no residual)")
        if shard is None:
            if graph is None:
                raise ValueError("give the normalized graph or this rank's shard")
            if graph.meta.get("normalized") != "gcn":
                raise ValueError("the engine needs the GCN-normalized graph: call graph.gcn_normalize() first")
            sigma = None
            if numerics.permute == "double":  # Plexus 5.1; the graph is already relabeled by P_c (prepare_graph)
                from ..permutation import double_sigma

                sigma = double_sigma(graph.num_nodes, seed)
            shard = build_rank_shard(graph, grid, sigma=sigma)
        if device.type == "cuda":  # this thread's current device: streams, events and allocations default to it
            torch.cuda.set_device(device)
        shard = shard.to(device)
        self.grid, self.shard, self.seed, self.perf, self.device = grid, shard, seed, perf, device
        self.dp_index = grid.axis_index("dp")
        self.dropout_seed = _dropout_seed(seed, self.dp_index)
        self.sampler = DistributedSampler(shard, grid, batch_size, seed=seed, use_index_map=use_index_map,
                                          backend=perf.sampler, padded=pad_samples)
        self.batch_size = self.sampler.batch_size
        self.steps_per_epoch = steps_per_epoch(shard.num_nodes, self.batch_size, grid.axis_size("dp"))
        self.multilabel = shard.multilabel
        self.model = ParallelScaleGNN(shard.num_features, shard.num_classes, model_cfg, grid, seed=seed).to(device)
        self.params = list(self.model.named_parameters())
        # W_in's gradient and update row-sparse with sparse features (scalegnn.optim):
        # the GEMM builds the gradient that way, the optimizer updates only its rows.
        # Sparse: the batches' features are CSR (the sampler's choice, training_features).
        self.sparse_input_update = use_sparse_input_update(optim_cfg.sparse_input_update,
                                                           is_csr(self.sampler.features), device)
        # --cuda-graphs: whether this configuration's steps can be captured (step_graph
        # module doc); if not, one line says why and the run goes on uncaptured.
        self.cuda_graphs_fallback = None
        if perf.cuda_graphs:
            self.cuda_graphs_fallback = capture_obstacle(
                device=device, pmm_ranks=grid.world_size // grid.axis_size("dp"), dp_ranks=grid.axis_size("dp"),
                backend=grid.backend, padded=self.sampler.padded,
                sparse_features=is_csr(self.sampler.features), row_sparse_update=self.sparse_input_update)
            if self.cuda_graphs_fallback is not None:
                _log.warning("--cuda-graphs: %s; the run goes on uncaptured", self.cuda_graphs_fallback)
        captured = perf.cuda_graphs and self.cuda_graphs_fallback is None
        self.optimizer, self.scheduler = make_optimizer(
            self.model.parameters(), optim_cfg, total_steps=epochs * self.steps_per_epoch,
            row_sparse=self.sparse_input_update, lr_device=device if captured else None,
        )
        self.grad_clip = optim_cfg.grad_clip
        comm_dtype = pmm_comm_dtype if pmm_comm_dtype is not None else numerics.pmm_comm_dtype
        # Three timers, resolved together when the loop reads the components: the step's
        # phases (always on: five spans a step), the local products and the collectives
        # (with ``perf.instrument``; bytes are counted either way).
        self._phases = SpanTimer(device)
        self._timer = SpanTimer(device, enabled=perf.instrument)
        self._stats = CommStats(timing=perf.instrument, device=device)
        fused = CompiledKernels(perf.compile_backend) if perf.compile else None
        self.pc = ParallelContext(grid, self._stats, self._timer, comm_dtype, overlap=perf.comm_overlap,
                                  fused=fused, sparse_input_grad=self.sparse_input_update,
                                  bucket=perf.bucket_collectives, gemm_dtype=numerics.local_gemm_dtype,
                                  tf32=numerics.tf32)
        if self.pc.defers_weight_grads:
            self.model.defer_weight_grad_sync(self.pc)
        self.eval_stats = CommStats(timing=False)  # evaluation traffic, kept out of the per-epoch training counters
        self._eval_pc = ParallelContext(grid, self.eval_stats, None, comm_dtype, fused=fused,
                                        gemm_dtype=numerics.local_gemm_dtype, tf32=numerics.tf32)
        self._components: dict[str, float] = defaultdict(float)
        self.comm_bytes: dict[str, int] = defaultdict(int)
        self.comm_calls: dict[str, int] = defaultdict(int)
        self.last_batch: ShardedBatch | None = None
        self.compile_time_s, self.compile_fallback = 0.0, None
        if perf.compile:
            self.compile_time_s, self.compile_fallback = self._compile_or_fall_back(perf.compile_backend)
        if self.device.type == "cpu" and not perf.compile:  # the CPU layer tail's numba kernels, out of step 1's time
            from .. import _elementwise

            _elementwise.warm_up(self.model.w_in.dtype)  # seconds on a first run, a cache load after
        self._prefetcher: Prefetcher | None = None  # started by the first step (paper V-A)
        self._profiler = StepProfiler(perf.profile, grid.rank)
        self.graphs = (StepGraphs(self._step_body, device, graph_backend(device), on_capture=self._untimed,
                                  accounts=self._stats) if captured else None)
        self.sampler.hold_capacity = captured  # a capture per capacity: capacities only grow

    # ------------------------------------------------------------------ helpers
    def _compile_or_fall_back(self, backend: str) -> tuple[float, str | None]:
        """Compile the fused tail (:meth:`_warm_up_compile`), or, when this machine cannot
        (:func:`compile_preflight`, or the first compilation fails), run it eager: the same
        formula (perf module doc), one warning line, and the reason in the record
        (``compile_fallback``) instead of a run lost in its constructor."""
        reason = compile_preflight(self.device, backend)
        if reason is None:
            try:
                return self._warm_up_compile(), None
            except Exception as exc:  # a backend's build step (Triton's launcher, inductor's C++) failed
                reason = f"the first compilation failed: {type(exc).__name__}: {str(exc).strip().splitlines()[0][:200]}"
        self.pc.fused = self._eval_pc.fused = None
        _log.warning("--compile: %s; the fused tail runs eager (same results, unfused)", reason)
        return 0.0, reason

    def _warm_up_compile(self) -> float:
        """Compile the layer tail's and the loss's phases before training (V-C) for every
        way training and evaluation call them (the ``warm_up_compiled`` of
        :mod:`~scalegnn.parallel.tail` and :mod:`~scalegnn.parallel.losses`: the same
        argument types, gradients, optional inputs and ints), and return the seconds it
        took: recorded apart, as the paper does, and kept out of the epoch time; no
        frame compiles after it. ``dynamic=True`` makes one graph serve every batch size."""
        cfg = self.model.config
        t0 = time.perf_counter()
        dtype = self.model.w_in.dtype
        warm_up_compiled(self.pc, cfg.hidden, cfg.norm_eps, cfg.dropout, cfg.post_norm, cfg.residual, self.device,
                         dtype)
        warm_up_compiled_loss(self.pc, self.multilabel, self.shard.num_classes, self.model.class_range[0],
                              self.device, dtype)
        synchronize(self.device)
        return time.perf_counter() - t0

    def _labels(self, batch: ShardedBatch, split: str = "train"):
        """(y, mask) for the logits' rows (head row axis a), classes sliced for multi-label."""
        a = self.model.head.row_axis
        # Double permutation with L odd: the last layer leaves its rows in sigma order.
        src = batch.alt if batch.alt is not None and self.model.config.layers % 2 == 1 else batch
        y = src.y[a]
        if self.multilabel:
            c0, c1 = self.model.class_range
            y = y[:, c0:c1]
        return y, getattr(src, f"{split}_mask")[a]

    def _loss(self, logits, y, mask, pc):
        """(loss, count, accuracy counts [correct, total]) of the batch, from the loss's own collectives."""
        head = self.model.head
        if self.multilabel:
            return parallel_bce(logits, y, mask, pc, head.row_axis, head.class_axis, self.shard.num_classes,
                                accuracy=True)
        return parallel_cross_entropy(logits, y, mask, pc, head.row_axis, head.class_axis, self.model.class_range[0],
                                      accuracy=True)

    def _global_grad_norm(self) -> torch.Tensor:
        """sqrt(sum over every parameter ELEMENT of g^2): each shard counted on one replica
        only (see ParallelScaleGNN.is_owner), summed over x, y, z. Gradients are already
        identical across data-parallel groups, so dp needs no sum.

        Bucketed (``perf.bucket_collectives``) where two or more 3D axes have several
        ranks: one all-reduce over the world instead of one per axis, to which only the
        owners of data-parallel group 0 contribute (the other groups hold the same
        gradients). The float64 sum is then taken in another order: the norm may differ
        in its last bits from the per-axis one, the clip coefficient (FP32) practically
        never."""
        axes = [ax for ax in PMM_AXES if self.grid.axis_size(ax) > 1]
        world = self.perf.bucket_collectives and len(axes) > 1
        sq = torch.zeros(1, dtype=torch.float64, device=self.device)
        if not world or self.dp_index == 0:
            for name, p in self.params:
                if p.grad is not None and self.model.is_owner(name):
                    sq += grad_values(p.grad).detach().double().pow(2).sum()
        if world:
            all_reduce_world(sq, self.grid, self._stats, "clip")
        else:
            for ax in axes:
                all_reduce(sq, self.grid, ax, self._stats, "clip")
        return sq.sqrt()

    def _resolve(self) -> None:
        """Fold the timers' spans since the last call into the per-component seconds
        (:data:`COMPONENTS`) and the collectives' bytes into ``comm_bytes``. On a GPU
        this waits for the recorded events: the loop calls it once per epoch."""
        ph, t = self._phases.flush(), self._timer.flush()
        self._stats.flush()
        s = self._stats.seconds
        spmm, gemm = t.get("spmm", 0.0), t.get("gemm", 0.0)
        mp_comm = sum(s.get(k, 0.0) for k in MP_KINDS)
        clip = s.get("clip", 0.0)
        sampling, fwd_bwd, dp, opt = (ph.get(k, 0.0) for k in ("sampling", "fwd_bwd", "dp", "optimizer"))
        c = self._components
        c["sampling"] += sampling
        c["spmm"] += spmm
        c["gemm"] += gemm
        c["pmm_comm"] += mp_comm
        c["elementwise"] += max(0.0, fwd_bwd - spmm - gemm - mp_comm)
        c["dp_comm"] += dp + clip
        c["optimizer"] += max(0.0, opt - clip)
        c["other"] += max(0.0, ph.get("step", 0.0) - sampling - fwd_bwd - dp - opt)
        for kind, nbytes in self._stats.bytes.items():
            self.comm_bytes[kind] += nbytes
        for kind, calls in self._stats.calls.items():
            self.comm_calls[kind] += calls
        self._phases.reset()
        self._timer.reset()
        self._stats.reset()

    @property
    def components(self) -> dict[str, float]:
        """Seconds per :data:`COMPONENTS` entry since :meth:`reset_counters` (resolves
        pending GPU timings: a read waits for the device)."""
        self._resolve()
        return self._components

    def counters(self) -> tuple[dict[str, float], dict[str, int], dict[str, int]]:
        """(seconds per component, bytes per collective kind, calls per collective kind)
        since :meth:`reset_counters`."""
        return dict(self.components), dict(self.comm_bytes), dict(self.comm_calls)  # components first: it resolves

    def reset_counters(self, components: dict | None = None, comm_bytes: dict | None = None,
                       comm_calls: dict | None = None) -> None:
        """Start the per-epoch counters afresh, or from a checkpoint's partial epoch."""
        self._resolve()  # drop what was timed before (evaluation, warm-up) with its events
        for counter, start in ((self._components, components), (self.comm_bytes, comm_bytes),
                               (self.comm_calls, comm_calls)):
            counter.clear()
            counter.update(start or {})

    def synchronize(self) -> None:
        """Wait for the work queued on the device (host clocks then cover it)."""
        synchronize(self.device)

    # ------------------------------------------------------------------ training
    def train_step(self, step: int) -> StepResult:
        """One optimizer update of Algorithm 1 on every data-parallel group at once.

        Nothing here reads a device value on the host: on a GPU the call returns as
        soon as the step's work is queued."""
        with self._phases("step"):
            with self._phases("sampling"):
                if self.perf.prefetch and self._prefetcher is None:
                    self._prefetcher = Prefetcher(self.sampler.sample, self.device)
                batch = self._prefetcher.get(step) if self._prefetcher is not None else self.sampler.sample(step)
            self.last_batch = batch
            if self.graphs is not None:  # one replay: no phases inside it ("other" holds it)
                stats = self.graphs.run(batch, step)
                if self.scheduler is not None:  # fills the lr tensor the next replay reads
                    self.scheduler.step()
            else:
                with self._phases("fwd_bwd"):
                    loss, count, counts = self._forward_backward(batch, step)
                with self._phases("dp"):
                    stats, nothing_to_learn = self._data_parallel(loss.detach(), count, counts)
                with self._phases("optimizer"):
                    self._update(nothing_to_learn)
                    if self.scheduler is not None:  # the schedule follows the step index
                        self.scheduler.step()
        if step % 64 == 63:  # fold the GPU timings already done, without waiting: few live events
            for timer in (self._phases, self._timer, self._stats):
                timer.poll()
        self._profiler.step()
        return StepResult(stats)

    def _forward_backward(self, batch: ShardedBatch, step: int | torch.Tensor):
        """The batch's loss, its count of labeled vertices and accuracy counts, and every
        gradient. ``step``: the index, or a captured step's device scalar of it."""
        self.model.train()
        logits = self.model(batch, self.pc, self.dropout_seed, step)
        y, mask = self._labels(batch)
        loss, count, counts = self._loss(logits, y, mask, self.pc)  # counts: the batch's accuracy
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.pc.wait_pending()  # deferred weight-gradient all-reduces (V-D, buckets); none otherwise
        return loss, count, counts

    def _update(self, nothing_to_learn: torch.Tensor) -> None:
        """Clip (if asked) and AdamW."""
        if self.grad_clip is not None:  # torch.nn.utils.clip_grad_norm_ semantics, global norm
            norm = self._global_grad_norm()
            coef = torch.clamp(self.grad_clip / (norm + 1e-6), max=1.0).to(torch.float32)
            for _, p in self.params:
                if p.grad is not None:
                    grad_values(p.grad).mul_(coef)
        # No labeled training vertex in any group's sample: nothing to learn. The
        # fused AdamW then leaves weights, moments and step count as they were.
        self.optimizer.found_inf = nothing_to_learn
        self.optimizer.step()

    def _step_body(self, batch: ShardedBatch, step: int | torch.Tensor) -> torch.Tensor:
        """Everything of a step after its sample, as one call: what ``--cuda-graphs``
        captures (step_graph module doc). Returns the step's stats."""
        loss, count, counts = self._forward_backward(batch, step)
        stats, nothing_to_learn = self._data_parallel(loss.detach(), count, counts)
        self._update(nothing_to_learn)
        return stats

    def _untimed(self, fn):
        """``fn()`` with the per-operator timers off: a capture cannot record events."""
        timers = (self._timer, self._stats._timer)
        was = [t.enabled for t in timers]
        for t in timers:
            t.enabled = False
        try:
            return fn()
        finally:
            for t, on in zip(timers, was):
                t.enabled = on

    def _state_loaded(self) -> None:
        """After a state load: the optimizer's state tensors are new, so a capture reading
        the old ones is dropped, and a captured run's learning rate is a device tensor
        again (the schedule fills it; a load may have set a float)."""
        if self.graphs is None:
            return
        self.graphs.drop()
        for group in self.optimizer.param_groups:
            if not isinstance(group["lr"], torch.Tensor):
                group["lr"] = device_lr(float(group["lr"]), self.device)

    def cuda_graphs_record(self) -> dict | None:
        """The record's ``cuda_graphs`` entry: captures, replays, eager steps and, when the
        steps ran uncaptured, why (None without ``--cuda-graphs``)."""
        if self.graphs is not None:
            return self.graphs.record()
        return {"fallback": self.cuda_graphs_fallback} if self.cuda_graphs_fallback is not None else None

    def _data_parallel(self, loss: torch.Tensor, count: torch.Tensor, counts: torch.Tensor):
        """Paper IV-A: one fused all-reduce over dp of every gradient and the step's
        scalars; gradients averaged over the groups that had a labeled vertex. Returns
        the step's stats (see :class:`StepResult`) and the 0/1 "skip the update" flag."""
        has = (count > 0).to(torch.float32)
        scalars = torch.stack([loss.float() * has, has, counts[0].float(), counts[1].float()])
        if self.grid.axis_size("dp") > 1:
            # A row-sparse gradient travels dense with a 0/1 flag per row: the groups
            # touched different rows, and every group must update their union.
            grads, pieces = [], []
            for _, p in self.params:
                g = p.grad if p.grad is not None else torch.zeros_like(p)
                touched = None
                if g.is_sparse:
                    rows = g._indices()[0]
                    g = torch.zeros_like(p).index_copy_(0, rows, g._values())
                    touched = torch.zeros(p.shape[0], dtype=p.dtype, device=p.device).index_fill_(0, rows, 1.0)
                grads.append((g, touched))
                pieces += [g.reshape(-1)] + ([touched] if touched is not None else [])
            flat = torch.cat(pieces + [scalars])
            all_reduce(flat, self.grid, "dp", self._stats, "dp")
            scalars = flat[-4:]
            groups = scalars[1].clamp(min=1.0)
            off = 0
            for (_, p), (g, touched) in zip(self.params, grads):
                n = g.numel()
                p.grad = flat[off: off + n].view_as(g) / groups
                off += n
                if touched is not None:
                    rows = flat[off: off + touched.numel()].nonzero().squeeze(1)
                    off += touched.numel()
                    p.grad = row_sparse_grad(rows, p.grad.index_select(0, rows), p.shape)
        groups = scalars[1]
        stats = torch.stack([scalars[0] / groups.clamp(min=1.0), (groups > 0).float(), scalars[2], scalars[3]])
        return stats.double(), (groups == 0).float()

    def close(self) -> None:
        """Stop the prefetch thread and write the profiler trace; idempotent."""
        if self._prefetcher is not None:
            self._prefetcher.close()
            self._prefetcher = None
        self._profiler.close()

    # ------------------------------------------------------------------ evaluation
    @torch.no_grad()
    def full_logits(self) -> tuple[torch.Tensor, ShardedBatch]:
        """One distributed full-graph forward (paper VII-B): B = N, no rescaling; the
        logits of ``model(batch)`` in eval mode, computed with activations split over all
        G ranks between layers and chunked within them (``ParallelScaleGNN.evaluate_logits``)."""
        batch = self.sampler.full_batch()
        self.model.eval()
        return self.model.evaluate_logits(batch, self._eval_pc), batch

    def evaluate(self) -> EvalResult:
        """Train/val/test accuracy (micro-F1 for multi-label), identical on every rank.

        Memory: the full-graph forward holds B = N activations (split over the ranks,
        :meth:`full_logits`), so the free heap the training steps left behind is handed
        back first, and the forward's own freed chunks after (:func:`_release_free_heap`)."""
        if self.device.type == "cpu":
            _release_free_heap()
        logits, batch = self.full_logits()
        masks = [self._labels(batch, split)[1] for split in ("train", "val", "test")]
        y, _ = self._labels(batch)
        head = self.model.head
        counts = parallel_accuracy_counts(logits, y, masks, self._eval_pc, head.row_axis, head.class_axis,
                                          self.model.class_range[0], self.multilabel, kind="eval").tolist()
        del logits
        if self.device.type == "cpu":
            _release_free_heap()
        return EvalResult(*[c / t if t else float("nan") for c, t in zip(counts[0::2], counts[1::2])])

    # ------------------------------------------------------------------ state
    def parameters_for_test(self) -> dict:
        """{name: {"value", "grad", "rows", "cols", "replicated"}}: this rank's shards (host
        copies) with their global ranges in the serial parameter (rows None for 1-D norm
        weights)."""
        out = {}
        for name, p in self.params:
            sh = self.model.shards[name]
            out[name] = {"value": p.detach().cpu().clone(),
                         "grad": None if p.grad is None else p.grad.detach().cpu().clone(),
                         "rows": sh.rows, "cols": sh.cols, "replicated": sh.replicated}
        return out

    def state_dict(self) -> dict:
        """This rank's shards, optimizer and LR-scheduler state (save one file per rank;
        tensors and plain containers only, so ``weights_only=True`` loads it). Sampling
        and dropout are pure functions of (seed, dp_index, step): no sampler state."""
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
                "grid": self.grid.spec(), "rank": self.grid.rank}

    def load_state_dict(self, state: dict) -> None:
        if state.get("grid") not in (None, self.grid.spec()):
            raise ValueError(f"state was saved on grid {state['grid']}, this run uses {self.grid.spec()}")
        if state.get("rank") not in (None, self.grid.rank):
            raise ValueError(f"state of rank {state['rank']} given to rank {self.grid.rank}")
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self._load_schedule(state.get("scheduler"))
        self._state_loaded()

    def _load_schedule(self, saved: dict | None, step: int | None = None) -> None:
        """The LR schedule's counters from ``saved``; ``step``: the next step of this run
        when it is not the saved one (a resume that changes Gd, so steps per epoch)."""
        if self.scheduler is None or saved is None:
            return
        sched = self.scheduler
        sched.load_state_dict(saved)
        if step is not None:
            sched.last_epoch = step
        # The next step's LR from this run's schedule (the saved one is the old run's:
        # they differ when a run is continued to more epochs); equal bits otherwise.
        for group, base, factor in zip(self.optimizer.param_groups, sched.base_lrs, sched.lr_lambdas):
            group["lr"] = base * factor(sched.last_epoch)

    def owned_state(self) -> dict[str, torch.Tensor]:
        """A copy, on the CPU, of the parameter shards this rank owns (:meth:`ParallelScaleGNN.is_owner`,
        data-parallel group 0; empty on the others): what :meth:`gather_model` sends, kept
        without a collective (the best validation epoch's weights, gathered once at the end)."""
        return {name: p.detach().to("cpu", copy=True) for name, p in self.params
                if self.dp_index == 0 and self.model.is_owner(name)}

    def gather_model(self, owned: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor] | None:
        """The serial model's parameters, whole, on rank 0 (None on the others): every rank
        sends the shards it owns now, or ``owned`` (an earlier :meth:`owned_state`), one
        collective over the world."""
        mine = self.owned_state() if owned is None else owned
        pieces = self.grid.gather_object(mine)
        if self.grid.rank != 0:
            return None
        m = self.model
        return assemble_shards({r: named for r, named in enumerate(pieces) if named}, self.grid.shape_tuple,
                               m.in_dim, m.num_classes, m.config)

    def load_whole_state(self, whole: dict, step: int | None = None) -> None:
        """Resume from another grid's checkpoint: this rank's shards of the whole parameters,
        AdamW moments and step counts (:func:`read_whole_state`), and the LR schedule
        (``step``: as in :meth:`_load_schedule`). Every value equals the one the same rank
        of the saving grid would hold, so the run continues as it would have there, up to
        the summation order of the new grid's collectives."""
        m = self.model
        if (whole["in_dim"], whole["num_classes"]) != (m.in_dim, m.num_classes):
            raise ValueError(f"the checkpoint's model has {whole['in_dim']} inputs and {whole['num_classes']} "
                             f"classes, this run's {m.in_dim} and {m.num_classes}")
        mine = lambda full, name: m.shards[name].slice_of(full[name]).clone().contiguous()  # noqa: E731
        m.load_state_dict({name: mine(whole["model"], name) for name, _ in self.params})
        state = {i: {"step": whole["steps"][name].clone(), "exp_avg": mine(whole["exp_avg"], name),
                     "exp_avg_sq": mine(whole["exp_avg_sq"], name)}
                 for i, (name, _) in enumerate(self.params) if name in whole["steps"]}
        self.optimizer.load_state_dict({"state": state, "param_groups": whole["param_groups"]})
        self._load_schedule(whole["scheduler"], step)
        self._state_loaded()


def read_whole_state(ckpt, meta: dict, parts=("model", "optimizer")) -> dict:
    """A checkpoint's training state made whole, whatever its grid: the serial parameters
    (``model``) and, with ``"optimizer"`` in ``parts``, AdamW's moments and step counts and
    the LR schedule, each tensor assembled from the rank files of data-parallel group 0
    (the groups are replicas). Also ``grid``, ``in_dim``, ``num_classes``, ``model_cfg``.
    Reads Gx*Gy*Gz rank files (each a few parameter shards: small beside a graph shard)."""
    from .. import checkpoint as ckpt_mod
    from ..records import current_config

    meta_file = f"{ckpt}/meta.json"
    fix = f"the checkpoint is damaged or not written by scalegnn; remove {ckpt} to resume from an older one"
    try:
        config = current_config(meta["config"])
        shape = tuple(int(g) for g in config["parallel"]["grid"])
        model_cfg = ModelConfig.from_dict(config["model"])
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ckpt_mod.CheckpointError(f"{meta_file}: its config has no usable parallel.grid and model "
                                       f"({type(exc).__name__}: {exc}); {fix}") from None
    # The grid sizes the loop over rank files: it must be the world the rank files were counted for.
    if len(shape) != 4 or min(shape) < 1 or math.prod(shape) != meta["world_size"]:
        raise ckpt_mod.CheckpointError(f"{meta_file}: its config's grid {shape} does not have its 'world_size' "
                                       f"{meta['world_size']} ranks; {fix}")
    graph = meta["record"].get("graph") or {}
    if "num_features" not in graph or "num_classes" not in graph:
        raise ckpt_mod.CheckpointError(f"{meta_file}: its record names no graph sizes (num_features, "
                                       "num_classes); this checkpoint cannot be consolidated")
    in_dim, num_classes = graph["num_features"], graph["num_classes"]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in (in_dim, num_classes)):
        raise ckpt_mod.CheckpointError(f"{meta_file}: its record's graph sizes (num_features {in_dim!r}, num_classes "
                                       f"{num_classes!r}) must be integers >= 1; {fix}")
    states = {r: ckpt_mod.load_rank_state(ckpt, r, meta=meta)["engine"] for r in range(shape[1] * shape[2] * shape[3])}
    try:
        # The sizes meta.json gives, bounded by the rank files before the whole tensors are allocated:
        # the shards of data-parallel group 0 cover every parameter, so they hold at least its elements.
        held = sum(t.numel() for s in states.values() for t in s["model"].values())
        if model_cfg.layers > len(states[0]["model"]) or \
                sum(math.prod(s) for s in full_shapes(in_dim, num_classes, model_cfg).values()) > held:
            raise ckpt_mod.CheckpointError(f"{meta_file}: its model ({model_cfg.layers} layers, hidden "
                                           f"{model_cfg.hidden}) and graph sizes ({in_dim} features, {num_classes} "
                                           f"classes) are larger than its rank files hold; {fix}")
        names = list(full_shapes(in_dim, num_classes, model_cfg))
        whole = {"grid": "x".join(map(str, shape)), "in_dim": in_dim, "num_classes": num_classes,
                 "model_cfg": model_cfg, "model": assemble_shards({r: s["model"] for r, s in states.items()}, shape,
                                                                  in_dim, num_classes, model_cfg)}
        if "optimizer" in parts:
            moments = {key: assemble_shards({r: {names[int(i)]: st[key] for i, st in s["optimizer"]["state"].items()}
                                             for r, s in states.items()}, shape, in_dim, num_classes, model_cfg)
                       for key in ("exp_avg", "exp_avg_sq")}
            first = states[0]["optimizer"]
            whole.update(moments, steps={names[int(i)]: st["step"] for i, st in first["state"].items()},
                         param_groups=first["param_groups"], scheduler=states[0].get("scheduler"))
    except ckpt_mod.CheckpointError:
        raise
    except (KeyError, TypeError, IndexError, ValueError, RuntimeError, AttributeError) as exc:
        # Rank files without a list of SHA-256s (written before it) whose engine state was edited.
        reason = (str(exc).strip().splitlines() or [""])[0]
        raise ckpt_mod.CheckpointError(f"{ckpt}: its rank files' engine state cannot be made whole "
                                       f"({type(exc).__name__}: {reason}); {fix}") from None
    return whole
