"""Training engines: what one optimizer step and one evaluation round mean.

The training loop (:mod:`scalegnn.train`) drives an engine and never looks inside
it. :class:`SerialEngine` is the single-process reference (Algorithm 1);
:class:`scalegnn.parallel.engine.ParallelEngine` is the 4D parallel one with the
same interface:

    engine.steps_per_epoch            int
    engine.train_step(step)  -> StepResult     (Algorithm 1, one optimizer update)
    engine.evaluate()        -> EvalResult     (full-graph forward, no sampling)
    engine.components        {name: seconds}  cumulative, reset by the loop per epoch
    engine.comm_bytes        {kind: bytes}     cumulative, reset by the loop per epoch
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from dataclasses import dataclass

import torch

from .graph import Graph
from .model import ModelConfig, ScaleGNN, node_loss
from .sampling import UniformVertexSampler, steps_per_epoch

__all__ = ["OptimConfig", "StepResult", "EvalResult", "SerialEngine", "make_optimizer", "accuracy_counts"]


@dataclass
class OptimConfig:
    """AdamW with an optional cosine schedule and global-norm gradient clipping."""

    lr: float = 1e-3
    weight_decay: float = 0.0
    schedule: str = "constant"  # "constant" or "cosine" (decay to 0 over the run)
    grad_clip: float | None = None  # max global L2 norm; None disables clipping

    def __post_init__(self):
        if self.lr <= 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay}")
        if self.schedule not in ("constant", "cosine"):
            raise ValueError(f"schedule must be 'constant' or 'cosine', got {self.schedule!r}")
        if self.grad_clip is not None and self.grad_clip <= 0:
            raise ValueError(f"grad_clip must be > 0 or None, got {self.grad_clip}")


@dataclass
class StepResult:
    """Loss of one step (mean over the batch's labeled training vertices) and the
    batch's training-accuracy counts."""

    loss: float
    correct: float
    count: int


@dataclass
class EvalResult:
    train_acc: float
    val_acc: float
    test_acc: float

    def as_dict(self) -> dict:
        return {"train_acc": self.train_acc, "val_acc": self.val_acc, "test_acc": self.test_acc}


def make_optimizer(params, cfg: OptimConfig, total_steps: int):
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    if cfg.schedule == "cosine":
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: 0.5 * (1 + math.cos(math.pi * min(s, total_steps) / max(total_steps, 1)))
        )
    else:
        sched = None
    return opt, sched


