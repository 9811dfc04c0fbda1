"""Run records: one JSON file per run, written atomically, never edited.

Every field is documented in ``results/README.md``. A record is a plain dict so
that baselines in other environments (DistDGL's own virtualenv) can emit the same
thing; :func:`validate_record` is the single definition of what a valid one is.
"""

from __future__ import annotations

import errno
import json
import os
import platform
import socket
import subprocess
import time
import uuid
from pathlib import Path
from typing import TypedDict

from .fileio import atomic_write

__all__ = [
    "SCHEMA_VERSION",
    "reserve_record_space",
    "reserve_path",
    "rescue_folders",
    "RecordError",
    "new_run_id",
    "new_record",
    "new_epoch_row",
    "RunRecord",
    "EpochRow",
    "environment_info",
    "placement_of",
    "git_commit",
    "memory_fields",
    "per_rank_fields",
    "atomic_write_json",
    "validate_record",
    "write_record",
    "read_record",
    "time_to_target",
    "summarize",
    "comm_per_step",
    "summary_line",
    "upgrade",
    "config_schema",
    "current_config",
]

SCHEMA_VERSION = 4
# "cancelled": the scheduler stopped the job on request (scancel) before it finished;
# "timeout": it reached its time limit with no requeue left (sweeps/task.py writes both);
# "interrupted": SIGINT (Ctrl-C) or SIGTERM stopped a run that no scheduler owns
# (scalegnn/signals.py; the error names the signal, the epochs done and how to resume).
STATUSES = ("ok", "failed", "diverged", "timeout", "cancelled", "interrupted", "running")



class EpochRow(TypedDict, total=False):
    """One epoch of a run (``results/README.md``, Epoch rows): the required keys
    below, plus system-specific ones (``cache_hits``, ``eval_components``...)."""

    epoch: int
    train_time_s: float  # cumulative training time at the end of this epoch
    loss: float  # mean training loss over the epoch's steps
    train_acc: float | None  # full-graph accuracies, None on epochs without evaluation
    val_acc: float | None
    test_acc: float | None
    eval_time_s: float | None
    components: dict  # seconds per step component
    comm_bytes: dict  # bytes sent per collective kind
    batch_train_acc: float | None  # accuracy on the sampled batches (not required: older records lack it)
    comm_calls: dict  # collective calls per kind (not required: older records and non-counting systems lack it)


class RunRecord(TypedDict, total=False):
    """A run record (``results/README.md``): the required keys below, plus the
    optional ones :func:`new_record` writes (``graph``, ``batch_size``, ...)."""

    schema_version: int
    run_id: str
    system: str
    dataset: str
    config: dict  # RunConfig.to_dict(): nested sections (schema 3: numerics apart from perf)
    grid: dict
    world_size: int
    seed: int
    env: dict
    epochs: list[EpochRow]
    target_acc: float | None
    time_to_target_s: float | None
    peak_memory_bytes: int | None
    status: str  # one of STATUSES
    error: str | None


REQUIRED_FIELDS = tuple(RunRecord.__annotations__)
OPTIONAL_EPOCH_FIELDS = ("batch_train_acc", "comm_calls")
EPOCH_FIELDS = tuple(k for k in EpochRow.__annotations__ if k not in OPTIONAL_EPOCH_FIELDS)


class RecordError(ValueError):
    """A run record is malformed, truncated or from an unsupported schema version."""


