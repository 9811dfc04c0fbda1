"""The papers' own numbers (``analysis/paper_numbers.toml``), for "paper vs measured here"."""

from __future__ import annotations

import functools
import tomllib
from pathlib import Path

__all__ = ["paper_numbers", "PAPER_FILE", "canonical_dataset", "fig6_points"]

PAPER_FILE = Path(__file__).resolve().parent / "paper_numbers.toml"


@functools.lru_cache(maxsize=4)
def _load(path: str) -> dict:
    return tomllib.loads(Path(path).read_text())


def paper_numbers(path: str | Path = PAPER_FILE) -> dict:
    """The reference numbers as nested dicts (see the TOML file for units and sources)."""
    return _load(str(path))


def fig6_points(paper: dict) -> list[tuple[str, str, str, int, float]]:
    """The paper's Fig. 6 times: (cluster, dataset, system, GPUs, seconds) for every point
    of ``paper["fig6"]`` (its ``targets`` table is the accuracy each time is to)."""
    return [(cl, ds, system, int(g), float(secs))
            for cl, datasets in paper.get("fig6", {}).items() if cl != "targets"
            for ds, systems in datasets.items() for system, pts in systems.items() for g, secs in pts.items()]


def canonical_dataset(name) -> str:
    """Dataset names as the paper tables key them: case-insensitive, ``_`` as ``-``."""
    if not isinstance(name, str):
        return ""
    if ":" in name:  # a generated graph or a file: its parameters are not a name to normalize
        return name.strip()
    key = name.strip().lower().replace("_", "-")
    return {"ogbn-papers100m": "ogbn-papers100M", "facebook-pagepage": "facebook"}.get(key, key)
