"""Fixtures of the harness tests (sweeps, Flux): the shell of a cluster's login node."""

import pytest

# What the sites set on their login nodes and the cluster profiles' data_root / out_root
# name (sweeps/profiles/*.toml): Perlmutter's scratch, the user name.
LOGIN_NODE = {"PSCRATCH": "/pscratch/sd/u/user", "USER": "user"}


@pytest.fixture
def login_node(monkeypatch):
    """This process's environment as on a cluster's login node (:data:`LOGIN_NODE`), with
    no ``$SCALEGNN_DATA_ROOT``, so the cluster profiles' site paths apply. Returns the
    variables it set."""
    for var, value in LOGIN_NODE.items():
        monkeypatch.setenv(var, value)
    monkeypatch.delenv("SCALEGNN_DATA_ROOT", raising=False)
    return dict(LOGIN_NODE)
