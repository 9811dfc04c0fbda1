"""The ``model`` section: the architecture's sizes and switches (read by :mod:`scalegnn.model`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..settings import setting

__all__ = ["ModelConfig", "NORM_POSITIONS"]

# Where a layer's RMSNorm sits: on the convolution's output (the paper's Eq. 7), or on the
# layer's input before the convolution (pre-norm, as in pre-LN transformers)
NORM_POSITIONS = ("post", "pre")


@dataclass(kw_only=True)
class ModelConfig:
    """Architecture switches. Each of norm/dropout/residual can be turned off
    without changing the parallel layout (paper III-A)."""

    hidden: int = setting(256, help="hidden dimension d_h")
    layers: int = setting(3, help="GCN layers L")
    dropout: float = setting(0.5, help="dropout probability")
    # rare: the paper's model has both; turning one off is an ablation (fullgraph-3d's Plexus permutation
    # turns the residual off by itself)
    norm: bool = setting(True, scope="scalegnn", rare=True,
                         help="RMSNorm after every layer's convolution (--no-norm: off)")
    # rare: "post" is the paper's model (Eq. 7); "pre" departs from it and trains in about half
    # the epochs on a products-shaped graph (docs/benchmarks.md, "Epochs to accuracy")
    norm_position: str = setting("post", scope="scalegnn", rare=True, choices=NORM_POSITIONS,
                                 help="where RMSNorm sits: post (the paper's, Eq. 7: on the convolution's output) "
                                 "or pre (on the layer input, before the convolution)")
    residual: bool = setting(True, scope="scalegnn", rare=True, help="residual connections (--no-residual: off)")
    norm_eps: float = 1e-6

    @classmethod
    def from_dict(cls, data: dict) -> "ModelConfig":
        """The configuration saved as ``data`` (a checkpoint's, a model file's); a key of
        another version of this class is left out, a setting it lacks keeps its default."""
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def __post_init__(self):
        if self.hidden < 1:
            raise ValueError(f"hidden must be >= 1, got {self.hidden}")
        if self.layers < 1:
            raise ValueError(f"layers must be >= 1, got {self.layers}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.norm_position not in NORM_POSITIONS:
            raise ValueError(f"--norm-position must be one of {', '.join(NORM_POSITIONS)}, got {self.norm_position!r}")

    @property
    def pre_norm(self) -> bool:
        """RMSNorm on each layer's input (``--norm-position pre``) rather than on its convolution's output."""
        return self.norm and self.norm_position == "pre"

    @property
    def post_norm(self) -> bool:
        """RMSNorm on each layer's convolution output, the paper's Eq. 7."""
        return self.norm and self.norm_position == "post"
