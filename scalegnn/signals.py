"""Stopping a run with a signal: SIGINT (Ctrl-C), SIGTERM, SIGHUP or SIGQUIT ends it as an
``interrupted`` record; SIGUSR1 prints where every thread is and the run goes on.

    SIGINT   Ctrl-C                                       stop: record interrupted, exit 130
    SIGTERM  kill, a scheduler                            stop: record interrupted, exit 143
    SIGHUP   the terminal closed, an ssh session dropped  stop: record interrupted, exit 129
    SIGQUIT  Ctrl-\\                                      stop: record interrupted, exit 131
    SIGUSR1  "where is it?" (a run that seems hung)       every thread's stack on stderr; runs on
    SIGUSR2  a sweep task's preemption notice (submitit)  checkpoint at the next step, requeue

:func:`stop_on_signals` makes the first stop signal raise :class:`Interrupted`
in the main thread, wherever the run is: loading data, training, evaluating, saving
a checkpoint (a save cut short has no ``meta.json`` and is ignored on resume).
:func:`scalegnn.launch.launch` installs it around every run that no launcher owns;
every worker of a local job installs it too, and the job forwards the signal it got
to them (:class:`scalegnn.launch.job.LocalJob`). The run's session marks its partial
record ``interrupted`` and hands it on the exception (``run_record``); the launcher
writes it (:func:`scalegnn.session.write_interruption`), naming the signal, the
epochs done and how to resume; ``scalegnn train`` exits with 128 + the signal's
number (130, 143) after one line, without a traceback.

In a rank of a job a launcher started (torchrun, srun), SIGTERM is the launcher
stopping the job: :func:`terminate_raises` turns it into :class:`Terminated`, a
failure the rank records. :class:`JobEnded` says a job ends for good from outside
(``scancel``, a time limit with no requeue left: the sweep task raises it; a job's
own deadline), recorded as ``cancelled`` or ``timeout``.

Once a stop is under way, and while a run records itself (:func:`held`), further
signals are ignored: a second Ctrl-C must not cut the record's write short (a stop
that arrives while a finished run writes its record changes nothing). A handler
someone else installed is left alone (submitit's SIGTERM, which requeues or records
the run ``cancelled``; a SIGINT the shell set to be ignored).
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading

__all__ = ["Interrupted", "Terminated", "JobEnded", "STOP_SIGNALS", "DUMP_SIGNAL", "stop_on_signals", "held", "signal_text",
           "stop_under_way", "terminate_raises", "sigterm_ignored", "defer_stops", "raise_deferred",
           "release_deferred"]

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
DUMP_SIGNAL = signal.SIGUSR1  # faulthandler: every thread's Python stack on stderr, the run goes on
_WHY = {signal.SIGINT: "Ctrl-C", signal.SIGHUP: "the terminal closed or the ssh session dropped",
        signal.SIGQUIT: "Ctrl-\\"}


class Interrupted(BaseException):
    """A stop signal ended the run (``signum``). Not an ``Exception``, like
    ``KeyboardInterrupt``: code that catches every error (a rank reporting a failure,
    a retry) must not swallow a stop. ``run_record``: the run's record, once one exists."""

    def __init__(self, signum: int):
        self.signum = int(signum)
        self.run_record: dict | None = None
        super().__init__(f"interrupted by {signal_text(signum)}")

    @property
    def exit_code(self) -> int:
        """The shell's convention for a process ended by a signal: 130 (SIGINT), 143 (SIGTERM),
        129 (SIGHUP), 131 (SIGQUIT)."""
        return 128 + self.signum


class Terminated(RuntimeError):
    """SIGTERM reached a rank of a launched job: the launcher stopping the job (torchrun
    does when a peer died), ``scancel`` or a time limit."""


class JobEnded(RuntimeError):
    """The job was ended for good from outside the run: its scheduler (SIGTERM after
    ``scancel``, or at the time limit with no requeue left) or its own deadline
    (DistDGL's ``--dgl-timeout``). ``status`` is the run record's ``cancelled`` or
    ``timeout``, ``reason`` says why."""

    def __init__(self, status: str, reason: str):
        if status not in ("cancelled", "timeout"):
            raise ValueError(f"a job ends as cancelled or timeout, not {status!r}")
        super().__init__(reason)
        self.status, self.reason = status, reason


def signal_text(signum: int) -> str:
    name = signal.Signals(signum).name
    return f"{name} ({_WHY[signum]})" if signum in _WHY else name


class _State:
    stopping: int | None = None  # the signal of the Interrupted raised: later signals are ignored
    held = 0  # inside held(): signals are ignored
    deferred: int | None = None  # a stop signal that came before the run could record it (defer_stops)


_STATE = _State()


