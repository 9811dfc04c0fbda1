"""Atomic file writes: a reader sees the whole new file or the old one, never a part.

Every file this project writes for later reading (run records, checkpoints, shard
files, sweep manifests, the dataset cache) goes through :func:`atomic_write`; when
reading one back fails, :func:`load_error` is the reason in one line.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["atomic_write", "load_error"]


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(target: str | os.PathLike, write, *, text: bool = False, exclusive: bool = False) -> Path:
    """``write(f)`` into a temporary file next to ``target`` (``f`` opened ``"wb"``, or
    ``"w"`` in UTF-8 with ``text``),
    fsync it, then rename it over ``target`` and fsync the folder. An interrupted or
    failing write leaves no temporary file and the previous ``target`` untouched.
    ``exclusive``: only if ``target`` does not exist yet (a hard link, atomic on
    POSIX); raises ``FileExistsError`` otherwise."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") if text else os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        if exclusive:
            os.link(tmp, target)
            os.unlink(tmp)
        else:
            os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(target.parent)
    return target


def load_error(exc: BaseException) -> str:
    """Why ``torch.load`` (or an unpickler) failed, as ``"<Type>: <reason>"`` on one line.

    torch's weights-only refusal spans several lines and opens by suggesting
    ``weights_only=False``, the one thing never to do with a file that failed this
    check; only its reason (the refused global or opcode) is kept."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if lines and lines[0].startswith("Weights only load failed"):
        reasons = []
        for line in lines[1:]:
            if line.startswith("Check the documentation"):
                continue
            line = line.split("WeightsUnpickler error:", 1)[-1].strip()
            if line:
                reasons.append(line)
        lines = ["; ".join(reasons) or "the file holds objects other than tensors and plain containers"]
    reason = lines[0] if lines else "the file is empty or ends early"
    return f"{type(exc).__name__}: {reason[:300]}"
