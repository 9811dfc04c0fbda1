"""Checkpoint and resume: atomic, per-rank sharded training state.

Because the sample of a step is a pure function of (seed, dp_index, step) and the
dropout mask of (seed, step, layer), a run is fully determined by its config and
the following state, which is all a checkpoint holds:

    per rank (``rank-RRRRR.pt``, torch.save, read back with ``weights_only=True``):
        engine    this rank's model shards, AdamW moments, LR-scheduler counters
        rng       torch CPU (and CUDA) generator, numpy and ``random`` global states,
                  stored as tensors and lists so that weights_only loading accepts them
    once (``meta.json``, written by rank 0 after every rank's file is in place):
        step      optimizer steps done (the next step to run is ``step``)
        epoch     epochs completed; a checkpoint may sit mid-epoch
        loop      the current epoch's partial sums (loss, accuracy counts, component
                  times, bytes) and the cumulative training time
        record    the partial run record (run id, per-epoch rows so far)
        config    the run's whole config, compared field by field on resume

A resumed run therefore replays exactly the steps an uninterrupted run would have
run next and produces the same loss sequence bit for bit (tests/integration/test_resume.py).

Layout of a checkpoint folder ``D`` (``--checkpoint-dir``; on multi-node jobs it must
be on storage every rank can reach)::

    D/step-000000120/rank-00000.pt
    D/step-000000120/rank-00001.pt
    D/step-000000120/meta.json        present <=> the checkpoint is complete

``meta.json`` lists every rank file (``files``: its size, SHA-256 and step), so that a
resume or an export reads only the bytes that were saved: a rank file truncated, edited
or copied from another step is refused in one line naming it, before it is unpickled.
Checkpoints written before the list are read too; their rank files' steps are checked.

Every file is written to a temporary name in the same folder, flushed, fsynced and
renamed over its target (``os.replace``), so a reader sees a whole file or none. A
save interrupted by a kill leaves a folder without ``meta.json``: :func:`latest`
skips it and the next save removes it. The newest ``keep`` complete checkpoints are
kept. Ranks of a data-parallel replica each write their own file (the replicas are
identical, but a rank only ever reads its own file, so no rank needs another's).

For launchers (the SLURM requeue path): pass ``--checkpoint-dir D --resume`` on every
(re)submission. ``--resume`` with no complete checkpoint in ``D`` starts from scratch,
so the first submission and every requeue use the same command line. Each attempt is
a run of its own, with its own record; a resumed one names the run it continues
(``resumed_from``). :func:`latest` and :func:`resume_run_id` tell a launcher what a
resume would pick up.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import re
import shutil
import time
import warnings
from pathlib import Path

import numpy as np
import torch

from .fileio import atomic_write, file_sha256, load_error
from .records import atomic_write_json
from .sections.checkpoint import CheckpointConfig, parse_every  # declared where no torch loads (scalegnn.sections)

__all__ = [
    "PREEMPTION",
    "Preempted",
    "PreemptionRequest",
    "CHECKPOINT_FORMAT",
    "CheckpointConfig",
    "CheckpointError",
    "Checkpointer",
    "FolderLock",
    "latest",
    "list_checkpoints",
    "read_meta",
    "load_rank_state",
    "resume_run_id",
    "rng_state",
    "set_rng_state",
    "config_mismatch",
    "continuation",
    "saved_grid",
    "regridded_step",
    "regridding",
    "atomic_torch_save",
    "parse_every",
]

CHECKPOINT_FORMAT = 1
_STEP_DIR = re.compile(r"^step-(\d{9,})$")
_RANK_FILE = re.compile(r"^rank-(\d{5,})\.pt$")
# Bounds on what meta.json may say, checked before anything is sized by it: more ranks than
# any job has, or counts past what a JSON number holds exactly, are a damaged file (a
# world_size of 10**9 made a resume build a list of 10**9 file names).
_MAX_WORLD = 2 ** 20
_MAX_COUNT = 2 ** 53
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
# What a resume reads of a rank file besides its engine state, by type (rng_state's layout).
_RNG_PARTS = {"torch": torch.Tensor, "numpy": dict, "python": dict}
_REMOVE = "Remove this checkpoint folder to resume from an older one"
# Config fields (dotted) that may differ between the interrupted run and its
# resumption: where things are, how they are shown or timed, never what is computed
# (the sampler kernels and prefetching give bit-identical batches).
RESUMABLE_DIFFERENCES = frozenset({"checkpoint", "loop.progress", "loop.heartbeat_s", "loop.out_dir",
                                   "loop.save_model", "data.data_root", "data.shard_dir",
                                   "parallel.collective_timeout_s", "parallel.nproc", "parallel.device",
                                   "parallel.backend", "perf.prefetch", "perf.profile", "perf.sampler",
                                   "perf.instrument"})
# Config fields that may change to continue a run: they move its end, not what a step
# computes (the sample and dropout of step s do not depend on them). The resumed entry
# of the record lists each change (:func:`continuation`).
CONTINUABLE_DIFFERENCES = frozenset({"loop.epochs"})
# The grid may change at a resume: the trainer makes the checkpoint's state whole and cuts
# each rank's shards from it (:func:`scalegnn.parallel.engine.read_whole_state`). With the
# same Gd a step samples and drops out the same vertices on any 3D grid, so the run goes
# on as it would have, up to the summation order of the new grid's collectives; another
# Gd changes the batches and the steps per epoch (:func:`regridded_step`, :func:`regridding`).
REGRIDDABLE_DIFFERENCES = frozenset({"parallel.grid"})


class CheckpointError(ValueError):
    """A checkpoint cannot be used: incomplete, corrupt, newer format, or from another run."""


# --------------------------------------------------------------------------- RNG
def rng_state() -> dict:
    """Every global random generator this process may use, as tensors and plain lists."""
    np_state = np.random.get_state()
    py_version, py_internal, py_gauss = random.getstate()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": {"keys": torch.from_numpy(np.asarray(np_state[1], dtype=np.int64)), "pos": int(np_state[2]),
                  "has_gauss": int(np_state[3]), "cached_gaussian": float(np_state[4])},
        "python": {"version": py_version, "internal": list(py_internal), "gauss_next": py_gauss},
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state(("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                         n["cached_gaussian"]))
    p = state["python"]
    random.setstate((p["version"], tuple(p["internal"]), p["gauss_next"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# --------------------------------------------------------------------------- files
def atomic_torch_save(obj, target: str | os.PathLike) -> Path:
    """``torch.save`` to a temp file in the same folder, fsync, ``os.replace``. Serialized
    in memory first (a rank's shards and moments: small beside its graph shard), so that
    a full disk is the ``OSError`` it is (ENOSPC), not torch's wrapped writer error."""
    import io

    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return atomic_write(target, lambda f: f.write(buffer.getbuffer()))


def _step_dir(directory: Path, step: int) -> Path:
    return directory / f"step-{step:09d}"


def _rank_file(ckpt: Path, rank: int) -> Path:
    return ckpt / f"rank-{rank:05d}.pt"


def _ranks_present(ckpt: Path) -> set[int]:
    """The ranks whose file is in ``ckpt``: what a world_size is bounded by before it sizes anything."""
    out = set()
    with os.scandir(ckpt) as entries:
        for entry in entries:
            m = _RANK_FILE.match(entry.name)
            if m and entry.name == _rank_file(ckpt, int(m.group(1))).name:
                out.add(int(m.group(1)))
    return out


def _missing(ckpt: Path, world: int, present: set[int]) -> list[str]:
    """Up to four names of rank files below ``world`` that ``ckpt`` lacks (lazy: ``world`` may be anything)."""
    return [_rank_file(ckpt, r).name for r in itertools.islice((r for r in range(world) if r not in present), 4)]


def list_checkpoints(directory) -> list[tuple[int, Path, bool]]:
    """(step, folder, complete) of every checkpoint folder under ``directory``, by step."""
    return [(step, path, problem is None) for step, path, problem in _scan(directory)]


def _scan(directory) -> list[tuple[int, Path, str | None]]:
    """(step, folder, problem) by step; problem is None for a complete checkpoint,
    ``""`` for a save cut short (no ``meta.json``: normal after a kill) and a reason
    for a folder that was completed and then damaged."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    out = []
    for child in directory.iterdir():
        m = _STEP_DIR.match(child.name)
        if m and child.is_dir():
            out.append((int(m.group(1)), child, _problem(child)))
    return sorted(out, key=lambda entry: entry[:2])


def _problem(ckpt: Path) -> str | None:
    """Why ``ckpt`` is no complete checkpoint, cheaply: its meta.json unreadable, or rank
    files it counts missing. What :func:`read_meta` refuses field by field is left to it
    (a resume names the field); the rank files' bytes are checked on reading them."""
    meta = ckpt / "meta.json"
    if not meta.is_file():
        return ""
    try:
        world = int(json.loads(meta.read_text())["world_size"])
    except json.JSONDecodeError as exc:
        return f"{meta}: not valid JSON (truncated or corrupt: {exc})"
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"{meta}: unreadable or without a world_size ({type(exc).__name__}: {exc})"
    if world > _MAX_WORLD:  # no job's world size: a damaged meta.json, which read_meta refuses by the field's name
        return None
    try:
        present = _ranks_present(ckpt)
    except OSError as exc:
        return f"{ckpt}: cannot be listed ({exc})"
    missing = _missing(ckpt, world, present)
    names = f"{', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}"
    if world > len(present):
        return f"{meta}: 'world_size' is {world} but the folder holds {len(present)} rank files ({names} missing)"
    if missing:
        return f"{ckpt}: {meta.name} is present but {names} is missing"
    return None


def latest(directory) -> Path | None:
    """The newest complete checkpoint folder under ``directory``, or None (also when
    ``directory`` does not exist yet). Saves cut short (no ``meta.json``) are skipped
    silently; a newer folder whose ``meta.json`` or rank files were damaged after it
    was completed is skipped with a warning naming the file, since resuming from an
    older checkpoint repeats work the user may not expect to lose."""
    entries = _scan(directory)
    complete = [(step, path) for step, path, problem in entries if problem is None]
    chosen_step, chosen = complete[-1] if complete else (-1, None)
    for step, path, problem in entries:
        if problem and step > chosen_step:
            then = f"resuming from the older {chosen}" if chosen else "no older complete checkpoint: starting afresh"
            warnings.warn(f"{problem}; this checkpoint is ignored; {then} (remove {path} to silence this warning)",
                          UserWarning, stacklevel=2)
    return chosen


def read_meta(ckpt) -> dict:
    """The ``meta.json`` of a checkpoint folder; :class:`CheckpointError` names what is wrong.
    Every field a resume or an export reads is checked here, bounded before it sizes
    anything (``world_size`` by the rank files present), with the list of rank files
    (``files``) and their sizes: a truncated rank file is refused before any is loaded."""
    ckpt = Path(ckpt)
    path = ckpt / "meta.json"
    try:
        meta = json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path} is missing: the checkpoint {ckpt} is incomplete") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path}: not valid JSON (truncated or corrupt): {exc}") from None
    version = meta.get("format") if isinstance(meta, dict) else None
    if not isinstance(version, int):
        raise CheckpointError(f"{path}: not a scalegnn checkpoint (no integer 'format')")
    if version > CHECKPOINT_FORMAT:
        raise CheckpointError(f"{path}: checkpoint format {version} is newer than this scalegnn understands "
                              f"({CHECKPOINT_FORMAT}); upgrade scalegnn to resume it")
    # Every field a resume reads, checked here: a missing or mistyped one is one line, not a KeyError later.
    fix = f"the file is damaged or not written by scalegnn; remove {ckpt} to resume from an older checkpoint"
    for key, kind, low, high in (("step", int, 0, _MAX_COUNT), ("epoch", int, 0, _MAX_COUNT),
                                 ("steps_per_epoch", int, 1, _MAX_COUNT), ("world_size", int, 1, _MAX_WORLD),
                                 ("config", dict, None, None), ("record", dict, None, None),
                                 ("loop", dict, None, None)):
        if key not in meta:
            raise CheckpointError(f"{path}: no {key!r}; {fix}")
        value = meta[key]
        if not isinstance(value, kind) or isinstance(value, bool) or (low is not None and not low <= value <= high):
            want = f"an integer from {low} to {high}" if kind is int else "an object"
            raise CheckpointError(f"{path}: {key!r} must be {want}, got {value!r}; {fix}")
    if not isinstance(meta["record"].get("run_id"), str) or not isinstance(meta["record"].get("epochs"), list):
        raise CheckpointError(f"{path}: 'record' needs a run_id string and an epochs list; {fix}")
    step, spe = meta["step"], meta["steps_per_epoch"]
    if meta["epoch"] != step // spe:  # the trainer saves the epochs done at step `step`
        raise CheckpointError(f"{path}: 'epoch' {meta['epoch']} does not fit 'step' {step} at {spe} "
                              f"'steps_per_epoch' (epoch {step // spe}); {fix}")
    loop = meta["loop"]
    if loop.get("step", step) != step or not _number(loop.get("train_time")):
        raise CheckpointError(f"{path}: 'loop' needs a numeric train_time (and its step, if any, {step}); {fix}")
    if step % spe and not (all(_number(loop.get(k)) for k in ("loss_sum", "loss_n", "correct", "count"))
                           and "components" in loop and "comm_bytes" in loop):
        raise CheckpointError(f"{path}: 'loop' of a checkpoint mid-epoch needs the epoch's sums (loss_sum, loss_n, "
                              f"correct, count, components, comm_bytes); {fix}")
    world = meta["world_size"]
    try:
        present = _ranks_present(ckpt)
    except OSError as exc:
        raise CheckpointError(f"{ckpt}: cannot be listed ({exc})") from None
    missing = _missing(ckpt, world, present)
    if missing:
        raise CheckpointError(f"{path}: 'world_size' is {world} but {ckpt} holds {len(present)} rank files "
                              f"({', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''} missing); {fix}")
    _check_manifest(ckpt, meta, fix)
    return meta


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_manifest(ckpt: Path, meta: dict, fix: str) -> None:
    """``files``, when the checkpoint has it (those before it do not): one entry per rank
    file, each with its SHA-256, size and this step, and each file of that size."""
    files, path = meta.get("files"), ckpt / "meta.json"
    if files is None:
        return
    world = meta["world_size"]
    if not isinstance(files, dict) or len(files) != world:
        raise CheckpointError(f"{path}: 'files' must list the {world} rank files ('world_size'); {fix}")
    for rank in range(world):
        target = _rank_file(ckpt, rank)
        entry = files.get(target.name)
        if not (isinstance(entry, dict) and isinstance(entry.get("sha256"), str) and _SHA256.match(entry["sha256"])
                and isinstance(entry.get("bytes"), int) and not isinstance(entry["bytes"], bool)
                and entry.get("step") == meta["step"]):
            raise CheckpointError(f"{path}: 'files' has no valid entry for {target.name} (sha256, bytes, step "
                                  f"{meta['step']}); {fix}")
        try:
            size = target.stat().st_size
        except OSError as exc:
            raise CheckpointError(f"{target}: cannot be read ({exc}). {_REMOVE}") from None
        if size != entry["bytes"]:
            raise CheckpointError(f"{target}: cannot be read ({size} bytes where {path.name} lists {entry['bytes']}); "
                                  f"it is truncated, corrupt or not written by scalegnn. {_REMOVE}")


