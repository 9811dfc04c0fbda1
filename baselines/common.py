"""Shared pieces of the baseline adapters: data, the distributed helpers, the run record.

Every adapter (``graphsage``, ``graphsaint``, ``salient``, ``bns-gcn``; ``distdgl``
through its own environment) trains on the dataset split of ``scalegnn train`` from
the same :class:`scalegnn.config.RunConfig` (its own settings in ``cfg.options``) and
writes the record of ``scalegnn.records`` (``results/README.md``). An adapter is a
*trainer* driven by the shared epoch loop (:func:`scalegnn.loop.train_epochs`), as
ScaleGNN's engine is:

    trainer.steps_per_epoch            int (optimizer steps of this rank per epoch)
    trainer.batch_size                 int (seed vertices / sampled vertices per step)
    trainer.device                     torch.device it trains on
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

import os
import time
import traceback
from dataclasses import dataclass

import torch
import torch.distributed as dist

from scalegnn import records
from scalegnn.device import peak_device_memory_bytes, peak_memory_bytes, peak_rss_bytes, resolve_device, synchronize
from scalegnn.graph import Graph
from scalegnn.loop import DivergedError, EpochStats, Progress, train_epochs
from scalegnn.metrics import accuracy_counts
from scalegnn.signals import Interrupted, held

__all__ = ["EpochStats", "BaselineData", "load_data", "run_baseline", "split_accuracies", "world_info", "rank_device",
           "ddp", "all_reduce_sum"]



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
def rank_device(cfg) -> torch.device:
    """This rank's device for ``cfg.device``: a spawned worker's local rank is its rank,
    a torchrun / srun rank's is in the launcher's variables."""
    local = os.environ.get("LOCAL_RANK") or os.environ.get("SLURM_LOCALID")
    return resolve_device(cfg.parallel.device, int(local) if local is not None else world_info()[0])


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


def owned_eval_batches(graph: Graph, owner: torch.Tensor, rank: int, batch_size: int, pad=None) -> list:
    """The labeled vertices ``rank`` owns (``owner``: each vertex's rank) in batches of
    ``batch_size``, padded with ``pad`` to the most batches any rank has: a sampled
    evaluation that exchanges features steps every rank through every batch."""
    nodes = torch.cat([graph.train_idx, graph.val_idx, graph.test_idx]).unique()
    mine = nodes[owner[nodes] == rank]
    batches = list(mine.split(batch_size)) if mine.numel() else []
    most = int(all_reduce_sum([float(len(batches))], op=dist.ReduceOp.MAX)[0])
    return batches + [pad] * (most - len(batches))


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


def load_data(cfg, graph: Graph | None = None) -> BaselineData:
    from scalegnn.datasets import load_graph
    from scalegnn.sampling import training_features

    graph = load_graph(cfg.data, cfg.seed, graph)
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
def new_record(cfg, data_graph: Graph, world: int, batch_size: int, steps_per_epoch: int, backend: str | None,
               device: torch.device | str = "cpu") -> dict:
    g = data_graph
    return records.new_record(
        system=cfg.system, dataset=cfg.data.dataset, config=cfg.to_dict(),
        grid={"dp": world, "x": 1, "y": 1, "z": 1},  # every baseline is data parallel only
        world_size=world, seed=cfg.seed, env=records.environment_info(backend=backend, device=device),
        graph=g.record_info(),
        batch_size=batch_size, steps_per_epoch=steps_per_epoch, target_acc=cfg.loop.target_acc)


def finalize(record: dict, cfg, peaks: list[tuple]) -> dict:
    """The record's closing fields; ``peaks`` has every rank's (peak memory, peak RSS,
    peak device memory) (:func:`scalegnn.records.memory_fields`), empty when unknown."""
    if peaks:
        record.update(records.memory_fields(peaks))
    else:
        record["peak_memory_bytes_per_rank"], record["peak_memory_bytes"] = [], None
    record["time_to_target_s"] = records.time_to_target(record["epochs"], cfg.loop.target_acc)
    records.summarize(record)
    return record


def _reduce(stats: EpochStats) -> EpochStats:
    """A rank's epoch sums summed over the ranks (components and bytes stay this rank's)."""
    loss_sum, loss_n, correct, count = all_reduce_sum([stats.loss_sum, stats.loss_n, stats.correct, stats.count])
    return EpochStats(loss_sum=loss_sum, loss_n=int(loss_n), correct=correct, count=count,
                      components=stats.components, comm_bytes=stats.comm_bytes, extra=stats.extra)


def _slowest(seconds: float) -> float:
    return all_reduce_sum([seconds], op=dist.ReduceOp.MAX)[0]


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


def train_in_process(cfg, make_trainer, graph: Graph | None = None, write: bool = True) -> dict:
    """Build the trainer on this rank, run the epochs, return the record (rank 0 writes it)."""
    rank, world = world_info()
    seed_everything(cfg.seed)
    data = load_data(cfg, graph)
    trainer = make_trainer(cfg, data)
    device = getattr(trainer, "device", torch.device("cpu"))
    backend = _backend_name() if world > 1 else None
    record = new_record(cfg, data.graph, world, trainer.batch_size, trainer.steps_per_epoch, backend, device)
    try:
        train_epochs(cfg.loop, trainer, record, reduce=_reduce, slowest=_slowest,
                     callbacks=[Progress(cfg.system, cfg.data.dataset, cfg.loop, rank,
                                         steps_per_epoch=trainer.steps_per_epoch, batch_size=trainer.batch_size)])
        record["status"] = "ok"
    except DivergedError as exc:
        record["status"], record["error"] = "diverged", str(exc)
    except Interrupted as exc:  # SIGINT/SIGTERM: scalegnn.run.run writes the record, naming the signal
        record["status"] = "interrupted"
        with held():
            record.update(getattr(trainer, "record_extra", lambda: {})())
            finalize(record, cfg, [_peaks(device)])  # peers may be gone: no collective
        exc.run_record = record
        raise
    except Exception as exc:
        record["status"] = "failed"
        record["error"] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=8)}"
        if world > 1:
            raise  # a distributed job fails as a whole; the parent writes the failed record
    finally:
        close = getattr(trainer, "close", None)
        if close is not None:
            close()
    with held():  # a stop signal now would cut the record short, not the run
        record.update(getattr(trainer, "record_extra", lambda: {})())
        finalize(record, cfg, _gather_peaks(device) if record["status"] != "failed" else [_peaks(device)])
        if write and rank == 0:
            record["path"] = str(records.write_record(record, cfg.loop.out_dir))
    return record


def _backend_name() -> str:
    """The backend of the world's device collectives: "nccl" in an NCCL world (which
    carries gloo beside it for CPU tensors), else the world's own."""
    name = str(dist.get_backend())
    return "nccl" if "nccl" in name else name