def accuracy_counts(logits: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """(correct, total) for single-label argmax accuracy; for multi-label, the
    micro-F1 numerator 2TP and denominator 2TP+FP+FN with a 0-logit threshold,
    so counts from several shards add up before dividing."""
    if y.dim() == 2:
        pred = logits > 0
        truth = y > 0.5
        tp = (pred & truth).sum().item()
        fp = (pred & ~truth).sum().item()
        fn = (~pred & truth).sum().item()
        return 2.0 * tp, float(2 * tp + fp + fn)
    return float((logits.argmax(-1) == y).sum().item()), float(y.numel())


class _Timer:
    """Accumulates wall seconds per component name (CPU: synchronous, so host time is right)."""

    def __init__(self, sink: dict):
        self.sink = sink

    def __call__(self, name: str):
        timer = self

        class _Span:
            def __enter__(self):
                self.t0 = time.perf_counter()

            def __exit__(self, *exc):
                timer.sink[name] += time.perf_counter() - self.t0

        return _Span()


class SerialEngine:
    """Single-process ScaleGNN: uniform vertex sampling + full model on one device."""

    system = "scalegnn"

    def __init__(self, graph: Graph, model_cfg: ModelConfig, optim_cfg: OptimConfig, batch_size: int,
                 seed: int = 0, epochs: int = 1, perf=None):
        from .perf import PerfConfig, StepProfiler

        if graph.meta.get("normalized") != "gcn":
            raise ValueError("SerialEngine needs the GCN-normalized graph: call graph.gcn_normalize() first")
        self.graph, self.seed = graph, seed
        self.perf = perf if perf is not None else PerfConfig()
        self.sampler = UniformVertexSampler(graph, batch_size, seed=seed, backend=self.perf.sampler)
        # Paper V-A: sample step t+1 in a background thread while step t trains (started by the first step).
        self._prefetcher = None
        self._profiler = StepProfiler(self.perf.profile)
        self.compile_time_s = 0.0
        self.steps_per_epoch = steps_per_epoch(graph.num_nodes, self.sampler.batch_size)
        self.model = ScaleGNN(graph.num_features, graph.num_classes, model_cfg, seed=seed)
        self.optimizer, self.scheduler = make_optimizer(
            self.model.parameters(), optim_cfg, total_steps=epochs * self.steps_per_epoch
        )
        self.grad_clip = optim_cfg.grad_clip
        self.components: dict[str, float] = defaultdict(float)
        self.comm_bytes: dict[str, int] = defaultdict(int)
        self._time = _Timer(self.components)
        self._full = None  # (A, A^T) of the full graph, built on first evaluation

    def train_step(self, step: int) -> StepResult:
        t0, before = time.perf_counter(), sum(self.components.values())
        try:
            return self._train_step(step)
        finally:  # "other": the step's wall time outside the timed components
            timed = sum(self.components.values()) - before
            self.components["other"] += max(0.0, time.perf_counter() - t0 - timed)
            self._profiler.step()

    def close(self) -> None:
        """Stop the prefetch thread and write the profiler trace; idempotent."""
        if self._prefetcher is not None:
            self._prefetcher.close()
            self._prefetcher = None
        self._profiler.close()

    def _train_step(self, step: int) -> StepResult:
        if self.perf.prefetch and self._prefetcher is None:
            from .perf import Prefetcher

            self._prefetcher = Prefetcher(self.sampler.sample)
        with self._time("sampling"):
            batch = self._prefetcher.get(step) if self._prefetcher is not None else self.sampler.sample(step)
        self.model.train()
        with self._time("forward_backward"):
            logits = self.model(batch.adj, batch.adj_t, batch.x, batch.nodes, self.seed, step)
            mask = batch.train_mask
            if not bool(mask.any()):  # no labeled training vertex in this sample: nothing to learn
                return StepResult(loss=float("nan"), correct=0.0, count=0)
            loss = node_loss(logits, batch.y, mask)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
        with self._time("optimizer"):
            if self.grad_clip is not None:
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
            self.optimizer.step()
            if self.scheduler is not None:
                self.scheduler.step()
        correct, count = accuracy_counts(logits.detach()[mask], batch.y[mask])
        return StepResult(loss=float(loss.detach()), correct=correct, count=int(count))

    @torch.no_grad()
    def full_logits(self) -> torch.Tensor:
        """One full-graph forward (paper VII-B): the normalized A, no sampling, no rescaling."""
        if self._full is None:
            adj = self.graph.to_torch_csr()
            self._full = (adj, adj.t().to_sparse_csr())
        self.model.eval()
        return self.model(*self._full, self.sampler.features)

    def evaluate(self) -> EvalResult:
        logits = self.full_logits()
        accs = []
        for idx in (self.graph.train_idx, self.graph.val_idx, self.graph.test_idx):
            y = self.graph.y[idx]
            keep = slice(None) if y.dim() == 2 else y >= 0
            correct, total = accuracy_counts(logits[idx][keep], y[keep])
            accs.append(correct / total if total else float("nan"))
        return EvalResult(*accs)

    def state_dict(self) -> dict:
        """Model, optimizer and LR-scheduler state: tensors and plain containers only
        (saved by :mod:`scalegnn.checkpoint`, loaded with ``weights_only=True``). The
        sampler and dropout are pure functions of (seed, step) and hold no state."""
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None and state.get("scheduler") is not None:
            self.scheduler.load_state_dict(state["scheduler"])
