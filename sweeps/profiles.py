"""Cluster profiles: data files in ``sweeps/profiles/<name>.toml`` (fields in sweeps/README.md).

A profile says how to place ranks on a machine (GPUs per node, CPUs per task),
how to submit there (SLURM account / QOS / partition / constraint placeholders,
srun arguments, environment set-up lines and variables) and what the network and
devices can do (bandwidths and throughputs for :mod:`scalegnn.perfmodel`). It is
read into a frozen :class:`ClusterProfile`; nothing in a profile is executed by
Python. Only the set-up lines and ``python`` (the interpreter command) are shell,
copied into the batch script as they are; every other value reaches the script as
data: scheduler values checked to be one safe word (:func:`check_script_value`),
``[env]`` values quoted (:func:`shell_value`).

Where a site keeps its data (``data_root``, ``out_root``: scratch, not ``$HOME``) is
a path template expanded on the submitting login node (:meth:`ClusterProfile.site_path`):
``${VAR}`` from its environment, ``{account}`` from the account or bank; a variable
that is not set there stops a submission with one line before anything is written. A
``--dry-run`` (on a laptop, before logging in) shows such a variable as itself,
``${PSCRATCH}`` (:func:`show_site_variables`), and says that it expands on the site.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["ClusterProfile", "Network", "Compute", "SlurmSettings", "FluxSettings", "StagingSettings", "load_profile",
           "list_profiles", "PROFILE_DIR", "ProfileError", "show_site_variables", "check_minutes"]

PROFILE_DIR = Path(__file__).resolve().parent / "profiles"
SCHEDULERS = ("slurm", "flux", "local")
PLACEHOLDER_PREFIX = "<"


class ProfileError(ValueError):
    """A profile file is missing, malformed, or still holds a placeholder where a value is needed."""


# ---------------------------------------------------------------------------- values that go into batch scripts
# Scheduler values land in directive lines of the batch script (`#SBATCH --account=...`,
# `# flux: --bank=...`): a newline there ends the directive and starts a shell line,
# and `# flux:` lines are not quoted at all. So each one is a single word from a
# conservative set (punctuation besides letters and digits), checked when the
# profile is loaded and when the command line overrides it, before anything is
# written or submitted.
NAME_PUNCT = "_.,:+=@/-"  # accounts, QOS, partitions, Flux banks and queues
EXPRESSION_PUNCT = NAME_PUNCT + "&|()[]*"  # SLURM feature expressions (gpu&hbm80g, [rack1|rack2]), extra values
FLAG_PUNCT = "_-"  # the option names of [slurm] / [flux] extra
IFNAME_PUNCT = "_.:-"  # a network interface name (hsn0, hsi0, eth0.1)
FILE_PUNCT = "_.+-"  # a library file name (librccl-net.so)
ONE_LINE = None  # values the script quotes itself (srun / flux run arguments, [env] values): no control characters
FIELD_PUNCT = {"account": NAME_PUNCT, "qos": NAME_PUNCT, "partition": NAME_PUNCT, "constraint": EXPRESSION_PUNCT,
               "bank": NAME_PUNCT, "queue": NAME_PUNCT}
_EXAMPLES = {"account": "m1234", "qos": "regular", "partition": "batch", "constraint": "'gpu&hbm80g'"}  # the fixes
_PLACEHOLDER = re.compile(r"<[A-Za-z0-9_. -]+>")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_SHELL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_REFERENCE = re.compile(r"(\$[A-Za-z_][A-Za-z0-9_]*|\$\{[A-Za-z_][A-Za-z0-9_]*\})")  # $NAME, ${NAME}
_SITE_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")
_SITE_FIELD = re.compile(r"(?<!\$)\{([^{}]*)\}")  # {account}; not ${NAME}
SITE_FIELDS = ("account",)
SITE_PATH_FLAGS = {"data_root": "--data-root", "out_root": "--out"}  # the command-line flag that overrides each
# A site variable a dry run cannot expand here stands in its path as a marker that keeps the path absolute (the
# sweep resolves its folders, and a relative "${PSCRATCH}/..." would resolve under the current folder); what the
# dry run prints shows each marker as the variable again (show_site_variables). The characters are ones shlex and
# check_script_value pass as they are; a path that starts with the variable gets the root form.
_UNSET_INSIDE, _UNSET_ROOT = "@unset-site-variable:", "/@site-root"  # NAME@ follows the first
_UNSET = re.compile(f"(?:{re.escape(_UNSET_ROOT)})?{re.escape(_UNSET_INSIDE)}([A-Za-z_][A-Za-z0-9_]*)@")


def check_script_value(what: str, value, punct: str | None, fix: str, *, placeholder: bool = False,
                       error: type[ValueError] = ProfileError) -> None:
    """Refuse ``value`` unless it stays one datum in a line of a batch script: letters,
    digits and ``punct``, or with ``punct=ONE_LINE`` any text without control
    characters. ``placeholder``: a ``<...>`` placeholder is accepted too (--dry-run
    prints it, a submission refuses it: :meth:`ClusterProfile.placeholders`). The
    message names ``what``, the value, the first bad character and ``fix``."""
    text = str(value)
    if placeholder and _PLACEHOLDER.fullmatch(text):
        return
    if punct is ONE_LINE:
        bad, allowed = _CONTROL.search(text), "one line of text"
    else:
        bad, allowed = re.search(f"[^A-Za-z0-9{re.escape(punct)}]", text), f"letters, digits and {punct}"
    if bad:
        raise error(f"{what} {text!r}: {bad.group()!r} cannot go into a batch script line (allowed: {allowed}); "
                    f"{fix}")


def check_script_command(what: str, value: str, fix: str, *, error: type[ValueError] = ProfileError) -> None:
    """Refuse ``value`` unless it is a command path a batch script may run as it is: path
    characters, quotes and ``$NAME`` / ``${NAME}`` references the job expands (a profile's
    ``"${SCALEGNN_VENV}/bin/python"``); a newline, ``;``, ``$(...)`` or a backtick would
    run something else."""
    check_script_value(what, _REFERENCE.sub("", str(value)), "/._+~-\"", fix, error=error)


def check_minutes(what: str, value, fix: str, *, error: type[ValueError] = ProfileError) -> int:
    """``value`` if it is a job's time limit (a whole number of minutes >= 1: it goes into
    ``--time`` / ``-t`` as it is); else ``error`` naming ``what``, the value and ``fix``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise error(f"{what} must be a whole number of minutes >= 1, got {value!r}; {fix}")
    return value


