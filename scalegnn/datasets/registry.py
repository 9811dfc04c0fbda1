"""Dataset names, parameters and the load path (files -> cache -> parser -> cache).

See the package docstring (``scalegnn/datasets/__init__.py``) for the name syntax.
"""

from __future__ import annotations

import difflib
import logging
import math
import operator
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from scalegnn.graph import Graph

from . import files as _files
from . import generators as _gen
from . import musae as _musae
from . import ogbn as _ogbn
from . import planetoid as _planetoid
from . import reddit as _reddit
from ._core import DatasetError, apply_split
from .cache import cache_dir, cache_path, load_cached, save_cached, source_signature
from ..sections.data import DataConfig  # declared where no torch loads (scalegnn.sections)


__all__ = ["default_data_root", "describe", "edge_homophily", "list_datasets", "load_dataset", "load_graph",
           "parse_name"]

PATH_KINDS = ("edgelist", "mtx", "npz", "dir")
# What each file form holds (``scalegnn data list``; the format: scalegnn/datasets/README.md).
FILE_FORMS = {
    "edgelist": "a text edge list (src dst per line, # or % comments); node data beside it, row v = vertex v: "
                "<stem>.features.npy (dense) or .features.npz (scipy.sparse.save_npz), <stem>.labels.npy; what is "
                "missing is stated and stands in: seeded random features, degree classes",
    "mtx": "a Matrix Market adjacency; node data beside it as for edgelist",
    "npz": "one .npz of arrays: edge_index (or indptr/indices), features x (dense) or x_indptr/x_indices/x_data/"
           "x_shape (CSR, kept sparse), y, and train/val/test ids or masks (none: a seeded random 50/25/25 split)",
    "dir": "a folder of .npy files with the npz keys as names; sparse features as x.npz (scipy.sparse.save_npz)",
}
assert set(FILE_FORMS) == set(PATH_KINDS)


@dataclass(frozen=True)
class Request:
    """One parsed dataset name: what to load, from where, with which parameters."""

    spec: "Spec"
    name: str  # canonical: round-trips through load_dataset
    params: dict
    explicit: frozenset  # parameters the user set
    root: Path
    seed: int
    path: Path | None = None  # path kinds only


@dataclass(frozen=True)
class Spec:
    """A registered dataset: ``sources`` resolves (and checks) its input files,
    ``build`` parses them; ``seeded`` tells whether the result depends on the seed."""

    name: str
    sources: Callable[[Request], list]
    build: Callable[[Request, list], Graph]
    seeded: Callable[[Request, list], bool]
    params: dict = field(default_factory=dict)
    aliases: tuple = ()
    takes_path: bool = False


_ALWAYS = lambda req, files: True  # noqa: E731
_NEVER = lambda req, files: False  # noqa: E731
_NO_FILES = lambda req: []  # noqa: E731


def _twitch_sources(country):
    def sources(req: Request) -> list:
        files = _musae.twitch_files(country, req.root)
        if country == "DE":
            linkx = _musae.linkx_split_file(req.root)
            if linkx is not None:
                files.append(linkx)
            elif "split" in req.explicit:
                raise DatasetError(
                    f"{req.name}: LINKX split file not found: {req.root / _musae.LINKX_SPLITS}. Get "
                    "data/splits/twitch-e-DE-splits.npy from https://github.com/CUAI/Non-Homophily-Large-Scale "
                    "and put it there, or drop ':split=...' to use a seeded random split"
                )
        return files

    return sources


def _twitch_build(country):
    def build(req: Request, files: list) -> Graph:
        split = req.params.get("split") if country == "DE" else None
        return _musae.load_twitch(req.name, country, files, req.seed, split)

    return build


