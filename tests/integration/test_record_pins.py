"""Records pinned across refactors: a fixed small run of ScaleGNN (one process, four
ranks, and a diverging one) and of two compared systems (GraphSAGE in process,
GraphSAINT on two ranks) writes a record equal, field for field, to the one stored in
``tests/expected/records/`` by the code before the run path was redesigned.

The stored records are read as the code reads any older record, through
:func:`scalegnn.records.upgrade` (they are of schema 2: the comm and GEMM dtypes and
the permutation under ``config.perf``, where schema 3 has them under
``config.numerics``): the records of then, as today's code reads them, must equal
today's. The files themselves are not rewritten; their ``schema_version`` compares as
the current one after the upgrade.

Left out of the comparison, because they measure the machine rather than the run:
times (every ``*_s`` field outside the configuration: epoch, evaluation, compile and
preprocessing seconds, time to target; of a ``*components`` breakdown only the names
are kept), memory
peaks and every other ``*_per_rank`` measurement (their presence and type are still compared), the run id and path, and ``env``
beyond its backend, device type and placement less the host names (host name,
library versions, git commit, CPU model, threads). Everything else is compared: the configuration, grid, world size,
steps per epoch, every epoch's loss and accuracies, collective bytes and calls per
kind, the component names, the status and the summary.

Floats are compared to a relative 1e-6: the runs are deterministic on one machine
(``test_same_seed_gives_the_same_loss_curve`` holds exact equality), but another CPU
model may pick other BLAS kernels and round the last bits differently.

``SCALEGNN_PIN_RECORDS=write pytest tests/integration/test_record_pins.py`` rewrites the stored
records (only when a change of behaviour is intended; say so in the commit).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

import scalegnn
from scalegnn.records import upgrade

EXPECTED = Path(__file__).resolve().parents[1] / "expected" / "records"
GRAPH = "csbm:n=600,avg_degree=8,classes=4,feature_dim=16"
COMMON = dict(dataset=GRAPH, epochs=2, seed=3, progress=False)

RUNS = {
    "scalegnn-1": dict(system="scalegnn", batch_ratio=0.2, hidden=16, layers=2, dropout=0.2),
    "scalegnn-4": dict(system="scalegnn", batch_ratio=0.2, hidden=16, layers=3, dropout=0.2, nproc=4,
                       grid=(2, 1, 2, 1)),
    "scalegnn-diverged": dict(system="scalegnn", batch_ratio=0.2, hidden=16, layers=2, lr=1e30, epochs=3),
    "graphsage-1": dict(system="graphsage", hidden=16, layers=2, batch_size=128),
    "graphsaint-2": dict(system="graphsaint", hidden=16, layers=2, nproc=2),
}

PEAKS = ("peak_memory_bytes", "peak_memory_bytes_per_rank", "peak_rss_bytes_per_rank",
         "peak_device_memory_bytes_per_rank")


def _shape(value):
    """What a measured value is, without its number: its type (and length for a list)."""
    if isinstance(value, list):
        return ["list", len(value), sorted({type(v).__name__ for v in value})]
    return type(value).__name__


def _unmeasured(fields: dict) -> dict:
    """``fields`` with its times reduced to their shape and its breakdowns to their names."""
    out = {}
    for key, value in fields.items():
        if key.endswith("_s") or key in PEAKS or key.endswith("_per_rank"):  # every rank's measurement
            value = _shape(value)
        elif key.endswith("components") and isinstance(value, dict):
            value = sorted(value)
        out[key] = value
    return out


def comparable(record: dict) -> dict:
    """The record without what measures the machine (see the module doc)."""
    rec = _unmeasured({k: v for k, v in record.items() if k not in ("run_id", "path", "env", "config")})
    env = record["env"]
    rec["env"] = {"keys": sorted(env), "backend": env.get("backend"), "device_type": env.get("device_type"),
                  "placement": [{k: v for k, v in p.items() if k != "host"} for p in env.get("placement", [])]}
    config = json.loads(json.dumps(record["config"]))
    config["loop"]["out_dir"] = "<out>"
    rec["config"] = config
    rec["epochs"] = [_unmeasured(row) for row in record["epochs"]]
    for key in ("model_file", "best_model_file"):  # beside the record, wherever that is: its name only
        if key in rec:
            rec[key] = Path(rec[key]).name.replace(record["run_id"], "<run id>")
    if rec.get("summary"):
        rec["summary"] = _unmeasured(rec["summary"])
    return json.loads(json.dumps(rec))  # tuples as lists, as on disk


def differences(expected, actual, where: str = "record") -> list[str]:
    """Every place where ``actual`` differs from ``expected`` (floats to a relative 1e-6)."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        out = [f"{where}: keys only expected {sorted(set(expected) - set(actual))}, only actual "
               f"{sorted(set(actual) - set(expected))}"] if set(expected) != set(actual) else []
        for key in sorted(set(expected) & set(actual)):
            out += differences(expected[key], actual[key], f"{where}.{key}")
        return out
    if isinstance(expected, list) and isinstance(actual, list):
        if len(expected) != len(actual):
            return [f"{where}: {len(expected)} items expected, {len(actual)} found"]
        return [d for i, (e, a) in enumerate(zip(expected, actual)) for d in differences(e, a, f"{where}[{i}]")]
    if isinstance(expected, float) and isinstance(actual, float) and not isinstance(actual, bool):
        same = (math.isnan(expected) and math.isnan(actual)) or math.isclose(expected, actual, rel_tol=1e-6,
                                                                             abs_tol=1e-12)
        return [] if same else [f"{where}: expected {expected!r}, found {actual!r}"]
    return [] if expected == actual and type(expected) is type(actual) else \
        [f"{where}: expected {expected!r}, found {actual!r}"]