def load_rank_state(ckpt, rank: int, map_location="cpu", meta: dict | None = None) -> dict:
    """This rank's state file, loaded with ``weights_only=True`` (tensors and plain containers
    only) once its size and SHA-256 match the checkpoint's list (``files`` of ``meta``, read
    with :func:`read_meta` when not given), then checked: its step that of ``meta``, and
    every part a resume reads present with its type."""
    ckpt = Path(ckpt)
    meta = read_meta(ckpt) if meta is None else meta
    path = _rank_file(ckpt, rank)
    if not path.is_file():
        raise CheckpointError(f"{path} is missing: the checkpoint was written by fewer ranks than this job has")
    entry = (meta.get("files") or {}).get(path.name)
    if entry is not None:
        try:
            size, digest = path.stat().st_size, file_sha256(path)
        except OSError as exc:
            raise CheckpointError(f"{path}: cannot be read ({exc}). {_REMOVE}") from None
        if size != entry["bytes"] or digest != entry["sha256"]:
            what = f"{size} bytes where meta.json lists {entry['bytes']}" if size != entry["bytes"] else \
                "its SHA-256 is not the one meta.json lists"
            raise CheckpointError(f"{path}: cannot be read ({what}); it is truncated, corrupt or not written by "
                                  f"scalegnn. {_REMOVE}")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unpickling failure means a corrupt file
        raise CheckpointError(f"{path}: cannot be read ({load_error(exc)}); it is truncated, corrupt or not "
                              f"written by scalegnn. {_REMOVE}") from None
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT or state.get("rank") != rank:
        raise CheckpointError(f"{path}: not a format-{CHECKPOINT_FORMAT} checkpoint of rank {rank}")
    _check_rank_state(path, state, meta)
    return state