def _registry() -> list[Spec]:
    specs = []
    for name in _planetoid.PLANETOID:
        specs.append(
            Spec(
                name,
                sources=lambda req, n=name: _planetoid.planetoid_files(n, req.root),
                build=lambda req, files, n=name: _planetoid.load_planetoid(n, files),
                seeded=_NEVER,
            )
        )
    specs.append(
        Spec(
            "facebook",
            sources=lambda req: _musae.facebook_files(req.root),
            build=lambda req, files: _musae.load_facebook(req.name, files, req.seed),
            seeded=_ALWAYS,
            aliases=("facebook-pagepage", "facebook-page-page"),
        )
    )
    for c in _musae.TWITCH_COUNTRIES:
        specs.append(
            Spec(
                f"twitch-{c.lower()}",
                sources=_twitch_sources(c),
                build=_twitch_build(c),
                seeded=(lambda req, files: len(files) == 3) if c == "DE" else _ALWAYS,
                params={"split": 0} if c == "DE" else {},
            )
        )
    specs.append(
        Spec(
            "reddit",
            sources=lambda req: _reddit.reddit_files(req.root),
            build=lambda req, files: _reddit.load_reddit(req.name, files),
            seeded=_NEVER,
        )
    )
    for name in _ogbn.OGB_DATASETS:
        specs.append(
            Spec(
                name,
                sources=lambda req, n=name: _ogbn.ogbn_release_files(n, req.root),
                build=lambda req, files, n=name: _ogbn.load_ogbn(n, req.root),
                seeded=_NEVER,
            )
        )
    for name in _files.FEATURELESS_NAMED:
        specs.append(
            Spec(
                name,
                sources=lambda req, n=name: _with_beside(_files.named_featureless_file(n, req.root)),
                build=lambda req, files: _files.featureless_from_file(
                    req.name, files[0], "mtx" if files[0].suffix == ".mtx" else "edgelist", req.seed
                ),
                seeded=_ALWAYS,
            )
        )
    specs.append(
        Spec(
            "csbm",
            sources=_NO_FILES,
            build=lambda req, files: _gen.csbm(req.name, req.seed, **req.params),
            seeded=_ALWAYS,
            params=dict(_gen.CSBM_DEFAULTS),
        )
    )
    specs.append(
        Spec(
            "rmat",
            sources=_NO_FILES,
            build=lambda req, files: _gen.rmat(req.name, req.seed, **req.params),
            seeded=_ALWAYS,
            params=dict(_gen.RMAT_DEFAULTS),
        )
    )
    for kind in ("edgelist", "mtx"):
        specs.append(
            Spec(
                kind,
                sources=lambda req, k=kind: _file_source(k, req.path),
                build=lambda req, files, k=kind: _files.featureless_from_file(req.name, req.path, k, req.seed,
                                                                              announce=True),
                seeded=_ALWAYS,
                takes_path=True,
            )
        )
    for kind in ("npz", "dir"):
        specs.append(
            Spec(
                kind,
                sources=lambda req, k=kind: _files.byo_sources(k, req.path),
                build=lambda req, files, k=kind: _files.load_byo(req.name, k, req.path, files, req.seed),
                seeded=lambda req, files, k=kind: not _files.byo_has_split(k, req.path, files),
                takes_path=True,
            )
        )
    return specs


def _file_source(kind: str, path: Path) -> list:
    if not path.is_file():
        raise DatasetError(f"{kind}: file not found: {path}; pass {kind}:<path to an existing file>")
    return _with_beside(path)


def _with_beside(path: Path) -> list:
    """A graph file and the node-data files beside it: all are the cache's sources."""
    return [path, *_files.beside_files(path).values()]


_SPECS = _registry()
_BY_KEY: dict[str, Spec] = {}
for _s in _SPECS:
    for _k in (_s.name, *_s.aliases):
        _BY_KEY[_k.lower().replace("_", "-")] = _s


def file_forms() -> list[str]:
    """``<kind>:<path>  what it holds``, one per file form a dataset name may take."""
    return [f"{kind + ':<path>':<16}{FILE_FORMS[kind]}" for kind in PATH_KINDS]


def list_datasets() -> list[str]:
    """Registered dataset names (path kinds ``edgelist: mtx: npz: dir:`` excluded)."""
    return [s.name for s in _SPECS if not s.takes_path]


def default_data_root() -> Path:
    """``$SCALEGNN_DATA_ROOT`` if set, else ``~/.cache/scalegnn/data``."""
    env = os.environ.get("SCALEGNN_DATA_ROOT")
    return Path(env).expanduser() if env else Path("~/.cache/scalegnn/data").expanduser()


# The file form a path names by its ending, for a path given without its prefix.
_FORM_OF_SUFFIX = {".npz": "npz", ".mtx": "mtx", ".txt": "edgelist", ".csv": "edgelist", ".tsv": "edgelist",
                   ".edges": "edgelist", ".el": "edgelist"}