def new_run_id(system: str, dataset: str) -> str:
    """Unique across concurrent array jobs: time, system, dataset and 48 random bits."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    safe = lambda s: "".join(c if c.isalnum() or c in "-." else "-" for c in s)  # noqa: E731
    return f"{stamp}-{safe(system)}-{safe(dataset)}-{uuid.uuid4().hex[:12]}"


def new_record(*, system: str, dataset: str, config: dict, grid: dict, world_size: int, seed: int, env: dict,
               graph: dict | None, batch_size: int | None, steps_per_epoch: int | None,
               target_acc: float | None, run_id: str | None = None, **extra) -> RunRecord:
    """A run record as it stands before the first epoch (status ``running``); ``extra``
    fields (e.g. ``compile_time_s``) go in as given. The one skeleton every record
    starts from (:mod:`scalegnn.session`: a run's own, and the stand-in of a run that
    lost the rank holding it). ``resumed_from`` is None until a resume fills it (the
    run id of the record whose checkpoint this run continues: a resume is a new run)."""
    return {
        "schema_version": SCHEMA_VERSION,
        "run_id": run_id or new_run_id(system, dataset),
        "resumed_from": None,
        "system": system,
        "dataset": dataset,
        "config": config,
        "grid": grid,
        "world_size": world_size,
        "seed": seed,
        "env": env,
        "graph": graph,
        "batch_size": batch_size,
        "steps_per_epoch": steps_per_epoch,
        **extra,
        "epochs": [],
        "target_acc": target_acc,
        "time_to_target_s": None,
        "peak_memory_bytes": None,
        "peak_memory_bytes_per_rank": None,
        "status": "running",
        "error": None,
    }


def new_epoch_row(epoch: int, train_time_s: float, loss: float, batch_train_acc: float | None, components: dict,
                  comm_bytes: dict, comm_calls: dict | None = None, **extra) -> EpochRow:
    """An epoch's row as its training ends, before evaluation fills the accuracies;
    ``comm_calls`` only from a system that counts its calls; ``extra`` system-specific
    fields go in as given."""
    row = EpochRow(epoch=epoch, train_time_s=train_time_s, loss=loss, batch_train_acc=batch_train_acc,
                   train_acc=None, val_acc=None, test_acc=None, eval_time_s=None,
                   components=dict(components), comm_bytes=dict(comm_bytes), **extra)
    if comm_calls is not None:
        row["comm_calls"] = dict(comm_calls)
    return row


def git_commit(short: int | None = None) -> str | None:
    """The commit of this source tree (``short``: abbreviated to that many hex digits, more where git finds
    them ambiguous), or None outside a git checkout or without git. The one place ``git rev-parse`` runs:
    a run record's ``env.git_commit``, ``scalegnn report`` and the GPU report name the commit alike."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", *([f"--short={short}"] if short else []), "HEAD"], capture_output=True, text=True,
            timeout=5, cwd=Path(__file__).resolve().parent,
        )
        return out.stdout.strip() or None if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def placement_of(rank: int, local_rank: int, device) -> dict:
    """Where one rank runs, as ``env.placement`` lists it: its rank, this host's name,
    its local rank on the host and its torch device."""
    return {"rank": rank, "host": socket.gethostname(), "local_rank": local_rank, "device": str(device)}