@pytest.mark.parametrize("name", sorted(RUNS))
def test_a_fixed_run_writes_the_pinned_record(name, tmp_path, isolated_data):
    settings = {**COMMON, **RUNS[name], "out_dir": str(tmp_path / "runs")}
    record = scalegnn.train(**settings)
    on_disk = json.loads(Path(record["path"]).read_text())
    assert comparable(on_disk) == comparable(record) or not differences(comparable(on_disk), comparable(record))
    path = EXPECTED / f"{name}.json"
    if os.environ.get("SCALEGNN_PIN_RECORDS") == "write":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(comparable(on_disk), indent=1, sort_keys=True) + "\n")
    expected = upgrade(json.loads(path.read_text()))  # stored by older code: read as any older record is
    found = differences(expected, comparable(on_disk))
    assert not found, "\n".join(found[:40])


def test_the_comparison_can_fail():
    """A changed loss, a changed byte count, a missing field and a status are all caught;
    a time is not compared."""
    base = {"a": 1.0, "b": {"pmm_x": 64}, "c": [1, 2], "status": "ok"}
    assert differences(base, json.loads(json.dumps(base))) == []
    assert differences(base, {**base, "a": 1.0 + 1e-5})
    assert differences(base, {**base, "b": {"pmm_x": 65}})
    assert differences(base, {k: v for k, v in base.items() if k != "c"})
    assert differences(base, {**base, "status": "failed"})
    assert differences(base, {**base, "a": 1})  # an int where a float was
    row = {"epoch": 1, "train_time_s": 1.5, "components": {"spmm": 0.1}}
    faster = {"epoch": 1, "train_time_s": 0.5, "components": {"spmm": 0.01}}
    rec = {"run_id": "x", "env": {"backend": None, "device_type": "cpu", "torch": "2"}, "config": {"loop": {}},
           "epochs": [row], "peak_memory_bytes": 10}
    other = {**rec, "run_id": "y", "epochs": [faster], "peak_memory_bytes": 99, "env": {**rec["env"], "torch": "3"}}
    assert comparable(rec) == comparable(other)
