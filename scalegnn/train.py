"""The training loop: epochs of engine steps, evaluation rounds, the run record.

Reads top to bottom:
  1. load the dataset and normalize it: A = D^-1/2 (A+I) D^-1/2      (Eq. 3)
  2. build the engine (serial, or 4D parallel under torch.distributed)
  3. per epoch: ceil(N/B)/Gd steps of Algorithm 1, timed; evaluation (full graph,
     every ``eval_every`` epochs) timed separately and excluded from training time
  4. stop at ``epochs``, at the target test accuracy if asked, or on divergence
  5. rank 0 writes one atomic JSON run record
"""

from __future__ import annotations

import dataclasses
import math
import resource
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import torch

from . import records
from .engine import OptimConfig, SerialEngine
from .graph import Graph
from .model import ModelConfig
from .sampling import resolve_batch_size

__all__ = ["RunConfig", "prepare_graph", "run_training", "DivergedError", "peak_memory_bytes"]


class DivergedError(RuntimeError):
    """The training loss became NaN or inf."""


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

    def __post_init__(self):
        if isinstance(self.model, dict):
            self.model = ModelConfig(**self.model)
        if isinstance(self.optim, dict):
            self.optim = OptimConfig(**self.optim)
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
    return graph.gcn_normalize()


def peak_memory_bytes(device: str = "cpu") -> int:
    """Peak memory of this process: CUDA allocator peak on GPU, max RSS on CPU."""
    if device.startswith("cuda"):
        return int(torch.cuda.max_memory_allocated(torch.device(device)))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB


def _progress(cfg: RunConfig, total: int, rank: int):
    show = sys.stderr.isatty() if cfg.progress is None else cfg.progress
    if not show or rank != 0:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=f"{cfg.system} {cfg.dataset}", unit="epoch", leave=False)


def make_engine(cfg: RunConfig, graph: Graph, batch_size: int, grid=None):
    if grid is None:
        return SerialEngine(graph, cfg.model, cfg.optim, batch_size, seed=cfg.seed, epochs=cfg.epochs)
    from .parallel.engine import ParallelEngine

    return ParallelEngine(graph, cfg.model, cfg.optim, batch_size, seed=cfg.seed, epochs=cfg.epochs, grid=grid)


def _engine_from_shards(cfg: RunConfig, grid):
    """Build the parallel engine from this rank's shard file: big graphs are never
    loaded whole on every rank (Plexus 5.4). Returns (None, graph info, engine)."""
    import json

    from .parallel.engine import ParallelEngine
    from .parallel.sharding import load_shard

    if grid is None:
        raise ValueError("--shard-dir is for distributed runs: add --nproc N / --grid, or launch with torchrun/srun")
    shard = load_shard(cfg.shard_dir, grid.rank, cfg.grid)
    manifest = json.loads((Path(cfg.shard_dir) / "manifest.json").read_text())
    info = {k: manifest[k] for k in ("num_nodes", "num_edges", "num_features", "num_classes")}
    batch_size = resolve_batch_size(shard.num_nodes, cfg.batch_size, cfg.batch_ratio)
    engine = ParallelEngine(None, cfg.model, cfg.optim, batch_size, seed=cfg.seed, epochs=cfg.epochs, grid=grid,
                            shard=shard)
    return None, info, engine


