"""The training loop: epochs of engine steps, evaluation rounds, the run record.

Reads top to bottom:
  1. load the dataset and normalize it: A = D^-1/2 (A+I) D^-1/2      (Eq. 3)
  2. build the engine on the run's device (one engine: a single process is the
     1x1x1x1 grid; more ranks run under torch.distributed)
  3. per epoch: ceil(N/B)/Gd steps of Algorithm 1, timed; evaluation (full graph,
     every ``eval_every`` epochs) timed separately and excluded from training time
  4. stop at ``epochs``, at the target test accuracy if asked, or on divergence
  5. rank 0 writes one atomic JSON run record

The loop never reads a device value inside an epoch: step results are summed on
the device (:class:`scalegnn.engine.EpochSums`) and read once at the epoch's end,
after which divergence (a loss that is not finite) is checked.
"""

from __future__ import annotations

import dataclasses
import math
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import torch

from . import checkpoint as ckpt_mod
from . import records
from .checkpoint import CheckpointConfig, CheckpointError, Checkpointer, Preempted
from .device import BACKENDS, check_device_spec, peak_device_memory_bytes, peak_memory_bytes, peak_rss_bytes
from .engine import EpochSums, OptimConfig
from .graph import Graph
from .model import ModelConfig
from .perf import PerfConfig
from .sampling import resolve_batch_size

__all__ = ["RunConfig", "prepare_graph", "run_training", "make_engine", "DivergedError"]


class DivergedError(RuntimeError):
    """The training loss became NaN or inf."""


class OutOfMemory(RuntimeError):
    """A rank ran out of memory; the message names the rank, the stage and a fix."""


DEFAULT_COLLECTIVE_TIMEOUT_S = 600.0  # --collective-timeout's default

