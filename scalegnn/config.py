"""The run configuration: one typed tree of settings, from flag to record.

A run is a :class:`RunConfig`: the system, the seed, and one kw-only dataclass per
component, each owned by its component's module::

    data        DataConfig        scalegnn.datasets       dataset, data_root, shard_dir
    sampling    SamplingConfig    scalegnn.sampling       batch_size, batch_ratio
    model       ModelConfig       scalegnn.model          hidden, layers, dropout, norm, residual
    optim       OptimConfig       scalegnn.optim          lr, weight_decay, schedule, grad_clip
    loop        LoopConfig        scalegnn.loop           epochs, eval_every, target_acc, ...
    parallel    ParallelConfig    scalegnn.parallel.grid  grid, nproc, device, backend, collective timeout, threads
    checkpoint  CheckpointConfig  scalegnn.checkpoint     dir, every, resume, keep
    numerics    NumericsConfig    scalegnn.numerics       comm_dtype, gemm_dtype, permute: change the numbers
    perf        PerfConfig        scalegnn.perf           prefetch, compile, comm_overlap, ...: speed only
    options     the system's own options dataclass (scalegnn.systems; None for ScaleGNN)

The sections are declared in :mod:`scalegnn.sections` (numerics in its own module), where
no torch loads: this module and the parser load none, so ``--help`` and a refused flag
take a fraction of a second and a run says what it starts before the heavy imports.

A setting has one name: its field. The run record stores ``config.<section>.<field>``
(:meth:`RunConfig.to_dict`, read back by :meth:`RunConfig.from_dict`), and the
``scalegnn train`` parser is built from the fields (:func:`add_train_arguments`): the
flag is ``--<field>`` unless the field names another (:func:`flag_table` lists
every flag with its setting); its ``--help`` leaves out the flags of the settings
declared ``rare``, which ``--help-all`` and ``--help-topic TOPIC`` show. The CLI
parses flags into a RunConfig (:func:`parse_train_args`), sweeps parse their runs'
options (flags) into RunConfigs at submission and hand them to their tasks, and the
launcher hands RunConfigs to its workers. :func:`make_config` is the same in Python (settings by field name), and
:func:`command_line` writes a RunConfig back as the flags that give it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import textwrap
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import systems as registry
from .fileio import check_declared_size
from .numerics import NumericsConfig
from .sections.checkpoint import CheckpointConfig
from .sections.data import DataConfig
from .sections.loop import LoopConfig
from .sections.model import ModelConfig
from .sections.optim import OptimConfig
from .sections.parallel import PMM_AXES, ParallelConfig, cube_3d, format_grid
from .sections.perf import PerfConfig
from .sections.sampling import SamplingConfig
from .settings import flag_of, is_setting, render_of, setting
from .systems import SCALEGNN_SYSTEMS

__all__ = ["RunConfig", "SECTIONS", "SCALEGNN_SYSTEMS", "add_train_arguments", "parse_train_args",
           "config_from_given", "make_config", "command_line", "flag_table", "flag_table_markdown", "train_flags",
           "nproc_grid"]

SECTIONS: dict[str, type] = {"data": DataConfig, "sampling": SamplingConfig, "model": ModelConfig,
                             "optim": OptimConfig, "loop": LoopConfig, "parallel": ParallelConfig,
                             "checkpoint": CheckpointConfig, "numerics": NumericsConfig, "perf": PerfConfig}


@dataclass(kw_only=True)
class RunConfig:
    """Everything that defines a run; serialized whole into its record."""

    system: str = setting("scalegnn", help="which system trains: scalegnn, fullgraph-3d (batch ratio 1.0, Plexus) "
                          "or a compared system (scalegnn.systems); its own flags: --system NAME --help")
    seed: int = setting(0, help="seed for the split, the weights and the samples")
    # rare: written by `scalegnn tune`'s chosen command and the tuned benchmark, not by hand
    tuned_from: str | None = setting(None, rare=True, metavar="TUNE_JSON",
                                     help="the `scalegnn tune` search (its tune.json) whose chosen settings this run "
                                     "uses: recorded, so that the report says which figures and tables come from "
                                     "tuned runs")
    data: DataConfig = field(default_factory=DataConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    loop: LoopConfig = field(default_factory=LoopConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    numerics: NumericsConfig = field(default_factory=NumericsConfig)
    perf: PerfConfig = field(default_factory=PerfConfig)
    options: Any = None

    def __post_init__(self):
        for name, cls in SECTIONS.items():
            value = getattr(self, name)
            if isinstance(value, dict):
                setattr(self, name, _build(cls, value, name))
            elif not isinstance(value, cls):
                raise ValueError(f"config.{name} must be a {cls.__name__} or a dict, got {type(value).__name__}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**63:
            raise ValueError(f"--seed must be an integer in [0, 2**63), got {self.seed!r}")
        if not math.isfinite(self.parallel.collective_timeout_s):
            raise ValueError(f"--collective-timeout must be a finite number of seconds, got "
                             f"{self.parallel.collective_timeout_s}")
        entry = registry.get(self.system)
        if not entry.available:
            raise ValueError(f"--system {self.system} cannot run here: {entry.unavailable}")
        options_cls = registry.resolve(entry.options) if entry.options else None
        if options_cls is None:
            if self.options not in (None, {}):
                raise ValueError(f"--system {self.system} has no options of its own, got {self.options!r}")
            self.options = None
        elif self.options is None:
            self.options = options_cls()
        elif isinstance(self.options, dict):
            self.options = _build(options_cls, self.options, f"{self.system} options")
        p = self.parallel
        self.numerics.check_device(p.device)
        if self.system in SCALEGNN_SYSTEMS:
            if self.system == "scalegnn" and self.sampling.batch_ratio == 1.0:
                self.system = "fullgraph-3d"  # B = N: full-graph training, recorded as the Plexus baseline
            if p.nproc and p.nproc > 1 and p.grid == (1, 1, 1, 1):
                p.grid = nproc_grid(self.system, p.nproc)[0]  # --nproc N alone
            if p.nproc is not None and p.nproc != p.world_size:
                raise ValueError(f"--nproc {p.nproc} does not match the grid {format_grid(p.grid)} (Gd*Gx*Gy*Gz = "
                                 f"{p.world_size}); pass --nproc {p.world_size} or change --grid")
            _check_model_size(self.model, p.grid)
            widest = max(zip(p.grid[1:], PMM_AXES))
            if self.model.hidden < widest[0]:
                raise ValueError(
                    f"hidden size {self.model.hidden} is smaller than grid axis {widest[1]} = {widest[0]}: every 3D "
                    f"axis splits the hidden dimension, so some ranks would hold no weights; use --hidden >= "
                    f"{widest[0]} or a grid with at most {self.model.hidden} ranks per axis")
        else:  # the compared systems are data parallel only: their world is --nproc or Gd
            if p.grid[1] * p.grid[2] * p.grid[3] != 1:
                raise ValueError(f"--system {self.system} is data parallel only: use --grid Gx1x1x1 or --nproc N, "
                                 f"got --grid {'x'.join(map(str, p.grid))}")
            if p.nproc is not None and p.grid[0] != 1 and p.nproc != p.grid[0]:
                raise ValueError(f"--nproc {p.nproc} does not match --grid {'x'.join(map(str, p.grid))}")
            p.nproc = p.nproc if p.nproc is not None else p.grid[0]
            p.grid = (p.nproc, 1, 1, 1)
            check_world = getattr(self.options, "check_world", None)  # a system's own grid over the processes
            if check_world is not None and p.nproc > 1:
                check_world(p.nproc)

    @property
    def world_size(self) -> int:
        return self.parallel.world_size

    def check_tuned_from(self) -> None:
        """``--tuned-from`` names a search of this system that chose settings (read as
        JSON, never executed); checked by the launching process before any work."""
        if self.tuned_from is None:
            return
        path = Path(self.tuned_from)
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"--tuned-from {path}: not a readable tuning record ({type(exc).__name__}); give the "
                             "tune.json that `scalegnn tune` wrote") from None
        system = doc.get("spec", {}).get("system") if isinstance(doc, dict) else None
        if system != self.system:
            raise ValueError(f"--tuned-from {path} is a search of {system!r}, this run is --system {self.system}")
        if not doc.get("chosen"):
            raise ValueError(f"--tuned-from {path}: that search chose no settings (no trial ran ok)")

    def output_folders(self) -> list[tuple[str, str]]:
        """(flag, folder) of every folder this run writes to: the settings declared with
        ``output=True`` (``--out``, ``--checkpoint-dir``, ``--profile``, a compared
        system's own) that are set. :func:`scalegnn.launch.launch` checks them before any work."""
        sections = [getattr(self, name) for name in SECTIONS] + ([self.options] if self.options is not None else [])
        return [(flag_of(f), str(getattr(section, f.name))) for section in sections for f in _settings(type(section))
                if f.metadata.get("output") and getattr(section, f.name) is not None]

    def to_dict(self) -> dict:
        """The whole configuration as plain data (the record's ``config``)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "RunConfig":
        """A configuration back from :meth:`to_dict` (a record's, a checkpoint's, a sweep
        task's ``config``), saved by this schema or an older one (:func:`records.current_config`:
        a sweep submitted before an upgrade still runs after it)."""
        from .records import current_config

        data = current_config(data)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"config has unknown fields {unknown}; known: {sorted(known)}")
        return cls(**data)


def nproc_grid(system: str, nproc: int) -> tuple[tuple[int, int, int, int], str]:
    """The grid ``--nproc N`` without ``--grid`` gives ``system``, and that rule in words
    (the first line of a run states it: :func:`scalegnn.launch.first_line`).

    ScaleGNN: ``N x 1 x 1 x 1``, data parallel. The grid ``scalegnn plan --recommend``
    ranks first depends on the graph's sizes, known only once it is loaded, after that
    first line; data parallelism needs none of them, splits nothing of the model (any
    ``--hidden`` runs), and the model (:mod:`scalegnn.perfmodel`, the local profile) ranks
    it first or within 1.1 % of the first at N = 2 for the paper's six graphs, within 16 %
    at N = 4 (at N = 8, 3D axes gain up to 1.5x: then give ``--grid``).
    The full graph (fullgraph-3d): B = N is one batch per epoch, which data parallelism
    cannot split: the most cube-like 3D grid ``1 x Gx x Gy x Gz`` (:func:`cube_3d`).
    The compared systems are data parallel only: ``N x 1 x 1 x 1``."""
    if system == "fullgraph-3d":
        return (1, *cube_3d(nproc)), "the most cube-like 3D grid"
    return (nproc, 1, 1, 1), "data parallel"


def _check_model_size(model, grid) -> None:
    """Refuse a model whose weights alone exceed the memory budget, before any work: L
    hidden x hidden matrices, each with its gradient and two AdamW moments (16 bytes an
    entry), split over the Gx * Gy * Gz ranks of the 3D grid."""
    ranks_3d = grid[1] * grid[2] * grid[3]
    check_declared_size(f"--hidden {model.hidden} --layers {model.layers}", "the weights (L x hidden^2 per 3D grid)",
                        -(-model.layers * model.hidden * model.hidden // ranks_3d), 16,
                        fix="use a smaller --hidden or --layers, or a larger 3D grid")


def _build(cls, values: dict, where: str):
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"{where}: unknown settings {unknown}; known: {sorted(known)}")
    return cls(**values)


# ---------------------------------------------------------------------------- flags
def _value_type(cls, f: dataclasses.Field):
    """The parse type of a setting from its annotation (``X | None`` parses as X)."""
    hint = typing.get_type_hints(cls)[f.name]
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        hint = args[0] if len(args) == 1 else str
    return hint


def _checked(parse):
    """A flag's parse function whose ValueError is argparse's one-line usage error."""
    def wrapper(text):
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    wrapper.__name__ = getattr(parse, "__name__", "value")
    return wrapper


def _add(group, cls, f: dataclasses.Field, dest: str, system_defaults: dict) -> argparse.Action:
    kw = dict(f.metadata["argparse"])
    if cls is RunConfig and f.name == "system":
        kw["choices"] = registry.names(available=True)  # the registry's, when the parser is built
    default = f.default if f.default is not dataclasses.MISSING else \
        (f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
    default = system_defaults.get(dest, default)  # what this system really runs with
    help_text = f.metadata["help"]
    shown_false = dest in system_defaults  # a system's own False (fullgraph-3d: no residual) is worth saying
    if kw.get("action") not in ("store_true", "store_const") and default is not None \
            and (default is not False or shown_false) and not kw.get("required"):
        shown = "x".join(map(str, default)) if isinstance(default, tuple) else default
        help_text += f" (default: {shown})"
    kw.setdefault("help", help_text)
    if "action" not in kw:
        kind = _value_type(cls, f)
        if kind is bool:
            kw["action"] = argparse.BooleanOptionalAction
        elif "type" not in kw and kind in (int, float, str) and "choices" not in kw:
            kw["type"] = kind
    if "type" in kw:
        kw["type"] = _checked(kw["type"])
    if "choices" not in kw and kw.get("action") in (None, "store"):
        kw.setdefault("metavar", f.name.upper())
    return group.add_argument(flag_of(f), dest=dest, default=argparse.SUPPRESS, **kw)


def _settings(cls):
    return [f for f in dataclasses.fields(cls) if is_setting(f)]


def _options_class(system: str):
    entry = registry.get(system)
    return registry.resolve(entry.options) if entry.options else None


def _system_settings(system: str):
    """(dest, class, field) of every setting ``scalegnn train --system SYSTEM`` has, in --help order."""
    out = [(f.name, RunConfig, f) for f in _settings(RunConfig)]
    for section, cls in SECTIONS.items():
        out += [(f"{section}.{f.name}", cls, f) for f in _settings(cls)
                if f.metadata["scope"] == "common" or system in SCALEGNN_SYSTEMS]
    options_cls = _options_class(system)
    if options_cls is not None:
        out += [(f"options.{f.name}", options_cls, f) for f in _settings(options_cls)]
    return out


# Other frameworks' names for a setting (PyG's examples, DGL's, Lightning's), answered with ours.
SYNONYMS = {"learning_rate": "lr", "num_layers": "layers", "n_layers": "layers", "hidden_channels": "hidden",
            "hidden_dim": "hidden", "hidden_size": "hidden", "num_hidden": "hidden", "num_epochs": "epochs",
            "max_epochs": "epochs", "n_epochs": "epochs", "dropout_rate": "dropout", "wd": "weight_decay",
            "batchsize": "batch_size", "output_dir": "out_dir", "nprocs": "nproc", "num_processes": "nproc",
            "random_seed": "seed", "data": "dataset", "dataset_name": "dataset"}


def _setting_hint(name: str, known) -> str:
    """How ``name`` is spelled in Python: the setting whose command-line flag it is
    (``quiet`` is ``--quiet``, the setting ``progress=False``), another framework's name
    for one of ours (``learning_rate`` is ``lr``), else the closest name."""
    import difflib

    names = {f.name for _, _, f in known}
    if SYNONYMS.get(name) in names:
        return f" (did you mean {SYNONYMS[name]!r}?)"
    for _, _, f in known:
        flag = flag_of(f)
        if flag.lstrip("-").replace("-", "_") == name and f.name != name:
            kw = f.metadata["argparse"]
            value = f"={kw['const']!r}" if kw.get("action") == "store_const" else "=..."
            return f" ({flag} on the command line is the setting {f.name}{value} in Python)"
    close = difflib.get_close_matches(name, [f.name for _, _, f in known], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _flag_names_as_fields(settings: dict, known) -> dict:
    """``settings`` with the flags' names read as their settings, so that a setting has the
    one name of its flag in Python as well (``checkpoint_dir=`` is ``--checkpoint-dir``,
    the field ``dir``; ``quiet=True`` is ``--quiet``, the field ``progress=False``; ``out=``
    is ``--out``, the field ``out_dir``)."""
    out = dict(settings)
    for _, _, f in known:
        name = flag_of(f).lstrip("-").replace("-", "_")
        if name == f.name or name not in out:
            continue
        if f.name in out:
            raise ValueError(f"{name}= and {f.name}= are one setting ({flag_of(f)}); give it once")
        value = out.pop(name)
        kw = f.metadata["argparse"]
        if kw.get("action") == "store_const":  # a switch: True is the flag given, False the default
            if not isinstance(value, bool):
                raise ValueError(f"{name}= is a switch ({flag_of(f)}): True or False, got {value!r}")
            value = kw["const"] if value else f.default
        out[f.name] = value
    return out


def add_train_arguments(parser: argparse.ArgumentParser, system: str = "scalegnn") -> None:
    """The flags of ``scalegnn train --system SYSTEM``: the common settings (every
    system reads them), then the system's own (ScaleGNN's sections, or the fields of
    the system's options dataclass). Flags default to "not given": a configuration
    starts from the dataclasses' defaults and takes only what the flags set.

    A parser that prints help (``add_help``) leaves the flags of the ``rare`` settings
    out of it (they parse as any other) and gets ``--help-all`` (the help with every
    flag) and ``--help-topic TOPIC`` (the flags of one section), named in its epilog."""
    help_all = None
    if parser.add_help:
        parser.formatter_class = _HelpFormatter
        help_all = _add_help_options(parser, system)
    common = parser.add_argument_group("common settings (every system)")
    own = parser.add_argument_group(_own_title(system))
    system_defaults = SYSTEM_DEFAULTS.get(system, {})
    for dest, cls, f in _system_settings(system):
        common_setting = f.metadata["scope"] == "common" and _topic(dest) != "options"  # options: the system's own
        action = _add(common if common_setting else own, cls, f, dest, system_defaults)
        if f.metadata["rare"] and help_all is not None:
            help_all.hide(action)
    if help_all is not None:
        parser.epilog = help_all.epilog()


def _own_title(system: str) -> str:
    title = f"{registry.get(system).display} settings"
    return title if system in SCALEGNN_SYSTEMS else f"{title} (--system {system})"


# ---------------------------------------------------------------------------- --help-all, --help-topic
def _topic(dest: str) -> str:
    """The ``--help-topic`` of a setting: its section (``options``: a compared system's
    own), or ``run`` for the run's own ``--system`` and ``--seed``."""
    return dest.split(".", 1)[0] if "." in dest else "run"


class _HelpFormatter(argparse.HelpFormatter):
    """argparse's help, except that a line never breaks inside a flag (argparse's own would
    split ``--help-all`` after ``--help-``)."""

    def _split_lines(self, text, width):
        return textwrap.wrap(self._whitespace_matcher.sub(" ", text).strip(), width, break_on_hyphens=False)

    def _fill_text(self, text, width, indent):
        return textwrap.fill(self._whitespace_matcher.sub(" ", text).strip(), width, initial_indent=indent,
                             subsequent_indent=indent, break_on_hyphens=False)


def _add_help_options(parser: argparse.ArgumentParser, system: str) -> "_HelpAll":
    command = parser.prog + ("" if system == "scalegnn" else f" --system {system}")
    topics = list(dict.fromkeys(_topic(dest) for dest, _, _ in _system_settings(system)))
    help_all = parser.add_argument("--help-all", action=_HelpAll, command=command,
                                   help="show this help with every flag, the rarely set ones too, and exit")
    parser.add_argument("--help-topic", action=_HelpTopic, system=system, command=command, choices=topics,
                        metavar="TOPIC", help=f"show the flags of one section of the run configuration and exit: "
                        f"{', '.join(topics)}")
    return help_all


class _HelpAll(argparse.Action):
    """``--help-all``: the parser's help with the hidden (rare) flags shown, then exit."""

    def __init__(self, option_strings, dest, command: str, **kw):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kw)
        self.command = command  # "scalegnn train [--system NAME]"
        self.hidden: dict[argparse.Action, str] = {}  # a flag left out of --help -> its help

    def hide(self, action: argparse.Action) -> None:
        """Leave ``action`` out of ``--help`` (and its usage line); it parses as before."""
        self.hidden[action] = action.help
        action.help = argparse.SUPPRESS

    def epilog(self) -> str:
        """The last line of ``--help``: what it leaves out and how to see it."""
        n = len(self.hidden)
        return (f"{n} rarely set flag{'' if n == 1 else 's'} not shown here (accepted as ever): `{self.command} "
                f"--help-all` lists every flag, `{self.command} --help-topic TOPIC` the flags of one section.")

    def __call__(self, parser, namespace, values, option_string=None):
        for action, text in self.hidden.items():
            action.help = text
        parser.epilog = f"`{self.command} --help-topic TOPIC` lists the flags of one section."
        parser.print_help()
        parser.exit()


