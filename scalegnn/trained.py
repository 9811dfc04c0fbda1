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
import math
import os
from pathlib import Path

import torch

from .fileio import check_declared_size, load_error
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


# Why a model file is refused, and what to do, for every shape of damage below: one line each.
_REWRITE = ("write it again (--save-model, or `scalegnn export CKPT_DIR --out FILE` from a checkpoint folder); "
            "a file that fails this check is damaged or was not written by scalegnn")


def _show(value) -> str:
    """``value`` in a few words, on one line (a tensor's repr spans lines; a crafted list has no end)."""
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    text = " ".join(repr(value).split())
    return text if len(text) <= 60 else text[:57] + "..."


def _bad(path: Path, what: str, fix: str = _REWRITE) -> ModelFileError:
    return ModelFileError(f"{path}: {what}; {fix}")


def _field(path: Path, holder: dict, key: str, where: str, kind: type):
    """``holder[key]``, present and of type ``kind`` (an int is not a bool; a float may be an
    int, and must be finite; an int is a size, >= 1); ``where`` names the field in the message."""
    if key not in holder:
        raise _bad(path, f"{where} is missing")
    value = holder[key]
    if kind in (int, float):
        ok = isinstance(value, int if kind is int else (int, float)) and not isinstance(value, bool)
    else:
        ok = isinstance(value, kind)
    if not ok:
        raise _bad(path, f"{where} is {_show(value)} ({type(value).__name__}), not {_TYPE_WORDS[kind]}")
    if kind is float and not math.isfinite(value):
        raise _bad(path, f"{where} is {value!r}, not a finite number")
    if kind is int and value < 1:
        raise _bad(path, f"{where} is {value}, not a size >= 1")
    return value


_TYPE_WORDS = {int: "an integer >= 1", float: "a number", bool: "True or False", str: "a string", dict: "a dict",
               object: "a value"}


def _annotated(annotation) -> type:
    """The type a parameter or field declares (a string under ``from __future__ import annotations``)."""
    return {"int": int, "float": float, "bool": bool, "str": str}.get(str(annotation), object)


def _check_budget(path: Path, fields: list[tuple[str, int]]) -> None:
    """The parameters the architecture declares (float32, as a module is built) against the
    memory budget, each matrix and then all together, before any is allocated."""
    fix = ("a file declaring this is damaged or crafted; a real model this large loads only where the memory "
           "budget holds it")
    for field, count in fields:
        check_declared_size(str(path), field, count, 4, fix=fix, error=ModelFileError)
    if len(fields) > 1:
        check_declared_size(str(path), "the architecture (all its parameters)", sum(c for _, c in fields), 4,
                            fix=fix, error=ModelFileError)


def _state_of(path: Path, payload: dict, count: int, architecture: str) -> dict:
    """The payload's ``state``: a dict of ``count`` entries (counted before its architecture's
    names are listed, as many as its layers: a crafted layer count must not list them without end)."""
    state = _field(path, payload, "state", "'state' (the parameters)", dict)
    if len(state) != count:
        raise _bad(path, f"'state' holds {len(state)} entries, its architecture ({architecture}) has {count}")
    return state


def _check_state(path: Path, state: dict, shapes: dict[str, tuple[int, ...]], architecture: str) -> None:
    """``state`` holds exactly the parameters ``shapes`` names, each a dense floating tensor of
    that shape, every value finite: what ``load_state_dict`` and then inference can use."""
    for name in state:
        if name not in shapes:
            raise _bad(path, f"'state' holds {_show(name)}, which its architecture ({architecture}) has not "
                       f"(it has {', '.join(list(shapes)[:6])}{', ...' if len(shapes) > 6 else ''})")
    for name, shape in shapes.items():
        t = state[name]
        if not isinstance(t, torch.Tensor):
            raise _bad(path, f"state {name} is {_show(t)} ({type(t).__name__}), not a tensor")
        if t.layout != torch.strided:
            raise _bad(path, f"state {name} is a {t.layout} tensor, not a dense one")
        if not t.is_floating_point():
            raise _bad(path, f"state {name} holds {t.dtype} values, not floating point ones")
        if tuple(t.shape) != tuple(shape):
            raise _bad(path, f"state {name} has shape {tuple(t.shape)}, its architecture ({architecture}) makes "
                       f"it {tuple(shape)}")
    for name in shapes:
        bad = int((~torch.isfinite(state[name])).sum())
        if bad:
            # Training never writes such a file: a loss that is not finite ends the run as diverged
            # before its model is saved. A mid-epoch checkpoint taken after the weights went bad, exported, can.
            raise _bad(path, f"state {name} has {bad:,} non-finite values (NaN or inf) of {state[name].numel():,}: "
                       "a model that predicts NaN", "the run that trained it diverged (or the file is damaged); "
                       "use a model of an earlier epoch (a checkpoint before the divergence, exported)")


