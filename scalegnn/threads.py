"""Threads of a training process: how many intra-op and inter-op threads torch uses,
and how OpenMP's idle threads wait.

Why a policy. Torch's default is one intra-op thread per core of the machine, and
OpenMP's default wait lets a thread that reaches the end of a parallel region spin
before it sleeps. On a machine that other processes share (two runs side by side, a
second job on the node, several ranks of one job), every parallel region then waits
for its slowest thread, which shares a core with somebody else, while its idle
threads burn the cycles that thread needs: a two-epoch run on two busy cores took
74.5 s with torch's two threads and 23.2 s with one.

The policy (``--threads``, :func:`decide`):

* ``auto`` (the default): the cores this process may use (its CPU affinity, and the
  cgroup's CPU quota when one is set), less the cores other processes keep busy now
  (sampled from ``/proc/stat`` over :data:`SAMPLE_S`, once per process), shared among the local ranks
  of the run that run on the same cores, at least 1 and never more than
  ``OMP_NUM_THREADS`` when that is set. A core counts as free when at least
  :data:`FREE_SHARE` of it is idle: a thread on a core another process keeps busy
  sets the pace of every parallel region (they split their work evenly).
* ``N``: exactly N threads per process, whatever the machine says (recorded as given).

The busy cores are sampled from ``/proc/stat`` rather than read from the load
average because the sample (1) is of now, where the 1-minute load average still
counts a job that ended seconds ago and has not yet seen one that just started,
(2) is per CPU, so it covers only the CPUs this process may run on, where the load
average counts every task of the host (of every container, in a container), and
(3) is bounded by the cores, so "free = cores - busy" needs no guess of how many
runnable tasks a core serves. Where ``/proc/stat`` cannot be read (not Linux) the
load average stands in.

Inter-op threads (``torch.set_num_interop_threads``, allowed once per process and
only before the inter-op pool starts) are set to the same count where still possible.

Passive waiting. ``OMP_WAIT_POLICY=PASSIVE`` makes an idle OpenMP thread sleep at
once instead of spinning; the OpenMP runtime reads it once, when it is loaded (with
torch), so it must be in the environment before torch is imported:
:func:`prepare_process` does that for the command line (``scalegnn`` and ``python -m
scalegnn`` call it first), and :mod:`scalegnn.launch.job` puts it in the
environment its local ranks start with. A value the user exported is kept.

What was chosen, from what, and how OpenMP waits goes into the run record
(``env.threads``, :func:`record`). This module imports torch only when it applies a
choice, so that :func:`prepare_process` can run before torch is loaded.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from dataclasses import dataclass, field

__all__ = ["AUTO", "SAMPLE_S", "FREE_SHARE", "WAIT_ENV", "ThreadChoice", "thread_setting", "decide", "choose",
           "apply", "applied", "using", "prepare_process", "inherited_process", "record", "machine_inputs",
           "parse_cpu_list", "parse_cpu_max", "cgroup_cpu_quota", "busy_cores", "omp_num_threads"]

AUTO = "auto"
SAMPLE_S = 0.2  # long enough for 20 clock ticks per CPU (2.5 % steps on 2 cores), short beside any run's start-up
FREE_SHARE = 0.75  # a core counts as free when at least this share of it is idle
WAIT_ENV = {"OMP_WAIT_POLICY": "PASSIVE"}  # read by libgomp and LLVM's libomp alike (OpenMP standard)


def thread_setting(value) -> str | int:
    """``--threads``: ``auto`` or a whole number >= 1 (ints pass through)."""
    if isinstance(value, str) and value.strip().lower() == AUTO:
        return AUTO
    text = str(value).strip()
    if isinstance(value, bool) or not text.isdigit() or int(text) < 1:
        raise ValueError(f"--threads must be 'auto' or a whole number >= 1 (intra-op threads per process), got "
                         f"{value!r}; use --threads auto to let the cores free decide")
    return int(text)


@dataclass(frozen=True)
class ThreadChoice:
    """Threads for one process: ``intra_op`` (``torch.set_num_threads``), ``inter_op``
    (``torch.set_num_interop_threads``), the ``setting`` they come from (``auto`` or N),
    a one-line ``reason`` and the ``inputs`` of the decision (see :func:`decide`)."""

    setting: str | int
    intra_op: int
    inter_op: int
    reason: str
    inputs: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"setting": self.setting, "intra_op": self.intra_op, "inter_op": self.inter_op,
                "reason": self.reason, "inputs": dict(self.inputs)}


def omp_num_threads(text: str | None) -> int | None:
    """The first level of ``OMP_NUM_THREADS`` (``"4"``, ``"4,2"``), None when unset or unreadable."""
    head = (text or "").split(",")[0].strip()
    return int(head) if head.isdigit() and int(head) >= 1 else None


def decide(setting="auto", *, cpus: int, quota: float | None = None, busy: float | None = None,
           local_ranks: int = 1, pinned: bool = False, omp_threads: int | None = None,
           busy_source: str | None = None, sample_s: float | None = None) -> ThreadChoice:
    """The thread count for ``setting`` on a machine described by the inputs (a pure function).

    ``cpus``: the CPUs this process may run on (its affinity); ``quota``: the cgroup's
    CPU quota in cores (None: no quota); ``busy``: cores other processes keep busy on
    those CPUs (None: not measured, taken as idle); ``local_ranks``: the processes of
    this run on this node; ``pinned``: the launcher gave this process CPUs of its own
    (its affinity is a strict subset of its parent's), so the local ranks do not share
    them; ``omp_threads``: ``OMP_NUM_THREADS`` when set (a ceiling for ``auto``).

    ``auto``: usable = min(cpus, floor(quota)); sharing = 1 if pinned else local ranks;
    free = min(usable, cpus - busy); threads = floor(free / sharing + 1 - FREE_SHARE),
    clamped to [1, min(usable // sharing, omp_threads)]. ``N``: N.
    """
    setting = thread_setting(setting)
    if cpus < 1 or local_ranks < 1:
        raise ValueError(f"cpus and local_ranks must be >= 1, got {cpus} and {local_ranks}")
    usable = max(1, min(cpus, math.floor(quota + 1e-9))) if quota is not None else cpus
    sharing = 1 if pinned else local_ranks
    inputs = {"cpus": cpus, "cpu_quota": quota, "usable_cores": usable, "busy_cores": busy,
              "busy_source": busy_source, "sample_s": sample_s, "local_ranks": local_ranks, "pinned": pinned,
              "sharing_ranks": sharing, "omp_num_threads": omp_threads}
    if setting != AUTO:
        over = setting * sharing > usable
        return ThreadChoice(setting, setting, setting, f"--threads {setting} (given)"
                            + (f"; {setting} x {sharing} rank(s) > {usable} usable cores" if over else ""), inputs)
    fair = max(1, usable // sharing)
    ceiling = min(fair, omp_threads) if omp_threads is not None else fair
    free = max(0.0, min(float(usable), cpus - (busy or 0.0)))
    by_load = math.floor(free / sharing + (1.0 - FREE_SHARE) + 1e-9)
    threads = max(1, min(ceiling, by_load))
    why = f"auto: {usable} usable core(s)"
    if busy is not None:
        why += f", {busy:.2f} busy"
    why += f", {sharing} rank(s) sharing them"
    if omp_threads is not None and omp_threads < fair:
        why += f", OMP_NUM_THREADS={omp_threads}"
    return ThreadChoice(AUTO, threads, threads, f"{why} -> {threads}", inputs)


# ---------------------------------------------------------------------------- the machine
def parse_cpu_list(text: str) -> set[int]:
    """``"0-3,8,10-11"`` (a Linux CPU list) -> {0, 1, 2, 3, 8, 10, 11}."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def parse_cpu_max(text: str) -> float | None:
    """A cgroup v2 ``cpu.max`` (``"max 100000"``, ``"150000 100000"``) in cores; None: no quota."""
    parts = text.split()
    if not parts or parts[0] == "max":
        return None
    period = int(parts[1]) if len(parts) > 1 else 100000
    return int(parts[0]) / period if int(parts[0]) > 0 and period > 0 else None


def cgroup_cpu_quota(root: str = "/sys/fs/cgroup", proc_cgroup: str = "/proc/self/cgroup") -> float | None:
    """The tightest CPU quota (in cores) on this process's cgroup and its ancestors
    (cgroup v2 ``cpu.max``, v1 ``cpu.cfs_quota_us / cpu.cfs_period_us``); None without one."""
    try:
        with open(proc_cgroup) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    quotas = []
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and not controllers:  # v2: one tree, cpu.max per folder
            bases, read = [root], lambda d: _read(os.path.join(d, "cpu.max"), parse_cpu_max)
        elif "cpu" in controllers.split(","):  # v1: the cpu controller's own tree
            bases = [os.path.join(root, controllers), os.path.join(root, "cpu"), os.path.join(root, "cpu,cpuacct")]
            read = _v1_quota
        else:
            continue
        for base in dict.fromkeys(bases):
            # Inside a container the folder of ``path`` may not exist (the mount is the
            # container's own cgroup): its ancestors, down to the mount, are tried.
            folder = os.path.normpath(os.path.join(base, path.lstrip("/")))
            while True:
                q = read(folder)
                if q is not None:
                    quotas.append(q)
                if os.path.normpath(folder) == os.path.normpath(base):
                    break
                folder = os.path.dirname(folder)
    return min(quotas) if quotas else None


def _read(path: str, parse):
    try:
        with open(path) as f:
            return parse(f.read())
    except (OSError, ValueError):
        return None


def _v1_quota(folder: str) -> float | None:
    quota = _read(os.path.join(folder, "cpu.cfs_quota_us"), int)
    period = _read(os.path.join(folder, "cpu.cfs_period_us"), int)
    return quota / period if quota is not None and quota > 0 and period else None


def _proc_stat_cpus(text: str) -> dict[int, tuple[int, int]]:
    """{cpu: (busy ticks, all ticks)} from ``/proc/stat``: idle and iowait are idle; steal
    (taken by the hypervisor) is busy, since this process cannot have it either."""
    out = {}
    for line in text.splitlines():
        if not line.startswith("cpu") or line.startswith("cpu "):
            continue
        name, *values = line.split()
        ticks = [int(v) for v in values[:8]]  # user nice system idle iowait irq softirq steal
        idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
        out[int(name[3:])] = (sum(ticks) - idle, sum(ticks))
    return out


def busy_cores(cpus, sample_s: float = SAMPLE_S, stat_path: str = "/proc/stat") -> float | None:
    """Cores kept busy by other processes on ``cpus`` over ``sample_s`` seconds (this
    process's own CPU time in the window is taken off); None where /proc/stat cannot be read."""
    try:
        with open(stat_path) as f:
            first = _proc_stat_cpus(f.read())
        own0, t0 = _own_cpu_s(), time.monotonic()
        time.sleep(sample_s)
        with open(stat_path) as f:
            second = _proc_stat_cpus(f.read())
        own = (_own_cpu_s() - own0) / max(time.monotonic() - t0, 1e-6)
    except (OSError, ValueError, IndexError):
        return None
    busy = 0.0
    for cpu in cpus:
        if cpu in first and cpu in second:
            d_busy, d_all = second[cpu][0] - first[cpu][0], second[cpu][1] - first[cpu][1]
            busy += d_busy / d_all if d_all > 0 else 0.0
    return round(max(0.0, busy - own), 3)


def _own_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def _affinity() -> set[int]:
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux: every CPU
        return set(range(os.cpu_count() or 1))


def _pinned(mine: set[int]) -> bool:
    """The launcher gave this process CPUs of its own: its affinity is a strict subset of
    its parent's (``srun --cpu-bind``, ``numactl`` per rank). False when unknown."""
    try:
        with open(f"/proc/{os.getppid()}/status") as f:
            line = next(ln for ln in f if ln.startswith("Cpus_allowed_list:"))
        return mine < parse_cpu_list(line.split(":", 1)[1])
    except (OSError, StopIteration, ValueError):
        return False


_sample: dict | None = None  # this process's one load sample (see machine_inputs)


def machine_inputs(local_ranks: int = 1, *, sample: bool = True, sample_s: float = SAMPLE_S) -> dict:
    """The inputs of :func:`decide` read from this machine (``busy`` only with ``sample``).

    The load is sampled once per process and reused: a process that trains several runs
    (the Python API, a notebook, the tests) gives each the same count, so that the same
    seed gives the same numbers in it (a reduction's rounding depends on its threads)."""
    global _sample
    mine = _affinity()
    inputs = {"cpus": len(mine), "quota": cgroup_cpu_quota(), "local_ranks": max(1, int(local_ranks)),
              "pinned": _pinned(mine), "omp_threads": omp_num_threads(os.environ.get("OMP_NUM_THREADS"))}
    if sample:
        if _sample is None:
            busy, source = busy_cores(mine, sample_s), "/proc/stat"
            if busy is None and hasattr(os, "getloadavg"):
                busy, source = min(float(len(mine)), os.getloadavg()[0]), "loadavg"
            _sample = {"busy": busy, "busy_source": source if busy is not None else None,
                       "sample_s": sample_s if source == "/proc/stat" and busy is not None else None}
        inputs.update(_sample)
    return inputs


def choose(setting="auto", local_ranks: int = 1, *, spawner: bool = False, sample_s: float = SAMPLE_S) -> ThreadChoice:
    """:func:`decide` on this machine. ``spawner``: the local ranks are workers this
    process starts, which inherit its CPUs, so they share them however it is pinned.
    The busy cores are sampled only when they can change the answer (``auto`` with
    more than one thread possible)."""
    setting = thread_setting(setting)
    inputs = machine_inputs(local_ranks, sample=False)
    if setting == AUTO and decide(AUTO, **{**inputs, "pinned": inputs["pinned"] and not spawner}).intra_op > 1:
        inputs = machine_inputs(local_ranks, sample=True, sample_s=sample_s)  # more than one thread is possible
    return decide(setting, **{**inputs, "pinned": inputs["pinned"] and not spawner})


# ---------------------------------------------------------------------------- this process
_applied: ThreadChoice | None = None
_wait: dict | None = None  # how this process's OpenMP runtime was told to wait, when known


def apply(choice: ThreadChoice) -> ThreadChoice:
    """Set torch's threads of this process to ``choice`` (inter-op threads only where torch
    still allows it: once per process, before the inter-op pool starts) and remember it
    for the run record."""
    global _applied
    import torch

    torch.set_num_threads(choice.intra_op)
    try:
        torch.set_num_interop_threads(choice.inter_op)
    except RuntimeError:  # set before in this process, or inter-op work started: torch keeps its count
        pass
    _applied = choice
    return choice


def applied() -> ThreadChoice | None:
    """The choice :func:`apply` last made in this process (None: torch's own defaults)."""
    return _applied


@contextlib.contextmanager
def using(choice: ThreadChoice):
    """:func:`apply` ``choice`` for the ``with`` block, then give back the intra-op count
    the process had (a run through the Python API leaves its caller's threads as they were)."""
    global _applied
    import torch

    before, previous = torch.get_num_threads(), _applied
    apply(choice)
    try:
        yield choice
    finally:
        torch.set_num_threads(before)
        _applied = previous


def prepare_process() -> None:
    """Put :data:`WAIT_ENV` in the environment where unset; call it before torch is
    imported (the command line's first step). Notes whether it came in time: the
    OpenMP runtime reads the variable once, when torch loads it."""
    global _wait
    before_torch = "torch" not in sys.modules
    given = os.environ.get("OMP_WAIT_POLICY")
    for key, value in WAIT_ENV.items():
        os.environ.setdefault(key, value)
    if _wait is None:
        _wait = {"omp_wait_policy": os.environ.get("OMP_WAIT_POLICY") if before_torch else given,
                 "omp_wait_policy_known": True if before_torch else given is None}


def inherited_process() -> None:
    """A local rank started by :mod:`scalegnn.launch.job`: its environment was fixed
    before its interpreter (or the fork server it comes from) imported torch, so the
    OpenMP runtime waits as ``OMP_WAIT_POLICY`` in it says."""
    global _wait
    _wait = {"omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"), "omp_wait_policy_known": True}


def record() -> dict:
    """``env.threads`` of the run record: the choice applied in this process (``setting``,
    ``intra_op``, ``inter_op``, ``reason``, ``inputs``; torch's own counts and a null
    setting when none was), and ``omp_wait_policy`` (null: the runtime's default) with
    ``omp_wait_policy_known`` (false where torch was loaded before scalegnn could set it,
    e.g. a run through the Python API in a process that had imported torch)."""
    import torch

    out = _applied.as_dict() if _applied is not None else {"setting": None, "reason": "torch's defaults",
                                                            "inputs": {}}
    out.update(intra_op=torch.get_num_threads(), inter_op=torch.get_num_interop_threads())
    out.update(_wait if _wait is not None else
               {"omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"), "omp_wait_policy_known": False})
    return out
