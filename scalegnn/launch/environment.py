"""Process start-up: join a launched job (torchrun / SLURM / submitit / Flux) or spawn local workers.

:func:`init_from_env` initializes ``torch.distributed`` from the environment a
launcher left behind, always with an explicit timeout. :func:`spawn` starts
``nprocs`` local workers, runs ``fn(rank, world, *args)`` in each and returns their
results; a failing or dying worker makes it terminate the others and raise
:class:`WorkerError` naming the rank, and a global deadline guarantees it never
hangs. The distributed tests use it.

Device and backend. Each rank computes on the device its run asks for
(:func:`scalegnn.device.resolve_device`: the local rank's GPU when one is visible
and ``--device`` is auto or cuda) and the backend follows it: NCCL (RCCL on ROCm)
for GPU tensors, gloo for CPU tensors. An NCCL world also carries gloo for the
host-side control traffic (checkpoint agreement, object gathers), and is bound to
the rank's GPU so that torch creates the axis groups by splitting its communicator.

Threads (:mod:`scalegnn.threads`): :func:`run_threads` applies a run's ``--threads``
choice to the process that runs it, counting the local ranks that share the node's
cores (:func:`local_ranks_of_run`); :func:`spawn` hands the same choice to each local
worker and starts the workers with OpenMP's passive wait in their environment.

Failing fast (a job never hangs, never leaves processes behind): every collective,
including those of the grid's axis groups, times out after the run's
``collective_timeout_s``, so a rank that stops answering makes its peers raise; a
rank that dies is seen by the spawner at once (its process sentinel); the spawner
then stops every worker (SIGTERM, then SIGKILL) and raises :class:`WorkerError`
with every rank's report (:mod:`scalegnn.run` turns it into the ``failed`` record).
Workers watch the spawner and exit within a second when it is killed. Under
torchrun / srun, the failing rank exits non-zero and the launcher stops the others
(``srun --kill-on-bad-exit=1``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import logging
import multiprocessing
import multiprocessing.connection
import os
import pickle
import re
import shutil
import socket
import tempfile
import time
import traceback
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .. import threads as thread_policy
from ..signals import Interrupted, held, stop_on_signals

__all__ = ["DistEnv", "init_from_env", "init_process_group", "first_host", "spawn", "local_backend", "WorkerError",
           "SpawnTimeout", "free_port", "run_threads", "threads_of_run", "local_ranks_of_run"]

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
    source: str  # "torchrun" | "slurm" | "submitit" | "flux" | "single"
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


def _env_int(name: str) -> int:
    try:
        return int(os.environ[name])
    except ValueError as e:
        raise ValueError(f"environment variable {name}={os.environ[name]!r} must be an integer") from e


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


def detect_env() -> DistEnv:
    """Read rank, world size, local rank and the rendezvous address from the environment.

    Precedence: torchrun (``RANK``/``WORLD_SIZE``), submitit (``SUBMITIT_EXECUTOR``,
    via ``submitit.JobEnvironment()``), Flux (``FLUX_TASK_RANK``/``FLUX_JOB_SIZE``/
    ``FLUX_TASK_LOCAL_ID``, the first host of ``flux getattr hostlist``; before SLURM,
    because a Flux instance started under SLURM passes its broker's ``SLURM_*``
    variables on to every task), SLURM (``SLURM_PROCID``/``SLURM_NTASKS``), else a
    single process.
    """
    backend = "auto"  # the device decides (init_from_env): a visible GPU alone does not make a run use it
    env = os.environ
    if "RANK" in env and "WORLD_SIZE" in env:
        if "MASTER_ADDR" not in env or "MASTER_PORT" not in env:
            raise ValueError("RANK/WORLD_SIZE are set but MASTER_ADDR/MASTER_PORT are not; launch with torchrun")
        world = _env_int("WORLD_SIZE")  # LOCAL_WORLD_SIZE is torchrun's; without it, assume one node
        return DistEnv(_env_int("RANK"), world, int(env.get("LOCAL_RANK", 0)), backend,
                       env["MASTER_ADDR"], _env_int("MASTER_PORT"), "torchrun",
                       local_world_size=_env_int("LOCAL_WORLD_SIZE") if env.get("LOCAL_WORLD_SIZE") else world)
    if env.get("SUBMITIT_EXECUTOR"):
        import submitit

        job = submitit.JobEnvironment()
        addr = env.get("MASTER_ADDR") or job.hostnames[0]
        port = int(env.get("MASTER_PORT") or _default_port(str(job.raw_job_id)))
        return DistEnv(job.global_rank, job.num_tasks, job.local_rank, backend, addr, port, "submitit",
                       local_world_size=-(-job.num_tasks // max(1, job.num_nodes)))
    if "FLUX_TASK_RANK" in env:
        if "FLUX_JOB_SIZE" not in env:
            raise ValueError("FLUX_TASK_RANK is set but FLUX_JOB_SIZE is not; launch the tasks with `flux run`")
        rank, world = _env_int("FLUX_TASK_RANK"), _env_int("FLUX_JOB_SIZE")
        local = _env_int("FLUX_TASK_LOCAL_ID") if "FLUX_TASK_LOCAL_ID" in env else 0
        addr = env.get("MASTER_ADDR") or first_host(_flux_hostlist())
        port = int(env.get("MASTER_PORT") or _flux_port(env.get("FLUX_JOB_ID")))
        nodes = _env_int("FLUX_JOB_NNODES") if env.get("FLUX_JOB_NNODES") else 1
        return DistEnv(rank, world, local, backend, addr, port, "flux", local_world_size=-(-world // max(1, nodes)))
    if "SLURM_PROCID" in env:
        if "SLURM_NTASKS" not in env:
            raise ValueError("SLURM_PROCID is set but SLURM_NTASKS is not; launch the job step with srun")
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST", "")
        addr = env.get("MASTER_ADDR") or first_host(nodelist)
        port = int(env.get("MASTER_PORT") or _default_port(env.get("SLURM_JOB_ID")))
        world = _env_int("SLURM_NTASKS")
        return DistEnv(_env_int("SLURM_PROCID"), world, int(env.get("SLURM_LOCALID", 0)),
                       backend, addr, port, "slurm", local_world_size=slurm_tasks_on_node(env) or world)
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
    from ..device import resolve_backend, resolve_device

    info = detect_env()
    dev = resolve_device(device or "auto", info.local_rank)
    info = dataclasses.replace(info, backend=resolve_backend(backend or "auto", dev), device=str(dev))
    if info.backend == "nccl" and info.local_rank >= torch.cuda.device_count():
        raise ValueError(f"local rank {info.local_rank} has no GPU of its own ({torch.cuda.device_count()} on this "
                         "node) and NCCL runs one rank per GPU: launch at most one rank per GPU per node, or use "
                         "--backend gloo (slow) or --device cpu")
    if info.source == "single" or dist.is_initialized():
        return info
    init_process_group(info.backend, dev, init_method=f"tcp://{info.master_addr}:{info.master_port}",
                       rank=info.rank, world_size=info.world_size, timeout=timeout)
    return info


def init_process_group(backend: str, device: torch.device, **kwargs) -> None:
    """``dist.init_process_group`` for a device backend. NCCL worlds get gloo beside
    NCCL for CPU tensors (the control traffic: checkpoint agreement, object gathers)
    and are bound to ``device``, which makes NCCL create its communicator at once and
    lets torch split it for the grid's axis groups instead of building each anew."""
    if backend == "nccl":
        torch.cuda.set_device(device)
        dist.init_process_group("cpu:gloo,cuda:nccl", device_id=device, **kwargs)
    else:
        dist.init_process_group(backend, **kwargs)


