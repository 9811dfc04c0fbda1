"""Shared pieces of the baseline adapters: config, data, the epoch loop, the run record.

Every adapter (``graphsage``, ``graphsaint``, ``salient``, ``bns-gcn``; ``distdgl``
through its own environment) trains on the dataset split of ``scalegnn train`` and
writes the record of ``scalegnn.records`` (``results/README.md``). An adapter is a
*trainer* with this interface, driven by :func:`run_epochs` exactly as
``scalegnn.train`` drives an engine:

    trainer.steps_per_epoch            int (optimizer steps of this rank per epoch)
    trainer.batch_size                 int (seed vertices / sampled vertices per step)
    trainer.train_epoch(epoch)  -> EpochStats      local sums; the loop reduces them
    trainer.evaluate()          -> (train, val, test) accuracies, the same on every rank
    trainer.record_extra()      -> dict            fields added to the record (optional)

Training time excludes evaluation; the epoch time recorded is the slowest rank's.
A multi-process run (``--nproc N``) spawns N local workers with
:func:`scalegnn.parallel.launch.spawn`; on a cluster the same code joins a
torchrun / srun job through :func:`scalegnn.parallel.launch.init_from_env`.

Device. Every adapter trains on ``trainer.device`` (:func:`rank_device`: the run's
``--device``, auto taking the local rank's GPU when one is visible), the backend
following it as for ScaleGNN; samplers and feature stores stay in host memory, as
in the systems themselves, and each batch is copied over. The record says which
device ran, so a GPU run is never compared with a CPU one unawares.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
import traceback
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from scalegnn import records
from scalegnn import systems as registry
from scalegnn.engine import accuracy_counts
from scalegnn.graph import Graph
from scalegnn.device import (check_device_spec, peak_device_memory_bytes, peak_memory_bytes, peak_rss_bytes,
                             resolve_device, synchronize)
from scalegnn.train import DivergedError, _summarize, summary_line

__all__ = [
    "CommonConfig", "EpochStats", "BaselineData", "load_data", "run_baseline", "run_epochs",
    "split_accuracies", "world_info", "rank_device", "ddp", "all_reduce_sum", "parse_ints", "summary_line",
]



def parse_ints(text) -> tuple[int, ...]:
    """``"15,10,5"`` -> ``(15, 10, 5)``; tuples and lists pass through."""
    if isinstance(text, (tuple, list)):
        return tuple(int(v) for v in text)
    try:
        return tuple(int(v) for v in str(text).split(",") if v.strip())
    except ValueError:
        raise ValueError(f"expected comma-separated integers such as 15,10,5, got {text!r}") from None


@dataclass
class CommonConfig:
    """The flags every system accepts (the common part of ``scalegnn train``)."""

    system: str
    dataset: str = "csbm"
    data_root: str | None = None
    epochs: int = 100
    eval_every: int = 1
    target_acc: float | None = None
    stop_at_target: bool = False
    seed: int = 0
    out_dir: str = "results/runs"
    nproc: int = 1
    lr: float = 1e-3
    weight_decay: float = 0.0
    hidden: int = 256
    layers: int = 3
    dropout: float = 0.5
    progress: bool | None = False
    device: str = "auto"  # auto | cpu | cuda | cuda:N (scalegnn.device)
    backend: str = "auto"  # auto (the device's) | gloo | nccl

    def __post_init__(self):
        self.device = check_device_spec(self.device)
        if self.system not in registry.names(available=True):
            raise ValueError(f"unknown system {self.system!r}; choose one of {', '.join(registry.names(available=True))}")
        if self.epochs < 1:
            raise ValueError(f"epochs must be >= 1, got {self.epochs}")
        if self.eval_every < 1:
            raise ValueError(f"eval_every must be >= 1, got {self.eval_every}")
        if self.nproc < 1:
            raise ValueError(f"--nproc must be >= 1, got {self.nproc}")
        if self.layers < 1 or self.hidden < 1:
            raise ValueError(f"layers and hidden must be >= 1, got {self.layers} and {self.hidden}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.lr <= 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.target_acc is not None and not 0.0 < self.target_acc <= 1.0:
            raise ValueError(f"target_acc is a fraction in (0, 1], got {self.target_acc}")


@dataclass
class EpochStats:
    """One rank's sums over one epoch; :func:`run_epochs` all-reduces them."""

    loss_sum: float = 0.0
    loss_n: int = 0
    correct: float = 0.0
    count: float = 0.0
    components: dict = field(default_factory=dict)
    comm_bytes: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)  # system-specific per-epoch fields (e.g. cache hits)

    def add_batch(self, loss: float, logits: torch.Tensor, y: torch.Tensor) -> None:
        """One step's loss and the training accuracy of its (detached) logits."""
        correct, count = accuracy_counts(logits, y)
        self.loss_sum += loss
        self.loss_n += 1
        self.correct += correct
        self.count += count


