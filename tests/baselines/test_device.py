"""The compared systems on the run's device: a system that cannot use a GPU says so
before any work, and every adapter that can trains on a GPU to the CPU run's losses
(``gpu`` marker). The sampling systems run PyG's samplers where torch-sparse imports
and the pure-torch ones of ``baselines/torch_sampling.py`` where it does not (a GPU
machine often lacks it): the CPU and GPU runs use the same, so their batches are the same.
"""

from __future__ import annotations

import pytest

from scalegnn.config import make_config
from tests.devices import DEVICES, needs_gpu

TINY = "csbm:n=400,avg_degree=6,classes=3,feature_dim=12"


def cfg_for(system, tmp_path, **over):
    kw = dict(dataset=TINY, data_root=str(tmp_path / "data"), epochs=3, out_dir=str(tmp_path / "r"), hidden=16,
              layers=2, dropout=0.0)
    kw.update(over)
    return make_config(system, **kw)


def test_distdgl_refuses_a_gpu_before_any_work(tmp_path):
    """DGL's PyPI wheels are CPU builds: an explicit GPU request is a clear error, raised
    before the DGL environment or the dataset is touched."""
    from scalegnn.baselines.distdgl import harness

    cfg = cfg_for("distdgl", tmp_path, device="cuda", dataset="no-such-dataset", python="/nonexistent/python")
    with pytest.raises(ValueError, match="runs on the CPU only .* use --device cpu or auto"):
        harness.job(cfg)
    assert "CPU builds" in harness.CPU_ONLY


OPTIONS = {"bns-gcn": dict(boundary_rate=1.0, partition="random"), "graphsage": dict(batch_size=64),
           "graphsaint": dict(node_budget=100), "salient": dict(batch_size=64, partition="random"), "pyg-gcn": {}}


def _run(system, tmp_path, device):
    from scalegnn.launch import launch

    return launch(cfg_for(system, tmp_path, device=device, **OPTIONS[system]))


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("system", ["bns-gcn", "graphsage", "graphsaint", "salient", "pyg-gcn"])
def test_baseline_on_the_gpu_trains_like_on_the_cpu(system, tmp_path):
    """The same run on cuda and on cpu: a record on the GPU, losses within float32
    reordering of the CPU's (dropout off; each system draws its samples on the host
    from the same seeds, so the batches are the same)."""
    from scalegnn.baselines.torch_sampling import resolve_sampler_impl

    cpu = _run(system, tmp_path, "cpu")
    gpu = _run(system, tmp_path, "cuda")
    assert gpu["status"] == "ok" and gpu["env"]["device_type"] == "cuda", gpu.get("error")
    if system not in ("bns-gcn", "pyg-gcn"):  # auto: pyg with torch-sparse, torch without; both runs the same
        assert gpu["sampler_impl"] == cpu["sampler_impl"] == resolve_sampler_impl("auto")
    assert gpu["peak_device_memory_bytes_per_rank"][0] > 0
    assert [r["loss"] for r in gpu["epochs"]] == pytest.approx([r["loss"] for r in cpu["epochs"]], rel=1e-3)


@pytest.mark.parametrize("device", DEVICES)
def test_csr_times_dense_differentiates_on_the_device(device):
    """Autograd through ``torch.sparse.mm(CSR, dense)`` (BNS-GCN's aggregation, the PyG GCN
    of the GPU benchmark) on the run's device: the input gradient is A^T dY, equal to the
    dense product's within float32 rounding (cuSPARSE transposes A inside the backward)."""
    import torch

    gen = torch.Generator().manual_seed(0)
    dense_a = torch.rand(50, 40, generator=gen) * (torch.rand(50, 40, generator=gen) < 0.1)
    x = torch.randn(40, 8, generator=gen)
    dy = torch.randn(50, 8, generator=gen)
    a = dense_a.to_sparse_csr().to(device)
    xs = x.to(device).requires_grad_()
    y = torch.sparse.mm(a, xs)
    y.backward(dy.to(device))
    assert xs.grad.device.type == torch.device(device).type
    assert torch.allclose(y.detach().cpu(), dense_a @ x, atol=1e-5)
    assert torch.allclose(xs.grad.cpu(), dense_a.t() @ dy, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["sage", "gcn", "graphconv"])
def test_csr_aggregation_gives_the_convolutions_output(kind, device):
    """The pure-torch samplers' evaluation matrix (``baselines/torch_sampling.py``'s
    ``adjacency_t``, a CSR A^T): a PyG convolution over it equals the same over
    ``edge_index`` (and over torch-sparse's ``SparseTensor`` where it exists) to 1e-6 on
    the device, with dense and with CSR input features (the models' first layer), edge
    weights for GraphConv (GraphSAINT's)."""
    import torch

    pytest.importorskip("torch_geometric")
    from scalegnn.baselines.models import InputConv
    from scalegnn.baselines.torch_sampling import adjacency_t, pyg_samplers_available

    n = 60
    gen = torch.Generator().manual_seed(0)
    ei = torch.randint(0, n - 2, (2, 300), generator=gen)  # two isolated vertices
    ei = torch.cat([ei, ei.flip(0)], 1)
    ei = ei[:, ei[0] != ei[1]].unique(dim=1)
    ei = ei[:, torch.randperm(ei.size(1), generator=gen)]
    x = torch.randn(n, 8, generator=gen) * (torch.rand(n, 8, generator=gen) < 0.3)
    w = torch.rand(ei.size(1), generator=gen) if kind == "graphconv" else None
    torch.manual_seed(0)
    conv = InputConv(kind, 8, 5).to(device)
    impls = ["torch", "pyg"] if pyg_samplers_available() else ["torch"]
    with torch.no_grad():
        for feats in (x, x.to_sparse_csr()):
            feats = feats.to(device)
            ref = conv(feats, ei.to(device), None if w is None else w.to(device))
            for impl in impls:
                out = conv(feats, adjacency_t(ei, n, impl, w).to(device), None)
                assert torch.allclose(out, ref, rtol=1e-6, atol=1e-6), (impl, (out - ref).abs().max())
