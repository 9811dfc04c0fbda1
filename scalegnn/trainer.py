"""ScaleGNN's trainer: the engine's steps as the epochs of the shared loop.

Reads top to bottom:
  1. the graph: the dataset (or the graph given) in GCN-normalized form,
     A = D^-1/2 (A+I) D^-1/2 (Eq. 3), relabeled first when ``--permute`` asks; or
     this rank's shard file, mapped, when ``--shard-dir`` names one (Plexus 5.4); the
     time it took and the peak RSS after it go into the record per rank, with the time
     from the process's start to the end of its first training step
  2. the engine on this rank's grid and device (one engine: a single process is
     the 1x1x1x1 grid; more ranks run under torch.distributed)
  3. :meth:`ScaleGNNTrainer.begin`: resume from the newest checkpoint (``--resume``:
     a new run, its record naming the run it continues), or start at epoch 1
  4. per epoch (the shared loop, :func:`scalegnn.loop.train_epochs`):
     ceil(N/B)/Gd steps of Algorithm 1; a checkpoint mid-epoch when due and at the
     epoch's end; a preemption request seen at the next step; evaluation (full
     graph) every ``eval_every`` epochs, excluded from training time

The epoch never reads a device value: step results are summed on the device
(:class:`scalegnn.loop.EpochSums`) and read once at its end, after which
divergence (a loss that is not finite) is checked.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from . import checkpoint as ckpt_mod
from .checkpoint import CheckpointError, Checkpointer, Preempted
from .config import RunConfig
from .graph import Graph
from .loop import BestValidation, Callback, DivergedError, EpochStats, EpochSums, LoopStart, Trainer, reached_target
from .progress import Heartbeat, Phases, mode_from_progress
from .device import peak_rss_bytes
from .sampling import resolve_batch_size
from .timing import process_age_s

__all__ = ["ScaleGNNTrainer", "make_trainer", "prepare_graph", "make_engine"]


def prepare_graph(cfg: RunConfig, graph: Graph | None = None) -> Graph:
    """The GCN-normalized form (self loops added) of ``graph``, a raw graph, or of the
    dataset loaded when there is none; with ``--split``'s split when one is given;
    relabeled first when ``cfg`` permutes. A graph that is already normalized is
    returned as it is (but for the split)."""
    from .datasets import load_graph

    graph = load_graph(cfg.data, cfg.seed, graph)
    if graph.meta.get("normalized") == "gcn":
        return graph
    if cfg.numerics.permute != "none":  # Plexus 5.1: relabel the vertices once (P_c; double adds sigma in the engine)
        from .permutation import random_permutation

        graph = graph.permute(random_permutation(graph.num_nodes, cfg.seed))
    return graph.gcn_normalize()


def _sizes(info: dict) -> str:
    """A graph's sizes as the first-minute lines give them (:class:`scalegnn.progress.Phases`)."""
    nnz = info.get("adjacency_nnz", info["num_edges"])  # shards staged before adjacency_nnz: num_edges held it
    return f"{info['num_nodes']:,} vertices, {nnz:,} adjacency entries, {info['num_features']:,} features"


def make_engine(cfg: RunConfig, graph: Graph, batch_size: int, grid=None, device: torch.device | str = "cpu"):
    """The engine for ``cfg`` on ``grid`` (default: the single process, 1x1x1x1, whose
    collectives are no-ops) and ``device``."""
    from .parallel.engine import ParallelEngine

    return ParallelEngine(graph, cfg.model, cfg.optim, batch_size, seed=cfg.seed, epochs=cfg.loop.epochs, grid=grid,
                          device=device, perf=cfg.perf, numerics=cfg.numerics)


def _read_shard(cfg: RunConfig, grid):
    """This rank's shard file, mapped (:func:`scalegnn.shards.load_shard`): big graphs
    are never loaded whole on every rank (Plexus 5.4). Returns (the graph's record info,
    the shard)."""
    from .shards import check_shard_manifest, load_shard, read_manifest

    shard_dir = cfg.data.shard_dir
    shard = load_shard(shard_dir, grid.rank, cfg.parallel.grid)
    manifest = read_manifest(shard_dir)
    check_shard_manifest(manifest, cfg.numerics.permute, cfg.seed, shard_dir, (cfg.data.split, cfg.data.split_seed))
    # The graph's record_info as written with the shards (older shards: the sizes alone).
    info = manifest.get("graph") or {k: manifest[k] for k in ("num_nodes", "num_edges", "num_features", "num_classes")}
    return info, shard


