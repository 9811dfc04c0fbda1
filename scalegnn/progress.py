"""Per-epoch progress that a batch job can read: a bar on a terminal, log lines elsewhere.

A SLURM or Flux job writes stdout to a file (``.out``), where a tqdm bar draws
nothing useful: one carriage-return-overwritten line, or nothing at all when it is
switched off. :class:`EpochLogger` therefore picks by where its output goes:

* ``mode="auto"`` (the default): a tqdm bar when stderr is a terminal, otherwise one
  log line per epoch;
* ``"lines"``: always log lines, with a :class:`Heartbeat` line inside a long epoch;
* ``"bar"``: always the bar; ``"off"`` (``--quiet``, ``progress=False``): nothing.

Only rank 0 reports (every rank sees the same reduced row). A line reads::

    scalegnn csbm:n=600 epoch 3/10: loss 1.2345, batch acc 0.5120, test acc 0.4980, epoch 1.23 s, 812 vertices/s

through the ``scalegnn.progress`` logger at INFO, so ``--log-level WARNING`` silences
it and ``--log-level DEBUG`` adds the rest of the row. :func:`configure_logging`
gives the ``scalegnn`` loggers their one handler (stdout: the job's ``.out`` file);
it does not touch the root logger, so submitit's own log lines are not doubled.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time

__all__ = ["EpochLogger", "Heartbeat", "resolve_mode", "configure_logging", "default_log_level", "mode_from_progress", "LOG_LEVELS", "LOG_FORMAT",
           "Phases"]

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
MODES = ("auto", "lines", "bar", "off")
_HANDLER_NAME = "scalegnn-stdout"


class _StdoutHandler(logging.StreamHandler):
    """Writes to ``stream`` when given, else to whatever ``sys.stdout`` is at each
    line (a test's captured stdout, a notebook's), never to a stale one."""

    def __init__(self, stream=None):
        super().__init__(stream if stream is not None else sys.stdout)
        self.use(stream)

    def use(self, stream=None) -> None:
        """Write to ``stream`` from now on (None: follow ``sys.stdout``); the previous
        stream is neither flushed nor kept (it may be closed by now)."""
        with self.lock:
            self.follow = stream is None
            self.stream = stream

    reader_gone = False  # stdout's reader left (`scalegnn train ... | head`): the run goes on, unheard

    def handleError(self, record):
        if isinstance(sys.exc_info()[1], BrokenPipeError):
            self.reader_gone = True  # not a "--- Logging error ---" traceback per line for the rest of the run
            return
        super().handleError(record)

    def emit(self, record):
        if self.reader_gone:
            return
        if not self.follow:
            return super().emit(record)
        with self.lock:
            self.stream = sys.stdout
            try:
                super().emit(record)
            finally:
                self.stream = None


def configure_logging(level: str | int = "INFO", stream=None) -> logging.Logger:
    """Level and handler of the ``scalegnn`` logger tree (idempotent: a second call
    changes the level, and the stream when one is given). Lines go to ``stream``, or
    to stdout (what a batch job's ``.out`` file holds). Returns the ``scalegnn`` logger."""
    if isinstance(level, str):
        name = level.upper()
        if name not in LOG_LEVELS:
            raise ValueError(f"--log-level (default $SCALEGNN_LOG_LEVEL) must be one of {', '.join(LOG_LEVELS)}, "
                             f"got {level!r}")
        level = getattr(logging, name)
    logger = logging.getLogger("scalegnn")
    logger.setLevel(level)
    # Worker processes (``--nproc``'s spawned ranks) start without this configuration:
    # they read the level from the environment they inherit (EpochLogger configures them).
    os.environ["SCALEGNN_LOG_LEVEL"] = logging.getLevelName(level)
    handler = next((h for h in logger.handlers if h.get_name() == _HANDLER_NAME), None)
    if handler is None:
        handler = _StdoutHandler(stream)
        handler.set_name(_HANDLER_NAME)
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        logger.addHandler(handler)
        logger.propagate = False  # one copy of each line, whatever the root logger has
    elif stream is not None:
        handler.use(stream)
    return logger


def _ensure_configured() -> None:
    """Give the ``scalegnn`` logger its handler in a process where nothing configured
    logging (a spawned rank): otherwise its INFO lines would be dropped. A process
    whose root logger has handlers (an application, pytest) keeps its own set-up."""
    if not logging.getLogger("scalegnn").handlers and not logging.getLogger().handlers:
        configure_logging(default_log_level())


def mode_from_progress(progress: bool | None) -> str:
    """``LoopConfig.progress`` as a mode: None -> auto (bar on a terminal, lines
    elsewhere), False (``--quiet``, ``quiet=True``) -> off, True -> bar."""
    return "auto" if progress is None else ("bar" if progress else "off")


def resolve_mode(mode: str, rank: int = 0, stream=None) -> str:
    """What rank ``rank`` shows for ``mode``: "off" on every rank but 0; "auto" is a bar
    where ``stream`` (default stderr) is a terminal, else lines."""
    if mode not in MODES:
        raise ValueError(f"progress mode must be one of {MODES}, got {mode!r}")
    if rank != 0:
        return "off"
    if mode == "auto":
        out = stream if stream is not None else sys.stderr
        return "bar" if hasattr(out, "isatty") and out.isatty() else "lines"
    return mode


def _duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    h, rest = divmod(seconds, 3600)
    return f"{h}h{rest // 60:02d}m" if h else (f"{rest // 60}m{rest % 60:02d}s" if rest >= 60 else f"{rest}s")


class Heartbeat:
    """A line inside a long epoch, every ``every_s`` seconds, where the epoch lines go
    (mode "lines": a batch log), so that a log is never silent for a whole epoch::

        scalegnn papers epoch 2/10: step 300/1000, 12.5 steps/s, 6,400 vertices/s, epoch ETA 56s, run ETA 14m20s

    :meth:`step` is called after every step; it reads the clock only (no device
    value), so the rates are those at which the host queues steps (on a GPU, ahead of
    the device by at most its queue). ``every_s`` 0 turns it off."""

    def __init__(self, system: str, dataset: str, total_epochs: int, rank: int = 0, mode: str = "auto", *,
                 every_s: float = 60.0, steps_per_epoch: int, batch_size: int | None = None, clock=time.monotonic):
        self.on = every_s > 0 and resolve_mode(mode, rank) == "lines"
        self.system, self.dataset, self.total = system, dataset, int(total_epochs)
        self.every_s, self.spe, self.batch_size, self.clock = float(every_s), int(steps_per_epoch), batch_size, clock
        self.log = logging.getLogger("scalegnn.progress")
        self.epoch = self.first_step = 0
        self.start = self.last = 0.0

    def begin_epoch(self, epoch: int, step_in_epoch: int = 0) -> None:
        """Epoch ``epoch`` starts (at ``step_in_epoch``: a run resumed mid-epoch)."""
        self.epoch, self.first_step = epoch, step_in_epoch
        self.start = self.last = self.clock()

    def step(self, step_in_epoch: int) -> str | None:
        """``step_in_epoch`` steps of the epoch are done; returns the line when one is due."""
        if not self.on:
            return None
        now = self.clock()
        if now - self.last < self.every_s:
            return None
        self.last = now
        done = step_in_epoch - self.first_step
        rate = done / max(now - self.start, 1e-9)
        parts = [f"step {step_in_epoch}/{self.spe}", f"{rate:.2f} steps/s"]
        if self.batch_size:
            parts.append(f"{rate * self.batch_size:,.0f} vertices/s")
        if rate > 0:
            left = (self.spe - step_in_epoch) / rate
            parts += [f"epoch ETA {_duration(left)}",
                      f"run ETA {_duration(left + (self.total - self.epoch) * self.spe / rate)}"]
        line = f"{self.system} {self.dataset} epoch {self.epoch}/{self.total}: " + ", ".join(parts)
        self.log.info(line)
        return line


def _fmt(value, spec: str = ".4f") -> str:
    return "-" if value is None else format(value, spec)


class Phases:
    """The first minute of a run, phase by phase: rank 0 logs one line as each phase
    (loading the graph, building the engine: ``scalegnn.trainer``) ends, with what it
    made and its seconds, so that a batch log is not silent until the first epoch::

        phases = Phases(rank)
        with phases("loading the graph") as said:
            graph = load(...)
            said(f"{graph.num_nodes:,} vertices")
    """

    def __init__(self, rank: int = 0, *, quiet: bool = False):
        self.rank = -1 if quiet else rank  # quiet (--quiet): no rank speaks
        self.log = logging.getLogger("scalegnn.progress")
        if self.rank == 0:
            _ensure_configured()

    def say(self, line: str) -> None:
        """One line now, outside any phase: a run's first, what it starts
        (:func:`scalegnn.launch.launch`, before torch loads)."""
        if self.rank == 0:
            self.log.info("%s", line)

    @contextlib.contextmanager
    def __call__(self, what: str):
        detail: list[str] = []
        start = time.perf_counter()
        yield detail.append
        if self.rank == 0:
            self.log.info("%s%s (%.1f s)", what, f": {'; '.join(detail)}" if detail else "",
                          time.perf_counter() - start)


class EpochLogger:
    """Reports each finished epoch of one run (rank 0 only).

    ``row`` is the run record's epoch row (``results/README.md``): ``epoch``,
    cumulative ``train_time_s``, ``loss``, ``batch_train_acc`` and the evaluated
    ``train_acc``/``val_acc``/``test_acc`` (None when not evaluated). The epoch time
    is the difference of cumulative training times (evaluation excluded); the
    throughput is ``steps_per_epoch * batch_size`` sampled vertices per second of it
    (steps per second without a batch size). A resumed run passes the epochs and
    training time it had already done.
    """

    def __init__(self, system: str, dataset: str, total_epochs: int, rank: int = 0, mode: str = "auto", *,
                 steps_per_epoch: int | None = None, batch_size: int | None = None, done_epochs: int = 0,
                 done_time_s: float = 0.0, stream=None):
        self.system, self.dataset, self.total = system, dataset, int(total_epochs)
        self.steps_per_epoch, self.batch_size = steps_per_epoch, batch_size
        self.last_time_s = float(done_time_s)
        self.log = logging.getLogger("scalegnn.progress")
        self.bar = None
        self.mode = mode = resolve_mode(mode, rank, stream)
        if mode == "off":
            return
        if mode == "lines":
            _ensure_configured()
        if mode == "bar":
            from tqdm import tqdm

            self.bar = tqdm(total=self.total, initial=int(done_epochs), desc=f"{system} {dataset}", unit="epoch",
                            leave=False, file=stream)

    def line(self, row: dict) -> str:
        """The log line of one epoch row."""
        epoch_s = max(0.0, float(row["train_time_s"]) - self.last_time_s)
        parts = [f"loss {_fmt(row.get('loss'))}", f"batch acc {_fmt(row.get('batch_train_acc'))}"]
        if row.get("test_acc") is not None:
            parts.append(f"val acc {_fmt(row.get('val_acc'))}")
            parts.append(f"test acc {_fmt(row['test_acc'])}")
        parts.append(f"epoch {epoch_s:.2f} s")
        if self.steps_per_epoch and epoch_s > 0:
            if self.batch_size:
                parts.append(f"{self.steps_per_epoch * self.batch_size / epoch_s:,.0f} vertices/s")
            else:
                parts.append(f"{self.steps_per_epoch / epoch_s:.2f} steps/s")
        if row.get("eval_time_s") is not None:
            parts.append(f"eval {row['eval_time_s']:.2f} s")
        return f"{self.system} {self.dataset} epoch {row['epoch']}/{self.total}: " + ", ".join(parts)

    def epoch(self, row: dict) -> None:
        """Report one finished epoch (call on every rank; only rank 0 writes)."""
        if self.mode == "lines":
            self.log.info(self.line(row))
            if self.log.isEnabledFor(logging.DEBUG):
                self.log.debug("epoch %s components %s comm_bytes %s", row["epoch"], row.get("components"),
                               row.get("comm_bytes"))
        elif self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(loss=f"{row['loss']:.3f}", test=row.get("test_acc") or float("nan"))
        if "train_time_s" in row:
            self.last_time_s = float(row["train_time_s"])

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def default_log_level() -> str:
    """``$SCALEGNN_LOG_LEVEL`` (a profile's ``[env]`` can set it for every task), else INFO."""
    return os.environ.get("SCALEGNN_LOG_LEVEL", "").strip() or "INFO"  # checked by configure_logging