def _unknown(name: str, key: str) -> DatasetError:
    path = Path(name).expanduser()
    if path.exists():  # a file or folder given without its form: name the form, never guess one silently
        kind = "dir" if path.is_dir() else _FORM_OF_SUFFIX.get(path.suffix.lower())
        forms = f"{kind}:{name}" if kind else " or ".join(f"{k}:{name}" for k in PATH_KINDS if k != "dir")
        return DatasetError(f"dataset {name!r} is a {'folder' if path.is_dir() else 'file'}: name its format, "
                            f"e.g. --dataset {forms}")
    keys = [k for k in _BY_KEY if not _BY_KEY[k].takes_path]
    close = difflib.get_close_matches(key, keys + [f"{k}:" for k in PATH_KINDS], n=1, cutoff=0.6)
    hint = f"; did you mean '{close[0]}'?" if close else "."
    return DatasetError(
        f"unknown dataset {name!r}{hint} Known: {', '.join(list_datasets())}; "
        f"or a file: {', '.join(f'{k}:<path>' for k in PATH_KINDS)}"
    )


def _convert(spec: Spec, key: str, text: str, default):
    bad = DatasetError(
        f"{spec.name}: parameter {key}={text!r} is not {'an integer' if isinstance(default, int) else 'a number'}"
    )
    try:
        value = float(text)
    except ValueError:
        raise bad from None
    if not math.isfinite(value):
        raise bad
    if isinstance(default, int):
        if not value.is_integer():
            raise bad
        return int(value)
    return value


def parse_name(name: str, root: Path, seed: int) -> Request:
    """Split ``name`` into (spec, params | path); see the package docstring."""
    if not isinstance(name, str) or not name.strip():
        raise DatasetError(
            f"dataset name must be a non-empty string, got {name!r}; known: {', '.join(list_datasets())}"
        )
    head, sep, rest = name.strip().partition(":")
    key = head.strip().lower().replace("_", "-")
    spec = _BY_KEY.get(key)
    if spec is None:
        raise _unknown(name, key)
    if spec.takes_path:
        if not rest.strip():
            raise DatasetError(f"{spec.name}: needs a path, e.g. {spec.name}:/data/graph.{spec.name}")
        path = Path(rest.strip()).expanduser().resolve()
        return Request(spec, f"{spec.name}:{path}", {}, frozenset(), root, seed, path)

    params, explicit = dict(spec.params), set()
    if sep and rest.strip():
        if not spec.params:
            raise DatasetError(f"{spec.name} takes no parameters, got {rest!r}; use '{spec.name}'")
        for item in rest.split(","):
            k, eq, v = (s.strip() for s in item.partition("="))
            if not eq or not k or not v:
                example = f"{spec.name}:{next(iter(spec.params))}=..."
                raise DatasetError(f"{name!r}: parameter {item.strip()!r} must be key=value, e.g. {example}")
            if k not in spec.params:
                valid = ", ".join(f"{p} (default {d})" for p, d in spec.params.items())
                raise DatasetError(f"{spec.name}: unknown parameter {k!r}; valid parameters: {valid}")
            params[k] = _convert(spec, k, v, spec.params[k])
            explicit.add(k)
    shown = [f"{k}={params[k]!r}" for k in spec.params if k in explicit and params[k] != spec.params[k]]
    canonical = spec.name + (":" + ",".join(shown) if shown else "")
    return Request(spec, canonical, params, frozenset(explicit), root, seed)


def _slug(req: Request) -> str:
    if req.spec.takes_path:
        return f"{req.spec.name}-{req.path.name}-{_files.path_tag(req.path)}"
    return req.name.replace(":", "-").replace(",", "-")


def load_graph(data: DataConfig, seed: int, graph: Graph | None = None) -> Graph:
    """The graph of a run's ``data`` settings: ``graph`` when the caller has one (the
    Python API), else the dataset loaded; with ``data.split`` applied either way."""
    if graph is None:
        graph = load_dataset(data.dataset, data_root=data.data_root, seed=seed, split=data.split,
                             split_seed=data.split_seed)
        if "labels" in stood_in(graph) and not data.stand_in_labels:
            raise DatasetError(f"{data.dataset}: {graph.meta['stand_in']}: write the labels file (row v: vertex v's "
                               "class, -1 unlabeled), or pass --stand-in-labels (Python: stand_in_labels=True) to "
                               "train on the degree classes knowingly")
        return graph
    if data.split is not None:
        return apply_split(graph, data.split, seed if data.split_seed is None else data.split_seed)
    return graph


