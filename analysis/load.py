"""Load a folder of run records into pandas DataFrames.

``load_runs`` gives one row per run (config flattened to ``config.*`` columns,
grid to ``grid.*``); ``load_epochs`` one row per (run, epoch), with component
times as ``time.<name>`` and bytes as ``bytes.<kind>``. Files that are truncated,
corrupt or from a newer schema are reported (path and reason) and skipped, never
silently dropped: they are returned in ``DataFrame.attrs['skipped']`` and warned.

A resume writes a record of its own, naming its parent (``resumed_from``) and holding
the parent's epochs before its own; so a chain of resumes is one run, and its latest
record stands for it (:func:`latest_of_chains`): both frames leave out the records a
later one continued (their run ids in ``DataFrame.attrs['continued']``), so no epoch
is counted twice. :func:`read_records` still reads every record.

Derived columns of ``load_runs`` (everything the figures need, computed once):

    record_file       where the record was read from (``path`` is where it was written)
    run_key           the sweep run folder the record sits in (its parent folder's name)
    grid_str, mp_grid "GdxGxxGyxGz" and the 3D part "GxxGyxGz"
    epoch_time_s      mean training time of one epoch, the first (warm-up) excluded
                      (Plexus: the average of the epochs after the first ones)
    eval_time_s       median wall time of one evaluation round
    time.<component>  mean seconds per epoch of each component (first epoch excluded),
                      time.other = epoch time minus the measured components
    bytes.<kind>      mean bytes per epoch sent by rank 0 per collective kind
    best_test_acc, time_to_best_s   best evaluated test accuracy and the training
                      time when it was first reached (Fig. 6's "x" points)
    test_acc_at_best_val, best_val_acc, best_epoch, final_test_acc
                      the summary's model selection, at the top level (also ``summary.*``)
    batch             what the run's ``batch_size`` counts, for that system: "2,247
                      vertices sampled uniformly (batch_ratio x N)", "1,024 seed vertices,
                      fan-outs 15,10,5", "the whole graph (N vertices)"

The comparison fields (``test_acc_at_best_val``, ``best_test_acc``, ``time_to_target_s``,
``epochs_run``, ``batch``) sit beside ``system``, ``dataset`` and ``world_size``; a
``config.*`` setting that the run's system does not read (``config.sampling.batch_ratio``
of a GraphSAGE run: the settings table's "read by") is blank (None), not the default a
record carries for every system.
    sweep.*           spec, figure, cluster, variant, paper_dataset, order of the run in
                      its sweep manifest (``<spec>-<cluster>.manifest``), when there is one
"""

from __future__ import annotations

import functools
import json
import os
import stat
import statistics
import warnings
from pathlib import Path

import pandas as pd

from scalegnn.records import RecordError, read_record

__all__ = ["read_records", "read_manifests", "load_runs", "load_epochs", "runs_from_records", "latest_of_chains",
           "batch_meaning", "COMPARISON"]


# JSON files a sweep folder holds besides records (sweeps/folders.py's layout):
# checkpoints' meta.json, staged shards' manifest.json, Flux task files, submitit's
# folder, and the job id a run was submitted as. They are not records, not skipped ones.
NOT_RECORD_FOLDERS = frozenset({"checkpoint", "shards", ".flux", ".submitit"})
NOT_RECORD_FILES = frozenset({"submitted.json"})


def _sweep_bookkeeping(path: Path, root: Path) -> bool:
    parts = path.relative_to(root).parts
    return path.name in NOT_RECORD_FILES or any(p in NOT_RECORD_FOLDERS for p in parts[:-1])