def _scalegnn_model(path: Path, payload: dict) -> ScaleGNN:
    in_dim = _field(path, payload, "in_dim", "'in_dim'", int)
    num_classes = _field(path, payload, "num_classes", "'num_classes'", int)
    saved = _field(path, payload, "model", "'model' (the architecture)", dict)
    # ModelConfig.from_dict keeps a key of this version's fields only and defaults a missing one (files of
    # other versions); the ones it keeps are checked here, by the field's declared type.
    for f in dataclasses.fields(ModelConfig):
        if f.name in saved:
            _field(path, saved, f.name, f"model.{f.name}", _annotated(f.type))
    if saved.get("norm_eps", 0) < 0:
        raise _bad(path, f"model.norm_eps is {saved['norm_eps']}, not >= 0")
    try:
        cfg = ModelConfig.from_dict(saved)
    except (TypeError, ValueError) as exc:
        raise _bad(path, f"'model' is not an architecture ({' '.join(str(exc).split())})") from None
    h, layers = cfg.hidden, cfg.layers
    _check_budget(path, [("in_dim x model.hidden", in_dim * h), ("model.layers x model.hidden^2", layers * h * h),
                         ("model.hidden x num_classes", h * num_classes)])
    described = (f"in_dim {in_dim}, hidden {h}, {layers} layers{'' if cfg.norm else ' without norm'}, "
                 f"{num_classes} classes")
    state = _state_of(path, payload, 2 + layers * (2 if cfg.norm else 1), described)
    shapes = {"w_in": (in_dim, h), **{f"w.{i}": (h, h) for i in range(layers)},
              **({f"norm.{i}": (h,) for i in range(layers)} if cfg.norm else {}), "w_out": (h, num_classes)}
    _check_state(path, state, shapes, described)
    model = ScaleGNN(in_dim, num_classes, cfg)
    model.load_state_dict(state)  # names, shapes and dtypes checked above
    return model


def _system_model(path: Path, payload: dict) -> torch.nn.Module:
    import inspect

    from . import systems as registry

    system = _field(path, payload, "system", "'system'", str)
    try:
        cls = registry.resolve(registry.get(system).model or "")
    except (registry.UnknownSystem, ValueError, ImportError, AttributeError):
        raise ModelFileError(f"{path}: a model of system {_show(system)}, which has no model class here "
                             f"(systems with one: {', '.join(MODEL_SYSTEMS)})") from None
    if not hasattr(cls, "logits"):  # CAGNET's model is a ScaleGNN, saved as a ScaleGNN model file
        raise _bad(path, f"a {system} model is saved as a ScaleGNN model file (kind {_KIND!r}), this one says "
                   f"{_SYSTEM_KIND!r}")
    arch = _field(path, payload, "architecture", "'architecture'", dict)
    params = {k: p for k, p in inspect.signature(cls.__init__).parameters.items() if k != "self"}
    for key in arch:
        if key not in params:
            raise _bad(path, f"architecture key {_show(key)} is not one of {cls.__name__}'s "
                       f"({', '.join(params)})")
    for key, p in params.items():
        if key not in arch and p.default is inspect.Parameter.empty:
            raise _bad(path, f"architecture.{key} is missing")
    # Every int a compared system's model takes is a size (in_dim, hidden, out_dim, layers).
    for key, p in params.items():
        if key in arch:
            _field(path, arch, key, f"architecture.{key}", _annotated(p.annotation))
    if not 0.0 <= arch.get("dropout", 0.0) < 1.0:
        raise _bad(path, f"architecture.dropout is {arch['dropout']}, not in [0, 1)")
    state = _field(path, payload, "state", "'state' (the parameters)", dict)
    # Each layer has parameters of its own, so a state shorter than the layers is refused before
    # the layers are built (a crafted count would build modules without end, even on no memory).
    if arch.get("layers", 1) > len(state):
        raise _bad(path, f"architecture.layers is {arch['layers']:,}, more than the {len(state)} entries of 'state'")
    described = ", ".join(f"{k} {v}" for k, v in arch.items())
    try:
        with torch.device("meta"):  # the shapes, and so the bytes, it would take, allocating none
            shapes = {k: tuple(v.shape) for k, v in cls(**arch).state_dict().items()}
    except (TypeError, ValueError, RuntimeError) as exc:
        raise _bad(path, f"its architecture ({described}) builds no {cls.__name__} "
                   f"({' '.join(str(exc).split())})") from None
    _check_budget(path, [(f"architecture ({described})", sum(math.prod(s) for s in shapes.values()))])
    _check_state(path, _state_of(path, payload, len(shapes), described), shapes, described)
    model = cls(**arch)
    model.load_state_dict(state)  # names, shapes and dtypes checked above
    return model