def environment_info(backend: str | None = None, device="cpu", placement: list[dict] | None = None) -> dict:
    """Where a run ran: host, device, backend and library versions.

    ``device`` (a ``torch.device`` or its name) gives ``device`` (its human name:
    the GPU model, or the CPU and its cores), ``device_type`` ("cpu" / "cuda") and
    ``accelerator`` (:func:`scalegnn.device.device_info`: index, CUDA or HIP version,
    NCCL/RCCL version, compute capability, memory); ``threads`` the threads of the
    process and how they were chosen, and OpenMP's wait policy (:func:`scalegnn.threads.record`);
    ``placement`` every rank's host, local rank and device (:func:`placement_of`; this
    process alone when None)."""
    import numpy
    import torch

    from importlib import metadata

    from . import threads
    from .device import device_info

    libs = {"torch": torch.__version__, "numpy": numpy.__version__}
    # Read installed versions from package metadata: importing PyG or DGL just to
    # ask their version would cost seconds per record.
    for dist in ("torch-geometric", "torch-sparse", "torch-scatter", "dgl", "ogb", "pandas", "scipy", "submitit"):
        try:
            libs[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    accelerator = device_info(device)
    return {
        "hostname": socket.gethostname(),
        "device": accelerator["name"],
        "device_type": accelerator["type"],
        "accelerator": accelerator,
        "backend": backend,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "git_commit": git_commit(),
        "libraries": libs,
        "threads": threads.record(),
        "placement": placement or [placement_of(0, 0, device)],
    }


def memory_fields(per_rank: list[tuple]) -> dict:
    """The record's memory fields from every rank's (peak memory, peak RSS, peak device
    memory or None), in rank order: ``peak_memory_bytes`` is what bounds the run on its
    device (the GPU allocator's peak on a GPU, the RSS on the CPU), the largest rank's,
    with ``peak_memory_bytes_per_rank``; ``peak_rss_bytes_per_rank`` (host memory,
    always) and ``peak_device_memory_bytes_per_rank`` (None on the CPU) beside it."""
    device = [p[2] for p in per_rank]
    return {"peak_memory_bytes_per_rank": [p[0] for p in per_rank],
            "peak_memory_bytes": max(p[0] for p in per_rank),
            "peak_rss_bytes_per_rank": [p[1] for p in per_rank],
            "peak_device_memory_bytes_per_rank": None if all(d is None for d in device) else device}


def per_rank_fields(per_rank: list[dict]) -> dict:
    """``{name}_per_rank`` lists, in rank order, from every rank's own measurements
    ``{name: value}`` (a trainer's :meth:`~scalegnn.loop.Trainer.rank_fields`; a rank
    without the name gives None); nothing when no rank measured anything."""
    names = list(dict.fromkeys(k for own in per_rank for k in own))
    return {f"{name}_per_rank": [own.get(name) for own in per_rank] for name in names}


# Version 1 kept the configuration flat (dataset, batch_ratio, epochs, grid, ... beside
# the nested model/optim/checkpoint/perf); version 2 nests every component's settings
# (scalegnn.config.RunConfig). Where each flat key went:
_V1_SECTIONS = {"data": ("dataset", "data_root", "shard_dir"), "sampling": ("batch_size", "batch_ratio"),
                "loop": ("epochs", "eval_every", "target_acc", "stop_at_target", "out_dir", "progress"),
                "parallel": ("grid", "nproc", "device", "backend", "collective_timeout_s")}
_V1_OPTION_NAMES = {"salient": {"prefetch": "prefetch_batches"}}  # options renamed with schema 2
# Version 3 splits version 2's perf section: the settings that change what is computed
# move to their own section, numerics (scalegnn.numerics); perf keeps the speed-only ones.
# Version 4 gives graph.num_edges one meaning, the graph's own (as `scalegnn data info`
# counts it), and the trained matrix's entries their own field, graph.adjacency_nnz.
_V2_NUMERICS = ("comm_dtype", "gemm_dtype", "permute")
# Settings added to a section after records were written, at the value every run had
# before the setting existed: a record without one ran with that value.
# Settings added since records were written -> the value every run had before: (section, key),
# section None for a top-level setting of the configuration.
_ADDED_SETTINGS = {("model", "norm_position"): "post",  # the paper's RMSNorm placement, the only one before
                   ("perf", "cuda_graphs"): False,  # every step ran uncaptured
                   (None, "tuned_from"): None}  # no run said where its settings came from
# Record fields added since records were written -> the value every record had before.
# A resume used to rewrite its parent's record under the same run id; since it writes a
# record of its own, ``resumed_from`` names the parent, and an older record continued no other.
_ADDED_FIELDS = {"resumed_from": None}


def upgrade(record: dict) -> dict:
    """The record in the current schema (in place; older versions are read, never
    rewritten on disk), one version after the other: version 1's flat configuration
    nested as version 2's; version 2's ``perf.comm_dtype``, ``perf.gemm_dtype`` and
    ``perf.permute`` moved into version 3's ``numerics`` section (placed before
    ``perf``, as :class:`scalegnn.config.RunConfig` orders them; a setting a record
    lacks stays absent); version 3's ``graph.num_edges`` (the trained matrix's entries)
    moved to version 4's ``graph.adjacency_nnz``, its ``num_edges`` unknown (None); a
    setting added since a record was written (:data:`_ADDED_SETTINGS`), and a record
    field (:data:`_ADDED_FIELDS`), takes the value every run had before it existed. The
    configuration's dicts are new ones: the caller's are left as they were."""
    if record.get("schema_version") == 1 and isinstance(record.get("config"), dict):
        old = record["config"]
        config = {"system": old.get("system", record.get("system")), "seed": old.get("seed", record.get("seed"))}
        for section, keys in _V1_SECTIONS.items():
            config[section] = {k: old[k] for k in keys if k in old}
        moved = {k for keys in _V1_SECTIONS.values() for k in keys} | {"system", "seed"}
        config.update({k: v for k, v in old.items() if k not in moved})
        if isinstance(config.get("optim"), dict):  # the baselines noted their (fixed) optimizer, "Adam"
            config["optim"] = {k: v for k, v in config["optim"].items() if k != "optimizer"}
        renamed = _V1_OPTION_NAMES.get(config["system"], {})
        if isinstance(config.get("options"), dict):
            config["options"] = {renamed.get(k, k): v for k, v in config["options"].items()}
        record["config"] = config
        record["schema_version"] = 2
    if record.get("schema_version") == 2 and isinstance(record.get("config"), dict):
        config = {}
        for key, value in record["config"].items():
            if key == "perf" and isinstance(value, dict):
                config["numerics"] = {k: value[k] for k in _V2_NUMERICS if k in value}
                value = {k: v for k, v in value.items() if k not in _V2_NUMERICS}
            config[key] = value
        record["config"] = config
        record["schema_version"] = 3
    if record.get("schema_version") == 3:
        graph = record.get("graph")
        if isinstance(graph, dict) and "num_edges" in graph and "adjacency_nnz" not in graph:
            # version 3's num_edges was the trained matrix's entries (self loops added by the
            # system's preparation included); the graph's own count was not recorded
            record["graph"] = {**graph, "adjacency_nnz": graph["num_edges"], "num_edges": None}
        record["schema_version"] = 4
    for (section, key), value in _ADDED_SETTINGS.items():
        config = record.get("config")
        if not isinstance(config, dict):
            continue
        if section is None:
            if key not in config:
                record["config"] = {**config, key: value}
        elif isinstance(config.get(section), dict) and key not in config[section]:
            record["config"] = {**config, section: {**config[section], key: value}}
    for key, value in _ADDED_FIELDS.items():
        record.setdefault(key, value)
    return record


def config_schema(config: dict) -> int:
    """The schema of a saved run configuration, read from its shape: version 1's flat
    keys at the top (``dataset``, ``epochs``...), version 2's numerics settings inside
    ``perf``, else the current one."""
    if any(k in config for keys in _V1_SECTIONS.values() for k in keys):
        return 1
    perf = config.get("perf")
    if isinstance(perf, dict) and any(k in perf for k in _V2_NUMERICS):
        return 2
    return SCHEMA_VERSION


def current_config(config: dict) -> dict:
    """A run configuration saved by any schema (a record's, a checkpoint's, a sweep
    task's) in today's layout, through :func:`upgrade`; the caller's dicts are left as
    they were."""
    return upgrade({"schema_version": config_schema(config), "config": dict(config)})["config"]


def validate_record(record: dict, source: str = "record") -> dict:
    """Raise :class:`RecordError` naming the first problem; return the record."""
    if not isinstance(record, dict):
        raise RecordError(f"{source}: a run record must be a JSON object")
    version = record.get("schema_version")
    if not isinstance(version, int):
        raise RecordError(f"{source}: missing integer schema_version")
    if version > SCHEMA_VERSION:
        raise RecordError(
            f"{source}: schema_version {version} is newer than this scalegnn understands ({SCHEMA_VERSION}); "
            "upgrade scalegnn to read it"
        )
    upgrade(record)
    missing = [f for f in REQUIRED_FIELDS if f not in record]
    if missing:
        raise RecordError(f"{source}: missing fields {missing}")
    if record["status"] not in STATUSES:
        raise RecordError(f"{source}: status {record['status']!r} is not one of {STATUSES}")
    if not isinstance(record["epochs"], list):
        raise RecordError(f"{source}: epochs must be a list")
    for i, row in enumerate(record["epochs"]):
        if not isinstance(row, dict):
            raise RecordError(f"{source}: epoch row {i} is a {type(row).__name__}, not an object")
        lacking = [f for f in EPOCH_FIELDS if f not in row]
        if lacking:
            raise RecordError(f"{source}: epoch row {row.get('epoch')} lacks {lacking}")
        for key in ("components", "comm_bytes", "comm_calls"):
            if key in row and not isinstance(row[key], dict):
                raise RecordError(f"{source}: epoch row {row.get('epoch')}: {key} must be an object")
        for key in _EPOCH_NUMBERS:  # what the analysis computes with: a number (NaN included) or null
            value = row.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise RecordError(f"{source}: epoch row {row.get('epoch')}: {key} must be a number, got {value!r}")
    for key in ("config", "grid", "env"):
        if not isinstance(record[key], dict):
            raise RecordError(f"{source}: {key} must be an object, got {type(record[key]).__name__}")
    world = record.get("world_size")
    if world is not None and (isinstance(world, bool) or not isinstance(world, int) or world < 1):
        raise RecordError(f"{source}: world_size must be an integer >= 1, got {world!r}")
    return record


_EPOCH_NUMBERS = ("epoch", "loss", "train_time_s", "val_acc", "test_acc", "train_acc", "eval_time_s")


# A full disk must not lose a finished run: when a run starts, rank 0 sets aside this much
# of its record folder (:func:`reserve_record_space`, a file of zeros, so the blocks are
# really allocated); when the record cannot be written for lack of space, the reserve is
# given back and the write tried again, then a rescue folder (:func:`rescue_folders`).
RESERVE_BASE_BYTES = 256 << 10
RESERVE_PER_EPOCH_BYTES = 4 << 10  # an epoch row with its components and bytes is ~1-2 KiB
_FULL = (errno.ENOSPC, errno.EDQUOT)


def reserve_path(out_dir, run_id: str) -> Path:
    """Where run ``run_id``'s reserve (:func:`reserve_record_space`) sits."""
    return Path(out_dir) / f".{run_id}.reserve"


def reserve_record_space(out_dir: str | os.PathLike, run_id: str, epochs: int) -> Path | None:
    """Set aside room for the record of run ``run_id`` (``epochs`` epoch rows) in
    ``out_dir``; None when even that fails (the disk is already full: the run goes on,
    and its record will go to a rescue folder if need be)."""
    path = reserve_path(out_dir, run_id)
    size = RESERVE_BASE_BYTES + RESERVE_PER_EPOCH_BYTES * max(int(epochs), 1)
    try:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as f:
            chunk = bytes(64 << 10)
            for start in range(0, size, len(chunk)):
                f.write(chunk[: size - start])
            f.flush()
            os.fsync(f.fileno())
        return path
    except OSError:
        path.unlink(missing_ok=True)
        return None


def rescue_folders() -> list[Path]:
    """Where a record goes when its own folder is full: ``$SCALEGNN_RESCUE_DIR``, then
    ``$SCALEGNN_CACHE_DIR/rescued-records`` (a user who moved the cache off the home folder
    moved it for a reason: a quota, a node without one), then
    ``~/.cache/scalegnn/rescued-records``, then the temporary folder."""
    import tempfile

    out = [Path(os.environ["SCALEGNN_RESCUE_DIR"])] if os.environ.get("SCALEGNN_RESCUE_DIR") else []
    if os.environ.get("SCALEGNN_CACHE_DIR"):
        out.append(Path(os.environ["SCALEGNN_CACHE_DIR"]) / "rescued-records")
    return out + [Path.home() / ".cache" / "scalegnn" / "rescued-records",
                  Path(tempfile.gettempdir()) / f"scalegnn-rescued-records-{os.getuid()}"]


def write_record(record: dict, out_dir: str | os.PathLike, *, exclusive: bool = False) -> Path:
    """Validate and write ``<out_dir>/<run_id>.json`` atomically (:func:`atomic_write_json`;
    ``exclusive``: only if no record of this run exists yet). A full disk (ENOSPC, a
    quota) gives back the run's reserve (:func:`reserve_record_space`) and tries again,
    then writes to the first rescue folder that takes it (:func:`rescue_folders`) and
    says so in one line on stderr; the reserve is removed once the record is written."""
    validate_record(record)
    reserve = reserve_path(out_dir, record["run_id"])
    name = f"{record['run_id']}.json"
    try:
        path = atomic_write_json(Path(out_dir) / name, record, exclusive=exclusive)
    except OSError as exc:
        if exc.errno not in _FULL:
            raise
        if reserve.exists():
            reserve.unlink()
            try:
                return atomic_write_json(Path(out_dir) / name, record, exclusive=exclusive)
            except OSError as again:
                if again.errno not in _FULL:
                    raise
        path = _rescue(record, name, out_dir, exc)
    reserve.unlink(missing_ok=True)
    return path


def _rescue(record: dict, name: str, out_dir, full: OSError) -> Path:
    import sys

    for folder in rescue_folders():
        try:
            folder.mkdir(parents=True, exist_ok=True)
            path = atomic_write_json(folder / name, record)
        except OSError:
            continue
        print(f"scalegnn: no space left in {out_dir} for the run record ({full.strerror}); it is in {path} instead",
              file=sys.stderr)
        return path
    raise OSError(full.errno, f"no space left for the run record in {out_dir} nor in any rescue folder "
                  f"({', '.join(map(str, rescue_folders()))}); set SCALEGNN_RESCUE_DIR to a folder with room") from full


def atomic_write_json(target: str | os.PathLike, obj, *, exclusive: bool = False) -> Path:
    """Write ``obj`` as JSON to ``target`` atomically (:func:`scalegnn.fileio.atomic_write`);
    numpy / torch scalars, sets, tuples and paths are converted. ``exclusive``: only
    if ``target`` does not exist yet (``FileExistsError`` otherwise)."""
    return atomic_write(target, lambda f: json.dump(obj, f, indent=1, allow_nan=True, default=_json_default),
                        text=True, exclusive=exclusive)


def _json_default(obj):
    if hasattr(obj, "item"):  # numpy / torch scalars
        return obj.item()
    if isinstance(obj, (set, tuple)):
        return list(obj)
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"run record field of type {type(obj).__name__} is not JSON-serializable")