class _HelpTopic(argparse.Action):
    """``--help-topic TOPIC``: the flags of one topic (the rare ones too), then exit."""

    def __init__(self, option_strings, dest, system: str, command: str, **kw):
        super().__init__(option_strings, dest, default=argparse.SUPPRESS, **kw)
        self.system, self.command = system, command

    def __call__(self, parser, namespace, topic, option_string=None):
        sets = {"run": "config.system and config.seed", "options": "config.options"}.get(topic, f"config.{topic}")
        shown = argparse.ArgumentParser(prog=parser.prog, add_help=False, formatter_class=_HelpFormatter,
                                        description=f"The flags of `{self.command}` that set {sets} (the run "
                                        f"record's names); `{self.command} --help-all` lists every flag.")
        group = shown.add_argument_group(_own_title(self.system) if topic == "options" else f"{topic} settings")
        for dest, cls, f in _system_settings(self.system):
            if _topic(dest) == topic:
                _add(group, cls, f, dest, SYSTEM_DEFAULTS.get(self.system, {}))
        shown.print_help()
        parser.exit()


def train_flags(system: str) -> set[str]:
    """Every flag ``scalegnn train --system SYSTEM`` accepts."""
    parser = argparse.ArgumentParser(add_help=False)
    add_train_arguments(parser, system)
    return {s for action in parser._actions for s in action.option_strings}