def _engine_from_shard(cfg: RunConfig, shard, grid, device):
    """The engine on this rank's shard."""
    from .parallel.engine import ParallelEngine

    batch_size = resolve_batch_size(shard.num_nodes, cfg.sampling.batch_size, cfg.sampling.batch_ratio)
    return ParallelEngine(None, cfg.model, cfg.optim, batch_size, seed=cfg.seed, epochs=cfg.loop.epochs, grid=grid,
                          shard=shard, device=device, perf=cfg.perf, numerics=cfg.numerics)


def _loaded(t0: float) -> dict:
    """What reading this rank's data cost: seconds since ``t0`` and the process's peak RSS."""
    return {"load_s": time.perf_counter() - t0, "rss_after_load_bytes": peak_rss_bytes()}


class ScaleGNNTrainer(Trainer):
    """ScaleGNN (and its full-graph mode) on this rank: the engine's steps, epoch by
    epoch, with resuming mid-epoch, checkpoints mid-epoch and at the epoch's end, and
    a preemption request seen at the next step.

    ``graph``: the graph to train on (raw or normalized), or None to load the
    configuration's dataset (or this rank's shard); ``env``: this rank's
    :class:`~scalegnn.launch.environment.DistEnv` (its device, and its backend when
    ``torch.distributed`` runs: then the grid's axis groups are built on it).
    Configuration and data errors raise here, before the run has a record.
    """

    def __init__(self, cfg: RunConfig, graph: Graph | None, env):
        from .parallel.grid import ProcessGrid

        self.cfg = cfg
        self.grid = ProcessGrid(*cfg.parallel.grid, backend=env.backend) if dist.is_initialized() \
            else ProcessGrid.single()
        self.device = torch.device(env.device)
        # one run per checkpoint folder, refused before anything loads (rank 0 holds it)
        self.lock = ckpt_mod.FolderLock(cfg.checkpoint.dir).acquire() if cfg.checkpoint.dir and env.rank == 0 \
            else None
        try:
            phases = Phases(env.rank, quiet=cfg.loop.progress is False)
            # This rank's data read: how long it took and the peak RSS then (the record's
            # load_s_per_rank, rss_after_load_bytes_per_rank); time_to_first_step_s at step 1.
            t_load = time.perf_counter()
            if cfg.data.shard_dir is not None:
                with phases("reading this rank's shard and building the engine") as said:
                    self.graph_info, shard = _read_shard(cfg, self.grid)
                    self.loaded = _loaded(t_load)
                    self.engine = _engine_from_shard(cfg, shard, self.grid, self.device)
                    said(_sizes(self.graph_info))
            else:
                with phases("loading the graph") as said:
                    graph = prepare_graph(cfg, graph)
                    self.graph_info = graph.record_info()
                    self.loaded = _loaded(t_load)
                    said(f"{graph.name}, {_sizes(self.graph_info)}")
                with phases("building the engine") as said:
                    batch_size = resolve_batch_size(graph.num_nodes, cfg.sampling.batch_size, cfg.sampling.batch_ratio)
                    self.engine = make_engine(cfg, graph, batch_size, self.grid, self.device)
                    said(f"grid {'x'.join(map(str, cfg.parallel.grid))}, batch {self.engine.batch_size:,}, "
                         f"{self.engine.steps_per_epoch} steps per epoch, on {self.device}")
        except BaseException:
            if self.lock is not None:
                self.lock.release()
            raise
        self.batch_size, self.steps_per_epoch = self.engine.batch_size, self.engine.steps_per_epoch
        self.heartbeat = Heartbeat(cfg.system, cfg.data.dataset, cfg.loop.epochs, env.rank,
                                   mode_from_progress(cfg.loop.progress), every_s=cfg.loop.heartbeat_s,
                                   steps_per_epoch=self.steps_per_epoch, batch_size=self.batch_size)
        self.ckpt = Checkpointer(cfg.checkpoint, self.grid if self.grid.distributed else None) \
            if cfg.checkpoint.enabled else None
        self.record: dict | None = None
        self.step = 0
        self.train_time = 0.0  # before the current epoch (checkpoint saves excluded)
        self.start: dict | None = None  # the checkpoint's loop position, when resumed
        self.stage = "setup"
        self.time_to_first_step_s: float | None = None  # set by this process's first step
        # --save-model: the best validation epoch's weights, each rank's own shards (gathered once, at the end)
        self.best_model: BestValidation | None = None

    # ------------------------------------------------------------------ the record
    def record_fields(self) -> dict:
        # torch.compile warm-up (paper V-C), not training time; why --compile ran eager, if it did
        fields = {"compile_time_s": self.engine.compile_time_s, "compile_fallback": self.engine.compile_fallback}
        # --cuda-graphs (only when asked): captures, replays and eager steps, or why the steps ran uncaptured
        if (graphs := self.engine.cuda_graphs_record()) is not None:
            fields["cuda_graphs"] = graphs
        return fields

    def rank_fields(self) -> dict:
        return {**self.loaded, "time_to_first_step_s": self.time_to_first_step_s}

    def begin(self, record: dict) -> LoopStart:
        self.record = record
        if self.cfg.checkpoint.resume:
            self.start = self._resume()  # a checkpoint of another config or grid raises: a user error
        spe, last = self.steps_per_epoch, (record["epochs"][-1] if record["epochs"] else None)
        if self.start is not None:
            self.step, self.train_time = int(self.start["step"]), float(self.start["train_time"])
        finished = bool(self.start and last and self.cfg.loop.stop_at_target
                        and reached_target(last, self.cfg.loop.target_acc) and self.step % spe == 0)
        self.best_model = BestValidation(self.engine.owned_state, record) if self.cfg.loop.save_model else None
        return LoopStart(first_epoch=self.step // spe + 1, train_time_s=self.train_time, finished=finished,
                         callbacks=(_EpochEndCheckpoint(self),) + ((self.best_model,) if self.best_model else ()))

    def record_extra(self) -> dict:
        extra = {}
        if self.engine.sampler.overflows:  # rank 0's batches drawn again because a padded block overflowed
            extra["sample_overflows"] = self.engine.sampler.overflows
        if self.ckpt is None:
            return extra
        before = self.record.get("checkpoint", {})  # a resumed run's saves so far
        return {**extra, "checkpoint": {**before, **self.ckpt.summary(),
                                        "saves": before.get("saves", 0) + self.ckpt.saves}}

    def close(self) -> None:
        self.engine.close()  # stops the prefetch thread (no orphan threads), writes the profiler trace
        if self.lock is not None:
            self.lock.release()

    def end(self, record: dict) -> None:
        """``--save-model``: the ranks' shards made one serial model, written by rank 0
        beside the record (:mod:`scalegnn.trained`), which names the file: the last
        epoch's (``model_file``) and the best validation epoch's (``best_model_file``: the
        same file when the last epoch is the best; absent when this run trained no
        evaluated epoch better than the ones it resumed)."""
        if not self.cfg.loop.save_model:
            return
        from .trained import model_file_of, save_model

        self.stage = "consolidating the trained model"
        best = self.best_model.kept if self.best_model is not None else None
        state = self.engine.gather_model()  # a collective: every rank takes part
        best_state = self.engine.gather_model(best[1]) if best and best[0] != self._epoch() else None
        if state is None:
            return
        m, cfg = self.engine.model, self.cfg

        def write(weights, epoch: int, suffix: str) -> str:
            about = {"run_id": record["run_id"], "system": cfg.system, "dataset": cfg.data.dataset,
                     "grid": "x".join(map(str, cfg.parallel.grid)), "step": epoch * self.steps_per_epoch,
                     "epoch": epoch}
            return str(save_model(model_file_of(cfg.loop.out_dir, record["run_id"], suffix), weights, in_dim=m.in_dim,
                                  num_classes=m.num_classes, model_cfg=m.config, about=about))

        record["model_file"] = write(state, self._epoch(), "model")
        if best is not None:
            record["best_model_file"] = record["model_file"] if best_state is None else \
                write(best_state, best[0], "best.model")

    def _epoch(self) -> int:
        return self.step // self.steps_per_epoch

    # ------------------------------------------------------------------ epochs
    def train_epoch(self, epoch: int) -> EpochStats:
        engine, start, spe = self.engine, self.start, self.steps_per_epoch
        if self.step % spe:  # resumed mid-epoch: continue this epoch's sums
            engine.reset_counters(start["components"], start["comm_bytes"], start.get("comm_calls"))
            sums = EpochSums(engine.device, tuple(start[k] for k in ("loss_sum", "loss_n", "correct", "count")))
        else:
            engine.reset_counters()
            sums = EpochSums(engine.device)
        engine.synchronize()
        t0, seconds = time.perf_counter(), 0.0
        end = epoch * spe
        self.heartbeat.begin_epoch(epoch, self.step % spe)
        while self.step < end:
            self.stage = f"training step {self.step} (epoch {epoch})"
            sums.add(engine.train_step(self.step), self.step)
            self.step += 1
            if self.time_to_first_step_s is None:  # the step's device work done: one wait per process
                engine.synchronize()
                self.time_to_first_step_s = process_age_s()
            self.heartbeat.step(self.step - (epoch - 1) * spe)
            if self.ckpt is not None and self.step < end and self.ckpt.due(self.step):  # mid-epoch save
                engine.synchronize()
                seconds += time.perf_counter() - t0
                self.stage = f"checkpoint save at step {self.step}"
                loss_sum, loss_n, correct, count, bad = sums.read()
                _check_finite(bad, epoch)
                self._save(epoch - 1, self.train_time + seconds, (loss_sum, loss_n, correct, count))
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
        self.stage = f"evaluation after epoch {self.step // self.steps_per_epoch}"
        r = self.engine.evaluate()
        return r.train_acc, r.val_acc, r.test_acc

    # ------------------------------------------------------------------ checkpoints
    def _save(self, epochs_done: int, train_time: float, partial: tuple) -> None:
        """Save a checkpoint at the current step (``partial``: the epoch's sums so far),
        then stop if a preemption was requested."""
        loss_sum, loss_n, correct, count = partial
        components, comm_bytes, comm_calls = self.engine.counters()
        loop = {"step": self.step, "train_time": train_time, "loss_sum": loss_sum, "loss_n": loss_n,
                "correct": correct, "count": count, "components": components, "comm_bytes": comm_bytes,
                "comm_calls": comm_calls}
        record = self.record
        saves = record.get("checkpoint", {}).get("saves", 0) + self.ckpt.saves + 1  # all attempts, this one included
        meta = {"epoch": epochs_done, "steps_per_epoch": self.steps_per_epoch, "batch_size": record["batch_size"],
                "config": self.cfg.to_dict(), "loop": loop, "record": {**record, "checkpoint": {"saves": saves}}}
        self.ckpt.save(self.step, self.engine.state_dict(), meta)
        if self.ckpt.stop_requested:
            raise Preempted(self.step, self.ckpt.last_path, ckpt_mod.PREEMPTION.signal)

    def _resume(self) -> dict | None:
        """Load the newest complete checkpoint of ``--checkpoint-dir`` into the engine and
        the record (its epochs so far, ``resumed_from`` its run id); return its loop
        position, or None when there is none (a fresh start)."""
        cfg, grid, record = self.cfg, self.grid, self.record
        path = ckpt_mod.latest(cfg.checkpoint.dir)
        if grid.distributed:
            seen = set(grid.gather_object(str(path)))  # every rank must resume the same checkpoint
            if len(seen) != 1:
                raise CheckpointError(f"ranks see different latest checkpoints in {cfg.checkpoint.dir}: "
                                      f"{sorted(seen)}; the folder must be on storage every rank can reach")
        if path is None:
            return None
        meta = ckpt_mod.read_meta(path)
        diff = ckpt_mod.config_mismatch(meta["config"], cfg.to_dict())
        if diff:
            raise CheckpointError(f"{path} was written by a run with another config ({'; '.join(diff)}); resume "
                                  "with the same settings, or use a new --checkpoint-dir for a new run")
        changes = ckpt_mod.continuation(path, meta, cfg.to_dict())  # e.g. more --epochs; refused past its end
        if meta.get("batch_size") != record["batch_size"]:
            raise CheckpointError(f"{path}: batch_size was {meta.get('batch_size')} when saved, is "
                                  f"{record['batch_size']} now (the dataset changed); use a new --checkpoint-dir")
        saved_grid = ckpt_mod.saved_grid(meta)
        step = meta["step"]
        if saved_grid == tuple(cfg.parallel.grid):
            for key in ("world_size", "steps_per_epoch"):
                if meta.get(key) != record[key]:
                    raise CheckpointError(f"{path}: {key} was {meta.get(key)} when saved, is {record[key]} now "
                                          "(the dataset or the launch changed); use a new --checkpoint-dir")
        else:
            step = ckpt_mod.regridded_step(path, meta, self.steps_per_epoch)
        # Each rank checks the files it reads (sizes and SHA-256 against meta.json); one whose
        # file is damaged must not leave the others waiting in the first step's collectives.
        try:
            state = self._load_checkpoint(path, meta, step)
            problem = None
        except CheckpointError as exc:
            state, problem = None, str(exc)
        problems = [p for p in (grid.gather_object(problem) if grid.distributed else [problem]) if p]
        if problems:
            raise CheckpointError(problems[0])
        if saved_grid != tuple(cfg.parallel.grid):
            changes = ckpt_mod.regridding(meta, tuple(cfg.parallel.grid), step, self.steps_per_epoch, changes)
        meta = {**meta, "loop": {**meta["loop"], "step": step}}  # the step read_meta checked (or the regridded one)
        ckpt_mod.set_rng_state(state["rng"])  # not read by a step (samples and dropout are keyed by step)
        saved = meta["record"]
        # A resume is a run of its own (its own id, record and model file): the parent's stay as written.
        record["resumed_from"] = saved["run_id"]
        record["epochs"] = saved["epochs"]
        record["checkpoint"] = saved.get("checkpoint", {})
        record["resumed"] = saved.get("resumed", []) + [{
            "step": meta["step"], "epoch": meta["epoch"], "checkpoint": str(path), "saved_at": meta.get("saved_at"),
            "resumed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "hostname": record["env"].get("hostname"), **changes,
        }]
        return meta["loop"]

    def _load_checkpoint(self, path, meta: dict, step: int) -> dict:
        """This rank's state from checkpoint ``path`` into the engine (on another grid: its
        shards cut from the state made whole, ``step`` the next step); its rank file's state."""
        grid = self.grid
        where = path / f"rank-{grid.rank:05d}.pt"
        try:
            if ckpt_mod.saved_grid(meta) == tuple(self.cfg.parallel.grid):
                state = ckpt_mod.load_rank_state(path, grid.rank, meta=meta)
                self.engine.load_state_dict(state["engine"])
                return state
            from .parallel.engine import read_whole_state  # another grid: every rank cuts its shards from it

            where = path  # the state made whole from its rank files
            self.engine.load_whole_state(read_whole_state(path, meta), step=step)
            return ckpt_mod.load_rank_state(path, grid.rank if grid.rank < meta["world_size"] else 0, meta=meta)
        except CheckpointError:
            raise
        except torch.OutOfMemoryError:
            raise
        except (KeyError, TypeError, IndexError, ValueError, RuntimeError) as exc:
            # A checkpoint without a list of SHA-256s (written before it) whose engine state was edited:
            # what torch says of it (a size mismatch, a missing key) in one line.
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise CheckpointError(f"{where}: its engine state does not fit this run ({type(exc).__name__}: "
                                  f"{reason}); it is damaged or not written by scalegnn. Remove this checkpoint "
                                  "folder to resume from an older one") from None


