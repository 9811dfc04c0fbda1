"""A job of local worker processes: start, wait, stop.

:class:`LocalJob` starts ``nprocs`` workers on this host, each running
``fn(rank, nprocs, *args)`` inside its own ``torch.distributed`` world, and collects
what they return. It is how ``--nproc N`` runs and how the distributed tests run
their ranks (:func:`spawn` is start + wait in one call).

A job never hangs and never leaves a process behind:
- the workers meet in a file store of a private folder (mode 0700, removed with the
  job) and gloo's connections stay on the loopback device, so a local run opens no
  rendezvous port that another machine or user could join;
- every collective times out after ``collective_timeout_s``, so a rank that stops
  answering makes its peers raise; a rank that dies is seen at once (its process
  sentinel);
- on the first failure the job waits ``report_grace_s`` for the other ranks' reports
  (ranks blocked on the lost peer fail at once: their reports and rank 0's partial
  run record make the error), then stops every worker (SIGTERM, then SIGKILL) and
  raises :class:`WorkerError` naming the first failing rank;
- workers watch the process that started them and exit within a second when it dies;
- a stop signal reaching this process (:class:`scalegnn.signals.Interrupted`) is
  forwarded to every worker, which stops and reports, rank 0 with its partial record.

Threads (:mod:`scalegnn.threads`): each worker applies the run's thread choice before
``fn`` and starts with OpenMP's passive wait in its environment, so its idle OpenMP
threads sleep instead of spinning on the cores the other workers need.
"""

from __future__ import annotations

import ast
import atexit
import datetime
import multiprocessing
import multiprocessing.connection
import os
import pickle
import shutil
import signal
import socket
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist

from .. import threads as thread_policy
from ..signals import Interrupted, held, stop_on_signals
from .environment import init_process_group

__all__ = ["LocalJob", "spawn", "WorkerError", "SpawnTimeout", "unguarded_main_call"]


class WorkerError(RuntimeError):
    """A worker of a :class:`LocalJob` failed: ``rank`` (None for a global timeout) and
    its traceback text.

    ``errors`` holds every rank's report gathered before the workers were stopped
    ({rank: text}); ``run_record`` rank 0's partial run record when it sent one;
    ``user_error`` is True when the failure is a configuration or data error raised
    before training started (a ``ValueError``: the CLI prints it as one line);
    ``results`` what the ranks that finished returned (None for the others).
    """

    def __init__(self, rank: int | None, traceback_text: str, errors: dict | None = None,
                 run_record: dict | None = None, user_error: bool = False, message: str | None = None):
        self.rank = rank
        self.traceback_text = traceback_text
        self.errors = dict(errors or {})
        self.run_record = run_record
        self.user_error = user_error
        self.message = message
        self.results: list = []
        self.record_path: str | None = None
        head = f"worker rank {rank} failed" if rank is not None else "spawned workers failed"
        super().__init__(f"{head}:\n{traceback_text}")


class SpawnTimeout(WorkerError):
    """The workers did not all finish within the job's deadline."""