def show_site_variables(text: str) -> str:
    """``text`` (a dry run's line or script) with every site variable that was not set
    here (:meth:`ClusterProfile.site_path` with ``unset``) shown as ``${NAME}``."""
    return _UNSET.sub(lambda m: "${" + m.group(1) + "}", text)


def shell_value(value: str) -> str:
    """``value`` double-quoted for bash, as data: ``$(...)``, backticks, ``\\`` and ``"``
    are escaped, so nothing in it runs; only references to other variables (``$NAME``,
    ``${NAME}``, e.g. ``/tmp/miopen-${USER}``) expand when the script runs."""
    parts = _REFERENCE.split(value)  # text, reference, text, ...
    return '"' + "".join(p if i % 2 else re.sub(r'([\\$`"])', r"\\\1", p) for i, p in enumerate(parts)) + '"'


@dataclass(frozen=True)
class Network:
    """Bandwidths for the communication model (Plexus Eq. 4.5-4.6), GB/s = 1e9 bytes/s."""

    intra_node_GBps: float
    inter_node_GBps: float  # per-node injection, shared by the groups that leave the node
    latency_us: float = 10.0
    intra_links: str = "ring"  # "full": each pair of a node's devices has its own intra_node_GBps link
    tree_allreduce: bool = False  # the collective library may pick a double binary tree (NCCL, RCCL)
    # The interface of the gloo / NCCL socket transport (bootstrap, and TCP where there is
    # no network plugin): exported as GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME unless
    # [env] sets them (ClusterProfile.env_lines). "": neither is exported.
    socket_ifname: str = ""

    def __post_init__(self):
        for name in ("intra_node_GBps", "inter_node_GBps"):
            if not getattr(self, name) > 0:
                raise ProfileError(f"network.{name} must be > 0, got {getattr(self, name)}")
        check_script_value("network.socket_ifname", self.socket_ifname, IFNAME_PUNCT,
                           "give one interface name, e.g. socket_ifname = \"hsn0\" (`ip -br link` on a compute node)")


