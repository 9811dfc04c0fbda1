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

A compared system's run saves its own model the same way (``kind``
``"scalegnn-system-model"``: ``system``, ``architecture`` (its constructor's arguments),
``state``, ``about``; the class is the registry's ``model``, a
``scalegnn.baselines.models.FullGraphModel``): rank 0's data-parallel replica, whose
``logits(graph)`` is the system's own exact full-graph inference. CAGNET saves the
ScaleGNN whose parameters its ranks replicate (a ScaleGNN model file); DistDGL, whose
model lives in its own DGL processes, saves none.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import torch

from .fileio import load_error
from .graph import as_graph
from .model import ModelConfig, ScaleGNN

__all__ = ["MODEL_FORMAT", "ModelFileError", "save_model", "save_system_model", "load_model", "predict",
           "checkpoint_model", "export_checkpoint", "model_file_of", "TrainResult", "MODEL_SYSTEMS"]

MODEL_FORMAT = 1
_KIND = "scalegnn-model"
_SYSTEM_KIND = "scalegnn-system-model"  # a compared system's model: its class is the registry's ``model``


def _model_systems() -> tuple[str, ...]:
    from . import systems as registry

    return tuple(s.name for s in registry.systems(available=True) if s.model)


# The systems whose runs save a model: ScaleGNN's (consolidated from the ranks) and the compared systems whose
# model is a whole replica (the registry's ``model``); DistDGL, whose model lives in its DGL processes, saves none.
MODEL_SYSTEMS = _model_systems()


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


def save_system_model(path: str | os.PathLike, system: str, architecture: dict, state: dict[str, torch.Tensor],
                      about: dict) -> Path:
    """Write a compared system's model (its registry ``model`` class, built again from
    ``architecture``, plain numbers and strings) as a model file, atomically."""
    from .checkpoint import atomic_torch_save

    payload = {"format": MODEL_FORMAT, "kind": _SYSTEM_KIND, "system": system, "architecture": dict(architecture),
               "state": {k: v.detach().cpu().contiguous() for k, v in state.items()}, "about": about}
    return atomic_torch_save(payload, path)


def _system_model(path: Path, payload: dict) -> torch.nn.Module:
    from . import systems as registry

    system = payload.get("system")
    try:
        cls = registry.resolve(registry.get(system).model or "")
    except (registry.UnknownSystem, ValueError, ImportError, AttributeError):
        raise ModelFileError(f"{path}: a model of system {system!r}, which has no model class here "
                             f"(systems with one: {', '.join(MODEL_SYSTEMS)})") from None
    try:
        model = cls(**payload["architecture"])
        model.load_state_dict(payload["state"])
    except (TypeError, KeyError, RuntimeError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ModelFileError(f"{path}: its parameters do not fit its own architecture ({first})") from None
    return model


def load_model(path: str | os.PathLike) -> torch.nn.Module:
    """The model in ``path`` (:func:`save_model`, ``scalegnn export``, or a compared
    system's run) as a plain module on the CPU, in eval mode: a
    :class:`~scalegnn.model.ScaleGNN`, or the system's own model (GraphSAGE's, ...); its
    ``about`` attribute says where it came from. Loading runs no code from the file
    (``weights_only``)."""
    path = Path(path)
    if not path.is_file():
        raise ModelFileError(f"{path}: no such model file (write one with --save-model, or `scalegnn export "
                             "CKPT_DIR --out FILE` from a checkpoint folder)")
    with open(path, "rb") as f:
        head = f.read(64).lstrip()
    if head.startswith(b"{"):  # JSON: a run record, whose model_file names its model
        raise ModelFileError(f"{path}: a run record (JSON), not a model file; the record's model_file (and "
                             "best_model_file) names its model: scalegnn.load_model(record['model_file'])")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unpickling failure means a file that is not ours or is damaged
        raise ModelFileError(f"{path}: cannot be read as a model file ({load_error(exc)})") from None
    if not isinstance(payload, dict) or payload.get("kind") not in (_KIND, _SYSTEM_KIND):
        raise ModelFileError(f"{path}: not a scalegnn model file (a checkpoint folder is exported with "
                             "`scalegnn export CKPT_DIR --out FILE`)")
    if not isinstance(payload.get("format"), int) or payload["format"] > MODEL_FORMAT:
        raise ModelFileError(f"{path}: model format {payload.get('format')!r} is newer than this scalegnn reads "
                             f"({MODEL_FORMAT}); upgrade scalegnn")
    if payload["kind"] == _SYSTEM_KIND:
        model = _system_model(path, payload)
        model.about = payload.get("about", {})
        return model.eval()
    model = ScaleGNN(payload["in_dim"], payload["num_classes"], ModelConfig.from_dict(payload["model"]))
    try:
        model.load_state_dict(payload["state"])
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()[0]
        raise ModelFileError(f"{path}: its parameters do not fit its own architecture ({first})") from None
    model.about = payload.get("about", {})
    return model.eval()


@torch.no_grad()
def predict(model: torch.nn.Module, graph) -> torch.Tensor:
    """Logits (N, C) of ``model`` for every vertex of ``graph`` (a :class:`Graph`, a PyG
    ``Data`` or a DGL graph; a full-graph forward, no sampling, no dropout). A ScaleGNN
    runs on the graph's GCN normalization as training uses it (self loops added; a
    normalized graph as is); a compared system's model on the raw graph, aggregating as
    its own full-graph evaluation does (every neighbour). Vertex order is the graph's own."""
    from .sampling import training_features

    graph = as_graph(graph)
    if not isinstance(model, ScaleGNN):
        if not hasattr(model, "logits"):
            raise ValueError(f"predict runs a model that scalegnn.load_model or a run gives, not a "
                             f"{type(model).__name__}")
        if graph.num_features != model.architecture["in_dim"]:
            raise ValueError(f"the graph has {graph.num_features} features per vertex, the model was trained on "
                             f"{model.architecture['in_dim']}")
        was_training = model.training
        model.eval()
        try:
            return model.logits(graph)
        finally:
            model.train(was_training)
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
        self._models: dict[str, torch.nn.Module] = {}

    @property
    def record(self) -> dict:
        return self

    def __repr__(self) -> str:
        return (f"TrainResult(run_id={self.get('run_id')!r}, status={self.get('status')!r}, "
                f"epochs={len(self.get('epochs') or [])}, model_file={self.get('model_file')!r})")

    @property
    def model(self) -> torch.nn.Module:
        """The last epoch's model (a :class:`~scalegnn.model.ScaleGNN`, or the compared
        system's own; loaded once from the record's ``model_file``)."""
        return self._load("model_file", "result.model")

    @property
    def best_model(self) -> torch.nn.Module:
        """The best validation epoch's model (the record's ``best_model_file``; the
        summary's ``best_epoch``)."""
        return self._load("best_model_file", "result.best_model")

    def _load(self, key: str, what: str) -> torch.nn.Module:
        if key not in self._models:
            if self.get("system") not in MODEL_SYSTEMS:
                raise ModelFileError(f"{what}: a {self.get('system')} run saves no model (systems that do: "
                                     f"{', '.join(MODEL_SYSTEMS)})")
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

