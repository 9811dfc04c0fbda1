"""Process start-up: join a launched job (torchrun / SLURM / submitit) or spawn local workers.

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

Failing fast (a job never hangs, never leaves processes behind): every collective,
including those of the grid's axis groups, times out after the run's
``collective_timeout_s``, so a rank that stops answering makes its peers raise; a
rank that dies is seen by the spawner at once (its process sentinel); the spawner
then stops every worker (SIGTERM, then SIGKILL) and writes the ``failed`` record
with the first error when rank 0 could not. Workers watch the spawner and exit
within a second when it is killed. Under torchrun / srun, the failing rank exits
non-zero and the launcher stops the others (``srun --kill-on-bad-exit=1``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import multiprocessing
import multiprocessing.connection
import os
import pickle
import re
import signal
import socket
import sys
import time
import traceback
from dataclasses import dataclass

import torch
import torch.distributed as dist

__all__ = ["DistEnv", "init_from_env", "init_process_group", "first_host", "spawn", "local_backend", "WorkerError",
           "SpawnTimeout", "failed_record", "run_distributed_training"]


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
    source: str  # "torchrun" | "slurm" | "submitit" | "single"
    device: str = "cpu"  # this rank's torch device, set by init_from_env


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


def detect_env() -> DistEnv:
    """Read rank, world size, local rank and the rendezvous address from the environment.

    Precedence: torchrun (``RANK``/``WORLD_SIZE``), submitit (``SUBMITIT_EXECUTOR``,
    via ``submitit.JobEnvironment()``), SLURM (``SLURM_PROCID``/``SLURM_NTASKS``),
    else a single process.
    """
    backend = "auto"  # the device decides (init_from_env): a visible GPU alone does not make a run use it
    env = os.environ
    if "RANK" in env and "WORLD_SIZE" in env:
        if "MASTER_ADDR" not in env or "MASTER_PORT" not in env:
            raise ValueError("RANK/WORLD_SIZE are set but MASTER_ADDR/MASTER_PORT are not; launch with torchrun")
        return DistEnv(_env_int("RANK"), _env_int("WORLD_SIZE"), int(env.get("LOCAL_RANK", 0)), backend,
                       env["MASTER_ADDR"], _env_int("MASTER_PORT"), "torchrun")
    if env.get("SUBMITIT_EXECUTOR"):
        import submitit

        job = submitit.JobEnvironment()
        addr = env.get("MASTER_ADDR") or job.hostnames[0]
        port = int(env.get("MASTER_PORT") or _default_port(str(job.raw_job_id)))
        return DistEnv(job.global_rank, job.num_tasks, job.local_rank, backend, addr, port, "submitit")
    if "SLURM_PROCID" in env:
        if "SLURM_NTASKS" not in env:
            raise ValueError("SLURM_PROCID is set but SLURM_NTASKS is not; launch the job step with srun")
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST", "")
        addr = env.get("MASTER_ADDR") or first_host(nodelist)
        port = int(env.get("MASTER_PORT") or _default_port(env.get("SLURM_JOB_ID")))
        return DistEnv(_env_int("SLURM_PROCID"), _env_int("SLURM_NTASKS"), int(env.get("SLURM_LOCALID", 0)),
                       backend, addr, port, "slurm")
    return DistEnv(0, 1, 0, backend, "127.0.0.1", 0, "single")


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


def _worker(rank, world, port, timeout_s, threads, conn, fn, args, parent_pid=None, backend="gloo"):
    _name_process(rank)
    if parent_pid is not None:
        _watch_parent(parent_pid)
    try:
        torch.set_num_threads(threads)
        timeout = datetime.timedelta(seconds=timeout_s)
        store = dist.TCPStore("127.0.0.1", port, world_size=world + 1, is_master=False, timeout=timeout)
        # A local worker's local rank is its rank (whatever a surrounding job's variables say,
        # e.g. SLURM_LOCALID of a one-task allocation): NCCL ranks take one GPU each.
        os.environ["LOCAL_RANK"] = str(rank)
        device = torch.device("cuda", rank % torch.cuda.device_count()) if backend == "nccl" else None
        init_process_group(backend, device, store=store, rank=rank, world_size=world, timeout=timeout)
        result = fn(rank, world, *args)
        payload = pickle.dumps(("ok", result), protocol=pickle.HIGHEST_PROTOCOL)
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the parent
        record = getattr(exc, "run_record", None)
        info = {"user_error": isinstance(exc, (ValueError, FileNotFoundError)) and record is None,
                "message": f"{exc}", "run_record": record}
        try:
            payload = pickle.dumps(("err", traceback.format_exc(), info))
        except Exception:  # noqa: BLE001 - an unpicklable record: send the text alone
            payload = pickle.dumps(("err", traceback.format_exc(), {**info, "run_record": None}))
    try:
        conn.send_bytes(payload)
        conn.close()
    finally:
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001 - exiting anyway
                pass


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


def spawn(fn, nprocs: int, *args, timeout_s: float | None = 120.0, threads_per_worker: int = 1,
          collective_timeout_s: float | None = None, report_grace_s: float = 3.0, backend: str = "gloo") -> list:
    """Run ``fn(rank, nprocs, *args)`` in ``nprocs`` local workers; return their results.

    ``backend`` is "gloo" (CPU tensors, and GPU tensors staged through the host: how
    several ranks share one GPU) or "nccl" (rank r on GPU r, one rank per GPU).

    ``fn`` must be importable (a module-level function) and its results picklable.
    The parent hosts the rendezvous store on a free port (bound by the OS, so no
    race) and waits on every worker's pipe and process sentinel. On the first error
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
    """
    if nprocs < 1:
        raise ValueError(f"nprocs must be >= 1, got {nprocs}")
    ctx = _context()
    if collective_timeout_s is None:
        collective_timeout_s = 1800.0 if timeout_s is None else timeout_s
    pg_timeout = float(collective_timeout_s)
    store = dist.TCPStore("127.0.0.1", 0, world_size=nprocs + 1, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=pg_timeout))
    port = store.port
    deadline = float("inf") if timeout_s is None else time.monotonic() + timeout_s
    procs, conns = [], []
    try:
        for rank in range(nprocs):
            recv, send = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_worker, args=(rank, nprocs, port, pg_timeout, threads_per_worker, send, fn, args,
                                                  os.getpid(), backend),
                            name=f"scalegnn-worker-{rank}", daemon=True)
            p.start()
            send.close()
            procs.append(p)
            conns.append(recv)
        results: list = [None] * nprocs
        pending = set(range(nprocs))
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
    finally:
        _stop(procs)
        for c in conns:
            c.close()
        del store


def free_port() -> int:
    """A TCP port free right now (for launchers that need one; racy by nature)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------- training entry
