"""PyG's full-batch GCN (baselines/pyg_gcn.py): the model is Kipf & Welling's formula on
the normalized adjacency, CSR features give the dense ones' output and gradients, a
run is one full-graph step per epoch that learns, and several processes are refused
before any data is loaded."""

from __future__ import annotations

import pytest
import torch

from scalegnn.launch import launch
from tests.runs import cfg_for

pytest.importorskip("torch_geometric")


def _dense_gcn(model, x, a_hat, training=False):
    """sum_j a_ij (x_j W) + b per layer, ReLU between (dropout off): the formula, densely."""
    h = x
    for i, conv in enumerate(model.convs):
        h = a_hat @ (h @ conv.lin.weight.t()) + conv.bias
        if i < len(model.convs) - 1:
            h = torch.relu(h)
    return h


def test_the_model_is_the_gcn_formula_and_csr_features_match_dense(tiny):
    from scalegnn.baselines.pyg_gcn import GCN

    g = tiny.graph
    norm = g.gcn_normalize()
    a_hat = norm.to_torch_csr().to_dense()
    deg = (g.to_torch_csr().to_dense() + torch.eye(g.num_nodes)).sum(1)
    assert torch.allclose(a_hat, (g.to_torch_csr().to_dense() + torch.eye(g.num_nodes))
                          / deg.sqrt()[:, None] / deg.sqrt()[None, :], atol=1e-6)  # D^-1/2 (A+I) D^-1/2
    torch.manual_seed(0)
    model = GCN(g.num_features, 8, g.num_classes, 3, dropout=0.0).eval()
    x = g.x.float() if g.x.layout == torch.strided else g.x.to_dense().float()
    adj_t = norm.to_torch_csr()
    dense_out = model(x, adj_t)
    assert torch.allclose(dense_out, _dense_gcn(model, x, a_hat), atol=1e-5)
    grads_dense = torch.autograd.grad(dense_out.square().sum(), list(model.parameters()))
    csr_out = model(x.to_sparse_csr(), adj_t)
    grads_csr = torch.autograd.grad(csr_out.square().sum(), list(model.parameters()))
    assert torch.allclose(csr_out, dense_out, atol=1e-5)
    for a, b in zip(grads_csr, grads_dense):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-5)


def test_a_run_is_the_full_batch_loop_written_out(data_root, tmp_path, tiny):
    """The record's losses are those of a plain loop: the dense formula, Adam, one step on
    every training vertex per epoch (the same seed for the weights); the loss falls."""
    from scalegnn.baselines.pyg_gcn import GCN

    rec = launch(cfg_for("pyg-gcn", data_root, tmp_path, epochs=10, lr=0.01))
    assert rec["status"] == "ok", rec.get("error")
    assert rec["steps_per_epoch"] == 1 and rec["batch_size"] == rec["graph"]["num_nodes"]
    g = tiny.graph
    a_hat = g.gcn_normalize().to_torch_csr().to_dense()
    x = g.x.float() if g.x.layout == torch.strided else g.x.to_dense().float()
    train = g.train_idx[g.y[g.train_idx] >= 0]
    torch.manual_seed(0)
    model = GCN(g.num_features, 16, g.num_classes, 2, dropout=0.0)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    losses = []
    for _ in range(10):
        loss = torch.nn.functional.cross_entropy(_dense_gcn(model, x, a_hat)[train], g.y[train])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    got = [r["loss"] for r in rec["epochs"]]
    assert got == pytest.approx(losses, rel=1e-4)
    assert all(b < a for a, b in zip(got, got[1:]))
    assert rec["preprocess_s"] >= 0


def test_several_processes_are_refused_before_any_data(tmp_path):
    rec_dir = tmp_path / "r"
    with pytest.raises(ValueError, match="pyg-gcn trains the whole graph in one process, got 2; use --nproc 1"):
        launch(cfg_for("pyg-gcn", str(tmp_path / "no-data"), rec_dir, nproc=2, dataset="no-such-dataset"))
    assert not rec_dir.exists()