def _check_rank_state(path: Path, state: dict, meta: dict) -> None:
    """What a resume reads of a rank file besides its format and rank, by type: its step and
    world size those of ``meta`` (a rank file copied from another checkpoint is refused
    here, also in a checkpoint without ``files``), a dict of engine state and the parts of
    :func:`rng_state`, whose sizes :func:`set_rng_state` needs."""
    def bad(what: str) -> CheckpointError:
        return CheckpointError(f"{path}: {what}; it is damaged or not written by scalegnn. {_REMOVE}")

    if state.get("step") != meta["step"]:
        raise CheckpointError(f"{path}: holds step {state.get('step')!r}, not the step {meta['step']} of its "
                              f"meta.json (a rank file of another checkpoint). {_REMOVE}")
    if state.get("world_size") != meta["world_size"]:
        raise bad(f"its world_size {state.get('world_size')!r} is not the {meta['world_size']} of its meta.json")
    if not isinstance(state.get("engine"), dict):
        raise bad("no 'engine' state")
    rng = state.get("rng")
    if not isinstance(rng, dict) or any(not isinstance(rng.get(k), kind) for k, kind in _RNG_PARTS.items()):
        raise bad(f"no 'rng' with its parts ({', '.join(_RNG_PARTS)})")
    t, n, py = rng["torch"], rng["numpy"], rng["python"]
    if t.dtype != torch.uint8 or t.shape != torch.get_rng_state().shape:
        raise bad("its 'rng' torch state is not a generator state")
    keys = n.get("keys")
    if not (isinstance(keys, torch.Tensor) and keys.shape == (624,) and isinstance(n.get("pos"), int)
            and 0 <= n["pos"] <= 624 and isinstance(n.get("has_gauss"), int) and _number(n.get("cached_gaussian"))):
        raise bad("its 'rng' numpy state is not a MT19937 state")
    internal = py.get("internal")
    if not (isinstance(py.get("version"), int) and isinstance(internal, list) and len(internal) == 625
            and all(isinstance(v, int) for v in internal) and (py.get("gauss_next") is None
                                                              or _number(py["gauss_next"]))):
        raise bad("its 'rng' python state is not a random.getstate()")
    if "cuda" in rng and not (isinstance(rng["cuda"], (list, tuple))
                              and all(isinstance(g, torch.Tensor) for g in rng["cuda"])):
        raise bad("its 'rng' cuda state is not a list of generator states")