def _not_a_file(path: Path) -> str | None:
    """Why ``path`` is not read (None: it is a regular file). Asked of the file itself
    (``stat`` follows links) before it is opened: opening a FIFO for reading blocks until
    a writer comes, which may be never, and a device may never end."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:  # a link to nothing, a loop of links, a folder that cannot be searched
        return f"cannot be read: {exc.strerror or exc}"
    if stat.S_ISREG(mode):
        return None
    kind = ("a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode)
            else "a socket" if stat.S_ISSOCK(mode) else "a device")
    return f"cannot be read: it is {kind}, not a regular file (not opened)"


def read_records(folder) -> tuple[list[dict], list[tuple[str, str]]]:
    """All valid records under ``folder`` (recursively) and the (path, reason) of the rest.

    Each record gets ``record_file`` (where it was read; not stored in the file). A
    sweep's own bookkeeping files (:data:`NOT_RECORD_FOLDERS`, :data:`NOT_RECORD_FILES`)
    are not read. A folder that does not exist is an error (FileNotFoundError)."""
    good, skipped = [], []
    root = Path(folder)
    if not root.is_dir():  # an empty result would read as "no runs yet", and a typo would go unseen
        what = "is a file, not a folder" if root.exists() else "does not exist"
        raise FileNotFoundError(f"results folder {str(root)!r} {what}: give the folder the runs wrote their "
                                "records to (scalegnn train --out, scalegnn sweep --out)")
    for path in sorted(root.rglob("*.json")):
        if _sweep_bookkeeping(path, root):
            continue
        problem = _not_a_file(path)
        if problem:
            skipped.append((str(path), f"{path}: {problem}"))
            continue
        try:
            record = read_record(path)
        except RecordError as exc:
            skipped.append((str(path), str(exc)))
            continue
        record.setdefault("path", str(path))
        record["record_file"] = str(path)
        good.append(record)
    for path, reason in skipped:
        warnings.warn(f"skipping run record {path}: {reason}", stacklevel=2)
    return good, skipped


def latest_of_chains(records: list[dict]) -> tuple[list[dict], list[dict]]:
    """``records`` split into those that stand for their runs and those a later record
    continued (in the order given). A record is continued when another one names it as
    ``resumed_from`` (the child holds its epochs, and its own after them), or when a
    later record (by run id, which starts with the UTC time) continues the same parent:
    a resume that ended before its first checkpoint, tried again from the parent's."""
    newest: dict[str, str] = {}  # parent's run id -> its latest child's
    for r in records:
        if parent := r.get("resumed_from"):
            newest[parent] = max(newest.get(parent, r["run_id"]), r["run_id"])
    kept, continued = [], []
    for r in records:
        rid = r.get("run_id")
        superseded = rid in newest or newest.get(r.get("resumed_from"), rid) != rid
        (continued if superseded else kept).append(r)
    return kept, continued


def read_manifests(folder) -> list[dict]:
    """Every sweep manifest (``*.manifest``, JSON written by ``scalegnn sweep``) under
    ``folder``, each with ``out``: the sweep's output folder."""
    out = []
    for path in sorted(Path(folder).rglob("*.manifest")):
        problem = _not_a_file(path)
        try:
            if problem:
                raise ValueError(problem)
            data = json.loads(path.read_text())
            runs = data.get("runs") if isinstance(data, dict) else None
            if not (isinstance(runs, list) and all(isinstance(r, dict) and "key" in r for r in runs)
                    and all(isinstance(data.get(k), str) for k in ("spec", "cluster"))):
                raise ValueError("not a sweep manifest (a JSON object with spec, cluster and runs, as "
                                 "`scalegnn sweep` writes)")
        except (OSError, ValueError) as exc:  # ValueError: JSON's and Unicode's decode errors too
            warnings.warn(f"skipping sweep manifest {path}: {exc}", stacklevel=2)
            continue
        data["out"] = str(path.parent)
        data["manifest_file"] = str(path)
        out.append(data)
    return out


def _flatten(prefix: str, value, out: dict) -> None:
    if isinstance(value, dict):
        for key, sub in value.items():
            _flatten(f"{prefix}.{key}" if prefix else key, sub, out)
    else:
        out[prefix] = value


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _steady(rows: list[dict]) -> list[dict]:
    return rows[1:] if len(rows) > 1 else rows


def device_kind(rec: dict) -> str:
    """"gpu" or "cpu": where the run computed (``env.device_type``; records written
    before devices were recorded ran on the CPU, and say so in ``env.device``)."""
    env = rec.get("env") or {}
    kind = env.get("device_type")
    if kind is None:
        kind = "cpu" if str(env.get("device") or "cpu").startswith("cpu") else "cuda"
    return "cpu" if kind == "cpu" else "gpu"


