"""Process start-up: join a launched job (torchrun / SLURM / submitit) or spawn local workers.

:func:`init_from_env` initializes ``torch.distributed`` from the environment a
launcher left behind (gloo on CPU, NCCL when CUDA is available), always with an
explicit timeout. :func:`spawn` starts ``nprocs`` local gloo workers, runs
``fn(rank, world, *args)`` in each and returns their results; a failing or dying
worker makes it terminate the others and raise :class:`WorkerError` naming the
rank, and a global deadline guarantees it never hangs. The distributed tests use it.
"""

from __future__ import annotations

import datetime
import multiprocessing
import multiprocessing.connection
import os
import pickle
import re
import socket
import time
import traceback
from dataclasses import dataclass

import torch
import torch.distributed as dist

__all__ = ["DistEnv", "init_from_env", "first_host", "spawn", "WorkerError", "SpawnTimeout"]


# --------------------------------------------------------------------------- environment
@dataclass(frozen=True)
class DistEnv:
    """Where this process sits in the launched job."""

    rank: int
    world_size: int
    local_rank: int
    backend: str
    master_addr: str
    master_port: int
    source: str  # "torchrun" | "slurm" | "submitit" | "single"


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
    backend = "nccl" if torch.cuda.is_available() else "gloo"
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


def init_from_env(timeout: datetime.timedelta = datetime.timedelta(minutes=10), backend: str | None = None) -> DistEnv:
    """Initialize ``torch.distributed`` from the launcher's environment; returns the :class:`DistEnv`.

    A single process (no launcher variables) is left uninitialized: use
    ``ProcessGrid.single()``. With NCCL the CUDA device is set to the local rank.
    """
    info = detect_env()
    if backend is not None:
        info = DistEnv(**{**info.__dict__, "backend": backend})
    if info.source == "single" or dist.is_initialized():
        return info
    if info.backend == "nccl":
        torch.cuda.set_device(info.local_rank % max(1, torch.cuda.device_count()))
    dist.init_process_group(
        backend=info.backend,
        init_method=f"tcp://{info.master_addr}:{info.master_port}",
        rank=info.rank,
        world_size=info.world_size,
        timeout=timeout,
    )
    return info


# --------------------------------------------------------------------------- local spawn
class WorkerError(RuntimeError):
    """A spawned worker failed: ``rank`` (None for a global timeout) and its traceback text."""

    def __init__(self, rank: int | None, traceback_text: str):
        self.rank = rank
        self.traceback_text = traceback_text
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


def _worker(rank, world, port, timeout_s, threads, conn, fn, args):
    try:
        torch.set_num_threads(threads)
        timeout = datetime.timedelta(seconds=timeout_s)
        store = dist.TCPStore("127.0.0.1", port, world_size=world + 1, is_master=False, timeout=timeout)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timeout)
        result = fn(rank, world, *args)
        payload = pickle.dumps(("ok", result), protocol=pickle.HIGHEST_PROTOCOL)
    except BaseException:  # noqa: BLE001 - every failure must reach the parent
        payload = pickle.dumps(("err", traceback.format_exc()))
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


def spawn(fn, nprocs: int, *args, timeout_s: float | None = 120.0, threads_per_worker: int = 1) -> list:
    """Run ``fn(rank, nprocs, *args)`` in ``nprocs`` local gloo workers; return their results.

    ``fn`` must be importable (a module-level function) and its results picklable.
    The parent hosts the rendezvous store on a free port (bound by the OS, so no
    race), waits on every worker's pipe and process sentinel, and on the first
    error or unexpected exit terminates the remaining workers and raises
    :class:`WorkerError` with that rank's traceback. After ``timeout_s`` seconds in
    all it kills everything and raises :class:`SpawnTimeout` (``None``: no deadline,
    for training runs; collectives still time out after 30 minutes).
    """
    if nprocs < 1:
        raise ValueError(f"nprocs must be >= 1, got {nprocs}")
    ctx = _context()
    pg_timeout = 1800.0 if timeout_s is None else timeout_s
    store = dist.TCPStore("127.0.0.1", 0, world_size=nprocs + 1, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=pg_timeout))
    port = store.port
    deadline = float("inf") if timeout_s is None else time.monotonic() + timeout_s
    procs, conns = [], []
    try:
        for rank in range(nprocs):
            recv, send = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_worker, args=(rank, nprocs, port, pg_timeout, threads_per_worker, send, fn, args),
                            name=f"scalegnn-worker-{rank}", daemon=True)
            p.start()
            send.close()
            procs.append(p)
            conns.append(recv)
        results: list = [None] * nprocs
        pending = set(range(nprocs))

        def take(rank: int) -> None:
            try:
                status, value = pickle.loads(conns[rank].recv_bytes())
            except EOFError:
                procs[rank].join(1.0)
                raise WorkerError(rank, f"exited with code {procs[rank].exitcode} before returning a result")
            if status == "err":
                raise WorkerError(rank, value)
            results[rank] = value
            pending.discard(rank)

        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                raise SpawnTimeout(None, f"timed out after {timeout_s:.0f} s; ranks {sorted(pending)} did not finish")
            waitables = {conns[r]: r for r in pending}
            waitables.update({procs[r].sentinel: r for r in pending})
            wait_s = None if left == float("inf") else left
            for obj in multiprocessing.connection.wait(list(waitables), timeout=wait_s):
                r = waitables[obj]
                if r not in pending:
                    continue
                if obj is conns[r] or conns[r].poll():
                    take(r)
                else:  # died without writing: a crash or os._exit
                    procs[r].join(1.0)
                    raise WorkerError(r, f"exited with code {procs[r].exitcode} before returning a result")
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
def _training_worker(rank: int, world: int, cfg):
    from ..train import run_training
    from .grid import ProcessGrid

    grid = ProcessGrid(*cfg.grid)
    record = run_training(cfg, grid=grid)
    return record if rank == 0 else None


def run_distributed_training(cfg, nproc: int | None = None, timeout_s: float | None = None):
    """Run :func:`scalegnn.train.run_training` on every rank of ``cfg.grid``.

    With ``nproc``: spawn that many local gloo workers (must equal Gd*Gx*Gy*Gz) and
    return rank 0's record. Without: join the job a launcher started (torchrun,
    srun, submitit); returns the record on rank 0 and None on the other ranks.
    """
    from .grid import ProcessGrid

    world = cfg.world_size
    if nproc is not None:
        if nproc != world:
            raise ValueError(
                f"--nproc {nproc} does not match the grid {'x'.join(map(str, cfg.grid))} "
                f"(Gd*Gx*Gy*Gz = {world}); pass --nproc {world} or change --grid"
            )
        threads = max(1, (os.cpu_count() or 1) // nproc)
        return spawn(_training_worker, nproc, cfg, timeout_s=timeout_s, threads_per_worker=threads)[0]
    info = init_from_env()
    if info.world_size != world:
        hint = (f"pass --nproc {world} to spawn local workers, or launch {world} processes with torchrun/srun"
                if info.source == "single" else f"launch {world} processes or change --grid")
        raise ValueError(f"the grid {'x'.join(map(str, cfg.grid))} needs {world} ranks but the job has "
                         f"{info.world_size} ({info.source}); {hint}")
    from ..train import run_training

    grid = ProcessGrid(*cfg.grid) if world > 1 or dist.is_initialized() else ProcessGrid.single()
    try:
        record = run_training(cfg, grid=grid)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return record if grid.rank == 0 else None