def resume_run_id(directory) -> str | None:
    """The run id a ``--resume`` in ``directory`` would continue (the new run's
    ``resumed_from``), or None (fresh start)."""
    ckpt = latest(directory) if directory else None
    return None if ckpt is None else read_meta(ckpt)["record"]["run_id"]


def _normalized(config: dict) -> dict:
    return json.loads(json.dumps(config, allow_nan=True))


def _current_layout(config: dict) -> dict:
    """A checkpoint's saved config in today's layout (:func:`scalegnn.records.current_config`:
    checkpoints written before schema 2 keep the flat layout of schema 1, those written
    before schema 3 the comm and GEMM dtypes and the permutation in ``perf``)."""
    from .records import current_config

    config = current_config(config)
    return {k: v for k, v in config.items() if v is not None or k not in ("system", "seed")}


def config_mismatch(saved: dict, current: dict) -> list[str]:
    """The fields (dotted) that differ between two run configs, ignoring those that
    do not change what is computed (:data:`RESUMABLE_DIFFERENCES`), those that
    continue the run (:data:`CONTINUABLE_DIFFERENCES`, see :func:`continuation`) and
    settings newer than the checkpoint (absent from its config)."""
    saved, current = _normalized(_current_layout(saved)), _normalized(current)
    out = []

    def walk(a, b, prefix):
        if isinstance(a, dict) and isinstance(b, dict):
            for key in sorted(set(a) | set(b)):
                if f"{prefix}{key}" in RESUMABLE_DIFFERENCES | CONTINUABLE_DIFFERENCES | REGRIDDABLE_DIFFERENCES:
                    continue
                if key not in a:  # a setting added after the checkpoint was written: it keeps its default
                    continue
                walk(a.get(key, "<absent>"), b.get(key, "<absent>"), f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix[:-1]}: checkpoint {a!r}, now {b!r}")

    walk(saved, current, "")
    return out


