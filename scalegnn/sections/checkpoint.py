"""The ``checkpoint`` section: where and how often to checkpoint, whether to resume
(read by :mod:`scalegnn.checkpoint`), and the ``--checkpoint-every`` parser."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..settings import setting

__all__ = ["CheckpointConfig", "parse_every"]

_EVERY = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*(steps?|s|sec|secs|seconds?|m|min|mins|minutes?|h|hours?)?\s*$", re.I)
_UNIT_SECONDS = {"s": 1.0, "m": 60.0, "h": 3600.0}


def parse_every(text) -> tuple[int | None, float | None]:
    """``"500"`` / ``"500steps"`` -> (500, None); ``"30m"`` -> (None, 1800.0); ``"90s"``, ``"2h"``."""
    m = _EVERY.match(str(text))
    if not m:
        raise ValueError(
            f"--checkpoint-every must be a step count (e.g. 500) or a duration with a unit "
            f"(e.g. 30m, 90s, 2h), got {text!r}"
        )
    value, unit = m.group(1), (m.group(2) or "steps").lower()
    if unit.startswith("step"):
        if "." in value or int(value) < 1:
            raise ValueError(f"--checkpoint-every in steps must be a whole number >= 1, got {text!r}")
        return int(value), None
    seconds = float(value) * _UNIT_SECONDS[unit[0]]
    if seconds <= 0:
        raise ValueError(f"--checkpoint-every must be a positive duration, got {text!r}")
    return None, seconds


@dataclass(kw_only=True)
class CheckpointConfig:
    """Where and how often to checkpoint, and whether to resume.

    ``every``: ``None`` (never save), a step count (``"500"``) or a wall-clock period
    (``"30m"``, ``"90s"``, ``"2h"``). ``resume``: continue from the newest complete
    checkpoint in ``dir``; a no-op when there is none yet. ``keep``: complete
    checkpoints kept on disk (the newest ones).
    """

    dir: str | None = setting(None, flag="--checkpoint-dir", scope="scalegnn", output=True,
                              help="folder for this run's checkpoints (one per run; shared storage on multi-node jobs)")
    every: str | None = setting(None, flag="--checkpoint-every", scope="scalegnn", metavar="K",
                                help="save a checkpoint every K steps (e.g. 500) or every period (e.g. 30m, 90s, 2h)")
    resume: bool = setting(False, scope="scalegnn", action="store_true",
                           help="continue from the newest complete checkpoint in --checkpoint-dir; starts from scratch "
                           "when there is none, so a requeued job can always pass it")
    # rare: a resumed run reads only the newest complete checkpoint; keeping more only costs disk
    keep: int = setting(2, flag="--keep-checkpoints", scope="scalegnn", rare=True,
                        help="complete checkpoints kept on disk")

    def __post_init__(self):
        if self.every is not None:
            self.every = str(self.every).strip()
            parse_every(self.every)
        if self.keep < 1:
            raise ValueError(f"--keep-checkpoints must be >= 1, got {self.keep}")
        if (self.every is not None or self.resume) and not self.dir:
            flag = "--checkpoint-every" if self.every is not None else "--resume"
            raise ValueError(f"{flag} needs --checkpoint-dir (a folder every rank can reach, one per run)")

    @property
    def every_steps(self) -> int | None:
        return None if self.every is None else parse_every(self.every)[0]

    @property
    def every_seconds(self) -> float | None:
        return None if self.every is None else parse_every(self.every)[1]

    @property
    def enabled(self) -> bool:
        return self.every is not None
