"""Cluster profiles: data files in ``sweeps/profiles/<name>.toml`` (fields in sweeps/README.md).

A profile says how to place ranks on a machine (GPUs per node, CPUs per task),
how to submit there (SLURM account / QOS / partition / constraint placeholders,
srun arguments, environment set-up lines and variables) and what the network and
devices can do (bandwidths and throughputs for :mod:`scalegnn.perfmodel`). It is
read into a frozen :class:`ClusterProfile`; nothing in a profile is executed by
Python (set-up lines are copied into the batch script).
"""

from __future__ import annotations

import dataclasses
import math
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["ClusterProfile", "Network", "Compute", "SlurmSettings", "FluxSettings", "load_profile", "list_profiles",
           "PROFILE_DIR", "ProfileError"]

PROFILE_DIR = Path(__file__).resolve().parent / "profiles"
SCHEDULERS = ("slurm", "flux", "local")
PLACEHOLDER_PREFIX = "<"


class ProfileError(ValueError):
    """A profile file is missing, malformed, or still holds a placeholder where a value is needed."""


@dataclass(frozen=True)
class Network:
    """Bandwidths for the communication model (Plexus Eq. 4.5-4.6), GB/s = 1e9 bytes/s."""

    intra_node_GBps: float
    inter_node_GBps: float  # per-node injection, shared by the groups that leave the node
    latency_us: float = 10.0

    def __post_init__(self):
        for name in ("intra_node_GBps", "inter_node_GBps"):
            if not getattr(self, name) > 0:
                raise ProfileError(f"network.{name} must be > 0, got {getattr(self, name)}")


@dataclass(frozen=True)
class Compute:
    """Rough device throughputs: the performance model's defaults before fitting."""

    spmm_gflops: float
    gemm_tflops: float
    step_overhead_ms: float = 1.0
    memory_gb: float = 0.0
    compute_slots: int = 0  # >0: all ranks of a node share this many cores (CPU); 0: one device per rank


@dataclass(frozen=True)
class SlurmSettings:
    account: str = ""
    qos: str = ""
    constraint: str = ""
    partition: str = ""
    gpus_per_node: int = 0  # 0: no --gpus-per-node line (GPUs bound per task by srun_args)
    srun_args: tuple[str, ...] = ()
    extra: dict = field(default_factory=dict)  # any other #SBATCH flag: {"exclusive": true}

    def placeholders(self) -> list[str]:
        return [f"slurm.{k}" for k in ("account", "qos", "constraint", "partition")
                if str(getattr(self, k)).startswith(PLACEHOLDER_PREFIX)]


@dataclass(frozen=True)
class FluxSettings:
    """``flux batch`` / ``flux run`` settings of a Flux-scheduled machine (``sweeps/flux.py``)."""

    bank: str = ""  # flux batch --bank
    queue: str = ""  # flux batch --queue
    run_args: tuple[str, ...] = ()  # extra `flux run` arguments (GPU/CPU binding)
    extra: dict = field(default_factory=dict)  # any other `flux batch` option: {"exclusive": true}

    def placeholders(self) -> list[str]:
        return [f"flux.{k}" for k in ("bank", "queue") if str(getattr(self, k)).startswith(PLACEHOLDER_PREFIX)]


