"""The compared systems' models (baselines/models.py): the sparse input layer equals PyG's."""

from __future__ import annotations

import warnings

import pytest
import torch

pytest.importorskip("torch_geometric")
pytest.importorskip("torch_sparse")

warnings.filterwarnings("ignore", message=".*pyg-lib.*")


# ----------------------------------------------------------------------------- models
@pytest.mark.parametrize("kind", ["sage", "gcn", "graphconv"])
def test_sparse_input_layer_equals_the_pyg_layer(kind):
    from scalegnn.baselines.models import InputConv

    torch.manual_seed(0)
    x = torch.rand(30, 20) * (torch.rand(30, 20) < 0.2)
    ei = torch.randint(0, 30, (2, 90))
    w = torch.rand(90) if kind != "sage" else None
    layer = InputConv(kind, 20, 7)
    dense = layer(x, ei, w)
    sparse = layer(x.to_sparse_csr(), ei, w)
    torch.testing.assert_close(sparse, dense, rtol=1e-5, atol=1e-5)
