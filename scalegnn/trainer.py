"""The training loop: epochs of engine steps, evaluation rounds, the run record.

Reads top to bottom:
  1. load the dataset and normalize it: A = D^-1/2 (A+I) D^-1/2      (Eq. 3)
  2. build the engine on the run's device (one engine: a single process is the
     1x1x1x1 grid; more ranks run under torch.distributed)
  3. per epoch (the shared loop, :func:`scalegnn.loop.train_epochs`): ceil(N/B)/Gd
     steps of Algorithm 1, timed; evaluation (full graph, every ``eval_every``
     epochs) timed separately and excluded from training time
  4. stop at ``epochs``, at the target test accuracy if asked, or on divergence
  5. rank 0 writes one atomic JSON run record

ScaleGNN's epochs are steps of the engine (:class:`_EngineEpochs`), with what only
it has: resuming mid-epoch, checkpoints mid-epoch and at the epoch's end, and a
preemption request seen at the next step. The epoch never reads a device value:
step results are summed on the device (:class:`scalegnn.engine.EpochSums`) and read
once at its end, after which divergence (a loss that is not finite) is checked.
"""

from __future__ import annotations

import time
import traceback
from pathlib import Path

import torch

from . import checkpoint as ckpt_mod
from . import records
from .checkpoint import CheckpointError, Checkpointer, Preempted
from .device import peak_device_memory_bytes, peak_memory_bytes, peak_rss_bytes
from .engine import EpochSums
from .graph import Graph
from .loop import Callback, DivergedError, EpochStats, Progress, reached_target, train_epochs
from .sampling import resolve_batch_size
from .signals import Interrupted, held, stop_under_way

__all__ = ["prepare_graph", "run_training", "make_engine", "out_of_memory", "OutOfMemory"]


class OutOfMemory(RuntimeError):
    """A rank ran out of memory; the message names the rank, the stage and a fix."""


def prepare_graph(cfg, graph: Graph | None = None) -> Graph:
    """The GCN-normalized form (self loops added) of ``graph``, a raw graph, or of the
    dataset loaded when there is none; with ``--split``'s split when one is given;
    relabeled first when ``cfg`` permutes. A graph that is already normalized is
    returned as it is (but for the split)."""
    from .datasets import load_graph

    graph = load_graph(cfg.data, cfg.seed, graph)
    if graph.meta.get("normalized") == "gcn":
        return graph
    if cfg.perf.permute != "none":  # Plexus 5.1: relabel the vertices once (P_c; double adds sigma in the engine)
        from .permutation import random_permutation

        graph = graph.permute(random_permutation(graph.num_nodes, cfg.seed))
    return graph.gcn_normalize()


def make_engine(cfg, graph: Graph, batch_size: int, grid=None, device: torch.device | str = "cpu"):
    """The engine for ``cfg`` on ``grid`` (default: the single process, 1x1x1x1, whose
    collectives are no-ops) and ``device``."""
    from .parallel.engine import ParallelEngine

    return ParallelEngine(graph, cfg.model, cfg.optim, batch_size, seed=cfg.seed, epochs=cfg.loop.epochs, grid=grid,
                          device=device, perf=cfg.perf)


def _engine_from_shards(cfg, grid, device):
    """Build the engine from this rank's shard file: big graphs are never loaded
    whole on every rank (Plexus 5.4). Returns (None, graph info, engine)."""
    import json

    from .parallel.engine import ParallelEngine
    from .parallel.sharding import check_shard_manifest, load_shard

    rank = grid.rank if grid is not None else 0
    shard_dir = cfg.data.shard_dir
    shard = load_shard(shard_dir, rank, cfg.parallel.grid)
    manifest = json.loads((Path(shard_dir) / "manifest.json").read_text())
    check_shard_manifest(manifest, cfg.perf.permute, cfg.seed, shard_dir, (cfg.data.split, cfg.data.split_seed))
    # The graph's record_info as written with the shards (older shards: the sizes alone).
    info = manifest.get("graph") or {k: manifest[k] for k in ("num_nodes", "num_edges", "num_features", "num_classes")}
    batch_size = resolve_batch_size(shard.num_nodes, cfg.sampling.batch_size, cfg.sampling.batch_ratio)
    engine = ParallelEngine(None, cfg.model, cfg.optim, batch_size, seed=cfg.seed, epochs=cfg.loop.epochs, grid=grid,
                            shard=shard, device=device, perf=cfg.perf)
    return None, info, engine