def load_model(path: str | os.PathLike) -> torch.nn.Module:
    """The model in ``path`` (:func:`save_model`, ``scalegnn export``, or a compared
    system's run) as a plain module on the CPU, in eval mode: a
    :class:`~scalegnn.model.ScaleGNN`, or the system's own model (GraphSAGE's, ...); its
    ``about`` attribute says where it came from. Loading runs no code from the file
    (``weights_only``); every field is checked before it is used, and the parameters the
    architecture declares against the memory budget before any is allocated: a damaged or
    crafted file is one :class:`ModelFileError` line."""
    path = Path(path)
    if not path.is_file():
        raise ModelFileError(f"{path}: no such model file (write one with --save-model, or `scalegnn export "
                             "CKPT_DIR --out FILE` from a checkpoint folder)")
    try:
        with open(path, "rb") as f:
            head = f.read(64).lstrip()
    except OSError as exc:
        raise ModelFileError(f"{path}: cannot be read ({exc.strerror or exc}); check its permissions") from None
    if head.startswith(b"{"):  # JSON: a run record, whose model_file names its model
        raise ModelFileError(f"{path}: a run record (JSON), not a model file; the record's model_file (and "
                             "best_model_file) names its model: scalegnn.load_model(record['model_file'])")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unpickling failure means a file that is not ours or is damaged
        raise ModelFileError(f"{path}: cannot be read as a model file ({load_error(exc)})") from None
    export = "(a checkpoint folder is exported with `scalegnn export CKPT_DIR --out FILE`)"
    if not isinstance(payload, dict):
        raise ModelFileError(f"{path}: not a scalegnn model file: it holds {_show(payload)} "
                             f"({type(payload).__name__}), not a model's dict {export}")
    if payload.get("kind") not in (_KIND, _SYSTEM_KIND):
        raise ModelFileError(f"{path}: not a scalegnn model file: its kind is {_show(payload.get('kind'))}, not "
                             f"{_KIND!r} or {_SYSTEM_KIND!r} {export}")
    fmt = payload.get("format")
    if not isinstance(fmt, int) or isinstance(fmt, bool) or fmt < 1:
        raise _bad(path, f"'format' is {_show(fmt)}, not a model format (an integer, 1..{MODEL_FORMAT})")
    if fmt > MODEL_FORMAT:
        raise ModelFileError(f"{path}: model format {fmt!r} is newer than this scalegnn reads "
                             f"({MODEL_FORMAT}); upgrade scalegnn")
    about = payload.get("about", {})
    if not isinstance(about, dict):
        raise _bad(path, f"'about' is {_show(about)} ({type(about).__name__}), not a dict")
    model = _system_model(path, payload) if payload["kind"] == _SYSTEM_KIND else _scalegnn_model(path, payload)
    model.about = about
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