# --------------------------------------------------------------------------- local spawn
class WorkerError(RuntimeError):
    """A spawned worker failed: ``rank`` (None for a global timeout) and its traceback text.

    ``errors`` holds every rank's report gathered before the workers were stopped
    ({rank: text}); ``run_record`` rank 0's partial run record when it sent one;
    ``user_error`` is True when the failure is a configuration or data error raised
    before training started (a ``ValueError``: the CLI prints it as one line).
    """

    def __init__(self, rank: int | None, traceback_text: str, errors: dict | None = None,
                 run_record: dict | None = None, user_error: bool = False, message: str | None = None):
        self.rank = rank
        self.traceback_text = traceback_text
        self.errors = dict(errors or {})
        self.run_record = run_record
        self.user_error = user_error
        self.message = message
        self.record_path: str | None = None
        head = f"worker rank {rank} failed" if rank is not None else "spawned workers failed"
        super().__init__(f"{head}:\n{traceback_text}")


class SpawnTimeout(WorkerError):
    """The workers did not all finish within ``timeout_s``."""


def _context():
    """A forkserver context preloading torch: each worker forks from a warm interpreter
    (tens of ms) instead of importing torch afresh (seconds on a small box). The
    preload takes effect when the fork server first starts and is reused after."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed", "scalegnn.parallel.launch"])
    return ctx


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (dead, not yet reaped) counts as dead
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _watch_parent(parent_pid: int, period_s: float = 1.0) -> None:
    """Exit this worker when the spawning process is gone: no orphan keeps training
    (or holding a GPU) after its launcher was killed. A daemon thread."""
    import threading

    def watch():
        while True:
            time.sleep(period_s)
            if not _pid_alive(parent_pid):
                os._exit(70)

    threading.Thread(target=watch, name="scalegnn-parent-watch", daemon=True).start()


def _name_process(rank: int) -> None:
    """``scalegnn-r<rank>`` in ps/top (Linux /proc/self/comm, 15 chars at most)."""
    try:
        with open("/proc/self/comm", "w") as f:
            f.write(f"scalegnn-r{rank}"[:15])
    except OSError:
        pass


def _worker(rank, world, rendezvous, timeout_s, threads, conn, fn, args, parent_pid=None, backend="gloo"):
    _name_process(rank)
    if parent_pid is not None:
        _watch_parent(parent_pid)
    # SIGINT/SIGTERM (forwarded by the spawner, or Ctrl-C reaching the whole process
    # group) stops this rank like any failure: it reports (rank 0 its partial record) and exits.
    with stop_on_signals():
        payload = _run_rank(rank, world, rendezvous, timeout_s, threads, fn, args, backend)
        with held():  # a report cut short would read as a crash
            try:
                conn.send_bytes(payload)
                conn.close()
            except OSError:
                pass  # the spawner no longer listens (it is stopping every rank): nothing left to tell
            finally:
                if dist.is_initialized():
                    try:
                        dist.destroy_process_group()
                    except Exception:  # noqa: BLE001 - exiting anyway
                        pass


def _run_rank(rank, world, rendezvous, timeout_s, threads, fn, args, backend) -> bytes:
    """Join the spawner's group, run ``fn``; its result or failure, pickled for the spawner."""
    try:
        thread_policy.inherited_process()  # the spawner set this process's OpenMP wait before torch loaded
        thread_policy.apply(threads)
        timeout = datetime.timedelta(seconds=timeout_s)
        # The ranks meet in a file of the spawner's private folder (no TCP listener anyone
        # could join or poison), and gloo's own connections stay on the loopback device.
        os.environ.setdefault("GLOO_SOCKET_IFNAME", _loopback_interface())
        store = dist.FileStore(rendezvous, world)
        # A local worker's local rank is its rank (whatever a surrounding job's variables say,
        # e.g. SLURM_LOCALID of a one-task allocation): NCCL ranks take one GPU each.
        os.environ["LOCAL_RANK"] = str(rank)
        device = torch.device("cuda", rank % torch.cuda.device_count()) if backend == "nccl" else None
        init_process_group(backend, device, store=store, rank=rank, world_size=world, timeout=timeout)
        result = fn(rank, world, *args)
        return pickle.dumps(("ok", result), protocol=pickle.HIGHEST_PROTOCOL)
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the parent
        record = getattr(exc, "run_record", None)
        info = {"user_error": isinstance(exc, (ValueError, FileNotFoundError)) and record is None,
                "message": f"{exc}", "run_record": record}
        try:
            return pickle.dumps(("err", traceback.format_exc(), info))
        except Exception:  # noqa: BLE001 - an unpicklable record: send the text alone
            return pickle.dumps(("err", traceback.format_exc(), {**info, "run_record": None}))