def run_training(cfg, graph: Graph | None = None, grid=None, write: bool = True,
                 run_id: str | None = None, write_failed: bool = True,
                 device: torch.device | str | None = None, callbacks=()) -> dict:
    """Train per ``cfg`` and return the run record (written by rank 0 when ``write``).

    ``grid`` is a :class:`scalegnn.parallel.grid.ProcessGrid` for a distributed run
    (every rank calls this function); None is the single process. ``device`` is the
    rank's ``torch.device`` as its launcher resolved it (default: ``cfg.device`` for
    local rank 0). ``run_id`` names the record (default: a new id; on resume, always
    the checkpoint's run id). ``write_failed=False`` leaves a ``failed`` record to
    the caller: the local launcher writes it with the first error of whichever rank
    failed first. With ``cfg.checkpoint.resume`` and a complete checkpoint in
    ``cfg.checkpoint.dir`` the run continues from it (see :mod:`scalegnn.checkpoint`);
    without one, it starts. ``callbacks`` (:class:`scalegnn.loop.Callback`) see every
    finished epoch (a benchmark's per-epoch sampling, say).
    """
    from .device import reset_peak_memory, resolve_device

    rank = grid.rank if grid is not None else 0
    world = grid.world_size if grid is not None else 1
    device = resolve_device(cfg.parallel.device) if device is None else torch.device(device)
    reset_peak_memory(device)
    # Configuration and data errors surface here, before any record exists: they
    # are the user's to fix, and a "failed" record for a typo would only be noise.
    if cfg.data.shard_dir is not None:
        graph, graph_info, engine = _engine_from_shards(cfg, grid, device)
        batch_size = engine.batch_size
    else:
        if graph is None:
            graph = prepare_graph(cfg)
        graph_info = graph.record_info()
        batch_size = resolve_batch_size(graph.num_nodes, cfg.sampling.batch_size, cfg.sampling.batch_ratio)
        engine = make_engine(cfg, graph, batch_size, grid, device)
    record = records.new_record(
        system=cfg.system, dataset=cfg.data.dataset, config=cfg.to_dict(),
        grid=dict(zip(("dp", "x", "y", "z"), cfg.parallel.grid)), world_size=world, seed=cfg.seed,
        env=records.environment_info(backend=grid.backend if grid is not None else None, device=device),
        graph=graph_info, batch_size=batch_size, steps_per_epoch=engine.steps_per_epoch,
        target_acc=cfg.loop.target_acc,
        run_id=run_id,
        compile_time_s=engine.compile_time_s,  # torch.compile warm-up (paper V-C), not in train_time_s
    )
    # Resume (a checkpoint of another config or grid raises here: a user error, no record).
    start = _resume(cfg, engine, record, grid) if cfg.checkpoint.resume else None
    ckpt = Checkpointer(cfg.checkpoint, grid) if cfg.checkpoint.enabled else None
    where = _Where()
    try:
        _train_epochs(cfg, engine, record, rank, ckpt=ckpt, start=start, where=where, callbacks=callbacks)
        record["status"] = "ok"
    except DivergedError as exc:
        record["status"], record["error"] = "diverged", str(exc)
    except Preempted as exc:  # saved; the launcher requeues. The record says where it stands.
        record["status"], record["error"] = "running", str(exc)
        raise
    except Interrupted as exc:  # SIGINT/SIGTERM: scalegnn.run.run writes the record, naming the signal
        record["status"] = "interrupted"
        exc.run_record = record
        raise
    except Exception as exc:
        if (signum := stop_under_way()) is not None:  # a stop that a C++ call (torch.save) wrapped in its own error
            record["status"] = "interrupted"
            stop = Interrupted(signum)
            stop.run_record = record
            raise stop from exc
        err = out_of_memory(exc, cfg, rank, where.stage, batch_size) or exc
        record["status"] = "failed"
        record["error"] = f"{type(err).__name__}: {err}\n{traceback.format_exc(limit=8)}"
        if grid is not None or not write:
            err.run_record = record  # the launcher writes it if this rank cannot
            if err is exc:
                raise  # a distributed job must fail as a whole; the launcher reports it
            raise err from exc
    finally:
        with held():  # a stop signal now would cut the record short, not the run
            engine.close()  # stops the prefetch thread (no orphan threads), writes the profiler trace
            if ckpt is not None:
                record["checkpoint"] = {**record.get("checkpoint", {}), **ckpt.summary(),
                                        "saves": record.get("checkpoint", {}).get("saves", 0) + ckpt.saves}
            peaks = (peak_memory_bytes(device), peak_rss_bytes(), peak_device_memory_bytes(device))
            stopped = record["status"] in ("failed", "interrupted")  # peers may be gone: no collective
            per_rank = grid.gather_object(peaks) if grid is not None and not stopped else [peaks]
            record.update(records.memory_fields(per_rank))
            record["time_to_target_s"] = records.time_to_target(record["epochs"], cfg.loop.target_acc)
            records.summarize(record)
            if write and rank == 0 and record["status"] != "interrupted" and \
                    (write_failed or record["status"] != "failed"):
                record["path"] = str(records.write_record(record, cfg.loop.out_dir))
    return record