def _derived(rec: dict) -> dict:
    rows = rec["epochs"]
    times = [r["train_time_s"] for r in rows]
    deltas = [t - p for p, t in zip([0.0] + times[:-1], times)]
    steady_deltas = deltas[1:] if len(deltas) > 1 else deltas
    epoch_time = sum(steady_deltas) / len(steady_deltas) if steady_deltas else None
    out = {"epoch_time_s": epoch_time,
           "eval_time_s": _median([r.get("eval_time_s") for r in rows])}
    steady = _steady(rows)
    comps: dict[str, float] = {}
    for r in steady:
        for k, v in (r.get("components") or {}).items():
            comps[k] = comps.get(k, 0.0) + v / len(steady)
    for k, v in comps.items():
        out[f"time.{k}"] = v
    if epoch_time is not None and comps:
        out["time.other"] = max(0.0, epoch_time - sum(comps.values()))
    for field, prefix in (("comm_bytes", "bytes"), ("comm_calls", "calls")):  # calls: absent in older records
        per_kind: dict[str, float] = {}
        for r in steady:
            for k, v in (r.get(field) or {}).items():
                per_kind[k] = per_kind.get(k, 0.0) + v / len(steady)
        out.update({f"{prefix}.{k}": v for k, v in per_kind.items()})
    evaluated = [r for r in rows if r.get("test_acc") is not None]
    if evaluated:
        best = max(r["test_acc"] for r in evaluated)
        out["best_test_acc"] = best
        out["time_to_best_s"] = next((r["train_time_s"] for r in evaluated if r["test_acc"] >= best), None)  # NaN
    else:
        out["best_test_acc"] = out["time_to_best_s"] = None
    out["device_kind"] = device_kind(rec)
    g = rec.get("grid") or {}
    shape = [g.get(a, 1) for a in ("dp", "x", "y", "z")]
    out["grid_str"] = "x".join(map(str, shape))
    out["mp_grid"] = "x".join(map(str, shape[1:]))
    return out


COMPARISON = ("test_acc_at_best_val", "best_val_acc", "best_epoch", "final_test_acc")  # from the summary
FRONT = ("run_id", "system", "dataset", "world_size", "grid_str", "status", "test_acc_at_best_val", "best_test_acc",
         "target_acc", "time_to_target_s", "epochs_run", "epoch_time_s", "batch", "batch_size")


@functools.lru_cache(maxsize=None)
def _unread_settings(system: str) -> frozenset[str]:
    """The ``config.*`` columns of the settings ``system`` does not read (the flag table's scopes)."""
    from scalegnn.config import flag_table
    from scalegnn.systems import SCALEGNN_SYSTEMS

    return frozenset(f"config.{path}" for _, path, scope in flag_table()
                     if scope == "scalegnn" and system not in SCALEGNN_SYSTEMS)


def batch_meaning(rec: dict) -> str | None:
    """What ``rec``'s ``batch_size`` counts, in words, for its system (the registry's ``batch``)."""
    from scalegnn import systems as registry

    try:
        system = registry.get(rec.get("system"))
    except registry.UnknownSystem:
        return None
    if system.full_graph:
        n = (rec.get("graph") or {}).get("num_nodes")
        return "the whole graph" + (f" ({n:,} vertices)" if isinstance(n, int) else "")
    size = rec.get("batch_size")
    if not isinstance(size, int):
        return None
    fanouts = ((rec.get("config") or {}).get("options") or {}).get("fanouts")
    return f"{size:,} {system.batch}" + (f", fan-outs {','.join(map(str, fanouts))}" if fanouts else "")