def run_training(cfg: RunConfig, graph: Graph | None = None, grid=None, write: bool = True) -> dict:
    """Train per ``cfg`` and return the run record (written by rank 0 when ``write``).

    ``grid`` is a :class:`scalegnn.parallel.grid.ProcessGrid` for a distributed run
    (every rank calls this function); None runs the serial engine.
    """
    rank = grid.rank if grid is not None else 0
    world = grid.world_size if grid is not None else 1
    device = "cpu"
    # Configuration and data errors surface here, before any record exists: they
    # are the user's to fix, and a "failed" record for a typo would only be noise.
    if cfg.shard_dir is not None:
        graph, graph_info, engine = _engine_from_shards(cfg, grid)
        batch_size = engine.batch_size
    else:
        if graph is None:
            graph = prepare_graph(cfg)
        graph_info = {"num_nodes": graph.num_nodes, "num_edges": graph.num_edges,
                      "num_features": graph.num_features, "num_classes": graph.num_classes}
        batch_size = resolve_batch_size(graph.num_nodes, cfg.batch_size, cfg.batch_ratio)
        engine = make_engine(cfg, graph, batch_size, grid)
    record = {
        "schema_version": records.SCHEMA_VERSION,
        "run_id": records.new_run_id(cfg.system, cfg.dataset),
        "system": cfg.system,
        "dataset": cfg.dataset,
        "config": cfg.to_dict(),
        "grid": dict(zip(("dp", "x", "y", "z"), cfg.grid)),
        "world_size": world,
        "seed": cfg.seed,
        "env": records.environment_info(backend=grid.backend if grid is not None else None, device=device),
        "graph": graph_info,
        "batch_size": batch_size,
        "steps_per_epoch": engine.steps_per_epoch,
        "epochs": [],
        "target_acc": cfg.target_acc,
        "time_to_target_s": None,
        "peak_memory_bytes": None,
        "peak_memory_bytes_per_rank": None,
        "status": "running",
        "error": None,
    }
    try:
        _train_epochs(cfg, engine, record, rank)
        record["status"] = "ok"
    except DivergedError as exc:
        record["status"], record["error"] = "diverged", str(exc)
    except Exception as exc:
        record["status"] = "failed"
        record["error"] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=8)}"
        if grid is not None or not write:
            raise  # a distributed job must fail as a whole; the launcher reports it
    finally:
        peak = peak_memory_bytes(device)
        per_rank = grid.gather_object(peak) if grid is not None and record["status"] != "failed" else [peak]
        record["peak_memory_bytes_per_rank"] = per_rank
        record["peak_memory_bytes"] = max(per_rank)
        record["time_to_target_s"] = records.time_to_target(record["epochs"], cfg.target_acc)
        _summarize(record)
        if write and rank == 0:
            record["path"] = str(records.write_record(record, cfg.out_dir))
    return record


def _train_epochs(cfg: RunConfig, engine, record: dict, rank: int) -> None:
    bar = _progress(cfg, cfg.epochs, rank)
    train_time, step = 0.0, 0
    try:
        for epoch in range(1, cfg.epochs + 1):
            engine.components.clear()
            engine.comm_bytes.clear()
            loss_sum, loss_n, correct, count = 0.0, 0, 0.0, 0
            t0 = time.perf_counter()
            for _ in range(engine.steps_per_epoch):
                res = engine.train_step(step)
                step += 1
                if res.count:
                    if not math.isfinite(res.loss):
                        raise DivergedError(f"loss became {res.loss} at epoch {epoch}, step {step - 1}")
                    loss_sum, loss_n = loss_sum + res.loss, loss_n + 1
                    correct, count = correct + res.correct, count + res.count
            train_time += time.perf_counter() - t0
            row = {
                "epoch": epoch, "train_time_s": train_time, "loss": loss_sum / max(loss_n, 1),
                "batch_train_acc": correct / count if count else None,
                "train_acc": None, "val_acc": None, "test_acc": None, "eval_time_s": None,
                "components": dict(engine.components), "comm_bytes": dict(engine.comm_bytes),
            }
            if epoch % cfg.eval_every == 0 or epoch == cfg.epochs:
                t1 = time.perf_counter()
                row.update(engine.evaluate().as_dict())
                row["eval_time_s"] = time.perf_counter() - t1
            record["epochs"].append(row)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{row['loss']:.3f}", test=row["test_acc"] or float("nan"))
            reached = cfg.target_acc is not None and (row["test_acc"] or 0.0) >= cfg.target_acc
            if cfg.stop_at_target and reached:
                break
    finally:
        if bar is not None:
            bar.close()


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