@dataclass(frozen=True)
class ClusterProfile:
    name: str
    description: str
    scheduler: str
    gpus_per_node: int
    cpus_per_task: int
    device: str
    torch_backend: str
    comm_library: str
    network: Network
    compute: Compute
    threads_per_task: int = 0  # 0: cpu_count // tasks
    time_min: int = 60
    max_timeouts: int = 3
    max_parallel_jobs: int = 0  # local: jobs at a time (0 = unlimited)
    checkpoint_every: str = "20m"  # `scalegnn train --checkpoint-every` of every sweep run (never off: see below)
    offline: bool = True  # every task runs with SCALEGNN_OFFLINE=1: compute nodes read staged data, never download
    stand_ins: bool | None = None  # use the specs' [local] stand-in graphs (None: only the local scheduler does)
    setup: tuple[str, ...] = ()
    env: dict = field(default_factory=dict)
    slurm: SlurmSettings = field(default_factory=SlurmSettings)
    flux: FluxSettings = field(default_factory=FluxSettings)
    python: str | None = None  # interpreter in the batch script; None: the submitting one (sys.executable)
    source: str = ""

    def __post_init__(self):
        if self.scheduler not in SCHEDULERS:
            raise ProfileError(f"profile {self.name}: scheduler must be one of {SCHEDULERS}, got {self.scheduler!r}")
        if self.gpus_per_node < 1 or self.cpus_per_task < 1:
            raise ProfileError(f"profile {self.name}: gpus_per_node and cpus_per_task must be >= 1")
        if self.torch_backend not in ("nccl", "gloo", "mpi"):
            raise ProfileError(f"profile {self.name}: torch_backend must be nccl (also RCCL on ROCm), gloo or mpi, "
                               f"got {self.torch_backend!r}")
        # A sweep run without a checkpointer does not listen for the scheduler's
        # preemption / time-limit signal: it would be requeued with nothing saved and
        # start again from scratch. So every profile checkpoints (a long period costs
        # nothing: the signal still triggers a save at the next step).
        from scalegnn.checkpoint import parse_every

        try:
            parse_every(self.checkpoint_every)
        except ValueError as exc:
            raise ProfileError(f"profile {self.name}: checkpoint_every {self.checkpoint_every!r} is not a step count "
                               f"or a period ({exc}); sweep runs always checkpoint so that a preempted or timed-out "
                               "job resumes: use e.g. \"20m\"") from None

    @property
    def uses_stand_ins(self) -> bool:
        """Whether specs expand to their ``[local]`` stand-in graphs on this machine."""
        return self.scheduler == "local" if self.stand_ins is None else bool(self.stand_ins)

    # ------------------------------------------------------------------ placement
    def placement(self, world_size: int) -> tuple[int, int]:
        """(nodes, tasks_per_node) for ``world_size`` ranks: one task per GPU, full nodes
        except for jobs smaller than a node."""
        if world_size < 1:
            raise ValueError(f"world size must be >= 1, got {world_size}")
        if self.scheduler == "local" and world_size > self.gpus_per_node:
            raise ValueError(f"{world_size} ranks do not fit the local profile (at most {self.gpus_per_node} "
                             "tasks in one local job); lower the GPU counts with --gpus")
        tasks = min(world_size, self.gpus_per_node)
        nodes = math.ceil(world_size / self.gpus_per_node)
        if nodes * tasks != world_size:
            raise ValueError(f"{world_size} ranks do not fill whole nodes of {self.gpus_per_node} GPUs on "
                             f"{self.name}; use a multiple of {self.gpus_per_node}")
        return nodes, tasks

    def threads(self, tasks_per_node: int) -> int:
        if self.threads_per_task > 0:
            return self.threads_per_task
        return max(1, (os.cpu_count() or 1) // max(1, tasks_per_node))

    def env_lines(self) -> list[str]:
        out = []
        for key, value in self.env.items():
            value = str(value).replace('"', '\\"')
            out.append(f'export {key}="{value}"')
        return out

    def placeholders(self) -> list[str]:
        if self.scheduler == "slurm":
            return self.slurm.placeholders()
        return self.flux.placeholders() if self.scheduler == "flux" else []

    def with_overrides(self, **changes) -> "ClusterProfile":
        """A copy with top-level fields or ``slurm`` fields (account, qos, partition,
        constraint) replaced; None values are ignored. On a Flux profile ``account``
        is the bank and ``partition`` the queue."""
        changes = {k: v for k, v in changes.items() if v is not None}
        if self.scheduler == "flux":
            flux_changes = {f: changes.pop(k) for k, f in (("account", "bank"), ("partition", "queue"))
                            if k in changes}
            for k in ("qos", "constraint"):
                if changes.pop(k, None) is not None:
                    raise ProfileError(f"--{k} is a SLURM setting; profile {self.name} is scheduled by Flux "
                                       "(use --account for the bank, --partition for the queue)")
            prof = dataclasses.replace(self, flux=dataclasses.replace(self.flux, **flux_changes)) \
                if flux_changes else self
            return dataclasses.replace(prof, **changes) if changes else prof
        slurm_keys = {f.name for f in dataclasses.fields(SlurmSettings)}
        slurm_changes = {k: changes.pop(k) for k in list(changes) if k in slurm_keys}
        prof = dataclasses.replace(self, **changes) if changes else self
        if slurm_changes:
            prof = dataclasses.replace(prof, slurm=dataclasses.replace(prof.slurm, **slurm_changes))
        return prof


def list_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.toml"))


def _known(cls, data: dict, where: str) -> dict:
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ProfileError(f"{where}: unknown fields {unknown}; known: {sorted(names)}")
    return data


def load_profile(name_or_path: str | os.PathLike) -> ClusterProfile:
    """Load ``sweeps/profiles/<name>.toml`` or a profile file path."""
    path = Path(name_or_path)
    if not path.suffix:
        path = PROFILE_DIR / f"{name_or_path}.toml"
    if not path.is_file():
        raise ProfileError(f"no cluster profile {str(name_or_path)!r}; known: {', '.join(list_profiles())} "
                           f"(or give a path to a .toml file)")
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"{path}: not valid TOML: {exc}") from None
    data = dict(data)
    where = str(path)
    try:
        network = Network(**_known(Network, data.pop("network"), f"{where} [network]"))
        compute = Compute(**_known(Compute, data.pop("compute"), f"{where} [compute]"))
    except KeyError as exc:
        raise ProfileError(f"{where}: missing table [{exc.args[0]}]") from None
    slurm_raw = dict(data.pop("slurm", {}))
    if "srun_args" in slurm_raw:
        slurm_raw["srun_args"] = tuple(slurm_raw["srun_args"])
    slurm = SlurmSettings(**_known(SlurmSettings, slurm_raw, f"{where} [slurm]"))
    flux_raw = dict(data.pop("flux", {}))
    if "run_args" in flux_raw:
        flux_raw["run_args"] = tuple(flux_raw["run_args"])
    flux = FluxSettings(**_known(FluxSettings, flux_raw, f"{where} [flux]"))
    data["setup"] = tuple(data.get("setup", ()))
    data["env"] = {str(k): str(v) for k, v in data.get("env", {}).items()}
    _known(ClusterProfile, data, where)
    try:
        return ClusterProfile(network=network, compute=compute, slurm=slurm, flux=flux, source=where, **data)
    except TypeError as exc:
        raise ProfileError(f"{where}: {exc}") from None