class LocalJob:
    """``nprocs`` local workers running ``fn(rank, nprocs, *args)``.

    ``fn`` must be importable (a module-level function) and its result picklable.
    ``backend``: "gloo" (CPU tensors, and GPU tensors staged through the host: how
    several ranks share one GPU) or "nccl" (rank r on GPU r, one rank per GPU).
    ``threads_per_worker``: a count or the run's :class:`scalegnn.threads.ThreadChoice`.
    ``collective_timeout_s``: the workers' collective timeout (default 30 minutes).

    ``with LocalJob(...) as job: results = job.start().wait(timeout_s)``; leaving the
    block stops whatever still runs and removes the rendezvous folder.
    """

    def __init__(self, fn, nprocs: int, args: tuple = (), *, backend: str = "gloo",
                 threads_per_worker: "int | thread_policy.ThreadChoice" = 1, collective_timeout_s: float | None = None,
                 report_grace_s: float = 3.0, stop_grace_s: float = 10.0):
        if nprocs < 1:
            raise ValueError(f"nprocs must be >= 1, got {nprocs}")
        if not isinstance(threads_per_worker, thread_policy.ThreadChoice):
            threads_per_worker = thread_policy.choose(threads_per_worker, nprocs, spawner=True)
        self.fn, self.nprocs, self.args, self.backend = fn, nprocs, tuple(args), backend
        self.threads = threads_per_worker
        self.collective_timeout_s = 1800.0 if collective_timeout_s is None else float(collective_timeout_s)
        self.report_grace_s, self.stop_grace_s = report_grace_s, stop_grace_s
        self.procs: list = []
        self.results: list = [None] * nprocs
        self._conns: list = []
        self._pending: set[int] = set()  # started ranks that have neither reported nor died
        self._failures: list[tuple[int, str, dict]] = []  # (rank, text, info) in arrival order
        self._private: str | None = None

    # ------------------------------------------------------------------ start / wait / stop
    def start(self) -> "LocalJob":
        """Start every worker (forked from a warm server that preloaded torch)."""
        where = unguarded_main_call()
        if where is not None:
            raise ValueError(f"{where}, starts {self.nprocs} worker processes from the top level of the script, "
                             "which every worker imports again before it runs (Python's spawn and forkserver "
                             "start methods): put the call under `if __name__ == \"__main__\":`")
        for key, value in thread_policy.WAIT_ENV.items():
            os.environ.setdefault(key, value)  # inherited by the fork server (started below, once) and every worker
        ctx = _context()
        self._private = tempfile.mkdtemp(prefix="scalegnn-rendezvous-")  # mode 0700: only this user reaches it
        rendezvous = os.path.join(self._private, "store")
        for rank in range(self.nprocs):
            recv, send = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_worker, args=(rank, self.nprocs, rendezvous, self.collective_timeout_s, self.threads,
                                                  send, self.fn, self.args, os.getpid(), self.backend),
                            name=f"scalegnn-worker-{rank}", daemon=True)
            p.start()
            send.close()
            self.procs.append(p)
            self._conns.append(recv)
            self._pending.add(rank)
        return self

    def wait(self, timeout_s: float | None = None) -> list:
        """Every worker's result, in rank order; raises :class:`WorkerError` for the first
        failure (after the grace for the others' reports), :class:`SpawnTimeout` when
        ``timeout_s`` passes first (None: no deadline, for training runs). A stop signal
        (:class:`Interrupted`) is forwarded to the workers, which get ``stop_grace_s`` to
        report; it is re-raised with ``run_record`` (rank 0's partial record) and
        ``results``."""
        deadline = float("inf") if timeout_s is None else time.monotonic() + timeout_s
        try:
            first_failure_at = None
            while self._pending:
                now = time.monotonic()
                if self._failures and first_failure_at is None:
                    first_failure_at = now
                if first_failure_at is not None and now - first_failure_at >= self.report_grace_s:
                    break
                left = deadline - now
                if left <= 0:
                    if self._failures:
                        break
                    raise SpawnTimeout(None, f"timed out after {timeout_s:.0f} s; ranks {sorted(self._pending)} "
                                       "did not finish")
                wait_s = None if left == float("inf") else left
                if first_failure_at is not None:
                    grace_left = first_failure_at + self.report_grace_s - now
                    wait_s = max(0.0, min(wait_s if wait_s is not None else grace_left, grace_left))
                self._receive(wait_s)
        except Interrupted as stop:
            self.stop(stop.signum)
            stop.results = self.results  # rank 0's record, if it had finished
            stop.run_record = self._rank0_record()
            raise
        if self._failures:
            raise self._error()
        for p in self.procs:
            p.join(5.0)
        return self.results

    def stop(self, signum: int | None = None) -> None:
        """Forward ``signum`` to every live worker and take their reports for up to
        ``stop_grace_s``; then (or with no signal, at once) terminate what is left."""
        if signum is not None:
            for p in self.procs:
                if p.is_alive():
                    try:
                        os.kill(p.pid, signum)
                    except ProcessLookupError:
                        pass
            end = time.monotonic() + self.stop_grace_s
            while self._pending and time.monotonic() < end:
                self._receive(max(0.0, end - time.monotonic()))
        _terminate(self.procs)

    def __enter__(self) -> "LocalJob":
        return self

    def __exit__(self, *exc) -> None:
        _terminate(self.procs)
        for c in self._conns:
            c.close()
        if self._private is not None:
            shutil.rmtree(self._private, ignore_errors=True)

    # ------------------------------------------------------------------ reports
    def _take(self, rank: int) -> None:
        self._pending.discard(rank)
        try:
            msg = pickle.loads(self._conns[rank].recv_bytes())
        except (EOFError, OSError):
            self.procs[rank].join(1.0)
            self._failures.append((rank, _exit_text(self.procs[rank].exitcode), {}))
            return
        if msg[0] == "err":
            self._failures.append((rank, msg[1], msg[2] if len(msg) > 2 else {}))
        else:
            self.results[rank] = msg[1]

    def _receive(self, wait_s: float | None) -> None:
        """Take what pending ranks sent, and note those that died, waiting at most ``wait_s``."""
        waitables = {self._conns[r]: r for r in self._pending}
        waitables.update({self.procs[r].sentinel: r for r in self._pending})
        for obj in multiprocessing.connection.wait(list(waitables), timeout=wait_s):
            r = waitables[obj]
            if r not in self._pending:
                continue
            if obj is self._conns[r] or self._conns[r].poll():
                self._take(r)
            else:  # died without writing: a crash, a signal or os._exit
                self.procs[r].join(1.0)
                self._pending.discard(r)
                self._failures.append((r, _exit_text(self.procs[r].exitcode), {}))

    def _rank0_record(self) -> dict | None:
        return next((i.get("run_record") for r, _, i in self._failures if r == 0 and i.get("run_record")), None)

    def _error(self) -> WorkerError:
        """The job's failure: the first report that is not a peer's echo of it."""
        primary = next((f for f in self._failures if not _secondary(f[1])), self._failures[0])
        rank, text, info = primary
        silent = sorted(self._pending)
        if silent and len(self._failures) < self.nprocs:
            text = f"{text}\n(ranks {silent} reported nothing within {self.report_grace_s:.0f} s of the first " \
                   "failure: hung, or still computing; they were terminated)"
        err = WorkerError(rank, text, errors={r: t for r, t, _ in self._failures}, run_record=self._rank0_record(),
                          user_error=bool(info.get("user_error")), message=info.get("message"))
        err.results = self.results
        return err