def backward_and_step(optimizer, loss: torch.Tensor, components: dict, forward_start: float) -> None:
    """Backward and optimizer step of one training step, timed: the seconds since
    ``forward_start`` go to ``components["forward_backward"]``, the step's to
    ``components["optimizer"]`` (DDP's gradient all-reduce runs inside backward). On a
    GPU the clock is read after the device has finished, so the times are the work's,
    not its launch's."""
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    synchronize(loss.device)
    t = time.perf_counter()
    components["forward_backward"] += t - forward_start
    optimizer.step()
    synchronize(loss.device)
    components["optimizer"] += time.perf_counter() - t


# --------------------------------------------------------------------------- distributed helpers
def rank_device(cfg: CommonConfig) -> torch.device:
    """This rank's device for ``cfg.device``: a spawned worker's local rank is its rank,
    a torchrun / srun rank's is in the launcher's variables."""
    local = os.environ.get("LOCAL_RANK") or os.environ.get("SLURM_LOCALID")
    return resolve_device(cfg.device, int(local) if local is not None else world_info()[0])


def ddp(model, world: int, device: torch.device):
    """``model`` wrapped in DistributedDataParallel on its device when several ranks train it."""
    if world == 1:
        return model
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)


def world_info() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def all_reduce_sum(values: list[float], op=None) -> list[float]:
    """Sum (or ``op``) a few floats over all ranks in one collective; identity when serial."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, op=op or dist.ReduceOp.SUM)
    return t.tolist()


def broadcast_floats(values: list[float] | None, n: int, src: int = 0) -> list[float]:
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return list(values)
    t = torch.tensor(values if values is not None else [0.0] * n, dtype=torch.float64)
    dist.broadcast(t, src)
    return t.tolist()


# --------------------------------------------------------------------------- data
@dataclass
class BaselineData:
    """A dataset as the PyG-based adapters need it.

    graph: the raw :class:`Graph` (undirected: both directions stored, no self loops);
    edge_index (2, E) int64 ``[src; dst]`` of that graph; features (N, F) dense or CSR
    (sparse bag-of-words features stay CSR, as in ScaleGNN, see
    ``scalegnn.sampling.training_features``); y, splits as in the graph.
    """

    graph: Graph
    edge_index: torch.Tensor
    features: torch.Tensor

    @property
    def num_nodes(self) -> int:
        return self.graph.num_nodes


def load_data(cfg: CommonConfig, graph: Graph | None = None) -> BaselineData:
    from scalegnn.datasets import load_dataset
    from scalegnn.sampling import training_features

    if graph is None:
        graph = load_dataset(cfg.dataset, data_root=cfg.data_root, seed=cfg.seed)
    if graph.meta.get("normalized"):
        raise ValueError("baselines need the raw graph (each system normalizes its own way), not a normalized one")
    rows = graph.row_ids()
    keep = rows != graph.indices  # the raw graph has no self loops; be safe for bring-your-own data
    edge_index = torch.stack([graph.indices[keep], rows[keep]])  # PyG: row 0 source, row 1 target
    return BaselineData(graph=graph, edge_index=edge_index, features=training_features(graph.x))


def split_accuracies(logits_of, graph: Graph, nodes: torch.Tensor | None = None) -> tuple[float, float, float]:
    """Accuracy on the train / val / test splits from logits of ``nodes`` (all when None).

    ``logits_of`` is an (n, C) tensor whose row i belongs to ``nodes[i]``. Counts are
    summed over ranks before dividing, so each rank may pass its own share of nodes.
    """
    n = graph.num_nodes
    if nodes is None:
        nodes = torch.arange(n)
    where = torch.full((n,), -1, dtype=torch.int64)
    where[nodes] = torch.arange(nodes.numel())
    sums = []
    for idx in (graph.train_idx, graph.val_idx, graph.test_idx):
        pos = where[idx]
        mine = idx[pos >= 0]
        y = graph.y[mine]
        lg = logits_of[pos[pos >= 0]]
        if y.dim() == 1:
            keep = y >= 0
            lg, y = lg[keep], y[keep]
        c, t = accuracy_counts(lg, y) if y.numel() else (0.0, 0.0)
        sums += [c, t]
    sums = all_reduce_sum(sums)
    return tuple(sums[2 * i] / sums[2 * i + 1] if sums[2 * i + 1] else float("nan") for i in range(3))


def seed_everything(seed: int) -> None:
    import random

    import numpy as np

    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


# --------------------------------------------------------------------------- the record
def new_record(cfg: CommonConfig, options, data_graph: Graph, world: int, batch_size: int,
               steps_per_epoch: int, backend: str | None, device: torch.device | str = "cpu") -> dict:
    config = {k: v for k, v in dataclasses.asdict(cfg).items()
              if k not in ("lr", "weight_decay", "hidden", "layers", "dropout", "progress")}
    model = {"hidden": cfg.hidden, "layers": cfg.layers, "dropout": cfg.dropout}
    opts = dataclasses.asdict(options) if dataclasses.is_dataclass(options) else dict(options or {})
    model.update(opts.pop("model", {}))
    config.update({"model": model, "optim": {"optimizer": "Adam", "lr": cfg.lr, "weight_decay": cfg.weight_decay},
                   "options": opts})
    g = data_graph
    return records.new_record(
        system=cfg.system, dataset=cfg.dataset, config=config,
        grid={"dp": world, "x": 1, "y": 1, "z": 1},  # every baseline is data parallel only
        world_size=world, seed=cfg.seed, env=records.environment_info(backend=backend, device=device),
        graph={"num_nodes": g.num_nodes, "num_edges": g.num_edges, "num_features": g.num_features,
               "num_classes": g.num_classes},
        batch_size=batch_size, steps_per_epoch=steps_per_epoch, target_acc=cfg.target_acc)


def finalize(record: dict, cfg: CommonConfig, peaks: list[tuple]) -> dict:
    """The record's closing fields; ``peaks`` has every rank's (peak memory, peak RSS,
    peak device memory) (:func:`scalegnn.records.memory_fields`), empty when unknown."""
    if peaks:
        record.update(records.memory_fields(peaks))
    else:
        record["peak_memory_bytes_per_rank"], record["peak_memory_bytes"] = [], None
    record["time_to_target_s"] = records.time_to_target(record["epochs"], cfg.target_acc)
    _summarize(record)
    return record


def run_epochs(cfg: CommonConfig, trainer, record: dict) -> None:
    """The epoch loop of ``scalegnn.train._train_epochs`` for a baseline trainer; rank 0
    reports each epoch (:class:`scalegnn.progress.EpochLogger`: a bar on a terminal,
    one log line per epoch in a batch job's output)."""
    from scalegnn.progress import EpochLogger, mode_from_progress

    progress = EpochLogger(cfg.system, cfg.dataset, cfg.epochs, world_info()[0], mode_from_progress(cfg.progress),
                           steps_per_epoch=trainer.steps_per_epoch, batch_size=trainer.batch_size)
    try:
        _epochs(cfg, trainer, record, progress)
    finally:
        progress.close()


def _epochs(cfg: CommonConfig, trainer, record: dict, progress) -> None:
    train_time = 0.0
    for epoch in range(1, cfg.epochs + 1):
        t0 = time.perf_counter()
        st = trainer.train_epoch(epoch)
        elapsed = time.perf_counter() - t0
        loss_sum, loss_n, correct, count = all_reduce_sum([st.loss_sum, st.loss_n, st.correct, st.count])
        elapsed = all_reduce_sum([elapsed], op=dist.ReduceOp.MAX)[0]  # the slowest rank sets the pace
        train_time += elapsed
        loss = loss_sum / max(loss_n, 1)
        if not math.isfinite(loss):
            raise DivergedError(f"loss became {loss} at epoch {epoch}")
        row = {
            "epoch": epoch, "train_time_s": train_time, "loss": loss,
            "batch_train_acc": correct / count if count else None,
            "train_acc": None, "val_acc": None, "test_acc": None, "eval_time_s": None,
            "components": dict(st.components), "comm_bytes": dict(st.comm_bytes),
        }
        row.update(st.extra)
        if epoch % cfg.eval_every == 0 or epoch == cfg.epochs:
            t1 = time.perf_counter()
            tr, va, te = trainer.evaluate()
            row["eval_time_s"] = all_reduce_sum([time.perf_counter() - t1], op=dist.ReduceOp.MAX)[0]
            row.update(train_acc=tr, val_acc=va, test_acc=te)
        record["epochs"].append(row)
        progress.epoch(row)
        if cfg.stop_at_target and cfg.target_acc is not None and (row["test_acc"] or 0.0) >= cfg.target_acc:
            break


def _peaks(device) -> tuple:
    return peak_memory_bytes(device), peak_rss_bytes(), peak_device_memory_bytes(device)


def _gather_peaks(device) -> list[tuple]:
    peak = _peaks(device)
    rank, world = world_info()
    if world == 1:
        return [peak]
    out = [None] * world
    dist.all_gather_object(out, peak)
    return out


def train_in_process(cfg: CommonConfig, options, make_trainer, graph: Graph | None = None,
                     write: bool = True) -> dict:
    """Build the trainer on this rank, run the epochs, return the record (rank 0 writes it)."""
    rank, world = world_info()
    seed_everything(cfg.seed)
    data = load_data(cfg, graph)
    trainer = make_trainer(cfg, options, data)
    device = getattr(trainer, "device", torch.device("cpu"))
    backend = _backend_name() if world > 1 else None
    record = new_record(cfg, options, data.graph, world, trainer.batch_size, trainer.steps_per_epoch, backend,
                        device)
    try:
        run_epochs(cfg, trainer, record)
        record["status"] = "ok"
    except DivergedError as exc:
        record["status"], record["error"] = "diverged", str(exc)
    except Exception as exc:
        record["status"] = "failed"
        record["error"] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=8)}"
        if world > 1:
            raise  # a distributed job fails as a whole; the parent writes the failed record
    finally:
        close = getattr(trainer, "close", None)
        if close is not None:
            close()
    record.update(getattr(trainer, "record_extra", lambda: {})())
    finalize(record, cfg, _gather_peaks(device) if record["status"] != "failed" else [_peaks(device)])
    if write and rank == 0:
        record["path"] = str(records.write_record(record, cfg.out_dir))
    return record