def _stop(procs, grace_s: float = 2.0) -> None:
    for p in procs:
        if p.is_alive():
            p.terminate()
    end = time.monotonic() + grace_s
    for p in procs:
        p.join(max(0.0, end - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join(1.0)


def _exit_text(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            import signal

            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        hint = " (the kernel's OOM killer, the scheduler, or a user)" if -code == 9 else ""
        return f"was killed by {name}{hint} before returning a result"
    return f"exited with code {code} before returning a result"


# Messages of ranks that fail only because a peer died or stopped answering: the
# first error reported is the one whose message is not of this kind, if any.
_SECONDARY = ("connection closed by peer", "connection reset", "broken pipe", "timed out", "timeout",
              "socket closed", "connection refused", "read error", "no route", "peer")


def _secondary(text: str) -> bool:
    tail = "\n".join(text.strip().splitlines()[-3:]).lower()
    return any(s in tail for s in _SECONDARY)


def spawn(fn, nprocs: int, *args, timeout_s: float | None = 120.0,
          threads_per_worker: "int | thread_policy.ThreadChoice" = 1, collective_timeout_s: float | None = None,
          report_grace_s: float = 3.0, backend: str = "gloo", stop_grace_s: float = 10.0) -> list:
    """Run ``fn(rank, nprocs, *args)`` in ``nprocs`` local workers; return their results.

    ``backend`` is "gloo" (CPU tensors, and GPU tensors staged through the host: how
    several ranks share one GPU) or "nccl" (rank r on GPU r, one rank per GPU).

    Threads: each worker applies ``threads_per_worker`` (a count, or the run's
    :class:`scalegnn.threads.ThreadChoice`, :func:`threads_of_run`) before ``fn``, and
    starts with :data:`scalegnn.threads.WAIT_ENV` in its environment (put into this
    process's environment where unset, before the first worker or the fork server
    starts: OpenMP reads it when torch loads), so its idle OpenMP threads sleep.

    ``fn`` must be importable (a module-level function) and its results picklable.
    The workers meet in a file store in a private folder of this user (mode 0700,
    removed afterwards): a local run opens no rendezvous port that another machine
    or user could join, and gloo's connections use the loopback device (unless
    ``GLOO_SOCKET_IFNAME`` says otherwise). The parent waits on every worker's pipe
    and process sentinel. On the first error
    or unexpected exit it waits at most ``report_grace_s`` for the other ranks to
    report (ranks blocked on the lost peer fail at once; their reports, and rank 0's
    partial run record, make the error message), then terminates the rest (SIGTERM,
    then SIGKILL) and raises :class:`WorkerError` naming the first failing rank.
    After ``timeout_s`` seconds in all it kills everything and raises
    :class:`SpawnTimeout` (``None``: no deadline, for training runs).

    Bounded failure time: a rank that dies is seen at once (its sentinel); a rank that
    hangs makes its peers' collectives fail after ``collective_timeout_s`` (default:
    ``timeout_s``, or 30 minutes without one). Workers exit by themselves within a
    second or two when this process dies, so none is left orphaned.

    Stopping: when :class:`scalegnn.signals.Interrupted` reaches this process (SIGINT
    or SIGTERM under :func:`scalegnn.signals.stop_on_signals`), the signal is
    forwarded to every worker, which stops and reports; after at most
    ``stop_grace_s`` the rest are terminated and the exception is re-raised with
    ``run_record`` (rank 0's partial record, if it sent one) and ``results``.
    """
    if nprocs < 1:
        raise ValueError(f"nprocs must be >= 1, got {nprocs}")
    if not isinstance(threads_per_worker, thread_policy.ThreadChoice):
        threads_per_worker = thread_policy.choose(threads_per_worker, nprocs, spawner=True)
    for key, value in thread_policy.WAIT_ENV.items():
        os.environ.setdefault(key, value)  # inherited by the fork server (started below, once) and every worker
    ctx = _context()
    if collective_timeout_s is None:
        collective_timeout_s = 1800.0 if timeout_s is None else timeout_s
    pg_timeout = float(collective_timeout_s)
    private = tempfile.mkdtemp(prefix="scalegnn-rendezvous-")  # mode 0700: only this user reaches the store
    rendezvous = os.path.join(private, "store")
    deadline = float("inf") if timeout_s is None else time.monotonic() + timeout_s
    procs, conns = [], []
    results: list = [None] * nprocs
    pending: set[int] = set()  # started ranks that have neither reported nor died
    failures: list[tuple[int, str, dict]] = []  # (rank, text, info) in arrival order

    def take(rank: int) -> None:
        pending.discard(rank)
        try:
            msg = pickle.loads(conns[rank].recv_bytes())
        except (EOFError, OSError):
            procs[rank].join(1.0)
            failures.append((rank, _exit_text(procs[rank].exitcode), {}))
            return
        if msg[0] == "err":
            failures.append((rank, msg[1], msg[2] if len(msg) > 2 else {}))
        else:
            results[rank] = msg[1]

    def receive(wait_s: float | None) -> None:
        """Take what pending ranks sent, and note those that died, waiting at most ``wait_s``."""
        waitables = {conns[r]: r for r in pending}
        waitables.update({procs[r].sentinel: r for r in pending})
        for obj in multiprocessing.connection.wait(list(waitables), timeout=wait_s):
            r = waitables[obj]
            if r not in pending:
                continue
            if obj is conns[r] or conns[r].poll():
                take(r)
            else:  # died without writing: a crash, a signal or os._exit
                procs[r].join(1.0)
                pending.discard(r)
                failures.append((r, _exit_text(procs[r].exitcode), {}))

    try:
        for rank in range(nprocs):
            recv, send = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_worker, args=(rank, nprocs, rendezvous, pg_timeout, threads_per_worker, send, fn, args,
                                                  os.getpid(), backend),
                            name=f"scalegnn-worker-{rank}", daemon=True)
            p.start()
            send.close()
            procs.append(p)
            conns.append(recv)
            pending.add(rank)
        first_failure_at = None
        while pending:
            now = time.monotonic()
            if failures and first_failure_at is None:
                first_failure_at = now
            if first_failure_at is not None and now - first_failure_at >= report_grace_s:
                break
            left = deadline - now
            if left <= 0:
                if failures:
                    break
                raise SpawnTimeout(None, f"timed out after {timeout_s:.0f} s; ranks {sorted(pending)} did not finish")
            wait_s = None if left == float("inf") else left
            if first_failure_at is not None:
                wait_s = max(0.0, min(wait_s if wait_s is not None else report_grace_s,
                                      first_failure_at + report_grace_s - now))
            receive(wait_s)
        if failures:
            primary = next((f for f in failures if not _secondary(f[1])), failures[0])
            rank, text, info = primary
            errors = {r: t for r, t, _ in failures}
            silent = sorted(pending)
            if silent and len(failures) < nprocs:
                text = f"{text}\n(ranks {silent} reported nothing within {report_grace_s:.0f} s of the first " \
                       "failure: hung, or still computing; they were terminated)"
            record = next((i.get("run_record") for r, _, i in failures if r == 0 and i.get("run_record")), None)
            err = WorkerError(rank, text, errors=errors, run_record=record,
                              user_error=bool(info.get("user_error")), message=info.get("message"))
            err.results = results  # what the ranks that finished returned (None for the others)
            raise err
        for p in procs:
            p.join(5.0)
        return results
    except Interrupted as stop:
        # SIGINT/SIGTERM reached this process (scalegnn.run.run listens for them): pass
        # it on, so that every rank stops and reports, rank 0 with its partial record.
        for p in procs:
            if p.is_alive():
                try:
                    os.kill(p.pid, stop.signum)
                except ProcessLookupError:
                    pass
        end = time.monotonic() + stop_grace_s
        while pending and time.monotonic() < end:
            receive(max(0.0, end - time.monotonic()))
        stop.results = results  # rank 0's record, if it had finished
        stop.run_record = next((i.get("run_record") for r, _, i in failures if r == 0 and i.get("run_record")), None)
        raise
    finally:
        _stop(procs)
        for c in conns:
            c.close()
        shutil.rmtree(private, ignore_errors=True)


# --------------------------------------------------------------------------- threads
def local_ranks_of_run(parallel) -> tuple[int, bool]:
    """(the processes of a run on this node, which share its cores; whether this process
    spawns them): the ranks of the job a launcher started on this node
    (:attr:`DistEnv.local_world_size`) when this process is one of them, else the
    ``--nproc`` local workers this process spawns, else 1."""
    info = detect_env()
    if info.world_size > 1 and parallel.nproc in (None, info.world_size):
        return info.local_world_size, False
    return parallel.nproc or 1, bool(parallel.nproc and parallel.nproc > 1)


def threads_of_run(parallel) -> thread_policy.ThreadChoice:
    """The threads of each process of a run (``parallel``: its
    :class:`~scalegnn.parallel.grid.ParallelConfig`): the one this process applied for
    the run (:func:`run_threads`), else :func:`scalegnn.threads.choose` for its ``--threads``
    and its local ranks now. What :func:`spawn` gives each local worker."""
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


def _loopback_interface() -> str:
    """The name of the loopback network device (``lo`` on Linux)."""
    try:
        return next(name for _, name in socket.if_nameindex() if name.startswith("lo"))
    except (OSError, StopIteration):
        return "lo"


def free_port() -> int:
    """A TCP port free right now (for launchers that need one; racy by nature)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def local_backend(parallel, nproc: int) -> str:
    """The backend of ``nproc`` local workers of a run (``parallel``: its
    :class:`~scalegnn.parallel.grid.ParallelConfig`; rank r on GPU r % count). NCCL
    refuses two ranks on one GPU, so more GPU ranks than GPUs need ``--backend gloo``."""
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