def unguarded_main_call() -> str | None:
    """Where the main script calls this, at its top level and outside ``if __name__ ==
    "__main__":`` (``"train.py, line 3"``), else None. Workers start from a fresh
    interpreter that imports the main script again: such a call would run once more in
    every worker, which Python refuses there, and the job would fail with nothing but
    an exit code. A call from ``python -c``, a notebook or a module without a source
    file is not re-imported and passes."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if not path or not path.endswith(".py") or not os.path.isfile(path):
        return None
    spec_name = getattr(getattr(main, "__spec__", None), "name", None) or ""
    if spec_name == "__main__" or spec_name.endswith(".__main__"):
        return None  # `python -m package`: multiprocessing does not run a package's __main__ again in the workers
    frame = sys._getframe(1)
    while frame is not None and not (frame.f_code.co_name == "<module>" and frame.f_globals is main.__dict__):
        frame = frame.f_back
    if frame is None:  # not called while the main script runs its top level (e.g. from a callback later)
        return None
    line = frame.f_lineno
    try:
        tree = ast.parse(Path(path).read_text(), path)
    except (OSError, SyntaxError, ValueError):
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_main_guard(node.test) and node.lineno <= line <= node.end_lineno:
            return None
    return f"{os.path.basename(path)}, line {line}"


def _is_main_guard(test: ast.expr) -> bool:
    """``__name__ == "__main__"``, either way round."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    return any(isinstance(a, ast.Name) and a.id == "__name__" for a in sides) and \
        any(isinstance(a, ast.Constant) and a.value == "__main__" for a in sides)


