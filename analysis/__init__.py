"""Analysis: run records -> pandas DataFrames -> paper figures and tables."""

from .load import load_epochs, load_runs, read_records

__all__ = ["load_runs", "load_epochs", "read_records"]