def _raise_once(signum, frame):
    if _STATE.stopping or _STATE.held:
        return
    _STATE.stopping = int(signum)
    raise Interrupted(signum)


def stop_under_way() -> int | None:
    """The signal whose :class:`Interrupted` was raised in this process, else None.

    A handler's exception raised inside a C++ call that calls back into Python comes
    out as that call's own error: ``torch.save`` to a file object, stopped in its
    ``write``, raises ``RuntimeError: [enforce fail at inline_container.cc] unexpected
    pos``. Code that catches every error asks this to tell such a stop from a failure."""
    return _STATE.stopping


def _defer(signum, frame):
    if _STATE.deferred is None:
        _STATE.deferred = int(signum)


def defer_stops() -> None:
    """From a command's first line (``scalegnn.cli.main``) until it can act on them, the
    stop signals are noted, not acted on: a SIGTERM while torch and the data load (the
    first seconds of a run) then ends the run as an ``interrupted`` record
    (:func:`raise_deferred` in :func:`scalegnn.launch.launch`), and any other command in
    one line, instead of a silent death. The interpreter's own start and ``import
    scalegnn.cli`` (about 0.1 s) come before it: a stop there ends the process as the
    signal's default does, with nothing written (it had nothing to write)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in STOP_SIGNALS:
        if signal.getsignal(sig) in (signal.SIG_DFL, signal.default_int_handler):
            signal.signal(sig, _defer)


def raise_deferred() -> None:
    """Raise :class:`Interrupted` for a stop signal :func:`defer_stops` noted, if one came."""
    signum, _STATE.deferred = _STATE.deferred, None
    if signum is not None:
        _STATE.stopping = signum
        raise Interrupted(signum)


def release_deferred() -> None:
    """The stop signals back to their defaults (a launched rank's own handlers take over
    from there); one noted meanwhile is raised (:func:`raise_deferred`)."""
    for sig in STOP_SIGNALS:
        if signal.getsignal(sig) is _defer:
            signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
    raise_deferred()


@contextlib.contextmanager
def stop_on_signals():
    """The stop signals (:data:`STOP_SIGNALS`) raise :class:`Interrupted` (once) inside
    the block, and SIGUSR1 dumps every thread's stack to stderr. Off the main thread,
    for a signal someone else handles, and inside an enclosing ``stop_on_signals``
    nothing changes."""
    import faulthandler

    installed = {}
    dumping = False
    if threading.current_thread() is threading.main_thread():
        for sig in STOP_SIGNALS:
            if signal.getsignal(sig) in (signal.SIG_DFL, signal.default_int_handler, None, _defer):
                installed[sig] = signal.signal(sig, _raise_once)
        if signal.getsignal(DUMP_SIGNAL) in (signal.SIG_DFL, None):
            for stream in (sys.stderr, sys.__stderr__):  # a captured stderr (pytest, a notebook) has no descriptor
                try:
                    faulthandler.register(DUMP_SIGNAL, file=stream, all_threads=True, chain=False)
                except (AttributeError, ValueError, OSError):
                    continue
                dumping = True
                break
    try:
        yield
    finally:
        for sig, previous in installed.items():
            signal.signal(sig, previous)
        if dumping:
            faulthandler.unregister(DUMP_SIGNAL)
        if installed:
            _STATE.stopping = None


@contextlib.contextmanager
def held():
    """Signals are ignored inside: the run is recording itself (its record, a rank's
    report to its spawner), and a stop would only have recorded it too."""
    _STATE.held += 1
    try:
        yield
    finally:
        _STATE.held -= 1


def terminate_raises(rank: int):
    """Make SIGTERM raise :class:`Terminated` in this rank, so the run ends as a
    recorded failure instead of vanishing (torchrun SIGTERMs the survivors when one
    rank dies). Left alone when someone already handles SIGTERM (submitit does: its
    preemption path must requeue, not fail) or off the main thread. Inside
    :func:`held` SIGTERM is ignored: it arrives while rank 0 surveys the lost ranks and
    writes the record (srun sends it when a node's tasks die), and raising there left
    no record at all. Returns the undo."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None):
        return lambda: None

    def handler(signum, frame):
        if _STATE.held:  # the rank is writing its record (held()): it exits right afterwards anyway
            return
        raise Terminated(f"rank {rank} received SIGTERM (the launcher stopped the job: a peer rank failed, "
                         "scancel, or a time limit)")

    previous = signal.signal(signal.SIGTERM, handler)
    return lambda: signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def sigterm_ignored():
    """A failing rank records the failure without being cut short: torchrun SIGTERMs the
    survivors as soon as it sees one rank dead, often while a survivor writes the
    failed record, and the Terminated raised mid-write left no record at all. The rank
    exits non-zero right afterwards anyway."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