_SETUP = "setup (loading the data or shards, building the model)"


def _training_worker(rank: int, world: int, cfg, run_id: str | None = None):
    from ..device import resolve_backend, resolve_device
    from ..train import out_of_memory, run_training
    from .grid import ProcessGrid

    device = resolve_device(cfg.device, local_rank=rank)
    grid = ProcessGrid(*cfg.grid, backend=resolve_backend(cfg.backend, device))
    try:
        # write_failed=False: the parent writes the failed record, with the first error of any rank
        record = run_training(cfg, grid=grid, run_id=run_id, write_failed=False, device=device)
    except Exception as exc:
        oom = None if hasattr(exc, "run_record") else out_of_memory(exc, cfg, rank, _SETUP)
        if oom is None:
            raise
        raise oom from exc
    return record if rank == 0 else None


def failed_record(cfg, run_id: str, error: str, world_size: int, partial: dict | None = None,
                  rank_errors: dict | None = None) -> dict:
    """A ``failed`` run record for a job whose rank 0 could not write one: built on
    rank 0's partial record when it sent one, else on the checkpoint's, else minimal."""
    from .. import records
    from ..checkpoint import latest, read_meta

    base = dict(partial) if partial else None
    if base is None and cfg.checkpoint.dir:
        ckpt = latest(cfg.checkpoint.dir)
        if ckpt is not None:
            saved = read_meta(ckpt)["record"]
            base = saved if saved.get("run_id") == run_id else None
    if base is None:
        base = records.new_record(
            system=cfg.system, dataset=cfg.dataset, config=cfg.to_dict(),
            grid=dict(zip(("dp", "x", "y", "z"), cfg.grid)), world_size=world_size, seed=cfg.seed,
            env=records.environment_info(backend=cfg.backend, device=_device_or_cpu(cfg.device)),
            graph=None, batch_size=None, steps_per_epoch=None, target_acc=cfg.target_acc, run_id=run_id, summary=None)
    base.pop("path", None)
    base.update(run_id=run_id, world_size=world_size, status="failed", error=error,
                time_to_target_s=records.time_to_target(base.get("epochs", []), cfg.target_acc),
                peak_memory_bytes=base.get("peak_memory_bytes"))
    if rank_errors:
        base["rank_errors"] = {str(r): (t.strip().splitlines() or [""])[-1][:500]
                               for r, t in sorted(rank_errors.items())}
    return base