def continuation(ckpt, meta: dict, current: dict) -> dict:
    """What resuming checkpoint ``ckpt`` (its ``meta``) with config ``current`` changes:
    ``{}`` when nothing, else ``{"changed": {"epochs": [old, new]}, "note": ...}`` for
    the record's resumed entry. A run may be continued to more epochs (or end earlier,
    but not before the epochs the checkpoint has done). With the constant schedule the
    continuation equals an uninterrupted run of the new length exactly; the cosine
    schedule's length is epochs x steps per epoch, so it is stretched: from the resumed
    step on, the LR is the cosine over the new number of steps."""
    old, new = _current_layout(meta["config"])["loop"]["epochs"], current["loop"]["epochs"]
    if old == new:
        return {}
    done, step, spe = meta["epoch"], meta["step"], meta["steps_per_epoch"]
    if new < done:
        raise CheckpointError(f"{ckpt} is at epoch {done}, past --epochs {new}; pass --epochs {done} or more to "
                              "continue this run, or use a new --checkpoint-dir for a new run")
    if current["optim"]["schedule"] == "cosine":
        note = (f"cosine LR schedule stretched from {old} to {new} epochs: steps 0..{step - 1} followed the cosine "
                f"over {old * spe} steps, steps {step}.. the cosine over {new * spe} steps")
    else:
        note = (f"continued from {old} to {new} epochs; with the {current['optim']['schedule']} LR schedule the "
                f"steps are those of an uninterrupted {new}-epoch run")
    return {"changed": {"epochs": [old, new]}, "note": note}