def _spawned_worker(rank: int, world: int, cfg, factory_path: str, graph):
    from scalegnn.systems import resolve

    record = train_in_process(cfg, resolve(factory_path), graph)
    return record if rank == 0 else None


def run_baseline(cfg, factory_path: str, graph: Graph | None = None) -> dict:
    """Run a baseline with ``cfg.parallel.nproc`` processes and return rank 0's record.

    ``factory_path`` is ``"module:function"`` building the trainer from ``(cfg, data)``
    (importable in the spawned workers). One process runs in this process; N > 1
    spawns N workers; inside a torchrun / srun job (``WORLD_SIZE`` > 1) every rank
    joins it.
    """
    from scalegnn.parallel.launch import WorkerError, init_from_env, local_backend, spawn, threads_of_run
    from scalegnn.systems import resolve

    make_trainer = resolve(factory_path)
    launched = int(os.environ.get("WORLD_SIZE", "1")) > 1 and "RANK" in os.environ
    check_world = getattr(cfg.options, "check_world", None)  # a system's own process grid, before any data loads
    if check_world is not None:
        check_world(int(os.environ["WORLD_SIZE"]) if launched else cfg.parallel.nproc)
    if launched:
        info = init_from_env(backend=cfg.parallel.backend, device=cfg.parallel.device)
        try:
            record = train_in_process(cfg, make_trainer, graph)
        finally:
            dist.destroy_process_group()
        return record if info.rank == 0 else None
    nproc = cfg.parallel.nproc
    if nproc == 1:
        return train_in_process(cfg, make_trainer, graph)
    threads = threads_of_run(cfg.parallel)
    backend = local_backend(cfg.parallel, nproc)
    try:
        return spawn(_spawned_worker, nproc, cfg, factory_path, graph, timeout_s=None, threads_per_worker=threads,
                     backend=backend, collective_timeout_s=cfg.parallel.collective_timeout_s)[0]
    except WorkerError as exc:
        # The workers died before a record existed: write a failed one so a sweep sees the run.
        data_graph = graph
        if data_graph is None:
            from scalegnn.datasets import load_graph

            data_graph = load_graph(cfg.data, cfg.seed)
        record = new_record(cfg, data_graph, nproc, 0, 0, backend)
        record["status"], record["error"] = "failed", str(exc)[-4000:]
        finalize(record, cfg, [])
        record["path"] = str(records.write_record(record, cfg.loop.out_dir))
        return record
