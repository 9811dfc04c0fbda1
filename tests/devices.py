"""The devices the parity and training tests run on: the CPU always, a GPU where one
is visible. GPU cases carry the ``gpu`` marker, so ``make test-gpu`` (``pytest -m
gpu``) runs exactly them; without a GPU they are reported as skipped, never passed.

Multi-rank GPU cases share one GPU between their ranks through gloo (NCCL refuses
two ranks on one device): the tensors are the GPU's, the collectives stage them
through host memory.
"""

from __future__ import annotations

import pytest
import torch

__all__ = ["HAS_GPU", "needs_gpu", "DEVICES"]

HAS_GPU = torch.cuda.is_available()
needs_gpu = pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA or ROCm GPU (run `make test-gpu` on a GPU machine)")
DEVICES = ["cpu", pytest.param("cuda", marks=(pytest.mark.gpu, needs_gpu), id="cuda")]