@dataclass(frozen=True)
class Compute:
    """Rough device throughputs: the performance model's defaults before fitting."""

    spmm_gflops: float
    gemm_tflops: float
    step_overhead_ms: float = 1.0
    memory_gb: float = 0.0
    compute_slots: int = 0  # >0: all ranks of a node share this many cores (CPU); 0: one device per rank
    hbm_GBps: float = 0.0  # >0: an accelerator: memory-bound kernels priced by device memory bandwidth


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
class StagingSettings:
    """The staging job (``scalegnn data shard``: CPU work, one task on one node) where it
    differs from the runs' jobs: an empty value or 0 takes the runs' (the profile's)."""

    time_min: int = 0  # its time limit (0: the profile's time_min)
    cpus_per_task: int = 0  # CPUs of its one task (0: the profile's cpus_per_task)
    qos: str = ""  # SLURM: e.g. "shared" (Perlmutter's QOS for jobs smaller than a node)
    constraint: str = ""  # SLURM: e.g. "cpu" (Perlmutter's CPU nodes)
    partition: str = ""  # SLURM
    queue: str = ""  # Flux: flux batch --queue
    extra: dict | None = None  # other #SBATCH / flux batch options in place of the runs' extra (None: the runs')
    memory_budget: str = ""  # stage out of core within this size (`data shard --memory-budget`; "": in memory)
    # The account (SLURM) or bank (Flux) it is charged to: a site may charge CPU and GPU
    # hours to different accounts (Perlmutter: <project> and <project>_g); --staging-account.
    account: str = ""

    SLURM_ONLY = ("qos", "constraint", "partition")
    FLUX_ONLY = ("queue",)


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
    threads_per_task: int = 0  # each run's --threads N (jobs.with_threads); 0: the run's own (auto)
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
    staging: StagingSettings = field(default_factory=StagingSettings)
    python: str | None = None  # interpreter in the batch script; None: the submitting one (sys.executable)
    data_root: str = ""  # default data root, a site path template (site_path); "": scalegnn's default
    out_root: str = ""  # folder of the sweep folders (<out_root>/<spec>-<cluster>), a template; "": results/sweeps
    net_plugin: tuple[str, ...] = ()  # the NCCL/RCCL network plugin's library, any of these names (sweeps/preflight.py)
    source: str = ""

    def __post_init__(self):
        if self.scheduler not in SCHEDULERS:
            raise ProfileError(f"profile {self.name}: scheduler must be one of {SCHEDULERS}, got {self.scheduler!r}")
        for name, value in (("gpus_per_node", self.gpus_per_node), ("cpus_per_task", self.cpus_per_task),
                            ("threads_per_task", self.threads_per_task), ("time_min", self.time_min),
                            ("max_timeouts", self.max_timeouts), ("max_parallel_jobs", self.max_parallel_jobs),
                            ("slurm.gpus_per_node", self.slurm.gpus_per_node),
                            ("staging.time_min", self.staging.time_min),
                            ("staging.cpus_per_task", self.staging.cpus_per_task)):
            if not isinstance(value, int) or isinstance(value, bool):  # they go into the script as they are
                raise ProfileError(f"profile {self.name}: {name} must be a whole number, got {value!r}")
        self._check_script_values()
        check_minutes(f"profile {self.name}: time_min", self.time_min, f"correct it in {self.source or 'the profile'}")
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

    def _check_script_values(self) -> None:
        """Everything a batch script takes from this profile as data (not ``setup``,
        which is shell by design) is one safe datum: see :func:`check_script_value`."""
        fix = f"correct it in {self.source or 'the profile ' + self.name}"
        for table, settings, keys in (("slurm", self.slurm, ("account", "qos", "partition", "constraint")),
                                      ("flux", self.flux, ("bank", "queue")),
                                      ("staging", self.staging, ("account", "qos", "partition", "constraint",
                                                                 "queue"))):
            for key in keys:
                check_script_value(f"{table}.{key}", getattr(settings, key), FIELD_PUNCT[key], fix, placeholder=True)
            for key, value in (settings.extra or {}).items():
                check_script_value(f"{table}.extra option", key, FLAG_PUNCT, fix)
                if value is not True:  # True: a bare flag
                    check_script_value(f"{table}.extra.{key}", value, EXPRESSION_PUNCT, fix)
        other, keys = (("SLURM", StagingSettings.SLURM_ONLY) if self.scheduler == "flux" else
                       ("Flux", StagingSettings.FLUX_ONLY) if self.scheduler == "slurm" else (None, ()))
        for key in keys:
            if getattr(self.staging, key):
                raise ProfileError(f"staging.{key} is a {other} setting; profile {self.name} is scheduled by "
                                   f"{self.scheduler}: remove it from [staging] in {self.source or self.name}")
        for name in SITE_PATH_FLAGS:
            template = getattr(self, name)
            check_script_value(name, template, ONE_LINE, fix)
            unknown = [f for f in _SITE_FIELD.findall(template) if f not in SITE_FIELDS]
            if unknown:
                raise ProfileError(f"{name} {template!r}: {{{unknown[0]}}} is not a field a site path can name "
                                   f"(known: {', '.join('{' + f + '}' for f in SITE_FIELDS)}; environment "
                                   f"variables are ${{NAME}}); {fix}")
        for lib in self.net_plugin:
            check_script_value("net_plugin", lib, FILE_PUNCT,
                               f"give the library's file name, e.g. librccl-net.so; {fix}")
        for what, args in (("slurm.srun_args", self.slurm.srun_args), ("flux.run_args", self.flux.run_args)):
            for arg in args:
                check_script_value(what, arg, ONE_LINE, fix)
        for key, value in self.env.items():
            if not _SHELL_NAME.fullmatch(str(key)):
                raise ProfileError(f"env name {key!r} is not a shell variable name (letters, digits and _, not "
                                   f"starting with a digit); {fix}")
            check_script_value(f"env.{key}", value, ONE_LINE, fix)

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

    def env_lines(self) -> list[str]:
        """``export NAME="value"``: the network interface of the socket transports
        (``[network] socket_ifname`` as ``GLOO_SOCKET_IFNAME`` and ``NCCL_SOCKET_IFNAME``,
        each unless ``[env]`` sets it), then every ``[env]`` variable. The values are data
        (see :func:`shell_value`)."""
        ifname = self.network.socket_ifname
        socket = {key: ifname for key in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME") if ifname and key not in self.env}
        return [f"export {key}={shell_value(str(value))}" for key, value in {**socket, **self.env}.items()]

    @property
    def account(self) -> str:
        """The account jobs are charged to: SLURM's account, Flux's bank."""
        return self.flux.bank if self.scheduler == "flux" else self.slurm.account

    def site_path(self, name: str, environ=None, unset: list[str] | None = None) -> str | None:
        """``data_root`` or ``out_root`` expanded for this submission, None when the
        profile leaves it to the default. ``${VAR}`` / ``$VAR`` come from ``environ``
        (default: this process's, i.e. the login node's; ``$PSCRATCH`` on Perlmutter),
        ``{account}`` is the account (the Flux bank) in lower case, as OLCF names its
        project folders, ``~`` the home folder. A variable that is not set is a
        :class:`ProfileError` naming it and the flag that overrides the path; with
        ``unset`` (a dry run) it is appended there instead and stays in the path as a
        marker that :func:`show_site_variables` shows as ``${NAME}``."""
        template = getattr(self, name)
        if not template:
            return None
        environ = os.environ if environ is None else environ
        missing = []

        def variable(match):
            var = match.group(1) or match.group(2)
            value = environ.get(var, "")
            if not value:
                missing.append(var)
                if unset is not None:
                    return (_UNSET_ROOT if match.start() == 0 else "") + f"{_UNSET_INSIDE}{var}@"
            return value

        text = _SITE_VARIABLE.sub(variable, _SITE_FIELD.sub(lambda m: self.account.lower(), template))
        if missing and unset is not None:
            unset.extend(v for v in dict.fromkeys(missing) if v not in unset)
        elif missing:
            raise ProfileError(f"profile {self.name}: {name} {template!r} needs ${missing[0]}, which is not set here; "
                               f"run on a {self.name} login node (where the site sets it), export it, or pass "
                               f"{SITE_PATH_FLAGS[name]} DIR")
        return str(Path(text).expanduser())

    def placeholders(self) -> list[str]:
        if self.scheduler == "local":
            return []
        held = self.slurm.placeholders() if self.scheduler == "slurm" else self.flux.placeholders()
        return held + (["staging.account"] if self.staging.account.startswith(PLACEHOLDER_PREFIX) else [])

    def with_overrides(self, **changes) -> "ClusterProfile":
        """A copy with top-level fields or ``slurm`` fields (account, qos, partition,
        constraint) replaced; None values are ignored. On a Flux profile ``account``
        is the bank and ``partition`` the queue. ``staging_account`` is the staging
        job's account (bank): ``[staging] account``."""
        changes = {k: v for k, v in changes.items() if v is not None}
        if "time_min" in changes:
            check_minutes("--time", changes["time_min"], "give the minutes per job, e.g. --time 60")
        for key in ("account", "qos", "partition", "constraint"):
            if key in changes:
                check_script_value(f"--{key}", changes[key], FIELD_PUNCT[key],
                                   f"give the {key} alone, e.g. --{key} {_EXAMPLES[key]}")
        if "staging_account" in changes:
            account = changes.pop("staging_account")
            check_script_value("--staging-account", account, FIELD_PUNCT["account"],
                               "give the account alone, e.g. --staging-account m1234")
            return dataclasses.replace(self, staging=dataclasses.replace(self.staging, account=account)) \
                .with_overrides(**changes)
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
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ProfileError(f"{path}: not valid TOML: {exc}") from None
    except OSError as exc:
        raise ProfileError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    try:
        return _parse_profile(dict(data), path)
    except (TypeError, KeyError, AttributeError) as exc:  # a value of the wrong kind (a number for a table, ...)
        raise ProfileError(f"{path}: not a cluster profile: a field holds the wrong kind of value "
                           f"({type(exc).__name__}: {exc}); the fields are in sweeps/README.md") from None


def _parse_profile(data: dict, path: Path) -> ClusterProfile:
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
    staging = StagingSettings(**_known(StagingSettings, dict(data.pop("staging", {})), f"{where} [staging]"))
    if staging.memory_budget:
        from scalegnn.shards.out_of_core import parse_size

        try:
            parse_size(staging.memory_budget)
        except ValueError as exc:
            raise ProfileError(f"{where} [staging] memory_budget: {exc}") from None
    data["setup"] = tuple(data.get("setup", ()))
    if "net_plugin" in data:
        plugin = data["net_plugin"]
        data["net_plugin"] = (plugin,) if isinstance(plugin, str) else tuple(plugin)
    data["env"] = {str(k): str(v) for k, v in data.get("env", {}).items()}
    _known(ClusterProfile, data, where)
    try:
        return ClusterProfile(network=network, compute=compute, slurm=slurm, flux=flux, staging=staging, source=where,
                              **data)
    except TypeError as exc:
        raise ProfileError(f"{where}: {exc}") from None
