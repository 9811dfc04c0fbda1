"""The papers' own numbers (``analysis/paper_numbers.toml``), for "paper vs measured here"."""

from __future__ import annotations

import functools
import tomllib
from pathlib import Path

__all__ = ["paper_numbers", "PAPER_FILE", "canonical_dataset"]

PAPER_FILE = Path(__file__).resolve().parent / "paper_numbers.toml"


@functools.lru_cache(maxsize=4)
def _load(path: str) -> dict:
    return tomllib.loads(Path(path).read_text())


def paper_numbers(path: str | Path = PAPER_FILE) -> dict:
    """The reference numbers as nested dicts (see the TOML file for units and sources)."""
    return _load(str(path))


def canonical_dataset(name) -> str:
    """Dataset names as the paper tables key them: case-insensitive, ``_`` as ``-``."""
    if not isinstance(name, str):
        return ""
    if ":" in name:  # a generated graph or a file: its parameters are not a name to normalize
        return name.strip()
    key = name.strip().lower().replace("_", "-")
    return {"ogbn-papers100m": "ogbn-papers100M", "facebook-pagepage": "facebook"}.get(key, key)