@dataclass
class RunConfig:
    """Everything that defines a run; serialized whole into its record."""

    dataset: str = "csbm"
    data_root: str | None = None
    batch_size: int | None = None
    batch_ratio: float | None = 0.1
    epochs: int = 100
    eval_every: int = 1
    target_acc: float | None = None
    stop_at_target: bool = False
    seed: int = 0
    grid: tuple[int, int, int, int] = (1, 1, 1, 1)  # (Gd, Gx, Gy, Gz)
    out_dir: str = "results/runs"
    shard_dir: str | None = None  # per-rank shard files from `scalegnn data shard` (distributed runs)
    progress: bool | None = None  # None: a bar only when stderr is a terminal
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    perf: PerfConfig = field(default_factory=PerfConfig)  # paper V optimizations, instrumentation, permutation
    collective_timeout_s: float = DEFAULT_COLLECTIVE_TIMEOUT_S  # every collective (and the rendezvous) fails after this
    device: str = "auto"  # auto | cpu | cuda | cuda:N (scalegnn.device)
    backend: str = "auto"  # auto (NCCL/RCCL for GPUs, gloo for CPU) | gloo | nccl

    def __post_init__(self):
        if isinstance(self.model, dict):
            self.model = ModelConfig(**self.model)
        if isinstance(self.optim, dict):
            self.optim = OptimConfig(**self.optim)
        if isinstance(self.checkpoint, dict):
            self.checkpoint = CheckpointConfig(**self.checkpoint)
        if isinstance(self.perf, dict):
            self.perf = PerfConfig(**self.perf)
        self.device = check_device_spec(self.device)
        if self.backend not in BACKENDS:
            raise ValueError(f"--backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        if self.backend == "nccl" and self.device == "cpu":
            raise ValueError("--backend nccl needs GPU tensors but --device is cpu; use --backend gloo or "
                             "--device cuda")
        if not self.collective_timeout_s > 0:
            raise ValueError(f"--collective-timeout must be > 0 seconds, got {self.collective_timeout_s}")
        self.grid = tuple(int(g) for g in self.grid)
        if self.batch_size is not None:
            self.batch_ratio = None
        if self.epochs < 1:
            raise ValueError(f"epochs must be >= 1, got {self.epochs}")
        if self.eval_every < 1:
            raise ValueError(f"eval_every must be >= 1, got {self.eval_every}")
        if self.target_acc is not None and not 0.0 < self.target_acc <= 1.0:
            raise ValueError(f"target_acc is a fraction in (0, 1], got {self.target_acc}")
        if len(self.grid) != 4 or min(self.grid) < 1:
            raise ValueError(f"grid must be four positive sizes (Gd, Gx, Gy, Gz), got {self.grid}")
        widest = max(zip(self.grid[1:], "xyz"))
        if self.model.hidden < widest[0]:
            raise ValueError(
                f"hidden size {self.model.hidden} is smaller than grid axis {widest[1]} = {widest[0]}: every 3D "
                f"axis splits the hidden dimension, so some ranks would hold no weights; use --hidden >= "
                f"{widest[0]} or a grid with at most {self.model.hidden} ranks per axis"
            )

    @property
    def world_size(self) -> int:
        return math.prod(self.grid)

    @property
    def system(self) -> str:
        return "fullgraph-3d" if self.batch_ratio == 1.0 else "scalegnn"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def prepare_graph(cfg: RunConfig) -> Graph:
    """Load the dataset and return its GCN-normalized form (self loops added)."""
    from .datasets import load_dataset

    graph = load_dataset(cfg.dataset, data_root=cfg.data_root, seed=cfg.seed)
    if cfg.perf.permute != "none":  # Plexus 5.1: relabel the vertices once (P_c; double adds sigma in the engine)
        from .permutation import random_permutation

        graph = graph.permute(random_permutation(graph.num_nodes, cfg.seed))
    return graph.gcn_normalize()


def make_engine(cfg: RunConfig, graph: Graph, batch_size: int, grid=None, device: torch.device | str = "cpu"):
    """The engine for ``cfg`` on ``grid`` (default: the single process, 1x1x1x1, whose
    collectives are no-ops) and ``device``."""
    from .parallel.engine import ParallelEngine

    return ParallelEngine(graph, cfg.model, cfg.optim, batch_size, seed=cfg.seed, epochs=cfg.epochs, grid=grid,
                          device=device, perf=cfg.perf)


def _engine_from_shards(cfg: RunConfig, grid, device):
    """Build the engine from this rank's shard file: big graphs are never loaded
    whole on every rank (Plexus 5.4). Returns (None, graph info, engine)."""
    import json

    from .parallel.engine import ParallelEngine
    from .parallel.sharding import check_shard_manifest, load_shard

    rank = grid.rank if grid is not None else 0
    shard = load_shard(cfg.shard_dir, rank, cfg.grid)
    manifest = json.loads((Path(cfg.shard_dir) / "manifest.json").read_text())
    check_shard_manifest(manifest, cfg.perf.permute, cfg.seed, cfg.shard_dir)
    info = {k: manifest[k] for k in ("num_nodes", "num_edges", "num_features", "num_classes")}
    batch_size = resolve_batch_size(shard.num_nodes, cfg.batch_size, cfg.batch_ratio)
    engine = ParallelEngine(None, cfg.model, cfg.optim, batch_size, seed=cfg.seed, epochs=cfg.epochs, grid=grid,
                            shard=shard, device=device, perf=cfg.perf)
    return None, info, engine


def run_training(cfg: RunConfig, graph: Graph | None = None, grid=None, write: bool = True,
                 run_id: str | None = None, write_failed: bool = True,
                 device: torch.device | str | None = None) -> dict:
    """Train per ``cfg`` and return the run record (written by rank 0 when ``write``).

    ``grid`` is a :class:`scalegnn.parallel.grid.ProcessGrid` for a distributed run
    (every rank calls this function); None is the single process. ``device`` is the
    rank's ``torch.device`` as its launcher resolved it (default: ``cfg.device`` for
    local rank 0). ``run_id`` names the record (default: a new id; on resume, always
    the checkpoint's run id). ``write_failed=False`` leaves a ``failed`` record to
    the caller: the local launcher writes it with the first error of whichever rank
    failed first. With ``cfg.checkpoint.resume`` and a complete checkpoint in
    ``cfg.checkpoint.dir`` the run continues from it (see :mod:`scalegnn.checkpoint`);
    without one, it starts.
    """
    from .device import reset_peak_memory, resolve_device

    rank = grid.rank if grid is not None else 0
    world = grid.world_size if grid is not None else 1
    device = resolve_device(cfg.device) if device is None else torch.device(device)
    reset_peak_memory(device)
    # Configuration and data errors surface here, before any record exists: they
    # are the user's to fix, and a "failed" record for a typo would only be noise.
    if cfg.shard_dir is not None:
        graph, graph_info, engine = _engine_from_shards(cfg, grid, device)
        batch_size = engine.batch_size
    else:
        if graph is None:
            graph = prepare_graph(cfg)
        graph_info = {"num_nodes": graph.num_nodes, "num_edges": graph.num_edges,
                      "num_features": graph.num_features, "num_classes": graph.num_classes}
        batch_size = resolve_batch_size(graph.num_nodes, cfg.batch_size, cfg.batch_ratio)
        engine = make_engine(cfg, graph, batch_size, grid, device)
    record = records.new_record(
        system=cfg.system, dataset=cfg.dataset, config=cfg.to_dict(), grid=dict(zip(("dp", "x", "y", "z"), cfg.grid)),
        world_size=world, seed=cfg.seed,
        env=records.environment_info(backend=grid.backend if grid is not None else None, device=device),
        graph=graph_info, batch_size=batch_size, steps_per_epoch=engine.steps_per_epoch, target_acc=cfg.target_acc,
        run_id=run_id,
        compile_time_s=engine.compile_time_s,  # torch.compile warm-up (paper V-C), not in train_time_s
    )
    # Resume (a checkpoint of another config or grid raises here: a user error, no record).
    start = _resume(cfg, engine, record, grid) if cfg.checkpoint.resume else None
    ckpt = Checkpointer(cfg.checkpoint, grid) if cfg.checkpoint.enabled else None
    where = _Where()
    try:
        _train_epochs(cfg, engine, record, rank, ckpt=ckpt, start=start, where=where)
        record["status"] = "ok"
    except DivergedError as exc:
        record["status"], record["error"] = "diverged", str(exc)
    except Preempted as exc:  # saved; the launcher requeues. The record says where it stands.
        record["status"], record["error"] = "running", str(exc)
        raise
    except Exception as exc:
        err = out_of_memory(exc, cfg, rank, where.stage, batch_size) or exc
        record["status"] = "failed"
        record["error"] = f"{type(err).__name__}: {err}\n{traceback.format_exc(limit=8)}"
        if grid is not None or not write:
            err.run_record = record  # the launcher writes it if this rank cannot
            if err is exc:
                raise  # a distributed job must fail as a whole; the launcher reports it
            raise err from exc
    finally:
        engine.close()  # stops the prefetch thread (no orphan threads), writes the profiler trace
        if ckpt is not None:
            record["checkpoint"] = {**record.get("checkpoint", {}), **ckpt.summary(),
                                    "saves": record.get("checkpoint", {}).get("saves", 0) + ckpt.saves}
        peaks = (peak_memory_bytes(device), peak_rss_bytes(), peak_device_memory_bytes(device))
        per_rank = grid.gather_object(peaks) if grid is not None and record["status"] != "failed" else [peaks]
        record.update(records.memory_fields(per_rank))
        record["time_to_target_s"] = records.time_to_target(record["epochs"], cfg.target_acc)
        _summarize(record)
        if write and rank == 0 and (write_failed or record["status"] != "failed"):
            record["path"] = str(records.write_record(record, cfg.out_dir))
    return record


class _Where:
    """What the loop is doing, for error messages (an OOM names its stage)."""

    stage = "setup"


def out_of_memory(exc: BaseException, cfg: RunConfig, rank: int, stage: str,
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
    gd, gx, gy, gz = cfg.grid
    bigger = list(cfg.grid)
    axis = min((1, 2, 3), key=lambda i: (cfg.grid[i], -i))  # double the smallest 3D axis
    bigger[axis] *= 2
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
    b = f"B={batch_size}" if batch_size else "the batch"
    return OutOfMemory(
        f"rank {rank} ran out of memory during {stage} (grid {gd}x{gx}x{gy}x{gz}, {b}, hidden "
        f"{cfg.model.hidden}): {first}. Use a larger grid, whose Gx*Gy*Gz ranks split the graph, features and "
        f"weights (e.g. --grid {'x'.join(map(str, bigger))}), a smaller batch (--batch-size / --batch-ratio), "
        f"or a smaller --hidden"
    )


def _resume(cfg: RunConfig, engine, record: dict, grid) -> dict | None:
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


def _save_checkpoint(ckpt: Checkpointer, cfg: RunConfig, engine, record: dict, step: int, epochs_done: int,
                     train_time: float, partial: tuple) -> None:
    loss_sum, loss_n, correct, count = partial
    components, comm_bytes = engine.counters()
    loop = {"step": step, "train_time": train_time, "loss_sum": loss_sum, "loss_n": loss_n, "correct": correct,
            "count": count, "components": components, "comm_bytes": comm_bytes}
    saves = record.get("checkpoint", {}).get("saves", 0) + ckpt.saves + 1  # all attempts, this one included
    meta = {"epoch": epochs_done, "steps_per_epoch": engine.steps_per_epoch, "batch_size": record["batch_size"],
            "config": cfg.to_dict(), "loop": loop, "record": {**record, "checkpoint": {"saves": saves}}}
    ckpt.save(step, engine.state_dict(), meta)


def _train_epochs(cfg: RunConfig, engine, record: dict, rank: int, ckpt: Checkpointer | None = None,
                  start: dict | None = None, where: _Where | None = None) -> None:
    """Epochs of ``steps_per_epoch`` steps; step ``s`` belongs to epoch ``s // steps_per_epoch + 1``.

    ``start`` (from a checkpoint) gives the global step to continue from and, when it
    falls mid-epoch, that epoch's partial sums, so the resumed loss sequence equals the
    uninterrupted one. Checkpoint saves (``ckpt.due`` is asked once per step, on every
    rank) are excluded from the training time, like evaluation.
    """
    where = where if where is not None else _Where()
    spe = engine.steps_per_epoch
    device = engine.device
    step, train_time = (int(start["step"]), float(start["train_time"])) if start else (0, 0.0)
    last = record["epochs"][-1] if record["epochs"] else None
    if start and last and cfg.stop_at_target and cfg.target_acc is not None \
            and (last["test_acc"] or 0.0) >= cfg.target_acc and step % spe == 0:
        return  # the interrupted run had already stopped at its target
    from .progress import EpochLogger, mode_from_progress

    progress = EpochLogger(cfg.system, cfg.dataset, cfg.epochs, rank, mode_from_progress(cfg.progress),
                           steps_per_epoch=spe, batch_size=record["batch_size"], done_epochs=step // spe,
                           done_time_s=last["train_time_s"] if last else 0.0)
    from .checkpoint import PREEMPTION

    PREEMPTION.listening = ckpt is not None  # a preemption request will be seen (Checkpointer.due)
    try:
        for epoch in range(step // spe + 1, cfg.epochs + 1):
            if step % spe:  # resumed mid-epoch: continue this epoch's sums
                engine.reset_counters(start["components"], start["comm_bytes"])
                sums = EpochSums(device, tuple(start[k] for k in ("loss_sum", "loss_n", "correct", "count")))
            else:
                engine.reset_counters()
                sums = EpochSums(device)
            engine.synchronize()
            t0 = time.perf_counter()
            end = epoch * spe
            while step < end:
                where.stage = f"training step {step} (epoch {epoch})"
                sums.add(engine.train_step(step), step)
                step += 1
                if ckpt is not None and step < end and ckpt.due(step):  # mid-epoch save
                    engine.synchronize()
                    train_time += time.perf_counter() - t0
                    where.stage = f"checkpoint save at step {step}"
                    loss_sum, loss_n, correct, count, bad = sums.read()
                    _check_finite(bad, epoch)
                    _save_checkpoint(ckpt, cfg, engine, record, step, epoch - 1, train_time,
                                     (loss_sum, loss_n, correct, count))
                    _stop_if_preempted(ckpt, step)
                    t0 = time.perf_counter()
            engine.synchronize()  # the epoch's work is done on the device, not only queued
            train_time += time.perf_counter() - t0
            loss_sum, loss_n, correct, count, bad = sums.read()
            _check_finite(bad, epoch)
            components, comm_bytes = engine.counters()
            row = {
                "epoch": epoch, "train_time_s": train_time, "loss": loss_sum / max(loss_n, 1),
                "batch_train_acc": correct / count if count else None,
                "train_acc": None, "val_acc": None, "test_acc": None, "eval_time_s": None,
                "components": components, "comm_bytes": comm_bytes,
            }
            if epoch % cfg.eval_every == 0 or epoch == cfg.epochs:
                where.stage = f"evaluation after epoch {epoch}"
                t1 = time.perf_counter()
                row.update(engine.evaluate().as_dict())
                row["eval_time_s"] = time.perf_counter() - t1
            record["epochs"].append(row)
            if ckpt is not None and ckpt.due(step):  # epoch-end save, after the row
                where.stage = f"checkpoint save at step {step}"
                _save_checkpoint(ckpt, cfg, engine, record, step, epoch, train_time, (0.0, 0, 0.0, 0))
                _stop_if_preempted(ckpt, step)
            progress.epoch(row)
            reached = cfg.target_acc is not None and (row["test_acc"] or 0.0) >= cfg.target_acc
            if cfg.stop_at_target and reached:
                break
    finally:
        PREEMPTION.listening = False
        progress.close()


def _check_finite(first_bad_step: int, epoch: int) -> None:
    """Divergence: the first step whose loss was NaN or infinite (read with the epoch's sums)."""
    if first_bad_step >= 0:
        raise DivergedError(f"loss became NaN or infinite at epoch {epoch}, step {first_bad_step}")


def _stop_if_preempted(ckpt: Checkpointer, step: int) -> None:
    if ckpt.stop_requested:
        from .checkpoint import PREEMPTION

        raise Preempted(step, ckpt.last_path, PREEMPTION.signal)


def _summarize(record: dict) -> None:
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
        }
    else:
        record["summary"] = None


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