def spawn(fn, nprocs: int, *args, timeout_s: float | None = 120.0, **job_options) -> list:
    """Run ``fn(rank, nprocs, *args)`` in a :class:`LocalJob` of ``nprocs`` workers and
    return their results (``job_options``: the job's keyword arguments). The
    distributed tests' way to run ranks; ``timeout_s`` also bounds the collectives
    unless ``collective_timeout_s`` says otherwise."""
    job_options.setdefault("collective_timeout_s", timeout_s)
    with LocalJob(fn, nprocs, args, **job_options) as job:
        return job.start().wait(timeout_s)


# --------------------------------------------------------------------------- the worker side
def _context():
    """A forkserver context preloading torch: each worker forks from a warm interpreter
    (tens of ms) instead of importing torch afresh (seconds on a small box). The
    preload takes effect when the fork server first starts and is reused after."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed", "scalegnn.launch.job"])
    atexit.unregister(_stop_fork_server)  # once, however many jobs this process starts
    atexit.register(_stop_fork_server)
    return ctx


def _stop_fork_server() -> None:
    """At this process's exit, end the fork server of :func:`_context` at once. Left to see
    the exit itself, it tears down an interpreter of its own (torch loaded: 0.3-0.7 s)
    while it still holds this process's stdout, so whatever reads the program's output (a
    pipe, ``$(...)``, a test) waited that long after the program had ended."""
    from multiprocessing import forkserver

    pid = getattr(forkserver._forkserver, "_forkserver_pid", None)  # private; None until one started
    if pid:
        try:
            os.kill(pid, signal.SIGTERM)  # it handles SIGCHLD and SIGINT only: this ends it now
        except ProcessLookupError:
            pass


def _worker(rank, world, rendezvous, timeout_s, threads, conn, fn, args, parent_pid=None, backend="gloo"):
    _name_process(rank)
    if parent_pid is not None:
        _watch_parent(parent_pid)
    # SIGINT/SIGTERM (forwarded by the job, or Ctrl-C reaching the whole process
    # group) stops this rank like any failure: it reports (rank 0 its partial record) and exits.
    with stop_on_signals():
        payload = _run_rank(rank, world, rendezvous, timeout_s, threads, fn, args, backend)
        with held():  # a report cut short would read as a crash
            try:
                conn.send_bytes(payload)
                conn.close()
            except OSError:
                pass  # the job no longer listens (it is stopping every rank): nothing left to tell
            finally:
                if dist.is_initialized():
                    try:
                        dist.destroy_process_group()
                    except Exception:  # noqa: BLE001 - exiting anyway
                        pass


def _run_rank(rank, world, rendezvous, timeout_s, threads, fn, args, backend) -> bytes:
    """Join the job's group, run ``fn``; its result or failure, pickled for the job."""
    try:
        thread_policy.inherited_process()  # the job set this process's OpenMP wait before torch loaded
        thread_policy.apply(threads)
        timeout = datetime.timedelta(seconds=timeout_s)
        # The ranks meet in a file of the job's private folder (no TCP listener anyone
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
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the job
        record = getattr(exc, "run_record", None)
        info = {"user_error": isinstance(exc, (ValueError, FileNotFoundError)) and record is None,
                "message": f"{exc}", "run_record": record}
        try:
            return pickle.dumps(("err", traceback.format_exc(), info))
        except Exception:  # noqa: BLE001 - an unpicklable record: send the text alone
            return pickle.dumps(("err", traceback.format_exc(), {**info, "run_record": None}))


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
    """Exit this worker when the process that started it is gone: no orphan keeps
    training (or holding a GPU) after its launcher was killed. A daemon thread."""
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


def _loopback_interface() -> str:
    """The name of the loopback network device (``lo`` on Linux)."""
    try:
        return next(name for _, name in socket.if_nameindex() if name.startswith("lo"))
    except (OSError, StopIteration):
        return "lo"


def _terminate(procs, grace_s: float = 2.0) -> None:
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
        import signal

        try:
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