class _Where:
    """What the loop is doing, for error messages (an OOM names its stage)."""

    stage = "setup"


def out_of_memory(exc: BaseException, cfg, rank: int, stage: str,
                  batch_size: int | None = None) -> OutOfMemory | None:
    """An :class:`OutOfMemory` naming the rank, the stage and a fix when ``exc`` is an
    out-of-memory error (CUDA/ROCm allocator, ``MemoryError``, torch's CPU
    allocator); None otherwise. (On Linux the kernel's OOM killer may SIGKILL a rank
    instead: the launcher then reports that rank as killed by signal 9.)"""
    oom_types = tuple(t for t in (getattr(torch, "OutOfMemoryError", None),
                                  getattr(torch.cuda, "OutOfMemoryError", None)) if t is not None)
    text = str(exc).lower()
    if not (isinstance(exc, MemoryError) or (oom_types and isinstance(exc, oom_types))
            or (isinstance(exc, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text))):
        return None
    if isinstance(exc, OutOfMemory):
        return exc
    grid = cfg.parallel.grid
    gd, gx, gy, gz = grid
    bigger = list(grid)
    axis = min((1, 2, 3), key=lambda i: (grid[i], -i))  # double the smallest 3D axis
    bigger[axis] *= 2
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
    b = f"B={batch_size}" if batch_size else "the batch"
    return OutOfMemory(
        f"rank {rank} ran out of memory during {stage} (grid {gd}x{gx}x{gy}x{gz}, {b}, hidden "
        f"{cfg.model.hidden}): {first}. Use a larger grid, whose Gx*Gy*Gz ranks split the graph, features and "
        f"weights (e.g. --grid {'x'.join(map(str, bigger))}), a smaller batch (--batch-size / --batch-ratio), "
        f"or a smaller --hidden"
    )