# What a system runs with where the dataclasses' defaults say otherwise (its --help shows
# these): --system fullgraph-3d is ScaleGNN with B = N and, unless --permute says
# otherwise, Plexus' double vertex permutation, whose shards need the residual off.
SYSTEM_DEFAULTS = {"fullgraph-3d": {"sampling.batch_ratio": 1.0, "numerics.permute": "double", "model.residual": False}}
_UNLESS_PERMUTE_GIVEN = ("numerics.permute", "model.residual")


def config_from_given(given: dict) -> RunConfig:
    """A RunConfig from the settings a parser saw given (``{"section.field": value}``,
    ``"system"``, ``"seed"``, ``"options.field"``); everything else keeps its default,
    the system's own where it has one (:data:`SYSTEM_DEFAULTS`)."""
    if given.get("system") == "fullgraph-3d":
        if "sampling.batch_size" in given:
            raise ValueError("--system fullgraph-3d trains on the whole graph: drop --batch-size")
        defaults = dict(SYSTEM_DEFAULTS["fullgraph-3d"])
        if "numerics.permute" in given:  # another permutation: the residual keeps its own default
            for key in _UNLESS_PERMUTE_GIVEN:
                defaults.pop(key)
        given = {**defaults, **given}
    if "sampling.batch_size" in given and "sampling.batch_ratio" in given:
        raise ValueError("give exactly one of --batch-size (a vertex count) and --batch-ratio (a fraction of N)")
    sections: dict[str, dict] = {name: {} for name in (*SECTIONS, "options")}
    top = {}
    for key, value in given.items():
        if "." in key:
            section, name = key.split(".", 1)
            sections[section][name] = value
        else:
            top[key] = value
    options = sections.pop("options") or None
    return RunConfig(**top, **{name: _build(cls, sections[name], f"--{name} settings")
                               for name, cls in SECTIONS.items()}, options=options)