def read_record(path: str | os.PathLike) -> dict:
    """Load and validate one record; a truncated or corrupt file raises RecordError with its path."""
    path = Path(path)
    try:
        record = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RecordError(f"{path}: not valid JSON (truncated or corrupt): {exc}") from None
    except RecursionError:  # nested deeper than the parser's stack: no record is
        raise RecordError(f"{path}: JSON nested too deep to be a run record") from None
    except OSError as exc:  # unreadable (permissions, a dangling link, an I/O error)
        raise RecordError(f"{path}: cannot be read: {exc}") from None
    return validate_record(record, source=str(path))


def time_to_target(epochs: list[dict], target: float | None, metric: str = "test_acc") -> float | None:
    """Cumulative training time (evaluation excluded) at the first epoch whose
    ``metric`` reaches ``target``; None if never reached or no target."""
    if target is None:
        return None
    for row in epochs:
        value = row.get(metric)
        if value is not None and value >= target:
            return row["train_time_s"]
    return None


def summarize(record: dict) -> None:
    """Best validation accuracy and the test accuracy at that epoch (model selection)."""
    evaluated = [r for r in record["epochs"] if r.get("val_acc") is not None]
    if evaluated:
        best = max(evaluated, key=lambda r: (r["val_acc"], -r["epoch"]))
        record["summary"] = {
            "best_val_acc": best["val_acc"],
            "test_acc_at_best_val": best["test_acc"],
            "best_epoch": best["epoch"],
            "best_test_acc": max(r["test_acc"] for r in evaluated),
            "final_test_acc": evaluated[-1]["test_acc"],
            "train_time_s": record["epochs"][-1]["train_time_s"],
            "epochs_run": len(record["epochs"]),
            **comm_per_step(record),
        }
    else:
        record["summary"] = None


