"""Load a folder of run records into pandas DataFrames.

``load_runs`` gives one row per run (config flattened to ``config.*`` columns,
grid to ``grid.*``); ``load_epochs`` one row per (run, epoch), with component
times as ``time.<name>`` and bytes as ``bytes.<kind>``. Files that are truncated,
corrupt or from a newer schema are reported (path and reason) and skipped, never
silently dropped: they are returned in ``DataFrame.attrs['skipped']`` and warned.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pandas as pd

from scalegnn.records import RecordError, read_record

__all__ = ["read_records", "load_runs", "load_epochs"]


def read_records(folder) -> tuple[list[dict], list[tuple[str, str]]]:
    """All valid records under ``folder`` (recursively) and the (path, reason) of the rest."""
    good, skipped = [], []
    for path in sorted(Path(folder).rglob("*.json")):
        try:
            record = read_record(path)
        except RecordError as exc:
            skipped.append((str(path), str(exc)))
            continue
        record.setdefault("path", str(path))
        good.append(record)
    for path, reason in skipped:
        warnings.warn(f"skipping run record {path}: {reason}", stacklevel=2)
    return good, skipped


def _flatten(prefix: str, value, out: dict) -> None:
    if isinstance(value, dict):
        for key, sub in value.items():
            _flatten(f"{prefix}.{key}" if prefix else key, sub, out)
    else:
        out[prefix] = value


def load_runs(folder) -> pd.DataFrame:
    records, skipped = read_records(folder)
    rows = []
    for rec in records:
        row = {k: v for k, v in rec.items() if k not in ("epochs", "config", "grid", "env", "summary", "graph")}
        for key in ("config", "grid", "env", "summary", "graph"):
            _flatten(key, rec.get(key) or {}, row)
        row["epochs_run"] = len(rec["epochs"])
        rows.append(row)
    frame = pd.DataFrame(rows)
    frame.attrs["skipped"] = skipped
    return frame


def load_epochs(folder) -> pd.DataFrame:
    records, skipped = read_records(folder)
    rows = []
    for rec in records:
        for ep in rec["epochs"]:
            row = {"run_id": rec["run_id"], "system": rec["system"], "dataset": rec["dataset"],
                   "world_size": rec["world_size"], "seed": rec["seed"]}
            for key, value in ep.items():
                if key == "components":
                    row.update({f"time.{k}": v for k, v in value.items()})
                elif key == "comm_bytes":
                    row.update({f"bytes.{k}": v for k, v in value.items()})
                else:
                    row[key] = value
            rows.append(row)
    frame = pd.DataFrame(rows)
    frame.attrs["skipped"] = skipped
    return frame
