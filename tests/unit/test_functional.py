"""RMSNorm and the counter-based dropout mask (scalegnn/functional.py), shared by the
serial and the parallel models."""

from __future__ import annotations

import torch

from scalegnn.functional import dropout_keep_mask, rms_norm


def test_rms_norm_definition():
    x = torch.randn(5, 8)
    w = torch.rand(8)
    expected = x / torch.sqrt((x**2).mean(-1, keepdim=True) + 1e-6) * w
    assert torch.allclose(rms_norm(x, w, 1e-6), expected, atol=1e-6)


def test_dropout_mask_rate_blocks_and_determinism():
    rows, cols = torch.arange(2000), torch.arange(64)
    mask = dropout_keep_mask(123, rows, cols, 0.3)
    # 128000 Bernoulli(0.7) draws: sd of the mean = 0.0013; 0.01 is 7.8 sd
    assert abs(mask.float().mean().item() - 0.7) < 0.01
    assert torch.equal(mask[100:300, 10:40], dropout_keep_mask(123, rows[100:300], cols[10:40], 0.3))
    assert not torch.equal(mask, dropout_keep_mask(124, rows, cols, 0.3))
    # neighbouring rows are not copies of each other (a weak hash would correlate them)
    agree = (mask[:-1] == mask[1:]).float().mean().item()
    assert abs(agree - (0.7**2 + 0.3**2)) < 0.01