def comm_per_step(record: dict) -> dict:
    """``comm_calls_per_step`` and ``comm_bytes_per_step`` ({kind: per step}, rank 0's) of
    the last epoch that counted calls, divided by ``steps_per_epoch``; empty when the
    record has neither."""
    steps = record.get("steps_per_epoch")
    rows = [r for r in record["epochs"] if isinstance(r.get("comm_calls"), dict)]
    if not steps or not rows:
        return {}
    last = rows[-1]
    return {"comm_calls_per_step": {k: v / steps for k, v in sorted(last["comm_calls"].items())},
            "comm_bytes_per_step": {k: v / steps for k, v in sorted(last["comm_bytes"].items())}}


def summary_line(record: dict) -> str:
    s = record.get("summary") or {}
    parts = [f"{record['system']} on {record['dataset']}: status {record['status']}"]
    if s:
        parts.append(
            f"test acc {s['test_acc_at_best_val']:.4f} at best val {s['best_val_acc']:.4f} (epoch {s['best_epoch']}), "
            f"best test {s['best_test_acc']:.4f}, {s['epochs_run']} epochs, train time {s['train_time_s']:.1f} s"
        )
    if record.get("time_to_target_s") is not None:
        parts.append(f"time to {record['target_acc']}: {record['time_to_target_s']:.2f} s")
    if record.get("error"):
        parts.append("error: " + record["error"].splitlines()[0])
    return "; ".join(parts)