def runs_from_records(records: list[dict], manifests: list[dict] | None = None) -> pd.DataFrame:
    """The ``load_runs`` frame for records already in memory (tests build synthetic ones),
    one row per run: a record that a later one continued is left out (:func:`latest_of_chains`)."""
    records, continued = latest_of_chains(records)
    sweep_of: dict[str, dict] = {}
    for m in manifests or []:
        for i, run in enumerate(m.get("runs", [])):
            sweep_of[run["key"]] = {"spec": m.get("spec"), "figure": m.get("figure"), "cluster": m.get("cluster"),
                                    "variant": run.get("variant", ""), "paper_dataset": run.get("paper_dataset"),
                                    "order": i, "key": run["key"]}
    rows = []
    for rec in records:
        try:
            rows.append(_run_row(rec, sweep_of))
        except (TypeError, ValueError, KeyError, AttributeError) as exc:  # a field of the wrong kind: skip the run
            where = rec.get("record_file") or rec.get("path") or rec.get("run_id")
            warnings.warn(f"skipping run record {where}: a field of the wrong kind ({type(exc).__name__}: {exc})",
                          stacklevel=2)
    frame = pd.DataFrame(rows)
    for col in ("sweep.spec", "sweep.figure", "sweep.cluster", "sweep.variant", "sweep.paper_dataset"):
        if col not in frame:
            frame[col] = None
    front = [c for c in FRONT if c in frame]  # who ran what, and how it compares, before the 150 others
    frame = frame[front + [c for c in frame.columns if c not in front]]
    frame.attrs["continued"] = [r["run_id"] for r in continued]
    return frame


def _run_row(rec: dict, sweep_of: dict) -> dict:
    """One run's row of :func:`runs_from_records`."""
    row = {k: v for k, v in rec.items() if k not in ("epochs", "config", "grid", "env", "summary", "graph")}
    for key in ("config", "grid", "env", "summary", "graph"):
        _flatten(key, rec.get(key) or {}, row)
    row["epochs_run"] = len(rec["epochs"])
    row.update(_derived(rec))
    row.update({key: (rec.get("summary") or {}).get(key) for key in COMPARISON})
    row["batch"] = batch_meaning(rec)
    row.update(dict.fromkeys(_unread_settings(rec["system"]) & row.keys()))
    file = rec.get("record_file") or rec.get("path")
    row["record_file"] = file
    row["run_key"] = Path(file).parent.name if file else None
    info = sweep_of.get(row["run_key"])
    if info:
        row.update({f"sweep.{k}": v for k, v in info.items()})
    return row


def load_runs(folder) -> pd.DataFrame:
    """One row per run of the records under ``folder`` (recursively): the record's
    top-level fields, its settings as ``config.*``, ``grid.*``, ``env.*``, ``graph.*`` and
    ``summary.*`` columns, and the derived and comparison columns of this module's
    docstring. A chain of resumes is one row (its latest record); files that are not
    valid records are skipped and listed in ``attrs["skipped"]`` (path, reason), with a
    warning, never dropped silently."""
    records, skipped = read_records(folder)
    frame = runs_from_records(records, read_manifests(folder))
    frame.attrs["skipped"] = skipped
    return frame


def load_epochs(folder) -> pd.DataFrame:
    """One row per (run, epoch) of the records under ``folder``: the epoch's fields, its
    component times as ``time.*``, its bytes and calls per collective kind as ``bytes.*``
    and ``calls.*``, and ``epoch_time_s`` (this epoch's training time). A chain of
    resumes counts its epochs once (its latest record holds them all)."""
    records, skipped = read_records(folder)
    records, continued = latest_of_chains(records)  # a chain's epochs once: its latest record holds them all
    rows = []
    for rec in records:
        prev = 0.0
        for ep in rec["epochs"]:
            row = {"run_id": rec["run_id"], "system": rec["system"], "dataset": rec["dataset"],
                   "world_size": rec["world_size"], "seed": rec["seed"], "record_file": rec["record_file"]}
            for key, value in ep.items():
                if key == "components":
                    row.update({f"time.{k}": v for k, v in value.items()})
                elif key == "comm_bytes":
                    row.update({f"bytes.{k}": v for k, v in value.items()})
                elif key == "comm_calls":
                    row.update({f"calls.{k}": v for k, v in value.items()})
                else:
                    row[key] = value
            row["epoch_time_s"] = ep["train_time_s"] - prev
            prev = ep["train_time_s"]
            rows.append(row)
    frame = pd.DataFrame(rows)
    frame.attrs["skipped"] = skipped
    frame.attrs["continued"] = [r["run_id"] for r in continued]
    return frame
