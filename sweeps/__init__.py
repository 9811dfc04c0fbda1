"""Sweeps: cluster profiles and per-figure sweep specs (TOML data files), expanded
into ``scalegnn train`` runs and launched with submitit (SLURM job arrays, or
locally). See sweeps/README.md for every field.

The names below load on first use, so that a module run on a compute node before the
ranks start (``python -m scalegnn.sweeps.preflight``) imports neither torch nor the specs."""

from __future__ import annotations

import importlib

__all__ = ["ClusterProfile", "ProfileError", "list_profiles", "load_profile", "RunSpec", "SpecError", "SweepSpec",
           "expand", "list_specs", "load_spec"]

_HOME = {"ClusterProfile": "profiles", "ProfileError": "profiles", "list_profiles": "profiles",
         "load_profile": "profiles", "RunSpec": "spec", "SpecError": "spec", "SweepSpec": "spec", "expand": "spec",
         "list_specs": "spec", "load_spec": "spec"}


def __getattr__(name: str):
    if name in _HOME:
        return getattr(importlib.import_module(f".{_HOME[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
