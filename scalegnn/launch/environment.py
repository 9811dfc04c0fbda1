"""Where this process stands in a run: a rank of a job a launcher started (torchrun,
SLURM, submitit, Flux), the starter of local workers, or the whole run in process.

:func:`detect_env` reads rank, world size, local rank and the rendezvous address
from the launcher's variables; :func:`run_mode` decides how this process takes part
in a run of a given grid; :func:`init_from_env` initializes ``torch.distributed``
from the environment, always with an explicit timeout, once every rank has come to the
:func:`rendezvous` (which names those that did not); :func:`local_rank_env` is the
:class:`DistEnv` of a worker of a local job (:mod:`scalegnn.launch.job`).

Device and backend. Each rank computes on the device its run asks for
(:func:`scalegnn.device.resolve_device`: the local rank's GPU when one is visible
and ``--device`` is auto or cuda) and the backend follows it: NCCL (RCCL on ROCm)
for GPU tensors, gloo for CPU tensors. An NCCL world also carries gloo for the
host-side control traffic (checkpoint agreement, object gathers), and is bound to
the rank's GPU so that torch creates the axis groups by splitting its communicator.

Threads (:mod:`scalegnn.threads`): :func:`run_threads` applies a run's ``--threads``
choice to the process that runs it, counting the local ranks that share the node's
cores (:func:`local_ranks_of_run`); a local job hands the same choice to each worker.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import logging
import os
import re
import socket
import sys
from dataclasses import dataclass

from .. import threads as thread_policy

__all__ = ["DistEnv", "detect_env", "run_mode", "RUN_MODES", "init_from_env", "init_process_group", "first_host",
           "single_env", "local_rank_env", "local_backend", "free_port", "run_threads", "threads_of_run", "local_ranks_of_run",
           "slurm_tasks_on_node", "launched_rank", "gather_placement", "check_socket_ifnames", "check_one_gpu_per_rank",
           "check_torch", "MIN_TORCH", "rendezvous", "RendezvousTimeout"]

log = logging.getLogger("scalegnn.launch")


# --------------------------------------------------------------------------- environment
@dataclass(frozen=True)
class DistEnv:
    """Where this process sits in the launched job."""

    rank: int
    world_size: int
    local_rank: int
    backend: str  # "auto" until init_from_env resolves it from the device
    master_addr: str
    master_port: int
    source: str  # "torchrun" | "slurm" | "submitit" | "flux" | "local" (a worker of a local job) | "single"
    device: str = "cpu"  # this rank's torch device, set by init_from_env
    local_world_size: int = 1  # the job's processes on this node (the ranks that may share its cores)


def first_host(nodelist: str) -> str:
    """The first hostname of a SLURM node list: ``"nid[001-004,007],gpu5"`` -> ``"nid001"``.

    Handles the compressed forms SLURM writes (``prefix[a-b,c]suffix`` groups,
    zero padding kept literally); for anything stranger set MASTER_ADDR yourself.
    """
    nodelist = nodelist.strip()
    if not nodelist:
        raise ValueError("SLURM_NODELIST is empty; set MASTER_ADDR to the first node's hostname")
    depth, first = 0, nodelist
    for i, ch in enumerate(nodelist):  # the first top-level comma ends the first group
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            first = nodelist[:i]
            break
    # Replace each bracket range list by its first element: "[001-004,007]" -> "001".
    return re.sub(r"\[([^\]]*)\]", lambda m: re.split(r"[-,]", m.group(1))[0], first)


def _default_port(job_id: str | None) -> int:
    """A rendezvous port derived from the job id (20000..39999), so two jobs sharing a
    node rarely collide; 29500 (torch's default) without a numeric job id."""
    return 20000 + int(job_id) % 20000 if job_id and job_id.isdigit() else 29500


def _env_int(name: str, fix: str = "") -> int:
    try:
        return int(os.environ[name])
    except ValueError as e:
        raise ValueError(f"environment variable {name}={os.environ[name]!r} must be an integer"
                         + (f"; {fix}" if fix else "")) from e


_PORT_FIX = "give every rank the same free port, e.g. MASTER_PORT=$((20000 + RANDOM % 20000))"


def _env_port(derived: int) -> int:
    """``MASTER_PORT`` when set (an integer in 1..65535), else ``derived`` (the launcher's job id's)."""
    if not os.environ.get("MASTER_PORT", "").strip():
        return derived
    port = _env_int("MASTER_PORT", _PORT_FIX)
    if not 1 <= port <= 65535:
        raise ValueError(f"MASTER_PORT={port} is no TCP port (1..65535); {_PORT_FIX}")
    return port


# What each launcher's users should do when its variables do not describe a job (named in detect_env's errors).
_FIX = {"torchrun": "start the ranks with torchrun, which sets RANK, WORLD_SIZE and LOCAL_RANK, or give each "
                    "process its own RANK in 0..WORLD_SIZE-1",
        "slurm": "start the tasks with srun, which sets SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID; do not set them "
                 "by hand",
        "flux": "start the tasks with `flux run`, which sets FLUX_TASK_RANK/FLUX_JOB_SIZE/FLUX_TASK_LOCAL_ID",
        "submitit": "start the job with submitit's SLURM executor, whose JobEnvironment gives each task its rank"}


@dataclass(frozen=True)
class _Source:
    """The launcher's variables a :class:`DistEnv` came from, named in its errors;
    ``local_world`` None where the ranks per node are estimated (tasks over nodes), not read."""

    rank: str
    world: str
    local_rank: str
    local_world: str | None


def _checked(info: DistEnv, names: _Source) -> DistEnv:
    """Refuse, in one line naming the variables, their values and the fix, a rank outside
    its world: a rank beyond WORLD_SIZE would wait for a rendezvous that never completes
    (rank 5 of 2 waits for ever), a local rank beyond the node's ranks takes another's GPU.
    Invariants: 0 <= rank < world, 0 <= local rank < ranks on the node <= world."""
    fix = _FIX[info.source]
    world, rank = info.world_size, info.rank
    if world < 1:
        raise ValueError(f"{names.world}={world} must be at least 1 (the job's ranks); {fix}")
    if not 0 <= rank < world:
        raise ValueError(f"{names.rank}={rank} is outside 0..{world - 1} ({names.world}={world}): each of the job's "
                         f"{world} ranks needs its own {names.rank} in that range; {fix}")
    bound, bound_name = world, names.world
    if names.local_world is not None:
        local_world = info.local_world_size
        if not 1 <= local_world <= world:
            raise ValueError(f"{names.local_world}={local_world} is outside 1..{world} ({names.world}={world}): a "
                             f"node runs at least one and at most all of the job's ranks; {fix}")
        bound, bound_name = local_world, names.local_world
    if not 0 <= info.local_rank < bound:
        raise ValueError(f"{names.local_rank}={info.local_rank} is outside 0..{bound - 1} ({bound_name}={bound}): "
                         f"each rank on a node needs its own {names.local_rank} in that range; {fix}")
    if not info.master_addr.strip():
        raise ValueError("MASTER_ADDR is empty; set it to the host of rank 0, the same on every rank (torchrun "
                         "--master-addr)")
    return info


def _flux_hostlist() -> str:
    """The enclosing Flux instance's host list (``flux getattr hostlist``, RFC 29 form
    such as ``tuolumne[1001-1004]``): the nodes of a ``flux batch`` allocation, in
    broker-rank order, so its first host runs task 0 of a ``flux run`` over all of them."""
    import subprocess

    try:
        out = subprocess.run(["flux", "getattr", "hostlist"], capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError) as exc:
        raise ValueError(f"FLUX_TASK_RANK is set but `flux getattr hostlist` failed ({exc}); set MASTER_ADDR to "
                         "the first node's hostname") from None
    return out.stdout.strip()


def _flux_port(job_id: str | None) -> int:
    """A rendezvous port from a Flux job id (20000..39999): Flux prints ids in F58
    (``ƒ2Mq8...``) or decimal; non-decimal ids are hashed, so two jobs rarely collide."""
    import zlib

    if job_id and not job_id.isdigit():
        return 20000 + zlib.crc32(job_id.encode()) % 20000
    return _default_port(job_id)


MIN_TORCH = (2, 6)  # pyproject.toml's floor: the oldest torch a cluster profile loads (Perlmutter's pytorch/2.6.0)


def check_torch(version: str | None = None) -> None:
    """Refuse a torch older than :data:`MIN_TORCH` in one line naming both versions and the
    fix: a site module or a venv can bring an older one than pip's resolver would."""
    text = version if version is not None else _torch_version()
    found = tuple(int(p) for p in re.findall(r"\d+", text.split("+")[0])[:2])
    if found < MIN_TORCH:
        need = ".".join(map(str, MIN_TORCH))
        raise RuntimeError(f"scalegnn needs torch >= {need}, this python has torch {text}; load a newer module "
                           f"(e.g. `module load pytorch/{need}.0`) or `pip install 'torch>={need}'`")


def _torch_version() -> str:
    """The version of the torch this process runs: the loaded module's, else that of the
    installation ``import torch`` will load (the first on ``sys.path``), read from its
    metadata without loading it: torch loads after a run's first line
    (:func:`scalegnn.launch.launch`), this module at none of its imports."""
    if "torch" in sys.modules:
        return sys.modules["torch"].__version__
    from importlib import metadata

    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:  # a torch without metadata (a source tree on the path)
        import torch

        return torch.__version__


def detect_env() -> DistEnv:
    """Read rank, world size, local rank and the rendezvous address from the environment.

    Precedence: torchrun (``RANK``/``WORLD_SIZE``), submitit (``SUBMITIT_EXECUTOR``,
    via ``submitit.JobEnvironment()``), Flux (``FLUX_TASK_RANK``/``FLUX_JOB_SIZE``/
    ``FLUX_TASK_LOCAL_ID``, the first host of ``flux getattr hostlist``; before SLURM,
    because a Flux instance started under SLURM passes its broker's ``SLURM_*``
    variables on to every task), SLURM (``SLURM_PROCID``/``SLURM_NTASKS``), else a
    single process.
    """
    check_torch()  # the first thing every run does (launch, a joined rank, a sweep task)
    backend = "auto"  # the device decides (init_from_env): a visible GPU alone does not make a run use it
    env = os.environ
    if "RANK" in env and "WORLD_SIZE" in env:
        if "MASTER_ADDR" not in env or "MASTER_PORT" not in env:
            raise ValueError("RANK/WORLD_SIZE are set but MASTER_ADDR/MASTER_PORT are not; launch with torchrun")
        fix = _FIX["torchrun"]
        if not env["MASTER_PORT"].strip():
            raise ValueError(f"MASTER_PORT is empty; {_PORT_FIX}")
        world = _env_int("WORLD_SIZE", fix)  # LOCAL_WORLD_SIZE is torchrun's; without it, assume one node
        read_local_world = bool(env.get("LOCAL_WORLD_SIZE"))
        info = DistEnv(_env_int("RANK", fix), world, _env_int("LOCAL_RANK", fix) if "LOCAL_RANK" in env else 0,
                       backend, env["MASTER_ADDR"].strip(), _env_port(0), "torchrun",
                       local_world_size=_env_int("LOCAL_WORLD_SIZE", fix) if read_local_world else world)
        return _checked(info, _Source("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE" if read_local_world
                                      else None))
    if env.get("SUBMITIT_EXECUTOR"):
        import submitit

        job = submitit.JobEnvironment()
        addr = env.get("MASTER_ADDR", "").strip() or job.hostnames[0]
        port = _env_port(_default_port(str(job.raw_job_id)))
        # the ranks per node are estimated (tasks over nodes); a node holding local rank k holds k + 1 at least
        info = DistEnv(job.global_rank, job.num_tasks, job.local_rank, backend, addr, port, "submitit",
                       local_world_size=max(-(-job.num_tasks // max(1, job.num_nodes)), job.local_rank + 1))
        return _checked(info, _Source("submitit's global_rank", "submitit's num_tasks", "submitit's local_rank", None))
    if "FLUX_TASK_RANK" in env:
        if "FLUX_JOB_SIZE" not in env:
            raise ValueError("FLUX_TASK_RANK is set but FLUX_JOB_SIZE is not; launch the tasks with `flux run`")
        fix = _FIX["flux"]
        rank, world = _env_int("FLUX_TASK_RANK", fix), _env_int("FLUX_JOB_SIZE", fix)
        local = _env_int("FLUX_TASK_LOCAL_ID", fix) if "FLUX_TASK_LOCAL_ID" in env else 0
        if not 0 <= rank < world:  # before asking flux for its host list: the variables are wrong anyway
            _checked(DistEnv(rank, world, local, backend, "-", 1, "flux"), _Source(
                "FLUX_TASK_RANK", "FLUX_JOB_SIZE", "FLUX_TASK_LOCAL_ID", None))
        addr = env.get("MASTER_ADDR", "").strip() or first_host(_flux_hostlist())
        port = _env_port(_flux_port(env.get("FLUX_JOB_ID")))
        nodes = _env_int("FLUX_JOB_NNODES", fix) if env.get("FLUX_JOB_NNODES") else 1
        # the ranks per node are estimated (tasks over nodes; Flux may place them unevenly): bound the local id by
        # the job's tasks alone, and a node holding local id k holds k + 1 tasks at least
        info = DistEnv(rank, world, local, backend, addr, port, "flux",
                       local_world_size=max(-(-world // max(1, nodes)), local + 1))
        return _checked(info, _Source("FLUX_TASK_RANK", "FLUX_JOB_SIZE", "FLUX_TASK_LOCAL_ID", None))
    if "SLURM_PROCID" in env:
        if "SLURM_NTASKS" not in env:
            raise ValueError("SLURM_PROCID is set but SLURM_NTASKS is not; launch the job step with srun")
        fix = _FIX["slurm"]
        rank, world = _env_int("SLURM_PROCID", fix), _env_int("SLURM_NTASKS", fix)
        local = _env_int("SLURM_LOCALID", fix) if "SLURM_LOCALID" in env else 0
        if not 0 <= rank < world:  # before reading the node list: the variables are wrong anyway
            _checked(DistEnv(rank, world, local, backend, "-", 1, "slurm"), _Source(
                "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", None))
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST", "")
        addr = env.get("MASTER_ADDR", "").strip() or first_host(nodelist)
        port = _env_port(_default_port(env.get("SLURM_JOB_ID")))
        on_node = slurm_tasks_on_node(env)
        # a job step's tasks per node are SLURM's own; the batch script (no step) sees its allocation's, which
        # need not bound anything of a rank, for it is none
        per_node = next((v for v in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE")
                         if env.get(v)), None) if on_node and "SLURM_STEP_ID" in env else None
        info = DistEnv(rank, world, local, backend, addr, port, "slurm", local_world_size=on_node or world)
        return _checked(info, _Source("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", per_node))
    return DistEnv(0, 1, 0, backend, "127.0.0.1", 0, "single")


def slurm_tasks_on_node(env=os.environ) -> int | None:
    """The tasks of this SLURM job step on this node: ``SLURM_STEP_TASKS_PER_NODE`` (or
    ``SLURM_TASKS_PER_NODE``, compressed as ``"4(x2),3"``) at index ``SLURM_NODEID``, else
    ``SLURM_NTASKS_PER_NODE``; None when SLURM says neither."""
    text = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
    if text:
        counts = []
        for part in text.split(","):
            m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
            if m is None:
                counts = []
                break
            counts += [int(m.group(1))] * int(m.group(2) or 1)
        node = int(env.get("SLURM_NODEID", "0")) if env.get("SLURM_NODEID", "0").isdigit() else 0
        if counts:
            return counts[min(node, len(counts) - 1)]
    per_node = env.get("SLURM_NTASKS_PER_NODE", "")
    return int(per_node) if per_node.isdigit() else None


def init_from_env(timeout: datetime.timedelta = datetime.timedelta(minutes=10), backend: str | None = None,
                  device: str | None = None) -> DistEnv:
    """Initialize ``torch.distributed`` from the launcher's environment; returns the :class:`DistEnv`.

    ``device`` is the run's ``--device`` (default auto), resolved for this rank's
    local rank; ``backend`` the run's ``--backend`` (default: the device's). A single
    process (no launcher variables) is left uninitialized: use ``ProcessGrid.single()``.
    """
    import torch
    import torch.distributed as dist

    from ..device import resolve_backend, resolve_device

    info = detect_env()
    dev = resolve_device(device or "auto", info.local_rank)
    info = dataclasses.replace(info, backend=resolve_backend(backend or "auto", dev), device=str(dev))
    check_one_gpu_per_rank(str(device or "auto"), info.backend, info.local_world_size, info.source)
    if info.backend == "nccl" and info.local_rank >= torch.cuda.device_count():
        raise ValueError(f"local rank {info.local_rank} has no GPU of its own ({torch.cuda.device_count()} on this "
                         "node) and NCCL runs one rank per GPU: launch at most one rank per GPU per node, or use "
                         "--backend gloo (slow) or --device cpu")
    if info.source == "single" or dist.is_initialized():
        return info
    check_socket_ifnames()
    store = rendezvous(info, timeout)
    init_process_group(info.backend, dev, store=store, rank=info.rank, world_size=info.world_size, timeout=timeout)
    return info


class RendezvousTimeout(ValueError):
    """Not every rank of a launched job reached the rendezvous within the collective
    timeout; the message names who is missing (a user's error to fix: one line)."""


_POLL_S = 0.2  # how often a waiting rank asks the store who has joined (one small request)


def rendezvous(info: DistEnv, timeout: datetime.timedelta):
    """The job's store at MASTER_ADDR:MASTER_PORT once every rank has joined it, for
    ``torch.distributed`` to start from (what its ``tcp://`` rendezvous makes, without
    its wait: that one ends in a 40-line traceback saying only how many clients came).

    Rank 0 hosts the store (torchrun's agent does, under torchrun); each rank marks its
    arrival, then waits up to ``timeout`` for the others. Past it, a
    :class:`RendezvousTimeout` names the ranks that did not come; the first rank to time
    out leaves its message in the store, so that every rank that came ends with it at
    once. A rank that cannot reach the store within ``timeout`` says rank 0 did not open it."""
    import time

    import torch.distributed as dist

    deadline = time.monotonic() + timeout.total_seconds()
    where, seconds = f"{info.master_addr}:{info.master_port}", f"{timeout.total_seconds():g} s"
    hosts = info.rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"
    if not hosts:  # wait for rank 0's store here: the store client's own wait logs C++ stack frames on stderr
        _wait_for_listener(info, deadline, where, seconds)
    try:
        store = dist.TCPStore(info.master_addr, info.master_port, info.world_size, is_master=hosts, timeout=timeout,
                              wait_for_workers=False, multi_tenant=True)
    except dist.DistNetworkError as exc:
        if "EADDRINUSE" not in str(exc) and "address already in use" not in str(exc).lower():
            raise
        raise ValueError(f"MASTER_PORT {info.master_port} on {info.master_addr} is already in use (another job or "
                         "process listens there), so rank 0 cannot open the rendezvous: give the job a free port, "
                         "e.g. MASTER_PORT=$((20000 + RANDOM % 20000)), or torchrun --master-port") from None
    # torchrun's agent keeps its store across restarts of the workers: each attempt joins under its own keys
    prefix = (f"scalegnn/rendezvous/{os.environ.get('TORCHELASTIC_RUN_ID', '')}/"
              f"{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}")
    count, failed = f"{prefix}/joined", f"{prefix}/failed"
    store.set(f"{prefix}/rank/{info.rank}", socket.gethostname())
    joined = store.add(count, 1)
    while joined < info.world_size:
        if store.check([failed]):
            raise RendezvousTimeout(store.get(failed).decode())
        if time.monotonic() >= deadline:
            message = _rendezvous_timeout(store, prefix, store.add(count, 0), info.world_size, where, seconds)
            if message is None:  # the last rank came just now
                break
            store.set(failed, message)
            time.sleep(2 * _POLL_S)  # the ranks that came read it before this rank (rank 0: the store) goes
            raise RendezvousTimeout(message)
        time.sleep(_POLL_S)
        joined = store.add(count, 0)
    return store


def _wait_for_listener(info: DistEnv, deadline: float, where: str, seconds: str) -> None:
    """Wait until rank 0's store accepts connections at ``where`` (or the deadline passes)."""
    import time

    while True:
        left = deadline - time.monotonic()
        try:
            with socket.create_connection((info.master_addr, info.master_port), timeout=max(0.1, min(left, 2.0))):
                return
        except socket.gaierror as exc:
            raise ValueError(f"MASTER_ADDR={info.master_addr} names no host this one can resolve ({exc.strerror}); "
                             "set it to the host of rank 0, the same on every rank") from None
        except OSError:  # refused (rank 0 not started yet), unreachable for now, or slow: try again
            pass
        if time.monotonic() >= deadline:
            raise RendezvousTimeout(
                f"rendezvous at {where} timed out after {seconds}: rank {info.rank} of {info.world_size} found no "
                f"store there (rank 0 opens it); check that rank 0 was started, with the same MASTER_ADDR/MASTER_PORT "
                "as this rank, and that this host reaches it, or raise --collective-timeout")
        time.sleep(_POLL_S)


_NAMED_AT_MOST = 16  # missing ranks a timeout names; more are counted


def _rendezvous_timeout(store, prefix: str, joined: int, world: int, where: str, seconds: str) -> str | None:
    """The message of a rendezvous that timed out with ``joined`` of ``world`` ranks, naming
    the missing ranks (the store holds a key per rank that came); None if none is missing."""
    if joined >= world:
        return None
    head = f"rendezvous at {where} timed out after {seconds}: {joined} of {world} ranks joined"
    missing = [r for r in range(world) if not store.check([f"{prefix}/rank/{r}"])] if world <= 1024 else []
    named = ", ".join(map(str, missing[:_NAMED_AT_MOST])) + (f", ... ({len(missing)} in all)"
                                                            if len(missing) > _NAMED_AT_MOST else "")
    who = f"; rank{'s' if len(missing) > 1 else ''} {named} missing" if missing else ""
    return (f"{head}{who}; check that every rank was started, with the same MASTER_ADDR/MASTER_PORT and "
            "WORLD_SIZE, or raise --collective-timeout")


def check_one_gpu_per_rank(spec: str, backend: str, ranks_on_node: int, source: str) -> None:
    """Refuse ``--device cuda:N`` when NCCL ranks share a node: every rank would bind GPU
    N, and NCCL aborts with "Duplicate GPU detected" after the job has started. The
    ``--nproc`` path refuses it the same way (:func:`local_backend`); ``--backend gloo``
    (ranks sharing one GPU on purpose, for tests) is allowed."""
    if backend == "nccl" and ranks_on_node > 1 and spec.strip().lower().startswith("cuda:"):
        raise ValueError(f"--device {spec} with {ranks_on_node} ranks per node under {source}: NCCL runs one rank "
                         "per GPU, and every rank would take this one; use --device cuda (or auto: each rank takes "
                         "the GPU of its local rank), or --backend gloo to share one GPU")


def init_process_group(backend: str, device: torch.device, **kwargs) -> None:
    """``dist.init_process_group`` for a device backend. NCCL worlds get gloo beside
    NCCL for CPU tensors (the control traffic: checkpoint agreement, object gathers)
    and are bound to ``device``, which makes NCCL create its communicator at once and
    lets torch split it for the grid's axis groups instead of building each anew."""
    import torch
    import torch.distributed as dist

    if backend == "nccl":
        torch.cuda.set_device(device)
        dist.init_process_group("cpu:gloo,cuda:nccl", device_id=device, **kwargs)
    else:
        dist.init_process_group(backend, **kwargs)


# --------------------------------------------------------------------------- where the ranks run
def gather_placement(env: DistEnv) -> list[dict]:
    """Where every rank runs (:func:`scalegnn.records.placement_of`: host, local rank,
    device), in rank order (a collective: every rank of an initialized world calls it;
    a single process has its own entry alone)."""
    import torch.distributed as dist

    from ..records import placement_of

    mine = placement_of(env.rank, env.local_rank, env.device)
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [mine]
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    return every


SOCKET_IFNAME_VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


def check_socket_ifnames(environ=os.environ) -> None:
    """Refuse, in one line and before the rendezvous, a transport interface this host
    lacks: gloo and NCCL otherwise wait for peers they can never reach, or fail with a
    message that names no variable. Both take comma-separated names; NCCL's may start
    with ``^`` (exclude) or ``=`` (exact), which name interfaces that need not exist,
    and a trailing prefix match (``hsn`` for hsn0..hsn3) is NCCL's rule too."""
    present = {name for _, name in socket.if_nameindex()}
    for variable in SOCKET_IFNAME_VARIABLES:
        value = environ.get(variable, "").strip()
        if not value or value.startswith("^"):
            continue
        exact = value.startswith("=")
        wanted = [w.strip() for w in value.lstrip("=").split(",") if w.strip()]
        prefix_ok = variable == "NCCL_SOCKET_IFNAME" and not exact
        found = [w for w in wanted if w in present or (prefix_ok and any(p.startswith(w) for p in present))]
        if not found:
            raise ValueError(f"{variable}={value} names no network interface of {socket.gethostname()} (it has "
                             f"{', '.join(sorted(present))}); set it to one of those (the profile's "
                             "socket_ifname) or unset it")


# --------------------------------------------------------------------------- how a process takes part
# "joined": a rank of the job a launcher started; "local": this process starts the run's
# --nproc workers on this host; "in process": the whole run is this one process.
RUN_MODES = ("joined", "local", "in process")


def run_mode(parallel, env: DistEnv | None = None) -> str:
    """How this process takes part in a run of ``parallel`` (its
    :class:`~scalegnn.parallel.grid.ParallelConfig`), one of :data:`RUN_MODES`:

    - "joined" when a launcher started this process as one of several ranks and
      ``--nproc`` is unset or names that many ranks (a batch script's own process,
      which sees its allocation's SLURM variables but is no task of a job step, is not
      a rank: there ``--nproc`` starts local workers);
    - "local" when ``--nproc`` asks for several local workers;
    - "joined" as well for a multi-rank grid with neither (joining then reports that
      no launcher started the ranks, and how to start them);
    - "in process" otherwise: one process, the 1x1x1x1 grid of its run.
    """
    env = detect_env() if env is None else env
    if launched_rank(env) and parallel.nproc in (None, env.world_size):
        return "joined"
    if (parallel.nproc or 1) > 1:
        return "local"
    return "joined" if parallel.world_size > 1 else "in process"


def launched_rank(env: DistEnv) -> bool:
    """This process is one of several ranks a launcher started (not the batch script
    of a SLURM allocation, which sees the allocation's task count but is no task)."""
    return env.world_size > 1 and not _slurm_batch_script(env)


def _slurm_batch_script(env: DistEnv) -> bool:
    """The process is the batch script of a SLURM allocation, not a task of a job step:
    SLURM sets its allocation's task count there (SLURM_NTASKS), but only ``srun``
    starts the tasks, each with its step's id (SLURM_STEP_ID)."""
    return env.source == "slurm" and "SLURM_STEP_ID" not in os.environ


def single_env(parallel) -> DistEnv:
    """The :class:`DistEnv` of a run that is this one process: rank 0 of 1, on the run's
    device (``parallel``: its :class:`~scalegnn.parallel.grid.ParallelConfig`)."""
    from ..device import resolve_backend, resolve_device

    device = resolve_device(parallel.device)
    resolve_backend(parallel.backend, device)  # one process runs no collective, but --backend nccl on a CPU is a mistake
    return DistEnv(0, 1, 0, "none", "127.0.0.1", 0, "single", device=str(device))


def local_rank_env(rank: int, world: int, parallel, backend: str) -> DistEnv:
    """The :class:`DistEnv` of worker ``rank`` of a local job of ``world`` workers
    (a local worker's local rank is its rank: NCCL ranks take one GPU each)."""
    from ..device import resolve_device

    device = resolve_device(parallel.device, local_rank=rank)
    return DistEnv(rank, world, rank, backend, "", 0, "local", device=str(device), local_world_size=world)


# --------------------------------------------------------------------------- threads
def local_ranks_of_run(parallel) -> tuple[int, bool]:
    """(the processes of a run on this node, which share its cores; whether this process
    spawns them): the ranks of the job a launcher started on this node
    (:attr:`DistEnv.local_world_size`) when this process is one of them, else the
    ``--nproc`` local workers this process spawns, else 1."""
    info = detect_env()
    mode = run_mode(parallel, info)
    if mode == "joined" and info.world_size > 1:
        return info.local_world_size, False
    return (parallel.nproc, True) if mode == "local" else (1, False)


def threads_of_run(parallel) -> thread_policy.ThreadChoice:
    """The threads of each process of a run (``parallel``: its
    :class:`~scalegnn.parallel.grid.ParallelConfig`): the one this process applied for
    the run (:func:`run_threads`), else :func:`scalegnn.threads.choose` for its ``--threads``
    and its local ranks now. What a local job gives each worker."""
    current = thread_policy.applied()
    if current is not None and current.setting == parallel.threads:
        return current
    ranks, spawner = local_ranks_of_run(parallel)
    return thread_policy.choose(parallel.threads, ranks, spawner=spawner)


@contextlib.contextmanager
def run_threads(parallel):
    """Apply the run's thread choice to this process for the ``with`` block (the intra-op
    count it had comes back afterwards): a single process, a rank of a launched job, or
    the spawner of ``--nproc`` workers (which decides once for all of them, before any
    starts, and passes the choice on: :func:`threads_of_run`)."""
    ranks, spawner = local_ranks_of_run(parallel)
    choice = thread_policy.choose(parallel.threads, ranks, spawner=spawner)
    log.debug("threads: %s", choice.reason)
    with thread_policy.using(choice):
        yield choice


def free_port() -> int:
    """A TCP port free right now (for launchers that need one; racy by nature)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def local_backend(parallel, nproc: int) -> str:
    """The backend of ``nproc`` local workers of a run (``parallel``: its
    :class:`~scalegnn.parallel.grid.ParallelConfig`; rank r on GPU r % count). NCCL
    refuses two ranks on one GPU, so more GPU ranks than GPUs need ``--backend gloo``."""
    import torch

    from ..device import resolve_backend, resolve_device

    device = resolve_device(parallel.device, local_rank=0)
    backend = resolve_backend(parallel.backend, device)
    if backend == "nccl" and nproc > 1 and ":" in parallel.device:
        raise ValueError(f"--device {parallel.device} with --nproc {nproc}: NCCL runs one rank per GPU, so the ranks "
                         "take GPUs 0..N-1; use --device cuda (or auto), or --backend gloo to share one GPU")
    if backend == "nccl" and nproc > torch.cuda.device_count():
        raise ValueError(f"--nproc {nproc} on {torch.cuda.device_count()} GPU(s): NCCL runs one rank per GPU; "
                         f"use --nproc {torch.cuda.device_count()} or fewer, --backend gloo to let ranks share "
                         "GPUs (slow, for tests), or --device cpu")
    return backend