class _EpochEndCheckpoint(Callback):
    """Listen for a preemption request while the epochs run; save at an epoch's end
    (after its row, so the checkpoint's record has it) when the checkpoint period says
    so, and stop there when preemption was requested."""

    def __init__(self, trainer: ScaleGNNTrainer):
        self.trainer = trainer

    def on_start(self, epochs: int) -> None:
        ckpt_mod.PREEMPTION.listening = self.trainer.ckpt is not None  # a request will be seen (Checkpointer.due)

    def on_epoch_end(self, row: dict) -> None:
        t = self.trainer
        if t.ckpt is not None and t.ckpt.due(t.step):
            t.stage = f"checkpoint save at step {t.step}"
            t._save(row["epoch"], t.train_time, (0.0, 0, 0.0, 0))

    def close(self) -> None:
        ckpt_mod.PREEMPTION.listening = False


def _check_finite(first_bad_step: int, epoch: int) -> None:
    """Divergence: the first step whose loss was NaN or infinite (read with the epoch's sums)."""
    if first_bad_step >= 0:
        raise DivergedError(f"loss became NaN or infinite at epoch {epoch}, step {first_bad_step}")


def make_trainer(cfg: RunConfig, graph: Graph | None, env) -> ScaleGNNTrainer:
    """ScaleGNN's trainer (the registry's ``trainer`` of scalegnn and fullgraph-3d)."""
    return ScaleGNNTrainer(cfg, graph, env)