def saved_grid(meta: dict) -> tuple[int, int, int, int]:
    """The grid (Gd, Gx, Gy, Gz) a checkpoint was written on."""
    return tuple(int(g) for g in _current_layout(meta["config"])["parallel"]["grid"])


def regridded_step(ckpt, meta: dict, steps_per_epoch: int) -> int:
    """The next step of a run resumed from ``ckpt`` on another grid with
    ``steps_per_epoch`` steps per epoch: the saved step when that count is unchanged (the
    same Gd); with another Gd the first step of the epoch after the checkpoint's, which
    must then end an epoch (a half-done epoch's steps have no counterpart on the new grid)."""
    step, old = int(meta["step"]), int(meta["steps_per_epoch"])
    if old == steps_per_epoch:
        return step
    if step % old:
        epoch = step // old + 1
        raise CheckpointError(
            f"{ckpt} is in the middle of epoch {epoch} (step {step % old} of {old}); a resume changes the data-parallel "
            f"size Gd only at an epoch's end: resume on the grid {'x'.join(map(str, saved_grid(meta)))} with "
            f"--epochs {epoch} first, then on the new grid with --epochs as wanted")
    return int(meta["epoch"]) * steps_per_epoch


def regridding(meta: dict, grid, step: int, steps_per_epoch: int, changes: dict) -> dict:
    """``changes`` (:func:`continuation`) with the grid's change added, for the record's
    resumed entry: what stays equal and what does not."""
    old, new = "x".join(map(str, saved_grid(meta))), "x".join(map(str, grid))
    if saved_grid(meta)[0] == tuple(grid)[0]:
        note = (f"resharded from the grid {old} to {new}: the same samples and dropout masks, so the steps of an "
                "uninterrupted run up to the collectives' summation order")
    else:
        note = (f"resharded from the grid {old} to {new} at an epoch's end: another data-parallel size, so other "
                f"batches and {steps_per_epoch} steps per epoch instead of {meta['steps_per_epoch']} (the next step "
                f"is {step}); the model, AdamW's moments and its step counts carry over")
    out = {"changed": {**changes.get("changed", {}), "grid": [old, new]}, "note": note}
    if changes.get("note"):
        out["note"] = f"{changes['note']}; {note}"
    return out


