"""What every ``scalegnn bench`` result shares: the machine it ran on and its Markdown
table. Below every benchmark module (:mod:`.bench_command` dispatches to the others, so
none of them imports it for these)."""

from __future__ import annotations

import os
import platform

__all__ = ["machine_info", "markdown_table"]


def machine_info() -> dict:
    """Host, cores, torch and its threads, the 1-minute load average and python: recorded
    with every result, since timings mean nothing without the load they ran under."""
    import torch

    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    return {"host": platform.node(), "cpus": os.cpu_count(), "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(), "load_avg_1m": round(load[0], 2),
            "python": platform.python_version()}


def markdown_table(header: list[str], rows: list[list]) -> str:
    """A Markdown table: floats to three significant digits (thousands grouped at 1,000 and
    above), whole numbers grouped, anything else as its text."""
    def cell(v):
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
        if isinstance(v, int) and not isinstance(v, bool):
            return f"{v:,}"
        return str(v)

    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)