def _device_or_cpu(spec: str) -> torch.device:
    """The device ``spec`` names on this host, or the CPU where it cannot be had (the
    failed record of a job whose GPU request could not be met still gets written)."""
    from ..device import resolve_device

    try:
        return resolve_device(spec)
    except ValueError:
        return torch.device("cpu")


def run_distributed_training(cfg, nproc: int | None = None, timeout_s: float | None = None, *, worker=None):
    """Run :func:`scalegnn.train.run_training` on every rank of ``cfg.grid``.

    With ``nproc``: spawn that many local workers (must equal Gd*Gx*Gy*Gz; gloo, or
    NCCL with one GPU each) and return rank 0's record. If any rank raises, is killed or stops answering, every
    worker is stopped within ``cfg.collective_timeout_s`` plus a few seconds, and this
    process writes and returns a ``failed`` record carrying the first error (rank 0
    may be the one that died). A configuration or data error raises ``ValueError``
    and writes no record, as in a serial run.

    Without ``nproc``: join the job a launcher started (torchrun, srun, submitit);
    returns the record on rank 0 and None on the other ranks. Collectives time out
    after ``cfg.collective_timeout_s``; a failing rank exits non-zero, and the
    launcher (torchrun, ``srun --kill-on-bad-exit=1``) stops the others.

    ``worker`` replaces the per-rank function ``(rank, world, cfg, run_id) -> record``
    of a spawned run (the fault-injection tests use it).
    """
    from .grid import ProcessGrid

    world = cfg.world_size
    if nproc is not None:
        if nproc != world:
            raise ValueError(
                f"--nproc {nproc} does not match the grid {'x'.join(map(str, cfg.grid))} "
                f"(Gd*Gx*Gy*Gz = {world}); pass --nproc {world} or change --grid"
            )
        from .. import records
        from ..checkpoint import resume_run_id

        run_id = (resume_run_id(cfg.checkpoint.dir) if cfg.checkpoint.resume else None) \
            or records.new_run_id(cfg.system, cfg.dataset)
        threads = max(1, (os.cpu_count() or 1) // nproc)
        backend = local_backend(cfg, nproc)
        try:
            return spawn(worker or _training_worker, nproc, cfg, run_id, timeout_s=timeout_s,
                         threads_per_worker=threads, backend=backend,
                         collective_timeout_s=cfg.collective_timeout_s)[0]
        except WorkerError as exc:
            if exc.user_error:
                raise ValueError(exc.message or str(exc)) from None
            done = (getattr(exc, "results", None) or [None])[0]
            if isinstance(done, dict) and done.get("path"):
                return done  # rank 0 finished and wrote its record; a rank failed while exiting
            where = f"rank {exc.rank}" if exc.rank is not None else "the job"
            record = failed_record(cfg, run_id, f"{where}: {exc.traceback_text}", nproc, exc.run_record, exc.errors)
            record["path"] = str(records.write_record(record, cfg.out_dir))
            return record
    info = init_from_env(timeout=datetime.timedelta(seconds=cfg.collective_timeout_s), backend=cfg.backend,
                         device=cfg.device)
    if info.world_size != world:
        hint = (f"pass --nproc {world} to spawn local workers, or launch {world} processes with torchrun/srun"
                if info.source == "single" else f"launch {world} processes or change --grid")
        raise ValueError(f"the grid {'x'.join(map(str, cfg.grid))} needs {world} ranks but the job has "
                         f"{info.world_size} ({info.source}); {hint}")
    from ..train import run_training

    grid = ProcessGrid(*cfg.grid, backend=info.backend) if world > 1 or dist.is_initialized() \
        else ProcessGrid.single()
    restore = _terminate_raises(grid.rank)
    try:
        run_id = _agree_run_id(cfg)
        try:
            record = run_training(cfg, grid=grid, run_id=run_id, device=torch.device(info.device))
        except Exception as exc:
            from ..checkpoint import Preempted

            if grid.rank != 0 and not isinstance(exc, Preempted):  # preempted: saved, rank 0 recorded it
                with _sigterm_ignored():
                    _record_failure_if_rank0_cannot(cfg, run_id, grid.rank, exc)
            raise
    finally:
        restore()
        if dist.is_initialized():
            dist.destroy_process_group()
    return record if grid.rank == 0 else None


def local_backend(cfg, nproc: int) -> str:
    """The backend of ``nproc`` local workers of ``cfg`` (rank r on GPU r % count). NCCL
    refuses two ranks on one GPU, so more GPU ranks than GPUs need ``--backend gloo``."""
    from ..device import resolve_backend, resolve_device

    device = resolve_device(cfg.device, local_rank=0)
    backend = resolve_backend(cfg.backend, device)
    if backend == "nccl" and nproc > 1 and ":" in cfg.device:
        raise ValueError(f"--device {cfg.device} with --nproc {nproc}: NCCL runs one rank per GPU, so the ranks "
                         "take GPUs 0..N-1; use --device cuda (or auto), or --backend gloo to share one GPU")
    if backend == "nccl" and nproc > torch.cuda.device_count():
        raise ValueError(f"--nproc {nproc} on {torch.cuda.device_count()} GPU(s): NCCL runs one rank per GPU; "
                         f"use --nproc {torch.cuda.device_count()} or fewer, --backend gloo to let ranks share "
                         "GPUs (slow, for tests), or --device cpu")
    return backend


class Terminated(RuntimeError):
    """SIGTERM reached a rank: the launcher stopping the job (torchrun does when a
    peer died), ``scancel`` or a time limit."""


def _terminate_raises(rank: int):
    """Make SIGTERM raise :class:`Terminated` in this rank, so the run ends as a
    recorded failure instead of vanishing (torchrun SIGTERMs the survivors when one
    rank dies). Left alone when someone already handles SIGTERM (submitit does: its
    preemption path must requeue, not fail) or off the main thread. Returns the undo."""
    import threading

    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None):
        return lambda: None

    def handler(signum, frame):
        raise Terminated(f"rank {rank} received SIGTERM (the launcher stopped the job: a peer rank failed, "
                         "scancel, or a time limit)")

    previous = signal.signal(signal.SIGTERM, handler)
    return lambda: signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def _sigterm_ignored():
    """A failing rank records the failure without being cut short: torchrun SIGTERMs the
    survivors as soon as it sees one rank dead, often while a survivor writes the
    failed record, and the Terminated raised mid-write left no record at all. The rank
    exits non-zero right afterwards anyway."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _agree_run_id(cfg) -> str:
    """Rank 0's new run id, broadcast: every rank of a torchrun/srun job can name the record."""
    from .. import records

    ids = [records.new_run_id(cfg.system, cfg.dataset) if not dist.is_initialized() or dist.get_rank() == 0
           else None]
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list(ids, src=0)
    return ids[0]


def _record_failure_if_rank0_cannot(cfg, run_id: str, rank: int, exc: BaseException) -> None:
    """Under torchrun/srun no parent process outlives the ranks: when rank 0 itself was
    killed, nobody else would record the run. Every other failing rank therefore
    writes a ``failed`` record under the agreed run id, but only if none exists yet
    (exclusive create: the first wins, and rank 0's own record, written whenever rank
    0 is alive to write it, replaces it)."""
    from .. import records

    partial = getattr(exc, "run_record", None)
    rid = (partial or {}).get("run_id") or run_id  # a resumed run keeps its checkpoint's id
    text = f"rank {rank}: {type(exc).__name__}: {exc}\n{traceback.format_exc(limit=6)}"
    record = failed_record(cfg, rid, text, dist.get_world_size() if dist.is_initialized() else 1, partial,
                           {rank: text})
    record["error"] = (f"rank {rank} saw the job fail (rank 0 wrote no record: it may have died first): "
                       f"{type(exc).__name__}: {exc}")
    try:
        records.write_record(record, cfg.out_dir, exclusive=True)
    except FileExistsError:
        pass
    except OSError as write_error:  # never mask the training error with a reporting one
        print(f"rank {rank}: could not write the failed record: {write_error}", file=sys.stderr)
