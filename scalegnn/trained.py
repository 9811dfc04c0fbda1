"""A trained ScaleGNN in one file: consolidated from its ranks, loaded without
``torch.distributed``, run on any graph.

A run's ranks each hold shards of the parameters (:func:`scalegnn.parallel.model.param_shards`);
the consolidated model is the serial :class:`scalegnn.model.ScaleGNN` with exactly those
values, whatever the grid. It comes from two places:

    the end of a run        ``--save-model`` (the Python API's default): the ranks gather
                            their shards, rank 0 writes ``<out>/<run id>.model.pt`` and the
                            record names it (``model_file``, absolute); a resumed run has
                            its own id, so its own file: its parent's stays as it was
    a checkpoint folder     ``scalegnn export CKPT_DIR --out FILE`` (:func:`export_checkpoint`),
                            from the rank files of any grid

The file (``torch.save``, read back with ``weights_only=True``: tensors and plain data
only, so loading it runs no code) holds::

    format        MODEL_FORMAT
    kind          "scalegnn-model"
    in_dim, num_classes, model   the architecture (ModelConfig's fields)
    state         the serial parameters by name (w_in, w.<l>, norm.<l>, w_out)
    about         where it came from: run id, system, dataset, grid, step, epoch

:func:`load_model` gives a plain ``torch.nn.Module`` on the CPU in eval mode;
:func:`predict` its (N, C) logits on a graph, GCN-normalized as training normalizes it.
:class:`TrainResult` is what :func:`scalegnn.train` returns.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import torch

from .fileio import load_error
from .graph import as_graph
from .model import ModelConfig, ScaleGNN

__all__ = ["MODEL_FORMAT", "ModelFileError", "save_model", "load_model", "predict", "checkpoint_model",
           "export_checkpoint", "model_file_of", "TrainResult", "MODEL_SYSTEMS"]

MODEL_FORMAT = 1
_KIND = "scalegnn-model"
# The systems whose trainer is ScaleGNN's engine: their parameters consolidate into ScaleGNN.
MODEL_SYSTEMS = ("scalegnn", "fullgraph-3d")


class ModelFileError(ValueError):
    """A model file or a checkpoint cannot give a model: missing, corrupt, or another kind of file."""


def model_file_of(out_dir: str | os.PathLike, run_id: str, kind: str = "model") -> Path:
    """Where a run's consolidated model goes: beside its record (``<run id>.json``), as an
    absolute path (the record names it, and a relative one would break on a change of
    the working directory); ``kind`` ``model`` (the last epoch's) or ``best.model``."""
    return Path(out_dir).absolute() / f"{run_id}.{kind}.pt"


def save_model(path: str | os.PathLike, state: dict[str, torch.Tensor], *, in_dim: int, num_classes: int,
               model_cfg: ModelConfig, about: dict) -> Path:
    """Write the serial parameters ``state`` as a model file (atomically: a reader sees the
    whole file or none)."""
    from .checkpoint import atomic_torch_save

    payload = {"format": MODEL_FORMAT, "kind": _KIND, "in_dim": int(in_dim), "num_classes": int(num_classes),
               "model": dataclasses.asdict(model_cfg), "state": {k: v.detach().cpu().contiguous() for k, v in state.items()},
               "about": about}
    return atomic_torch_save(payload, path)


def load_model(path: str | os.PathLike) -> ScaleGNN:
    """The model in ``path`` (:func:`save_model`, ``scalegnn export``) as a plain
    :class:`~scalegnn.model.ScaleGNN` on the CPU, in eval mode; its ``about`` attribute
    says where it came from. Loading runs no code from the file (``weights_only``)."""
    path = Path(path)
    if not path.is_file():
        raise ModelFileError(f"{path}: no such model file (write one with --save-model, or `scalegnn export "
                             "CKPT_DIR --out FILE` from a checkpoint folder)")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unpickling failure means a file that is not ours or is damaged
        raise ModelFileError(f"{path}: cannot be read as a model file ({load_error(exc)})") from None
    if not isinstance(payload, dict) or payload.get("kind") != _KIND:
        raise ModelFileError(f"{path}: not a scalegnn model file (a checkpoint folder is exported with "
                             "`scalegnn export CKPT_DIR --out FILE`)")
    if not isinstance(payload.get("format"), int) or payload["format"] > MODEL_FORMAT:
        raise ModelFileError(f"{path}: model format {payload.get('format')!r} is newer than this scalegnn reads "
                             f"({MODEL_FORMAT}); upgrade scalegnn")
    model = ScaleGNN(payload["in_dim"], payload["num_classes"], ModelConfig.from_dict(payload["model"]))
    try:
        model.load_state_dict(payload["state"])
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()[0]
        raise ModelFileError(f"{path}: its parameters do not fit its own architecture ({first})") from None
    model.about = payload.get("about", {})
    return model.eval()


@torch.no_grad()
def predict(model: ScaleGNN, graph) -> torch.Tensor:
    """Logits (N, C) of ``model`` for every vertex of ``graph`` (a :class:`Graph`, a PyG
    ``Data`` or a DGL graph; a full-graph forward, no sampling, no dropout), on the graph's
    GCN normalization as training uses it (self loops added; a normalized graph as is).
    Vertex order is the graph's own."""
    from .sampling import training_features

    graph = as_graph(graph)
    if graph.num_features != model.w_in.shape[0]:
        raise ValueError(f"the graph has {graph.num_features} features per vertex, the model was trained on "
                         f"{model.w_in.shape[0]}")
    if graph.meta.get("normalized") != "gcn":
        graph = graph.gcn_normalize()
    adj = graph.to_torch_csr()
    was_training = model.training
    model.eval()
    try:
        return model(adj, adj.t().to_sparse_csr(), training_features(graph.x))
    finally:
        model.train(was_training)


def checkpoint_model(ckpt_dir: str | os.PathLike) -> tuple[dict[str, torch.Tensor], dict]:
    """The serial parameters in a checkpoint, of any grid, and what :func:`save_model` needs
    besides (``in_dim``, ``num_classes``, ``model_cfg``, ``about``). ``ckpt_dir``: a
    ``--checkpoint-dir`` (its newest complete checkpoint) or one ``step-*`` folder in it."""
    from .checkpoint import CheckpointError, latest, read_meta
    from .parallel.engine import read_whole_state

    folder = Path(ckpt_dir)
    if not folder.is_dir():
        raise ModelFileError(f"{folder}: no such checkpoint folder")
    ckpt = folder if (folder / "meta.json").is_file() else latest(folder)
    if ckpt is None:
        raise ModelFileError(f"{folder}: holds no complete checkpoint (a step-* folder with meta.json)")
    try:
        meta = read_meta(ckpt)
        whole = read_whole_state(ckpt, meta, parts=("model",))
    except CheckpointError as exc:
        raise ModelFileError(str(exc)) from None
    record = meta["record"]
    about = {"run_id": record.get("run_id"), "system": record.get("system"), "dataset": record.get("dataset"),
             "grid": whole["grid"], "step": meta["step"], "epoch": meta["epoch"], "source": str(ckpt)}
    return whole["model"], {"in_dim": whole["in_dim"], "num_classes": whole["num_classes"],
                            "model_cfg": whole["model_cfg"], "about": about}


def export_checkpoint(ckpt_dir: str | os.PathLike, out: str | os.PathLike) -> Path:
    """Consolidate a sharded checkpoint of any grid into one model file (``scalegnn export``)."""
    state, rest = checkpoint_model(ckpt_dir)
    return save_model(out, state, **rest)


class TrainResult(dict):
    """What :func:`scalegnn.train` returns: the run record itself (a ``dict``:
    ``result["summary"]``, ``json.dumps(result)``; ``result.record`` is the same), the
    trained model consolidated from the ranks and :meth:`predict`.

    Two models, as the record names them: ``result.model``, the **last** epoch's
    (``model_file``: what training ended with, what a resume continues), and
    ``result.best_model``, the **best validation** epoch's (``best_model_file``: the
    model selection of the record's ``summary``, whose ``test_acc_at_best_val`` it
    scores). :meth:`predict` uses the last epoch's; ``scalegnn.predict(result.best_model,
    graph)`` the other."""

    def __init__(self, record: dict):
        super().__init__(record)
        self._models: dict[str, ScaleGNN] = {}

    @property
    def record(self) -> dict:
        return self

    def __repr__(self) -> str:
        return (f"TrainResult(run_id={self.get('run_id')!r}, status={self.get('status')!r}, "
                f"epochs={len(self.get('epochs') or [])}, model_file={self.get('model_file')!r})")

    @property
    def model(self) -> ScaleGNN:
        """The last epoch's :class:`~scalegnn.model.ScaleGNN` (loaded once from the record's ``model_file``)."""
        return self._load("model_file", "result.model")

    @property
    def best_model(self) -> ScaleGNN:
        """The best validation epoch's :class:`~scalegnn.model.ScaleGNN` (the record's
        ``best_model_file``; the summary's ``best_epoch``)."""
        return self._load("best_model_file", "result.best_model")

    def _load(self, key: str, what: str) -> ScaleGNN:
        if key not in self._models:
            if self.get("system") not in MODEL_SYSTEMS:
                raise ModelFileError(f"{what}: a {self.get('system')} run has no ScaleGNN model to consolidate "
                                     f"(systems with one: {', '.join(MODEL_SYSTEMS)})")
            if not self.get(key):
                if self.get("status") != "ok":
                    why = f"the run ended {self.get('status')}"
                elif self.get("model_file"):
                    why = (f"its best validation epoch ({(self.get('summary') or {}).get('best_epoch')}) came before "
                           f"the resume, in run {self.get('resumed_from')}, whose record names that model")
                else:
                    why = "it was trained with save_model=False"
                raise ModelFileError(f"{what}: run {self.get('run_id')} wrote no such model ({why}); a checkpoint "
                                     "folder gives one with scalegnn.export_checkpoint(CKPT_DIR, FILE)")
            self._models[key] = load_model(self[key])
        return self._models[key]

    def predict(self, graph) -> torch.Tensor:
        """Logits (N, C) of the last epoch's model on ``graph`` (:func:`predict`)."""
        return predict(self.model, graph)