# --------------------------------------------------------------------------- one run per folder
class FolderLock:
    """One run per checkpoint folder: rank 0 holds an exclusive ``flock`` on ``D/.lock``
    while it runs (the kernel lets go when the process ends, however it ends) and writes
    its host, pid and run id into it, so a second run on the same folder is refused in one
    line naming the holder. Where the file system has no locks (some network mounts),
    nothing is held."""

    def __init__(self, directory):
        self.path = Path(directory) / ".lock"
        self._fd: int | None = None

    def acquire(self, run_id: str | None = None) -> "FolderLock":
        import fcntl
        import socket

        def unwritable(exc: OSError) -> CheckpointError:
            return CheckpointError(f"{self.path}: cannot be written ({exc.strerror or exc}); free space in (or make "
                                   f"writable) {self.path.parent}, or give this run another --checkpoint-dir")

        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:  # a full disk (ENOSPC), a read-only or foreign folder: one line, not a traceback
            raise unwritable(exc) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 4096).decode(errors="replace").strip() or "another run"
            os.close(fd)
            raise CheckpointError(f"{self.path.parent} is in use by {holder}: one run per checkpoint folder; wait "
                                  "for it to end, or give this run another --checkpoint-dir") from None
        except OSError:  # no locks on this file system: nothing to hold
            os.close(fd)
            return self
        try:
            os.ftruncate(fd, 0)
            os.write(fd, f"{f'run {run_id}, ' if run_id else ''}pid {os.getpid()} on host "
                         f"{socket.gethostname()}".encode())
        except OSError as exc:
            os.close(fd)  # drops the lock: a run that cannot write here holds nothing
            raise unwritable(exc) from None
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None


# --------------------------------------------------------------------------- preemption
class PreemptionRequest:
    """A pending "save now and stop" (SLURM signals a job ``--signal=USR2@T`` seconds
    before its time limit or a preemption). A signal handler only calls
    :meth:`request`; the training loop sees it at its next step boundary, where every
    rank agrees on it in :meth:`Checkpointer.due`, saves and raises :class:`Preempted`.

    ``armed`` must be set on every rank or none (it adds one 1-element all-reduce per
    step to agree on the step); the sweep task arms it with its USR2 handler.
    """

    def __init__(self):
        self.armed = False
        self.listening = False  # the training loop is running and will see a request
        self.requested = False
        self.signal: str | None = None

    def arm(self) -> None:
        self.armed, self.requested, self.signal = True, False, None

    def disarm(self) -> None:
        self.armed, self.listening, self.requested, self.signal = False, False, False, None

    def request(self, signum: int | None = None) -> None:
        import signal as _signal

        self.requested = True
        self.signal = _signal.Signals(signum).name if signum is not None else "request"


PREEMPTION = PreemptionRequest()  # this process's (one per rank)


class Preempted(Exception):
    """Raised after the checkpoint a preemption request asked for: ``step`` and ``path``."""

    def __init__(self, step: int, path, signal_name: str | None):
        super().__init__(f"preempted ({signal_name or 'request'}): checkpoint saved at step {step} in {path}; "
                         f"resume with --resume")
        self.step, self.path = step, path


