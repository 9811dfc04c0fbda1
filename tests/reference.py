"""The serial reference of Algorithm 1, which the engine is held to.

One process, the whole model (:class:`scalegnn.model.ScaleGNN`), the serial sampler
(:class:`scalegnn.sampling.UniformVertexSampler`), plain ``torch.optim.AdamW`` (the
non-fused implementation, so the engine's fused optimizer is checked against an
independent one) and host-side decisions: written for clarity, not speed. The engine
(:class:`scalegnn.parallel.engine.ParallelEngine`) must reproduce its steps on every
grid and device, up to float summation order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from scalegnn.graph import Graph
from scalegnn.loop import EvalResult
from scalegnn.metrics import accuracy_counts
from scalegnn.model import ModelConfig, ScaleGNN, node_loss
from scalegnn.optim import OptimConfig
from scalegnn.sampling import UniformVertexSampler, steps_per_epoch

__all__ = ["ReferenceStep", "SerialReference"]


@dataclass
class ReferenceStep:
    loss: float  # NaN when the sample held no labeled training vertex (no update)
    correct: float
    count: int


class SerialReference:
    """Uniform vertex sampling + the full model on one CPU process (Algorithm 1)."""

    def __init__(self, graph: Graph, model_cfg: ModelConfig, optim_cfg: OptimConfig, batch_size: int,
                 seed: int = 0, epochs: int = 1):
        self.graph, self.seed = graph, seed
        self.sampler = UniformVertexSampler(graph, batch_size, seed=seed)
        self.steps_per_epoch = steps_per_epoch(graph.num_nodes, self.sampler.batch_size)
        self.model = ScaleGNN(graph.num_features, graph.num_classes, model_cfg, seed=seed)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=optim_cfg.lr,
                                           weight_decay=optim_cfg.weight_decay, fused=False)
        total = epochs * self.steps_per_epoch
        self.scheduler = None
        if optim_cfg.schedule == "cosine":
            self.scheduler = torch.optim.lr_scheduler.LambdaLR(
                self.optimizer, lambda s: 0.5 * (1 + math.cos(math.pi * min(s, total) / max(total, 1))))
        self.grad_clip = optim_cfg.grad_clip

    def train_step(self, step: int) -> ReferenceStep:
        batch = self.sampler.sample(step)
        self.model.train()
        logits = self.model(batch.adj, batch.adj_t, batch.x, batch.nodes, self.seed, step)
        mask = batch.train_mask
        if not bool(mask.any()):  # nothing to learn: no update (the schedule still follows the step index)
            if self.scheduler is not None:
                self.scheduler.step()
            return ReferenceStep(float("nan"), 0.0, 0)
        loss = node_loss(logits, batch.y, mask)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        correct, count = accuracy_counts(logits.detach()[mask], batch.y[mask])
        return ReferenceStep(float(loss.detach()), correct, int(count))

    @torch.no_grad()
    def evaluate(self) -> EvalResult:
        """Full-graph forward (paper VII-B): the normalized A, no sampling."""
        adj = self.graph.to_torch_csr()
        self.model.eval()
        logits = self.model(adj, adj.t().to_sparse_csr(), self.sampler.features)
        accs = []
        for idx in (self.graph.train_idx, self.graph.val_idx, self.graph.test_idx):
            y = self.graph.y[idx]
            keep = slice(None) if y.dim() == 2 else y >= 0
            correct, total = accuracy_counts(logits[idx][keep], y[keep])
            accs.append(correct / total if total else float("nan"))
        return EvalResult(*accs)
