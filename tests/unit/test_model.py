"""Serial model (scalegnn/model.py): gradients against finite differences, switches, loss."""

from __future__ import annotations

import pytest
import torch

from scalegnn.model import ModelConfig, ScaleGNN, node_loss, spmm
from scalegnn.sampling import UniformVertexSampler
from tests.graphs import random_graph


def _batch():
    g = random_graph(n=30, m=120, features=5)
    return g, UniformVertexSampler(g, batch_size=12, seed=1).sample(2)


def _double_csr(t):
    return torch.sparse_csr_tensor(t.crow_indices(), t.col_indices(), t.values().double(), t.shape)


@pytest.mark.parametrize(
    "cfg",
    [
        ModelConfig(hidden=6, layers=2, dropout=0.0),
        ModelConfig(hidden=6, layers=3, dropout=0.3),
        ModelConfig(hidden=4, layers=1, dropout=0.0, norm=False, residual=False),
        ModelConfig(hidden=6, layers=3, dropout=0.3, norm_position="pre"),
    ],
    ids=["plain", "dropout", "bare", "pre-norm"],
)
def test_gradients_match_central_finite_differences(cfg):
    """float64 central differences with h = 1e-6 have truncation error O(h^2) and
    round-off O(eps/h) ~ 1e-10 relative; 1e-6 relative tolerance is far above both
    and far below any real gradient bug."""
    g, b = _batch()
    model = ScaleGNN(5, 3, cfg, seed=4).double().train()
    adj, adj_t, x = _double_csr(b.adj), _double_csr(b.adj_t), b.x.double().requires_grad_()

    def loss_fn():
        return node_loss(model(adj, adj_t, x, b.nodes, dropout_seed=7, step=2), b.y, b.train_mask)

    loss = loss_fn()
    loss.backward()
    checks = [(name, p) for name, p in model.named_parameters()] + [("x", x)]
    gen = torch.Generator().manual_seed(0)
    for name, tensor in checks:
        flat = tensor.data.view(-1)
        for idx in torch.randint(0, flat.numel(), (4,), generator=gen).tolist():
            old = flat[idx].item()
            h = 1e-6
            with torch.no_grad():
                flat[idx] = old + h
                up = loss_fn().item()
                flat[idx] = old - h
                down = loss_fn().item()
                flat[idx] = old
            numeric = (up - down) / (2 * h)
            analytic = tensor.grad.view(-1)[idx].item()
            assert analytic == pytest.approx(numeric, rel=1e-6, abs=1e-9), (name, idx)


def test_spmm_backward_uses_transpose():
    _, b = _batch()
    x = torch.randn(12, 3, requires_grad=True)
    y = spmm(b.adj, b.adj_t, x)
    y.sum().backward()
    assert torch.allclose(x.grad, b.adj.to_dense().T @ torch.ones(12, 3), atol=1e-6)


def test_switches_change_the_computation():
    _, b = _batch()
    outs = {}
    for key, cfg in {"all": ModelConfig(hidden=8, layers=2, dropout=0.0),
                     "no_norm": ModelConfig(hidden=8, layers=2, dropout=0.0, norm=False),
                     "no_res": ModelConfig(hidden=8, layers=2, dropout=0.0, residual=False)}.items():
        outs[key] = ScaleGNN(5, 3, cfg, seed=0).eval()(b.adj, b.adj_t, b.x)
    assert not torch.allclose(outs["all"], outs["no_norm"])
    assert not torch.allclose(outs["all"], outs["no_res"])
    model = ScaleGNN(5, 3, ModelConfig(hidden=8, layers=2, dropout=0.5), seed=0).train()
    with pytest.raises(ValueError, match="node_ids"):
        model(b.adj, b.adj_t, b.x)


def test_the_norm_position_puts_rmsnorm_on_the_layer_input_or_the_convolution_output():
    """``post`` (the default, the paper's Eq. 7): x + relu(norm(A x W)); ``pre``:
    x + relu(A norm(x) W), each checked against the formula written out; any other
    position is refused in one line, and without a norm the position changes nothing."""
    from scalegnn.functional import rms_norm

    _, b = _batch()
    assert ModelConfig().norm_position == "post"
    outs = {}
    for position in ("post", "pre"):
        cfg = ModelConfig(hidden=8, layers=2, dropout=0.0, norm_position=position)
        model = ScaleGNN(5, 3, cfg, seed=0).eval()
        with torch.no_grad():
            for g in model.norm:
                g.uniform_(0.5, 1.5)
            h = b.x @ model.w_in
            for layer in range(2):
                if position == "pre":
                    z = torch.sparse.mm(b.adj, rms_norm(h, model.norm[layer], cfg.norm_eps)) @ model.w[layer]
                else:
                    z = rms_norm(torch.sparse.mm(b.adj, h) @ model.w[layer], model.norm[layer], cfg.norm_eps)
                h = h + torch.relu(z)
            outs[position] = model(b.adj, b.adj_t, b.x)
            torch.testing.assert_close(outs[position], h @ model.w_out)
    assert not torch.allclose(outs["post"], outs["pre"])
    bare = [ScaleGNN(5, 3, ModelConfig(hidden=8, layers=2, norm=False, norm_position=p), seed=0).eval()(
        b.adj, b.adj_t, b.x) for p in ("post", "pre")]
    assert torch.equal(*bare)
    with pytest.raises(ValueError, match="--norm-position must be one of post, pre"):
        ModelConfig(norm_position="middle")


def test_loss_functions():
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0], [5.0, -5.0]])
    y = torch.tensor([0, 1, 1])
    mask = torch.tensor([True, True, False])
    assert node_loss(logits, y, mask).item() == pytest.approx(
        torch.nn.functional.cross_entropy(logits[:2], y[:2]).item())
    multi = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    assert node_loss(logits, multi, mask).item() == pytest.approx(
        torch.nn.functional.binary_cross_entropy_with_logits(logits[:2], multi[:2]).item())
