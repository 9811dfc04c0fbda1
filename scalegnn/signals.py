"""Stopping a run with a signal: SIGINT (Ctrl-C) or SIGTERM ends it as an ``interrupted`` record.

:func:`stop_on_signals` makes the first SIGINT or SIGTERM raise :class:`Interrupted`
in the main thread, wherever the run is: loading data, training, evaluating, saving
a checkpoint (a save cut short has no ``meta.json`` and is ignored on resume).
:func:`scalegnn.run.run` installs it around every run; every local ``--nproc``
worker installs it too, and its spawner forwards the signal it got to them
(:func:`scalegnn.parallel.launch.spawn`). The trainers mark their partial record
``interrupted`` and hand it on the exception (``run_record``); ``run`` writes it,
naming the signal, the epochs done and how to resume; ``scalegnn train`` exits with
128 + the signal's number (130, 143) after one line, without a traceback.

Once a stop is under way, and while a run records itself (:func:`held`), further
signals are ignored: a second Ctrl-C must not cut the record's write short (a stop
that arrives while a finished run writes its record changes nothing). A handler
someone else installed is left alone (submitit's SIGTERM, which requeues or records
the run ``cancelled``; a SIGINT the shell set to be ignored).
"""

from __future__ import annotations

import contextlib
import signal
import threading

__all__ = ["Interrupted", "STOP_SIGNALS", "stop_on_signals", "held", "signal_text", "stop_under_way"]

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


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
        """The shell's convention for a process ended by a signal: 130 (SIGINT), 143 (SIGTERM)."""
        return 128 + self.signum


def signal_text(signum: int) -> str:
    name = signal.Signals(signum).name
    return f"{name} (Ctrl-C)" if signum == signal.SIGINT else name


class _State:
    stopping: int | None = None  # the signal of the Interrupted raised: later signals are ignored
    held = 0  # inside held(): signals are ignored


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


@contextlib.contextmanager
def stop_on_signals():
    """SIGINT and SIGTERM raise :class:`Interrupted` (once) inside the block. Off the
    main thread, for a signal someone else handles, and inside an enclosing
    ``stop_on_signals`` nothing changes."""
    installed = {}
    if threading.current_thread() is threading.main_thread():
        for sig in STOP_SIGNALS:
            if signal.getsignal(sig) in (signal.SIG_DFL, signal.default_int_handler, None):
                installed[sig] = signal.signal(sig, _raise_once)
    try:
        yield
    finally:
        for sig, previous in installed.items():
            signal.signal(sig, previous)
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
