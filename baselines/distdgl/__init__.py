"""DistDGL adapter: ``harness`` (this environment) drives ``dgl_run.py`` (the DGL environment)."""
