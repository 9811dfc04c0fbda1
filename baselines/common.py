"""Shared pieces of the baseline adapters: data, the data-parallel trainer, distributed helpers.

Every adapter (``graphsage``, ``graphsaint``, ``salient``, ``bns-gcn``, ``cagnet-*``,
``fastsample``; ``distdgl`` through its own environment) trains on the dataset split
of ``scalegnn train`` from the same :class:`scalegnn.config.RunConfig` (its own
settings in ``cfg.options``) and its run is launched and recorded as ScaleGNN's is
(:func:`scalegnn.launch.launch`, :class:`scalegnn.session.RunSession`). An adapter is
a :class:`DataParallelTrainer` driven by the shared epoch loop
(:func:`scalegnn.loop.train_epochs`):

    make_trainer(cfg, graph, env)      its registry entry: the trainer of one rank
                                       (:func:`baseline_data` gives the graph as it needs it)
    trainer.steps_per_epoch            int (optimizer steps of this rank per epoch)
    trainer.batch_size                 int (seed vertices / sampled vertices per step)
    trainer.device                     torch.device it trains on (``env.device``)
    trainer.train_epoch(epoch)  -> EpochStats      local sums; the loop reduces them
    trainer.evaluate()          -> (train, val, test) accuracies, the same on every rank
    trainer.record_extra()      -> dict            fields added to the record (optional)

Training time excludes evaluation; the epoch time recorded is the slowest rank's.

Device. Every adapter trains on its rank's device (``env.device``: the run's
``--device``, auto taking the local rank's GPU when one is visible), the backend
following it as for ScaleGNN; samplers and feature stores stay in host memory, as
in the systems themselves, and each batch is copied over. The record says which
device ran, so a GPU run is never compared with a CPU one unawares.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from scalegnn.config import RunConfig
from scalegnn.device import synchronize
from scalegnn.graph import Graph
from scalegnn.loop import BestValidation, EpochStats, LoopStart, Trainer
from scalegnn.metrics import accuracy_counts
from scalegnn.model import ScaleGNN

from .models import FullGraphModel, graph_edge_index

__all__ = ["EpochStats", "BaselineData", "DataParallelTrainer", "baseline_data", "load_data", "split_accuracies",
           "world_info", "ddp", "all_reduce_sum"]



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


def step_on_labeled_rows(optimizer, out: torch.Tensor, y: torch.Tensor, stats: EpochStats, components: dict,
                         forward_start: float) -> None:
    """One training step whose output rows ``out`` are all labeled training vertices
    (labels ``y``): the loss over every row, backward and the optimizer step (timed, as
    :func:`backward_and_step`), and the step's loss and accuracy added to ``stats``."""
    from scalegnn.model import node_loss

    loss = node_loss(out, y, torch.ones(out.shape[0], dtype=torch.bool, device=out.device))
    backward_and_step(optimizer, loss, components, forward_start)
    stats.add_batch(float(loss.detach()), out.detach(), y)


# --------------------------------------------------------------------------- distributed helpers
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


def load_data(cfg: RunConfig, graph: Graph | None = None) -> BaselineData:
    from scalegnn.datasets import load_graph
    from scalegnn.sampling import training_features

    from scalegnn.systems import check_graph

    graph = load_graph(cfg.data, cfg.seed, graph)
    check_graph(cfg.system, graph)
    if graph.meta.get("normalized"):
        raise ValueError("baselines need the raw graph (each system normalizes its own way), not a normalized one")
    # PyG: row 0 source, row 1 target; self loops left out (the raw graph has none; be safe for a user's)
    return BaselineData(graph=graph, edge_index=graph_edge_index(graph), features=training_features(graph.x))


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


# --------------------------------------------------------------------------- the trainer
class DataParallelTrainer(Trainer):
    """A baseline's trainer on one rank: ``data`` what it trains on, ``env`` where the
    rank stands (its rank, the run's world, its device). Each rank sums its own steps
    and times its own epochs, so the loop sums the epoch's loss and accuracy counts
    over the ranks and takes the slowest rank's seconds (components and bytes stay
    this rank's)."""

    def __init__(self, data: BaselineData, env):
        self.data = data
        self.graph_info = data.graph.record_info()
        self.rank, self.world = env.rank, env.world_size
        self.device = torch.device(env.device)

    def reduce(self, stats: EpochStats) -> EpochStats:
        loss_sum, loss_n, correct, count = all_reduce_sum([stats.loss_sum, stats.loss_n, stats.correct, stats.count])
        return EpochStats(loss_sum=loss_sum, loss_n=int(loss_n), correct=correct, count=count,
                          components=stats.components, comm_bytes=stats.comm_bytes, extra=stats.extra)

    def slowest(self, seconds: float) -> float:
        return all_reduce_sum([seconds], op=dist.ReduceOp.MAX)[0]

    # ------------------------------------------------------------ the trained model
    # A data-parallel replica holds the whole model: rank 0 writes it (--save-model, the
    # Python API's default) beside the record, the last epoch's and the best validation
    # epoch's, as scalegnn.trained does for ScaleGNN: a FullGraphModel as the system's own
    # model file, a ScaleGNN (CAGNET's replicated parameters) as ScaleGNN's.
    def begin(self, record: dict) -> LoopStart:
        model = self.saved_model()
        snapshot = lambda: {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}  # noqa: E731
        self.best = BestValidation(snapshot, record) if model is not None else None
        return LoopStart(callbacks=(self.best,) if self.best is not None else ())

    def saved_model(self) -> torch.nn.Module | None:
        """The model a run saves (rank 0's, with --save-model), or None."""
        model = getattr(self, "model", None)
        cfg = getattr(self, "cfg", None)
        keep = isinstance(model, (FullGraphModel, ScaleGNN)) and cfg is not None and cfg.loop.save_model \
            and self.rank == 0
        return model if keep else None

    def end(self, record: dict) -> None:
        from scalegnn.trained import model_file_of, save_model, save_system_model

        model = self.saved_model()
        if model is None:
            return
        cfg, last = self.cfg, (record["epochs"][-1]["epoch"] if record["epochs"] else 0)

        def write(state, epoch: int, kind: str) -> str:
            path = model_file_of(cfg.loop.out_dir, record["run_id"], kind)
            about = {"run_id": record["run_id"], "system": cfg.system, "dataset": cfg.data.dataset,
                     "world_size": self.world, "epoch": epoch}
            if isinstance(model, ScaleGNN):
                return str(save_model(path, state, in_dim=model.w_in.shape[0], num_classes=model.w_out.shape[1],
                                      model_cfg=model.config, about=about))
            return str(save_system_model(path, cfg.system, model.architecture, state, about))

        record["model_file"] = write(model.state_dict(), last, "model")
        if self.best.kept is not None:
            epoch, state = self.best.kept
            record["best_model_file"] = record["model_file"] if epoch == last else write(state, epoch, "best.model")


def baseline_data(cfg: RunConfig, graph: Graph | None = None) -> BaselineData:
    """What every baseline does before building its trainer: seed every generator with
    the run's seed, then load the raw graph (:func:`load_data`)."""
    seed_everything(cfg.seed)
    return load_data(cfg, graph)