def _resume(cfg, engine, record: dict, grid) -> dict | None:
    """Load the newest complete checkpoint of ``cfg.checkpoint.dir`` into ``engine`` and
    ``record``; return the loop position, or None when there is none (a fresh start)."""
    path = ckpt_mod.latest(cfg.checkpoint.dir)
    if grid is not None and grid.distributed:
        seen = set(grid.gather_object(str(path)))  # every rank must resume the same checkpoint
        if len(seen) != 1:
            raise CheckpointError(f"ranks see different latest checkpoints in {cfg.checkpoint.dir}: {sorted(seen)}; "
                                  "the folder must be on storage every rank can reach")
    if path is None:
        return None
    meta = ckpt_mod.read_meta(path)
    diff = ckpt_mod.config_mismatch(meta["config"], cfg.to_dict())
    if diff:
        raise CheckpointError(f"{path} was written by a run with another config ({'; '.join(diff)}); resume with "
                              "the same settings, or use a new --checkpoint-dir for a new run")
    changes = ckpt_mod.continuation(path, meta, cfg.to_dict())  # e.g. more --epochs; refused past its end
    for key in ("world_size", "batch_size", "steps_per_epoch"):
        now = record[key]
        if meta.get(key) != now:
            raise CheckpointError(f"{path}: {key} was {meta.get(key)} when saved, is {now} now "
                                  "(the dataset or the launch changed); use a new --checkpoint-dir")
    rank = grid.rank if grid is not None else 0
    state = ckpt_mod.load_rank_state(path, rank)
    engine.load_state_dict(state["engine"])
    ckpt_mod.set_rng_state(state["rng"])
    saved = meta["record"]
    record["run_id"] = saved["run_id"]
    record["epochs"] = saved["epochs"]
    record["checkpoint"] = saved.get("checkpoint", {})
    record["resumed"] = saved.get("resumed", []) + [{
        "step": meta["step"], "epoch": meta["epoch"], "checkpoint": str(path), "saved_at": meta.get("saved_at"),
        "resumed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "hostname": record["env"].get("hostname"),
        **changes,
    }]
    return meta["loop"]


def _save_checkpoint(ckpt: Checkpointer, cfg, engine, record: dict, step: int, epochs_done: int,
                     train_time: float, partial: tuple) -> None:
    loss_sum, loss_n, correct, count = partial
    components, comm_bytes, comm_calls = engine.counters()
    loop = {"step": step, "train_time": train_time, "loss_sum": loss_sum, "loss_n": loss_n, "correct": correct,
            "count": count, "components": components, "comm_bytes": comm_bytes, "comm_calls": comm_calls}
    saves = record.get("checkpoint", {}).get("saves", 0) + ckpt.saves + 1  # all attempts, this one included
    meta = {"epoch": epochs_done, "steps_per_epoch": engine.steps_per_epoch, "batch_size": record["batch_size"],
            "config": cfg.to_dict(), "loop": loop, "record": {**record, "checkpoint": {"saves": saves}}}
    ckpt.save(step, engine.state_dict(), meta)


class _EngineEpochs:
    """The engine's epochs for :func:`scalegnn.loop.train_epochs`: ``steps_per_epoch``
    steps each (step ``s`` belongs to epoch ``s // steps_per_epoch + 1``).

    ``start`` (from a checkpoint) gives the global step to continue from and, when it
    falls mid-epoch, that epoch's partial sums, so the resumed loss sequence equals the
    uninterrupted one. Mid-epoch checkpoint saves (``ckpt.due`` is asked once per
    step, on every rank) are excluded from the epoch's training time, like evaluation.
    """

    def __init__(self, cfg, engine, record: dict, ckpt: Checkpointer | None, start: dict | None, where: "_Where"):
        self.cfg, self.engine, self.record, self.ckpt, self.where = cfg, engine, record, ckpt, where
        self.start = start
        self.step = int(start["step"]) if start else 0
        self.train_time = float(start["train_time"]) if start else 0.0  # before this epoch (checkpoint saves)

    def train_epoch(self, epoch: int) -> EpochStats:
        engine, start, spe = self.engine, self.start, self.engine.steps_per_epoch
        if self.step % spe:  # resumed mid-epoch: continue this epoch's sums
            engine.reset_counters(start["components"], start["comm_bytes"], start.get("comm_calls"))
            sums = EpochSums(engine.device, tuple(start[k] for k in ("loss_sum", "loss_n", "correct", "count")))
        else:
            engine.reset_counters()
            sums = EpochSums(engine.device)
        engine.synchronize()
        t0, seconds = time.perf_counter(), 0.0
        end = epoch * spe
        while self.step < end:
            self.where.stage = f"training step {self.step} (epoch {epoch})"
            sums.add(engine.train_step(self.step), self.step)
            self.step += 1
            if self.ckpt is not None and self.step < end and self.ckpt.due(self.step):  # mid-epoch save
                engine.synchronize()
                seconds += time.perf_counter() - t0
                self.where.stage = f"checkpoint save at step {self.step}"
                loss_sum, loss_n, correct, count, bad = sums.read()
                _check_finite(bad, epoch)
                _save_checkpoint(self.ckpt, self.cfg, engine, self.record, self.step, epoch - 1,
                                 self.train_time + seconds, (loss_sum, loss_n, correct, count))
                _stop_if_preempted(self.ckpt, self.step)
                t0 = time.perf_counter()
        engine.synchronize()  # the epoch's work is done on the device, not only queued
        seconds += time.perf_counter() - t0
        self.train_time += seconds
        loss_sum, loss_n, correct, count, bad = sums.read()
        _check_finite(bad, epoch)
        components, comm_bytes, comm_calls = engine.counters()
        return EpochStats(loss_sum=loss_sum, loss_n=loss_n, correct=correct, count=count, components=components,
                          comm_bytes=comm_bytes, comm_calls=comm_calls, seconds=seconds)

    def evaluate(self) -> tuple[float, float, float]:
        self.where.stage = f"evaluation after epoch {self.step // self.engine.steps_per_epoch}"
        r = self.engine.evaluate()
        return r.train_acc, r.val_acc, r.test_acc


