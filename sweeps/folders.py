"""A sweep's folders: where its runs, records and manifest live, and what state a run is in.

``OUT/runs/<run key>/`` holds a run's records (rank 0 of its job writes them) and
``submitted.json``, the scheduler job that runs it (written at submission, so a
re-invoked sweep leaves a still-queued run alone).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from .spec import RunSpec

__all__ = ["default_out", "run_dir", "manifest_path", "run_state", "SUBMITTED", "mark_submitted", "submitted_job"]


def default_out(spec: str, cluster: str, root: str | os.PathLike | None = None) -> Path:
    """``<root>/<spec>-<cluster>``; ``root`` is the profile's ``out_root`` (expanded), by
    default ``results/sweeps`` under the current folder."""
    return Path(root if root else Path("results") / "sweeps") / f"{spec}-{cluster}"


def run_dir(out: str | os.PathLike, run: RunSpec) -> Path:
    return Path(out) / "runs" / run.key


def manifest_path(out: str | os.PathLike, spec: str, cluster: str) -> Path:
    return Path(out) / f"{spec}-{cluster}.manifest"


def run_state(folder: str | os.PathLike) -> tuple[str, str | None, str | None]:
    """(state, record path, error) of a run folder: ``ok`` if any record there is ok;
    else the latest record's status; ``missing`` without records."""
    from scalegnn.records import RecordError, read_record

    folder = Path(folder)
    latest = None
    for path in sorted(folder.glob("*.json")):
        if path.name == SUBMITTED:  # the sweep's own note of the job id, not a record
            continue
        try:
            rec = read_record(path)
        except RecordError as exc:
            latest = ("unreadable", str(path), str(exc))
            continue
        if rec["status"] == "ok":
            return "ok", str(path), None
        latest = (rec["status"], str(path), rec.get("error"))
    return latest or ("missing", None, None)


SUBMITTED = "submitted.json"  # in a run folder: the SLURM job that runs it (written at submission)


def mark_submitted(folder: Path, job_id: str, cluster: str) -> None:
    from scalegnn.records import atomic_write_json

    atomic_write_json(folder / SUBMITTED, {"job_id": job_id, "cluster": cluster, "time": time.time()})


def submitted_job(folder: str | os.PathLike) -> str | None:
    """The SLURM job id a run folder was last submitted as (None if never, or unreadable)."""
    try:
        return str(json.loads((Path(folder) / SUBMITTED).read_text())["job_id"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
