"""ScaleGNN: mini-batch GCN training with communication-free uniform vertex sampling
and 4D (data x 3D parallel matrix multiplication) parallelism."""

__version__ = "0.1.0"

import warnings

# CSR tensors are the fastest SpMM path on CPU; their "beta" warnings are noise for users.
warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta state")
warnings.filterwarnings("ignore", message="Sparse invariant checks are implicitly disabled")