# --------------------------------------------------------------------------- saving
class Checkpointer:
    """Decides when to save and saves; one per rank, driven by the training loop.

    ``due(step)`` is called once per step on every rank in the same order. With a
    step period it is local arithmetic. With a wall-clock period, ranks must agree
    (a save ends in a barrier), so rank 0's clock decides and one 1-element
    all-reduce per step carries the decision (only in that mode).
    """

    def __init__(self, cfg: CheckpointConfig, grid=None):
        self.cfg = cfg
        self.grid = grid
        self.dir = Path(cfg.dir) if cfg.dir else None
        self.every_steps, self.every_seconds = cfg.every_steps, cfg.every_seconds
        self.last_save = time.monotonic()
        self.saves = 0
        self.save_time_s = 0.0
        self.last_path: Path | None = None
        self.stop_requested = False  # set by due(): save, then raise Preempted

    @property
    def rank(self) -> int:
        return self.grid.rank if self.grid is not None else 0

    @property
    def world_size(self) -> int:
        return self.grid.world_size if self.grid is not None else 1

    def _distributed(self) -> bool:
        return self.grid is not None and self.grid.distributed and self.world_size > 1

    def due(self, step: int) -> bool:
        """Save at this step? True on every rank or on none. Also True, with
        ``stop_requested`` set, once any rank has a preemption request pending."""
        if self.every_steps is not None:
            flag = float(step % self.every_steps == 0)
        elif self.every_seconds is not None:
            flag = float(self.rank == 0 and time.monotonic() - self.last_save >= self.every_seconds)
        else:
            flag = 0.0
        armed = PREEMPTION.armed
        if not armed and self.every_seconds is None:
            return flag > 0  # local arithmetic: no agreement needed
        stop = float(armed and PREEMPTION.requested)
        if self._distributed():
            import torch.distributed as dist

            t = torch.tensor([flag, stop])
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=dist.group.WORLD)
            flag, stop = float(t[0]), float(t[1])
        self.stop_requested = stop > 0
        return flag > 0 or self.stop_requested

    def _gather(self, entry: dict) -> list[dict]:
        """Every rank's ``entry``, in rank order, on every rank: a collective, so also the
        barrier that puts every rank's file in place before rank 0 completes the checkpoint."""
        return self.grid.gather_object(entry) if self._distributed() else [entry]

    def save(self, step: int, engine_state: dict, meta: dict) -> Path:
        """Write this rank's file, wait for every rank, then rank 0 writes ``meta.json``
        (which completes the checkpoint and lists every rank file's size and SHA-256) and
        prunes old or incomplete ones."""
        t0 = time.perf_counter()
        ckpt = _step_dir(self.dir, step)
        ckpt.mkdir(parents=True, exist_ok=True)
        target = _rank_file(ckpt, self.rank)
        atomic_torch_save({"format": CHECKPOINT_FORMAT, "rank": self.rank, "world_size": self.world_size,
                           "step": step, "engine": engine_state, "rng": rng_state()}, target)
        # Hashed as it lies on disk (page-cached, just written): what a resume will read.
        mine = {"sha256": file_sha256(target), "bytes": target.stat().st_size, "step": step}
        files = {_rank_file(ckpt, r).name: entry for r, entry in enumerate(self._gather(mine))}
        if self.rank == 0:
            atomic_write_json(ckpt / "meta.json", {**meta, "format": CHECKPOINT_FORMAT, "step": step,
                                                   "world_size": self.world_size, "files": files,
                                                   "saved_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
            self._prune(step)
        self.saves += 1
        self.last_save = time.monotonic()
        self.save_time_s += time.perf_counter() - t0
        self.last_path = ckpt
        return ckpt

    def _prune(self, newest: int) -> None:
        entries = list_checkpoints(self.dir)
        complete = [s for s, _, ok in entries if ok]
        keep = set(complete[-self.cfg.keep:])
        for step, path, ok in entries:
            # older complete ones beyond `keep`, and incomplete ones left by an interrupted save
            if step not in keep and step <= newest:
                shutil.rmtree(path, ignore_errors=True)

    def summary(self) -> dict:
        return {"dir": str(self.dir) if self.dir else None, "every": self.cfg.every, "saves": self.saves,
                "save_time_s": self.save_time_s, "last": str(self.last_path) if self.last_path else None}