class _EpochEndCheckpoint(Callback):
    """Save at an epoch's end (after its row, so the checkpoint's record has it) when
    the checkpoint period says so, and stop there when preemption was requested."""

    def __init__(self, epochs: _EngineEpochs):
        self.epochs = epochs

    def on_epoch_end(self, row: dict) -> None:
        e = self.epochs
        if e.ckpt is not None and e.ckpt.due(e.step):
            e.where.stage = f"checkpoint save at step {e.step}"
            _save_checkpoint(e.ckpt, e.cfg, e.engine, e.record, e.step, row["epoch"], e.train_time,
                             (0.0, 0, 0.0, 0))
            _stop_if_preempted(e.ckpt, e.step)


def _train_epochs(cfg, engine, record: dict, rank: int, ckpt: Checkpointer | None = None,
                  start: dict | None = None, where: _Where | None = None, callbacks=()) -> None:
    """ScaleGNN's epochs through the shared loop, from ``start`` (a checkpoint's position) on."""
    epochs = _EngineEpochs(cfg, engine, record, ckpt, start, where if where is not None else _Where())
    spe = engine.steps_per_epoch
    last = record["epochs"][-1] if record["epochs"] else None
    if start and last and cfg.loop.stop_at_target and reached_target(last, cfg.loop.target_acc) \
            and epochs.step % spe == 0:
        return  # the interrupted run had already stopped at its target
    progress = Progress(cfg.system, cfg.data.dataset, cfg.loop, rank, steps_per_epoch=spe,
                        batch_size=record["batch_size"], done_epochs=epochs.step // spe,
                        done_time_s=last["train_time_s"] if last else 0.0)
    ckpt_mod.PREEMPTION.listening = ckpt is not None  # a preemption request will be seen (Checkpointer.due)
    try:
        train_epochs(cfg.loop, epochs, record, first_epoch=epochs.step // spe + 1, train_time_s=epochs.train_time,
                     callbacks=[_EpochEndCheckpoint(epochs), progress, *callbacks])
    finally:
        ckpt_mod.PREEMPTION.listening = False


def _check_finite(first_bad_step: int, epoch: int) -> None:
    """Divergence: the first step whose loss was NaN or infinite (read with the epoch's sums)."""
    if first_bad_step >= 0:
        raise DivergedError(f"loss became NaN or infinite at epoch {epoch}, step {first_bad_step}")


def _stop_if_preempted(ckpt: Checkpointer, step: int) -> None:
    if ckpt.stop_requested:
        raise Preempted(step, ckpt.last_path, ckpt_mod.PREEMPTION.signal)
