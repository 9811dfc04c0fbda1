"""The ScaleGNN model (paper III-A/B, Fig. 2), single-process reference.

Shape legend:
    B   rows (sampled vertices, or N for full-graph)     F  input features
    H   hidden dimension d_h                              C  classes

    X_h0 = X_in W_in                                    (Eq. 4)
    for l in 1..L:
        H_agg = A~ X_h(l-1)                             (Eq. 5, SpMM)
        X_conv = H_agg W_l                              (Eq. 6, GEMM)
        X_h,l = dropout(relu(rmsnorm(X_conv))) + X_h(l-1)   (Eqs. 7-10)
    O = X_hL W_out                                      (Eq. 11)

The parallel model in :mod:`scalegnn.parallel` shards exactly these parameters;
dropout uses a counter-based mask (:func:`scalegnn.functional.dropout_keep_mask`)
that is a function of (key, global row id, global column id), so a rank can compute
the mask of its own block and the union of all blocks equals the serial mask bit for
bit.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .functional import dropout_keep_mask, rms_norm
from .sections.model import NORM_POSITIONS, ModelConfig  # declared where no torch loads (scalegnn.sections)

__all__ = ["ModelConfig", "NORM_POSITIONS", "ScaleGNN", "spmm", "dropout_key", "node_loss"]


class _SpMM(torch.autograd.Function):
    """Y = A X with the backward dX = A^T dY (Eq. 17) using the prebuilt transpose."""

    @staticmethod
    def forward(ctx, adj, adj_t, x):
        ctx.adj_t = adj_t
        return torch.sparse.mm(adj, x)

    @staticmethod
    def backward(ctx, grad_out):
        grad_x = torch.sparse.mm(ctx.adj_t, grad_out.contiguous()) if ctx.needs_input_grad[2] else None
        return None, None, grad_x


def spmm(adj: torch.Tensor, adj_t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Sparse (rows, cols) x dense (cols, d) with autograd through ``adj_t``."""
    return _SpMM.apply(adj, adj_t, x)


def dropout_key(seed: int, step: int | torch.Tensor, layer: int) -> int | torch.Tensor:
    """One 62-bit key per (seed, step, layer) for :func:`scalegnn.functional.dropout_keep_mask`.

    ``step`` may be a 0-d int64 device tensor (a step captured as a CUDA graph reads its
    step there, :mod:`scalegnn.parallel.step_graph`): the key is then a 0-d tensor with
    the same bits, since int64 arithmetic wraps mod 2^64 and the key keeps 62 bits."""
    if isinstance(step, torch.Tensor):
        base = (seed * 1_000_003 * 131 + layer) % (1 << 64)
        base = base - (1 << 64) if base >= 1 << 63 else base  # as a signed int64
        return (step.to(torch.int64) * 131 + base) & ((1 << 62) - 1)
    return ((seed * 1_000_003 + step) * 131 + layer) & ((1 << 62) - 1)


def node_loss(logits: torch.Tensor, y: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy (single-label, y int64) or BCE-with-logits (multi-label,
    y float multi-hot) over the rows selected by ``mask`` (Eq. 12)."""
    if y.dim() == 2:
        return F.binary_cross_entropy_with_logits(logits[mask], y[mask])
    return F.cross_entropy(logits[mask], y[mask])


class ScaleGNN(nn.Module):
    """Input projection, L x [GCN conv, RMSNorm, ReLU, dropout, residual], output head.

    Parameters are plain matrices (no biases, as in Eqs. 4-11) so the parallel
    model can shard them by rows and columns: ``w_in`` (F, H), ``w[l]`` (H, H),
    ``norm[l]`` (H,), ``w_out`` (H, C).
    """

    def __init__(self, in_dim: int, num_classes: int, config: ModelConfig, seed: int = 0):
        super().__init__()
        self.config = config
        gen = torch.Generator().manual_seed(seed)
        h = config.hidden

        def init(fan_in, fan_out):  # nn.Linear's default: U(-1/sqrt(fan_in), 1/sqrt(fan_in))
            bound = fan_in**-0.5
            return nn.Parameter((torch.rand(fan_in, fan_out, generator=gen) * 2 - 1) * bound)

        self.w_in = init(in_dim, h)
        self.w = nn.ParameterList([init(h, h) for _ in range(config.layers)])
        self.norm = nn.ParameterList([nn.Parameter(torch.ones(h)) for _ in range(config.layers)]) if config.norm else None
        self.w_out = init(h, num_classes)

    def forward(self, adj, adj_t, x, node_ids: torch.Tensor | None = None, dropout_seed: int = 0,
                step: int = 0) -> torch.Tensor:
        """Logits (B, C) for features x (B, F) and the sampled adjacency (B, B).

        ``node_ids`` (global vertex ids of the rows) and ``(dropout_seed, step)``
        define the dropout mask; they matter only in training mode.
        """
        cfg = self.config
        use_dropout = self.training and cfg.dropout > 0
        if use_dropout and node_ids is None:
            raise ValueError("training with dropout needs node_ids (global vertex ids of the rows)")
        cols = torch.arange(cfg.hidden)
        h = x @ self.w_in
        for layer in range(cfg.layers):
            z = rms_norm(h, self.norm[layer], cfg.norm_eps) if cfg.pre_norm else h
            z = spmm(adj, adj_t, z) @ self.w[layer]
            if cfg.post_norm:
                z = rms_norm(z, self.norm[layer], cfg.norm_eps)
            z = torch.relu(z)
            if use_dropout:
                keep = dropout_keep_mask(dropout_key(dropout_seed, step, layer), node_ids, cols, cfg.dropout)
                z = z * keep / (1.0 - cfg.dropout)
            h = z + h if cfg.residual else z
        return h @ self.w_out
