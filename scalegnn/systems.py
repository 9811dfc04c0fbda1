"""The registry of systems: ScaleGNN and every system it is compared with, in one place.

A :class:`System` says what a system is called (its name on the command line and in
records, its display name, its colour and marker in figures, its place in tables),
how it trains (``trainer``: ``make_trainer(cfg, graph, env)``, the
:class:`scalegnn.loop.Trainer` of one rank, which :func:`scalegnn.launch.launch`
runs in every mode; or, for a system that starts its own processes, ``job``:
``job(cfg, graph) -> record``; ``options``: the dataclass of its own settings, whose
fields become its flags under ``scalegnn train --system NAME``; an options class may
define ``check_world(world)``, which refuses a process count its own grid cannot use
before any data is loaded), what it can do (devices, several nodes, full graph or
sampled, edge weights: :func:`check_graph`) and how a sweep launches it (``grids``: the
experiment's grid policy or pure data parallelism; ``sweep_options``: every option of the
spec's ``[train]`` table or only the loop's, the system keeping its own published
hyper-parameters).

The command line, the launcher, the sweeps, the tables, the report and the figures
all read this registry. ``trainer``, ``job`` and ``options`` are ``"module:attribute"``
strings, resolved when they are needed, so the registry can list the compared
systems (``baselines/``) without importing them; :func:`register` adds one at run
time (a test adds a toy system that way). Adding a system is one module and one
entry here (``baselines/README.md`` shows how).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

__all__ = ["System", "register", "unregister", "get", "systems", "names", "resolve", "check_graph", "UnknownSystem",
           "SCALEGNN_SYSTEMS"]

SCALEGNN_SYSTEMS = ("scalegnn", "fullgraph-3d")  # ScaleGNN and its full-graph mode: one trainer, one set of flags


class UnknownSystem(ValueError):
    """A system name the registry does not know."""


@dataclass(frozen=True, kw_only=True)
class System:
    name: str
    display: str
    color: str = "#444444"
    marker: str = "o"
    trainer: str | None = None  # "module:function": make_trainer(cfg, graph, env) -> scalegnn.loop.Trainer
    job: str | None = None  # "module:function": job(cfg, graph) -> record, for a system that starts its own processes
    options: str | None = None  # "module:Class": the system's own settings (its flags)
    full_graph: bool = False  # trains on the whole graph each step (no sampling)
    devices: tuple[str, ...] = ("cpu", "cuda")
    multi_node: bool = True
    self_launching: bool = False  # starts its own processes from one task, on one node (a job gets one task)
    grids: str = "dp"  # sweeps: "spec" (the experiment's grid policy) or "dp" (Gd = G, data parallel only)
    sweep_options: str = "loop"  # sweeps: "all" of the spec's [train] options, or the "loop" options only
    sweep_defaults: tuple[tuple[str, object], ...] = ()  # options a sweep passes for this system (flag, value)
    unavailable: str = ""  # why it cannot run here (paper-only systems): sweeps and reports say so
    edge_weights: bool = False  # trains the GCN normalization of a weighted adjacency (else refuses weights)
    batch: str = "seed vertices"  # what a record's batch_size counts (analysis' batch column); full graph: all
    model: str | None = None  # "module:Class" of the model a run saves (scalegnn.trained), None: it saves none

    def __post_init__(self):
        if self.grids not in ("spec", "dp"):
            raise ValueError(f"system {self.name}: grids must be 'spec' or 'dp', got {self.grids!r}")
        if self.sweep_options not in ("all", "loop"):
            raise ValueError(f"system {self.name}: sweep_options must be 'all' or 'loop', got {self.sweep_options!r}")
        if self.trainer is None and self.job is None and not self.unavailable:
            raise ValueError(f"system {self.name}: give it a trainer (or a job) or say why it is unavailable")
        if self.trainer is not None and self.job is not None:
            raise ValueError(f"system {self.name}: a trainer the launcher runs, or a job of its own, not both")
        if (self.job is not None) != self.self_launching:
            raise ValueError(f"system {self.name}: a system that starts its own processes (self_launching) gives "
                             "a job, and only it does")
        if self.self_launching and self.multi_node:
            raise ValueError(f"system {self.name}: a self-launching system starts its processes on one node")

    @property
    def available(self) -> bool:
        return self.trainer is not None or self.job is not None

    @property
    def style(self) -> tuple[str, str, str]:
        """(colour, marker, display name) for figures."""
        return self.color, self.marker, self.display


def check_graph(name: str, graph) -> None:
    """Refuse, in one line, a graph ``name`` would not train as it was passed: edge
    weights (``graph.meta["weighted"]``) for a system that aggregates its own way."""
    system = get(name)
    if graph.meta.get("weighted") and not system.edge_weights:
        takers = ", ".join(sorted((s.name for s in systems(available=True) if s.edge_weights),
                                  key=lambda n: (n not in SCALEGNN_SYSTEMS, n != "scalegnn")))  # ScaleGNN first
        raise ValueError(f"--system {name} ignores edge weights ({system.display} weighs neighbours its own way) "
                         f"and the graph {graph.name!r} has them: train it with {takers}, or pass it without weights")


def resolve(ref: str):
    """The object named by ``"module:attribute"``."""
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


_REGISTRY: dict[str, System] = {}


def register(system: System) -> System:
    """Add (or replace) a system; tables and figures list systems in registration order."""
    _REGISTRY[system.name] = system
    return system


def unregister(name: str) -> None:
    """Remove a system (a test's toy, once the test is over)."""
    _REGISTRY.pop(name, None)


def get(name: str) -> System:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownSystem(f"unknown system {name!r}; the systems are {', '.join(_REGISTRY)}") from None


def systems(available: bool | None = None) -> list[System]:
    """Every registered system in table order (``available``: only the runnable ones, or only the others)."""
    return [s for s in _REGISTRY.values() if available is None or s.available == available]


def names(available: bool | None = None) -> list[str]:
    return [s.name for s in systems(available)]


def order_key(name: str) -> int:
    """Position of ``name`` in tables (unknown names last)."""
    keys = list(_REGISTRY)
    return keys.index(name) if name in keys else len(keys)


# In table order: the compared systems, then the full-graph 3D mode, then ScaleGNN.
def _compared(name: str, display: str, color: str, marker: str, module: str, options: str, **kw) -> System:
    """A system of ``baselines/``: data parallel only, its own published hyper-parameters;
    its trainer is the module's ``make_trainer`` (a self-launching one's job, its ``job``)."""
    entry = {"job": f"scalegnn.baselines.{module}:job"} if kw.get("self_launching") else \
        {"trainer": f"scalegnn.baselines.{module}:make_trainer"}
    return System(name=name, display=display, color=color, marker=marker, **entry,
                  options=f"scalegnn.baselines.{module}:{options}", sweep_defaults=(("system", name),), **kw)


for _system in (
    _compared("graphsaint", "GraphSAINT", "#17becf", "X", "graphsaint", "GraphSAINTOptions",
              batch="vertices per sampled subgraph (the node budget)", model="scalegnn.baselines.models:SAINTNet"),
    _compared("graphsage", "GraphSAGE", "#ff7f0e", "P", "graphsage", "GraphSAGEOptions",
              model="scalegnn.baselines.models:SAGENet"),
    _compared("distdgl", "DistDGL", "#9467bd", "D", "distdgl.harness", "DistDGLOptions", devices=("cpu",),
              multi_node=False, self_launching=True),
    System(name="massivegnn", display="MassiveGNN", color="#8c564b", marker="v",
           sweep_defaults=(("system", "massivegnn"),),
           unavailable="MassiveGNN is in the paper's figures only: no adapter in baselines/"),
    _compared("salient", "SALIENT++", "#1f77b4", "s", "salient", "SalientOptions",
              model="scalegnn.baselines.models:SAGENet"),
    _compared("fastsample", "FastSample", "#aec7e8", "d", "fastsample", "FastSampleOptions",
              model="scalegnn.baselines.models:SAGENet"),
    _compared("pyg-gcn", "PyG GCN (full batch)", "#8c8c00", "h", "pyg_gcn", "PyGGCNOptions", full_graph=True,
              multi_node=False, edge_weights=True, model="scalegnn.baselines.pyg_gcn:GCN"),
    _compared("bns-gcn", "BNS-GCN", "#2ca02c", "^", "bns_gcn", "BNSOptions", full_graph=True,
              model="scalegnn.baselines.bns_gcn:BNSModel"),
    _compared("cagnet-1d", "CAGNET 1D", "#bcbd22", "<", "cagnet", "Cagnet1DOptions", full_graph=True,
              edge_weights=True, model="scalegnn.model:ScaleGNN"),
    _compared("cagnet-1.5d", "CAGNET 1.5D", "#dbdb8d", ">", "cagnet", "Cagnet15DOptions", full_graph=True,
              edge_weights=True, model="scalegnn.model:ScaleGNN"),
    _compared("cagnet-2d", "CAGNET 2D", "#e377c2", "p", "cagnet", "Cagnet2DOptions", full_graph=True,
              edge_weights=True, model="scalegnn.model:ScaleGNN"),
    System(name="fullgraph-3d", display="full-graph 3D", color="#7f7f7f", marker="*", full_graph=True,
           trainer="scalegnn.trainer:make_trainer", grids="spec", sweep_options="all", edge_weights=True,
           sweep_defaults=(("batch-ratio", 1.0),), model="scalegnn.model:ScaleGNN"),
    System(name="scalegnn", display="ScaleGNN", color="#d62728", marker="o",
           trainer="scalegnn.trainer:make_trainer", grids="spec", sweep_options="all", edge_weights=True,
           batch="vertices sampled uniformly (batch_ratio x N)", model="scalegnn.model:ScaleGNN"),
):
    register(_system)