def _backend_name() -> str:
    """The backend of the world's device collectives: "nccl" in an NCCL world (which
    carries gloo beside it for CPU tensors), else the world's own."""
    name = str(dist.get_backend())
    return "nccl" if "nccl" in name else name


def _spawned_worker(rank: int, world: int, cfg, options, factory_path: str, graph):
    import importlib

    mod_name, fn_name = factory_path.split(":")
    make_trainer = getattr(importlib.import_module(mod_name), fn_name)
    record = train_in_process(cfg, options, make_trainer, graph)
    return record if rank == 0 else None


def run_baseline(cfg: CommonConfig, options, factory_path: str, graph: Graph | None = None) -> dict:
    """Run a baseline with ``cfg.nproc`` processes and return rank 0's record.

    ``factory_path`` is ``"module:function"`` building the trainer (importable in
    the spawned workers). One process runs in this process; N > 1 spawns N gloo
    workers; inside a torchrun / srun job (``WORLD_SIZE`` > 1) every rank joins it.
    """
    import importlib

    from scalegnn.parallel.launch import WorkerError, init_from_env, local_backend, spawn

    mod_name, fn_name = factory_path.split(":")
    make_trainer = getattr(importlib.import_module(mod_name), fn_name)
    launched = int(os.environ.get("WORLD_SIZE", "1")) > 1 and "RANK" in os.environ
    if launched:
        info = init_from_env(backend=cfg.backend, device=cfg.device)
        try:
            record = train_in_process(cfg, options, make_trainer, graph)
        finally:
            dist.destroy_process_group()
        return record if info.rank == 0 else None
    if cfg.nproc == 1:
        return train_in_process(cfg, options, make_trainer, graph)
    threads = max(1, (os.cpu_count() or 1) // cfg.nproc)
    backend = local_backend(cfg, cfg.nproc)
    try:
        return spawn(_spawned_worker, cfg.nproc, cfg, options, factory_path, graph, timeout_s=None,
                     threads_per_worker=threads, backend=backend)[0]
    except WorkerError as exc:
        # The workers died before a record existed: write a failed one so a sweep sees the run.
        data_graph = graph
        if data_graph is None:
            from scalegnn.datasets import load_dataset

            data_graph = load_dataset(cfg.dataset, data_root=cfg.data_root, seed=cfg.seed)
        record = new_record(cfg, options, data_graph, cfg.nproc, 0, 0, backend)
        record["status"], record["error"] = "failed", str(exc)[-4000:]
        finalize(record, cfg, [])
        record["path"] = str(records.write_record(record, cfg.out_dir))
        return record