def parse_train_args(argv: list[str], prog: str = "scalegnn train") -> tuple[RunConfig, argparse.Namespace]:
    """Parse ``scalegnn train`` flags into a RunConfig (two passes: ``--system`` first,
    since it decides which flags exist). Returns the configuration and the namespace
    (for the CLI's own flags, such as ``--log-level``)."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--system", default="scalegnn")
    known, _ = pre.parse_known_args(argv)
    parser = argparse.ArgumentParser(prog=prog)
    add_train_arguments(parser, known.system if known.system in registry.names() else "scalegnn")
    ns = parser.parse_args(argv)
    return config_from_given(vars(ns)), ns


def make_config(system: str = "scalegnn", **settings) -> RunConfig:
    """The Python form of ``scalegnn train --system SYSTEM --flag value ...``: settings
    named by their field, each looked up among the system's settings (names are unique
    there), so the sections need not be spelled out; a whole section may be given as
    its dataclass instead (then none of its fields one by one)::

        make_config(dataset="cora", epochs=3, grid=(1, 2, 2, 1), hidden=64)
        make_config("graphsage", dataset="facebook", fanouts=(10, 5), batch_size=512)
        make_config(dataset="cora", checkpoint=CheckpointConfig(dir="ck", every="30m"))
    """
    whole = {name: settings.pop(name) for name in (*SECTIONS, "options") if name in settings}
    known = _system_settings(system)
    dests = {dest.rsplit(".", 1)[-1]: dest for dest, _, _ in known}
    settings = _flag_names_as_fields(settings, known)
    unknown = sorted(set(settings) - set(dests))
    if unknown:
        raise ValueError(f"system={system!r} has no setting {unknown[0]!r}{_setting_hint(unknown[0], known)}; "
                         f"its settings: {', '.join(sorted(dests))}")
    given = {"system": system, **{dests[name]: value for name, value in settings.items()}}
    twice = sorted({key.split(".")[0] for key in given if "." in key} & set(whole))
    if twice:
        raise ValueError(f"give section {twice[0]} either whole or setting by setting, not both")
    cfg = config_from_given(given)
    return dataclasses.replace(cfg, **whole) if whole else cfg


def command_line(cfg: RunConfig) -> list[str]:
    """The ``scalegnn train`` flags that give ``cfg`` (``parse_train_args`` of them returns
    an equal configuration): every setting that differs from what the system's
    command line starts from. What a sweep shows for each run, and what a user can
    paste to rerun one."""
    def value_at(config, dest):
        *sections, name = dest.split(".")
        for part in sections:
            config = getattr(config, part)
        return getattr(config, name)

    start = config_from_given({"system": cfg.system, "data.dataset": cfg.data.dataset})
    argv = []
    for dest, _, f in _system_settings(cfg.system):
        value = value_at(cfg, dest)
        flag, kw = flag_of(f), f.metadata["argparse"]
        if value == value_at(start, dest) and dest != "system" and not kw.get("required"):
            continue
        action = kw.get("action")
        if action == "store_true":
            argv += [flag] if value else []
        elif action == "store_const":
            argv += [flag] if value == kw.get("const") else []
        elif isinstance(value, bool):
            argv.append(flag if value else "--no-" + flag[2:])
        elif value is not None:
            argv += [flag, render_of(f)(value)]
    return argv


def flag_table() -> list[tuple[str, str, str]]:
    """(flag, setting path in the config and the record, who reads it) for every flag."""
    rows = [(flag_of(f), f.name, f.metadata["scope"]) for f in _settings(RunConfig)]
    for section, cls in SECTIONS.items():
        rows += [(flag_of(f), f"{section}.{f.name}", f.metadata["scope"]) for f in _settings(cls)]
    for entry in registry.systems(available=True):
        cls = _options_class(entry.name)
        if cls is not None:
            rows += [(flag_of(f), f"options.{f.name}", entry.name) for f in _settings(cls)]
    return rows


def flag_table_markdown() -> str:
    """:func:`flag_table` as the Markdown table of ``results/README.md`` (a test keeps
    the two equal): one row per setting, the systems that read it."""
    rows: dict[tuple[str, str], list[str]] = {}
    for flag, path, scope in flag_table():
        rows.setdefault((flag, path), []).append(scope)
    lines = ["| flag | setting (`config.` in the record) | read by |", "|---|---|---|"]
    for (flag, path), scopes in rows.items():
        who = {"common": "every system", "scalegnn": "scalegnn, fullgraph-3d"}.get(scopes[0], ", ".join(scopes))
        lines.append(f"| `{flag}` | `{path}` | {who} |")
    return "\n".join(lines)


if __name__ == "__main__":  # python -m scalegnn.config: the table of results/README.md
    print(flag_table_markdown())
