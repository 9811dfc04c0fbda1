"""Sweep specs: data files ``sweeps/specs/<name>.toml``, one per paper figure or table.

A spec declares datasets, systems, GPU counts, grid policies, seeds, target
accuracies and ``scalegnn train`` options (fields in sweeps/README.md). It is
*data*: :func:`load_spec` parses it with ``tomllib``, nothing in it is executed.
:func:`expand` turns it into :class:`RunSpec` objects for one cluster profile; a
RunSpec knows its ``scalegnn train`` argument list and a stable key (a hash of
what defines the run), which names its output folder so that a finished run is
recognised and never submitted twice.

Option precedence (later wins): spec ``[train]`` < experiment ``train`` < the
spec's ``[local] train`` (stand-in runs only) < the system's ``sweep_defaults``
(:mod:`scalegnn.systems`) < the variant's ``train`` < the target accuracy < command
line overrides. Baselines (``sweep_options = "loop"``) take only the loop options
(epochs, evaluation, target, seed, data root) from the spec-wide tables (``[train]``,
``[local] train``); an experiment's own ``train`` applies to every system it lists.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from scalegnn import systems as registry
from scalegnn.sections.parallel import format_grid

from .grids import grids_for
from .profiles import check_minutes, check_script_value

__all__ = ["SweepSpec", "Experiment", "Variant", "RunSpec", "load_spec", "list_specs", "expand",
           "SPEC_DIR", "SpecError", "LOOP_OPTIONS"]

SPEC_DIR = Path(__file__).resolve().parent / "specs"
LOOP_OPTIONS = frozenset({"epochs", "eval-every", "target-acc", "stop-at-target", "seed", "data-root"})
# Options the sweep itself sets per run; a spec must not set them in [train].
RESERVED = frozenset({"dataset", "grid", "seed", "out", "nproc", "shard-dir"})


class SpecError(ValueError):
    """A sweep spec is missing, malformed or inconsistent; the message names the field."""


@dataclass(frozen=True)
class Experiment:
    cluster: str
    dataset: str
    gpus: tuple[int, ...]
    grids: object = "cube"  # a policy name or a tuple of grid strings
    systems: tuple[str, ...] | None = None  # None: every system of the spec
    train: dict = field(default_factory=dict)
    stands_for: str | None = None  # the paper dataset a local stand-in replaces


@dataclass(frozen=True)
class Variant:
    name: str
    train: dict = field(default_factory=dict)


@dataclass(frozen=True)
class SweepSpec:
    name: str
    title: str
    figure: str
    paper: str
    systems: tuple[str, ...]
    seeds: tuple[int, ...]
    train: dict
    targets: dict
    experiments: tuple[Experiment, ...]
    variants: tuple[Variant, ...] = ()
    variant_systems: tuple[str, ...] = ("scalegnn",)
    local: dict = field(default_factory=dict)
    reference: dict = field(default_factory=dict)  # e.g. {cluster: baseline} for speedup annotations
    time_min: int | None = None
    source: str = ""

    @property
    def clusters(self) -> list[str]:
        return list(dict.fromkeys(e.cluster for e in self.experiments))


def _slug(text: str, limit: int = 48) -> str:
    s = re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-").lower()
    return s[:limit].rstrip("-")


def _render(value) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return repr(value)  # 1.0 stays "1.0" (a fraction), never "1"
    return str(value)


@dataclass(frozen=True)
class RunSpec:
    """One run of a sweep: what to train, where, and how to launch it."""

    spec: str
    figure: str
    cluster: str
    system: str
    dataset: str
    grid: tuple[int, int, int, int]
    seed: int
    options: tuple[tuple[str, object], ...]  # `scalegnn train` options other than dataset/grid/seed/out
    variant: str = ""
    paper_dataset: str = ""  # the dataset of the paper this run reproduces (== dataset unless a stand-in)
    target_acc: float | None = None
    time_min: int | None = None

    @property
    def world_size(self) -> int:
        gd, gx, gy, gz = self.grid
        return gd * gx * gy * gz

    @property
    def grid_str(self) -> str:
        return format_grid(self.grid)

    @property
    def key(self) -> str:
        """Readable and unique: system, dataset, GPUs, grid, seed, variant and a hash of
        everything that defines the run (so two specs asking for the same run share it)."""
        ident = {"cluster": self.cluster, "system": self.system, "dataset": self.dataset, "grid": list(self.grid),
                 "seed": self.seed, "options": sorted([k, _render(v)] for k, v in self.options)}
        digest = hashlib.sha1(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:10]
        parts = [self.system, _slug(self.dataset, 32), f"g{self.world_size}", self.grid_str, f"s{self.seed}"]
        if self.variant:
            parts.append(_slug(self.variant, 24))
        return "-".join(p for p in parts if p) + "-" + digest

    def option_argv(self) -> list[str]:
        out = []
        for flag, value in self.options:
            if value is True:
                out.append(f"--{flag}")
            elif value is False or value is None:
                continue
            else:
                out.extend([f"--{flag}", _render(value)])
        return out

    def train_argv(self, out_dir: str) -> list[str]:
        """``scalegnn`` arguments (after the program name) that run this on a launched job."""
        return ["train", "--dataset", self.dataset, "--grid", self.grid_str, "--seed", str(self.seed),
                *self.option_argv(), "--out", str(out_dir)]  # no --quiet: the job's .out file keeps one line per epoch

    def config(self, out_dir: str):
        """This run as the trainer's :class:`~scalegnn.config.RunConfig`: :meth:`train_argv`
        parsed by ``scalegnn train``'s own flags, so a spec option is exactly a flag and
        one the trainer rejects is reported here, at submission, not in a job hours later."""
        import contextlib
        import io

        from scalegnn.config import parse_train_args

        argv = self.train_argv(out_dir)[1:]
        said = io.StringIO()  # argparse's usage and error lines: its error goes into this one line
        try:
            with contextlib.redirect_stderr(said):
                return parse_train_args(argv, prog="scalegnn train")[0]
        except SystemExit:
            lines = [t for t in said.getvalue().splitlines() if t.strip() and not t.startswith(("usage:", " "))]
            why = lines[-1].split(": error: ", 1)[-1] if lines else "see `scalegnn train --help`"
            raise SpecError(f"`scalegnn train` rejects the options of run {self.key}: {why}: {' '.join(argv)}") \
                from None
        except ValueError as exc:
            raise SpecError(f"`scalegnn train` rejects the options of run {self.key}: {exc}") from None

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["grid"] = self.grid_str
        d["options"] = {k: v for k, v in self.options}
        d["key"] = self.key
        d["world_size"] = self.world_size
        return d


# ---------------------------------------------------------------------------- loading
def list_specs() -> list[str]:
    return sorted(p.stem for p in SPEC_DIR.glob("*.toml"))


def _spec_path(name_or_path) -> Path:
    path = Path(name_or_path)
    known = f"known: {', '.join(list_specs())}"
    if path.suffix == ".toml" or len(path.parts) > 1:  # a path, not a name: it is the file or nothing
        if path.is_file():
            return path
        what = ("is a folder" if path.is_dir() else "does not exist" if not path.exists()
                else "is not a regular file (a FIFO, socket or device)")
        raise SpecError(f"sweep spec {str(name_or_path)!r} {what}; give a spec's .toml file or a spec name ({known})")
    name = str(name_or_path)
    if re.fullmatch(r"[A-Za-z0-9_.-]+", name):  # a name (never a glob pattern)
        for cand in (SPEC_DIR / f"{name}.toml", *sorted(SPEC_DIR.glob(f"{name}_*.toml"))):
            if cand.is_file():
                return cand
    raise SpecError(f"no sweep spec {name!r}; {known} (or a path to a .toml file)")


def _options(table, where: str) -> dict:
    if not isinstance(table, dict):
        raise SpecError(f"{where} must be a table of `scalegnn train` options (flag = value)")
    bad = sorted(RESERVED & set(table))
    if bad:
        raise SpecError(f"{where}: options {bad} are set by the sweep itself (datasets, grids, seeds, staged "
                        "shards); remove them")
    if "quiet" in table:
        raise SpecError(f"{where}: 'quiet' would blind the batch jobs' logs (one line per epoch); remove it, or set "
                        "log-level = \"WARNING\" to drop the epoch lines")
    return dict(table)


def load_spec(name_or_path) -> SweepSpec:
    """Parse and validate ``sweeps/specs/<name>.toml`` (also ``<name>_*.toml``, e.g.
    ``fig7`` finds ``fig7_strong_scaling.toml``) or a path."""
    path = _spec_path(name_or_path)
    try:
        data = tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise SpecError(f"{path}: not valid TOML: {exc}") from None
    except OSError as exc:
        raise SpecError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    try:
        return _parse_spec(data, path)
    except (TypeError, KeyError, AttributeError) as exc:  # a value of the wrong kind (a number for a list, ...)
        raise SpecError(f"{path}: not a sweep spec: a field holds the wrong kind of value ({type(exc).__name__}: "
                        f"{exc}); the fields are in sweeps/README.md") from None


def _parse_spec(data: dict, path: Path) -> SweepSpec:
    where = str(path)
    def need(key):
        if key not in data:
            raise SpecError(f"{where}: missing required field {key!r}")
        return data[key]

    # The name goes into job names (`#SBATCH --job-name=`, `# flux: --job-name=`) and
    # file names, the minutes into `--time`: both are checked like a profile's values.
    check_script_value("name", need("name"), "_.-", f"rename the spec in {where}", error=SpecError)
    time_min = data.get("time_min")
    if time_min is not None:
        check_minutes(f"{where}: time_min", time_min, f"correct it in {where}", error=SpecError)
    systems = tuple(need("systems"))
    unknown = [s for s in systems if s not in registry.names()]
    if unknown:
        raise SpecError(f"{where}: unknown systems {unknown}; known: {registry.names()} (scalegnn.systems)")
    experiments = []
    for i, raw in enumerate(need("experiments")):
        w = f"{where} experiments[{i}]"
        missing = [k for k in ("cluster", "dataset", "gpus") if k not in raw]
        if missing:
            raise SpecError(f"{w}: missing {missing}")
        exp_systems = tuple(raw["systems"]) if "systems" in raw else None
        if exp_systems and any(s not in systems for s in exp_systems):
            raise SpecError(f"{w}: systems {list(exp_systems)} must be among the spec's systems {list(systems)}")
        grids = raw.get("grids", "cube")
        experiments.append(Experiment(
            cluster=raw["cluster"], dataset=raw["dataset"], gpus=tuple(int(g) for g in raw["gpus"]),
            grids=tuple(grids) if isinstance(grids, list) else grids, systems=exp_systems,
            train=_options(raw.get("train", {}), f"{w}.train"), stands_for=raw.get("stands_for")))
    variants = tuple(Variant(v["name"], _options(v.get("train", {}), f"{where} variant {v.get('name')}"))
                     for v in data.get("variants", []))
    targets = {str(k): float(v) for k, v in data.get("targets", {}).items()}
    for ds, t in targets.items():
        if not 0 < t <= 1:
            raise SpecError(f"{where}: target for {ds} must be a fraction in (0, 1], got {t}")
    local = dict(data.get("local", {}))
    if "train" in local:
        local["train"] = _options(local["train"], f"{where} [local].train")
    spec = SweepSpec(
        name=need("name"), title=data.get("title", ""), figure=data.get("figure", need("name")),
        paper=data.get("paper", ""), systems=systems, seeds=tuple(int(s) for s in data.get("seeds", [0])),
        train=_options(data.get("train", {}), f"{where} [train]"), targets=targets,
        experiments=tuple(experiments), variants=variants,
        variant_systems=tuple(data.get("variant_systems", ["scalegnn"])), local=local,
        reference=dict(data.get("reference", {})), time_min=time_min, source=where)
    # Grid policies must be valid for their GPU lists (fail at load, not at submission).
    for e in spec.experiments:
        try:
            grids_for(e.grids, list(e.gpus))
        except ValueError as exc:
            raise SpecError(f"{where}: experiment {e.cluster}/{e.dataset}: {exc}") from None
    return spec


# ---------------------------------------------------------------------------- expansion
def _merge(opts: dict, layer: dict, only: frozenset | None = None) -> None:
    for key, value in layer.items():
        if only is not None and key not in only:
            continue
        if key == "batch-ratio":
            opts.pop("batch-size", None)
        if key == "batch-size":
            opts.pop("batch-ratio", None)
        opts[key] = value


def _local_experiments(spec: SweepSpec, gpus, datasets, use_local: bool) -> list[Experiment]:
    """Experiments for a cluster the spec does not list, or with ``--gpus``/``--dataset``:
    the reference cluster's experiments with GPU counts from ``gpus``, datasets from
    ``datasets``; on a local profile the ``[local]`` table fills what is not given
    (stand-in datasets, GPU counts, grids)."""
    local = spec.local if use_local else {}
    gpus = list(gpus or local.get("gpus") or [])
    if not gpus:
        raise SpecError(f"spec {spec.name}: give GPU counts with --gpus (the spec has no [local] gpus)")
    ref = spec.clusters[0]
    mapping = local.get("datasets", {})
    seen, out = set(), []
    for e in spec.experiments:
        if e.cluster != ref:
            continue
        names = list(datasets) if datasets else [mapping.get(e.dataset, e.dataset)]
        for ds in names:
            grids = local.get("grids", e.grids)
            grids = tuple(grids) if isinstance(grids, list) else grids
            ident = (ds, e.systems, grids)
            if ident in seen:
                continue
            seen.add(ident)
            out.append(Experiment(cluster="*", dataset=ds, gpus=tuple(gpus), grids=grids, systems=e.systems,
                                  train=dict(e.train), stands_for=e.dataset if ds != e.dataset else None))
    return out


def expand(spec: SweepSpec, cluster: str, *, gpus=None, datasets=None, epochs: int | None = None,
           seeds=None, systems=None, local: bool | None = None) -> list[RunSpec]:
    """All runs of ``spec`` on ``cluster`` (a profile name). ``gpus`` / ``datasets``
    replace the spec's lists (stand-in runs); ``epochs`` / ``seeds`` / ``systems``
    override or restrict. The spec's ``[local]`` stand-ins apply on a local profile
    (``local``; default: the cluster is named ``local``) without experiments of its own."""
    local = cluster == "local" if local is None else local
    exps = [e for e in spec.experiments if e.cluster == cluster]
    derived = bool(gpus or datasets or not exps)
    if derived:
        if not exps and not gpus and not (local and spec.local):
            raise SpecError(f"spec {spec.name} has no experiments for cluster {cluster} (it declares "
                            f"{', '.join(spec.clusters)}); pass --gpus (and --dataset) to run stand-ins there")
        exps = _local_experiments(spec, gpus, datasets, local)
    want_systems = set(systems) if systems else None
    if want_systems:
        unknown = sorted(want_systems - set(spec.systems))
        if unknown:
            raise SpecError(f"spec {spec.name} has no systems {unknown}; it has {list(spec.systems)}")
    runs: list[RunSpec] = []
    for e in exps:
        for system in e.systems or spec.systems:
            if want_systems and system not in want_systems:
                continue
            entry = registry.get(system)
            policy = "dp" if entry.grids == "dp" else e.grids
            only = LOOP_OPTIONS if entry.sweep_options == "loop" else None
            variants = spec.variants if (spec.variants and system in spec.variant_systems) else (Variant(""),)
            paper_ds = e.stands_for or e.dataset
            target = spec.local.get("targets", {}).get(paper_ds) if derived and local else None
            target = target if target is not None else spec.targets.get(paper_ds)
            for g, grids in grids_for(policy, list(e.gpus)).items():
                for grid in grids:
                    for seed in seeds or spec.seeds:
                        for v in variants:
                            opts: dict = {}
                            _merge(opts, spec.train, only)
                            _merge(opts, e.train)  # an experiment's own options are meant for its systems
                            if derived and local:
                                _merge(opts, spec.local.get("train", {}), only)
                            _merge(opts, dict(entry.sweep_defaults))
                            _merge(opts, v.train)
                            if target is not None:
                                opts["target-acc"] = target
                            if epochs is not None:
                                opts["epochs"] = int(epochs)
                            runs.append(RunSpec(
                                spec=spec.name, figure=spec.figure, cluster=cluster, system=system,
                                dataset=e.dataset, grid=tuple(grid), seed=int(seed),
                                options=tuple(opts.items()), variant=v.name, paper_dataset=paper_ds,
                                target_acc=target, time_min=spec.time_min))
    if derived:  # stand-ins: two paper datasets may map to one local graph; run it once
        runs = list({r.key: r for r in reversed(runs)}.values())[::-1]
    keys = [r.key for r in runs]
    if len(set(keys)) != len(keys):
        dup = sorted({k for k in keys if keys.count(k) > 1})
        raise SpecError(f"spec {spec.name}: runs {dup[:3]} appear more than once; make experiments distinct")
    return runs