def stood_in(graph: Graph) -> list[str]:
    """What of a user's graph file's node data is a stand-in (``"features"``,
    ``"labels"``): the files that were not beside it (read from the statement in
    ``meta["stand_in"]`` for a graph cached before ``stand_in_for`` existed)."""
    if "stand_in_for" in graph.meta:
        return list(graph.meta["stand_in_for"])
    text = graph.meta.get("stand_in") or ""
    return [kind for kind in ("features", "labels") if f"stand in for the {kind}" in text]


def load_dataset(name: str, data_root: str | os.PathLike | None = None, seed: int = 0, cache: bool = True,
                 split: str | None = None, split_seed: int | None = None) -> Graph:
    """Load a dataset as it is defined: undirected (both directions stored), unit
    weights, no self loops, not normalized; splits set; ``name`` canonical.

    ``data_root``: folder holding the dataset files (default: ``$SCALEGNN_DATA_ROOT``,
    else ``~/.cache/scalegnn/data``). ``seed`` drives random splits, features and
    generators (datasets with fixed splits ignore it). ``cache``: read/write the
    processed-graph cache (``scalegnn.datasets.cache``). ``split``: ``--split``'s
    ``random:TRAIN,VAL,TEST`` in place of the dataset's own split, drawn with
    ``split_seed`` (default ``seed``); applied after the cache, which keeps the
    dataset as it is defined. A graph whose features or labels are stand-ins (an edge
    list without files beside it) is announced by a warning on the ``scalegnn`` logger, and so
    is a user's file that was not symmetric (made undirected: ``Graph.state_symmetrized``).
    Raises :class:`DatasetError` naming the missing or bad file and the fix.
    """
    graph = _load(name, data_root, seed, cache)
    if graph.meta.get("stand_in"):
        logging.getLogger("scalegnn.datasets").warning("%s: %s", graph.name, graph.meta["stand_in"])
    if graph.meta.get("unread"):
        logging.getLogger("scalegnn.datasets").warning("%s: %s", graph.name, graph.meta["unread"])
    graph.state_symmetrized()
    if split is not None:
        graph = apply_split(graph, split, seed if split_seed is None else split_seed)
    return graph


def _load(name: str, data_root, seed: int, cache: bool) -> Graph:
    try:
        seed = operator.index(seed)
    except TypeError:
        raise DatasetError(f"seed must be an integer, got {seed!r}") from None
    if seed < 0:
        raise DatasetError(f"seed must be >= 0, got {seed}")
    root = Path(data_root).expanduser() if data_root is not None else default_data_root()
    req = parse_name(name, root, seed)
    files = req.spec.sources(req)
    seeded = req.spec.seeded(req, files)

    path = None
    if cache:
        source = source_signature(files)
        directory = cache_dir(root)
        if directory is not None:
            path = cache_path(directory, _slug(req), seed if seeded else None)
            graph = load_cached(path, req.name, source)
            if graph is not None:
                graph.meta["from_cache"] = True  # a fresh object, not yet shared
                return graph
    graph = req.spec.build(req, files)
    # The graph was just built here and is not shared yet: completing its metadata in place.
    graph.meta.update(
        name=req.name,
        params=req.params,
        seed=seed if seeded else None,
        data_root=str(root),
        cache_path=str(path) if path is not None else None,
    )
    if path is not None:
        # Sources again: a download (OGB) may have created them while building.
        save_cached(path, graph, source_signature(req.spec.sources(req)))
    graph.meta["from_cache"] = False
    return graph


# ------------------------------------------------------------------ describe
def edge_homophily(graph: Graph) -> float | None:
    """Fraction of stored entries (u, v) with y_u == y_v, over entries with both
    endpoints labeled (single-label graphs; None for multi-label)."""
    if graph.multilabel or graph.num_edges == 0:
        return None
    yu, yv = graph.y[graph.row_ids()], graph.y[graph.indices]
    both = (yu >= 0) & (yv >= 0)
    if not bool(both.any()):
        return None
    return float((yu[both] == yv[both]).double().mean())


def describe(graph: Graph) -> dict:
    """``Graph.stats()`` plus isolated vertices, edge homophily and the data source."""
    out = graph.stats()
    out["isolated"] = int((graph.degrees() == 0).sum())
    out["edge_homophily"] = edge_homophily(graph)
    out["source"] = graph.meta.get("source")
    out["split"] = graph.meta.get("split")
    if not graph.multilabel:
        out["labeled"] = int((graph.y >= 0).sum())
    return out
