"""Sweeps: cluster profiles and per-figure sweep specs (TOML data files), expanded
into ``scalegnn train`` runs and launched with submitit (SLURM job arrays, or
locally). See sweeps/README.md for every field."""

from .profiles import ClusterProfile, ProfileError, list_profiles, load_profile
from .spec import RunSpec, SpecError, SweepSpec, expand, list_specs, load_spec

__all__ = ["ClusterProfile", "ProfileError", "list_profiles", "load_profile", "RunSpec", "SpecError", "SweepSpec",
           "expand", "list_specs", "load_spec"]
