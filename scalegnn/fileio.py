"""Atomic file writes: a reader sees the whole new file or the old one, never a part.

Every file this project writes for later reading (run records, checkpoints, shard
files, sweep manifests, the dataset cache) goes through :func:`atomic_write`; when
reading one back fails, :func:`load_error` is the reason in one line. Before any work,
:func:`check_output_folder` and :func:`check_output_file` make sure what the work will write can be written
(and overwrites nothing it reads).

Sizes that a file (or a flag) declares are checked before memory is spent on them
(:func:`check_declared_size`): against the file's own size where the data must be in
the file, and against the memory budget (:func:`memory_budget`: this machine's
memory, or ``$SCALEGNN_MEMORY_BUDGET``), so a 60-byte header claiming 10^12 rows is
one line naming the file and the field, not an allocator traceback.
"""

from __future__ import annotations

import mmap
import os
import shutil
import tempfile
from pathlib import Path

__all__ = ["atomic_write", "NpyAppender", "drop_pages", "load_error", "check_output_folder", "check_output_file",
           "file_sha256", "memory_budget", "physical_memory", "check_declared_size", "human_bytes",
           "MEMORY_BUDGET_ENV", "MIN_FREE_BYTES"]

MEMORY_BUDGET_ENV = "SCALEGNN_MEMORY_BUDGET"
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


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


def _process_umask() -> int:
    """This process's umask, read without changing it where Linux shows it (changing it,
    even for an instant, races with other threads creating files)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# Files are created as open() would create them (0666 less the umask): mkstemp's private
# 0600 would hide records, shards and checkpoints from a project group on shared storage.
FILE_MODE = 0o666 & ~_process_umask()


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
        os.fchmod(fd, FILE_MODE)
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


# Room a command needs in its output folder before it starts: the run record's reserve
# (records.RESERVE_BASE_BYTES, 256 KiB) and more; a disk with less is full for our purposes,
# and finding it at the start loses nothing, where finding it at the end loses the run.
MIN_FREE_BYTES = 1 << 20
_NAME_MAX = 255  # bytes per path component (ext4, xfs, Lustre, GPFS); longer is ENAMETOOLONG
_PATH_MAX = 4095


def _check_path_text(path: str | os.PathLike, flag: str) -> Path:
    """``path`` made absolute, refused in one line when it cannot name a file on POSIX
    (a component over 255 bytes, the whole over 4095, a NUL): asked of the file system,
    those are ENAMETOOLONG or ValueError tracebacks from the first ``stat``."""
    text = os.fspath(path)
    if not text or "\0" in text:
        raise ValueError(f"{flag} {text!r} is not a file name; pass a path")
    target = Path(text).absolute()
    long = [part for part in target.parts if len(os.fsencode(part)) > _NAME_MAX]
    if long:
        raise ValueError(f"{flag} {text[:60]}...: a folder or file name of {len(os.fsencode(long[0]))} bytes, longer "
                         f"than the {_NAME_MAX} a file system allows; pass a shorter name")
    if len(os.fsencode(str(target))) > _PATH_MAX:
        raise ValueError(f"{flag} {text[:60]}...: a path of {len(os.fsencode(str(target)))} bytes, longer than the "
                         f"{_PATH_MAX} a file system allows; pass a shorter path")
    return target


def _dangling_link(target: Path) -> Path | None:
    """The first of ``target`` and its ancestors that is a symbolic link to nothing."""
    for candidate in (target, *target.parents):
        if os.path.islink(candidate) and not candidate.exists():
            return candidate
    return None


def check_output_folder(path: str | os.PathLike, flag: str, *, min_free: int = MIN_FREE_BYTES) -> None:
    """Refuse, before any work, a folder that the work could not write to: ``ValueError``
    with one line naming ``flag``, the path, the problem and the fix: a file in the way,
    a name too long for the file system, a symbolic link to nothing (on it or on the way
    to it: creating the folder would fail at the end of the run), no write permission,
    or less than ``min_free`` bytes free on its disk.

    Writability is tried, not read from permission bits (root ignores them, and /proc
    or /sys refuse what the bits allow): a probe file is created and removed in the
    folder, or, when the folder does not exist yet, in its nearest existing ancestor,
    where the folder would be created. Nothing is left behind, so a refused or failed
    run leaves no empty folder, and ranks that check the same folder at once cannot
    disturb each other."""
    target = _check_path_text(path, flag)
    fix = "pass a folder you can write to (it is created if missing)"
    link = _dangling_link(target)
    if link is not None:
        raise ValueError(f"{flag} {path}: {link} is a symbolic link to {os.readlink(link)}, which does not exist; "
                         f"create that folder or {fix}")
    folder = target
    while not folder.exists() and folder.parent != folder:
        folder = folder.parent
    if not folder.is_dir():
        what = "is an existing file" if folder == target else f"cannot be created: {folder} is a file"
        raise ValueError(f"{flag} {path} {what}, not a folder; {fix}")
    try:
        fd, probe = tempfile.mkstemp(prefix=".scalegnn-write-probe-", dir=folder)
    except OSError as exc:
        where = "is not writable" if folder == target else f"cannot be created in {folder}"
        raise ValueError(f"{flag} {path} {where} ({exc.strerror or exc}); {fix}") from None
    os.close(fd)
    os.unlink(probe)
    try:
        free = shutil.disk_usage(folder).free
    except OSError:  # a file system that does not say: the writes will tell
        return
    if free < min_free:
        raise ValueError(f"{flag} {path}: its disk has {human_bytes(free)} free, less than the {human_bytes(min_free)} "
                         f"this command needs before it starts; free space there or {fix}")


def check_output_file(path: str | os.PathLike, flag: str, *, inputs: tuple = (), min_free: int = MIN_FREE_BYTES) \
        -> None:
    """Refuse, before any work, a file path that the work could not write, or must not:
    a folder in the way, a symbolic link to nothing, a folder it cannot be created in
    (:func:`check_output_folder` on its folder), or a path that is, or lies inside, one
    of ``inputs`` (the files and folders the command reads: a checkpoint folder, whose
    own rank files an export must never overwrite)."""
    target = _check_path_text(path, flag)
    if target.is_dir():
        raise ValueError(f"{flag} {path} is a folder; pass a file name (e.g. {Path(path) / 'model.pt'})")
    if os.path.islink(target) and not target.exists():
        raise ValueError(f"{flag} {path} is a symbolic link to {os.readlink(target)}, which does not exist; pass "
                         "another file name")
    if target.exists() and not target.is_file():  # a FIFO, a socket, /dev/null: the atomic write would replace it
        raise ValueError(f"{flag} {path} is not a regular file (a pipe, a socket or a device); pass a file name")
    real = target.resolve()
    for source in inputs:
        source_real = Path(source).resolve()
        if real == source_real or source_real in real.parents:
            raise ValueError(f"{flag} {path} is {'inside ' if real != source_real else ''}{source}, which this "
                             "command reads; pass a path outside it")
    check_output_folder(target.parent, flag, min_free=min_free)


def file_sha256(path, block: int = 1 << 22) -> str:
    """The SHA-256 of a file, read ``block`` bytes at a time (shard manifests' and
    checkpoints' checksums)."""
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(block):
            h.update(chunk)
    return h.hexdigest()


def human_bytes(n: float) -> str:
    """``n`` bytes as a short text (``7.3 TiB``)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def memory_budget() -> int:
    """The bytes one declared size may claim: ``$SCALEGNN_MEMORY_BUDGET`` (bytes, or with
    a K/M/G/T suffix, e.g. ``64G``), else this machine's physical memory."""
    text = os.environ.get(MEMORY_BUDGET_ENV, "").strip().upper().removesuffix("B").removesuffix("I")
    if text:
        unit = text[-1] if text[-1] in _UNITS else ""
        try:
            value = float(text[: len(text) - len(unit)])
        except ValueError:
            raise ValueError(f"${MEMORY_BUDGET_ENV}={os.environ[MEMORY_BUDGET_ENV]!r} is not a size; give bytes or "
                             "a number with K, M, G or T (e.g. 64G)") from None
        if not 0 < value * _UNITS[unit] < 2**63:
            raise ValueError(f"${MEMORY_BUDGET_ENV} must be a finite size > 0 (e.g. 64G), got "
                             f"{os.environ[MEMORY_BUDGET_ENV]!r}")
        return int(value * _UNITS[unit])
    return physical_memory()


def physical_memory() -> int:
    """This machine's physical memory in bytes (1 TiB where the system does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 1 << 40


def check_declared_size(where: str, field: str, count, itemsize: int = 1, *, fix: str,
                        available: int | None = None, error: type[Exception] = ValueError) -> None:
    """Refuse ``count`` items of ``itemsize`` bytes that ``where``'s ``field`` declares,
    before they are allocated: more bytes than ``available`` (what the file holds for
    them, when the data must be in the file) or than the :func:`memory_budget`. Raises
    ``error`` with one line naming ``where``, ``field``, the sizes and ``fix``."""
    count = int(count)
    if count < 0:
        raise error(f"{where}: {field} declares a negative size {count:,}; {fix}")
    need = count * max(int(itemsize), 1)
    if available is not None and need > available:
        raise error(f"{where}: {field} declares {count:,} entries ({human_bytes(need)}) but the file holds only "
                    f"{human_bytes(available)} for them; {fix}")
    budget = memory_budget()
    if need > budget:
        raise error(f"{where}: {field} declares {count:,} entries ({human_bytes(need)}), more than the memory "
                    f"budget of {human_bytes(budget)} (this machine's memory; ${MEMORY_BUDGET_ENV} sets another); "
                    f"{fix}")


def npy_header(dtype, shape: tuple) -> bytes:
    """An .npy (v1.0) header whose first dimension is printed at a fixed width, so the
    header of a file written by appending rows can be rewritten in place once the length
    is known (``np.load`` reads the shape with ``ast.literal_eval``; the padding keeps the
    data 64-byte aligned)."""
    import numpy as np

    dims = "%20d," % shape[0] + "".join(" %d," % d for d in shape[1:])
    d = "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }" % (np.dtype(dtype).str, dims.rstrip(",")
                                                                        if len(shape) > 1 else dims)
    pad = 64 - (10 + len(d) + 1) % 64
    text = (d + " " * pad + "\n").encode("latin1")
    return b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text


class NpyAppender:
    """An .npy file of ``dtype`` rows (trailing dimensions ``row_shape``) written by
    appending chunks, in bounded memory: under a temporary name beside ``path`` until
    :meth:`close` rewrites the header's row count, fsyncs and renames it into place (an
    interrupted write leaves no ``path``). Data go out through ``write``, never through a
    writable memory map, whose dirty pages would count against the writer's memory."""

    def __init__(self, path, dtype, row_shape: tuple = ()):
        import numpy as np

        self.path, self.dtype, self.row_shape, self.rows = Path(path), np.dtype(dtype), tuple(row_shape), 0
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = self.path.with_name(f".{self.path.name}.part")
        self.f = open(self.tmp, "wb")
        self.f.write(npy_header(self.dtype, (0,) + self.row_shape))

    def add(self, chunk) -> None:
        import numpy as np

        chunk = np.ascontiguousarray(chunk, dtype=self.dtype)
        if chunk.shape[1:] != self.row_shape:
            raise ValueError(f"{self.path}: rows of shape {chunk.shape[1:]}, not {self.row_shape}")
        self.f.write(memoryview(chunk).cast("B"))
        self.rows += chunk.shape[0] if chunk.ndim else 1

    def close(self) -> Path:
        self.f.seek(0)
        self.f.write(npy_header(self.dtype, (self.rows,) + self.row_shape))
        self.f.flush()
        os.fsync(self.f.fileno())
        self.f.close()
        os.replace(self.tmp, self.path)
        _fsync_dir(self.path.parent)
        return self.path

    def abort(self) -> None:
        """Drop the partial file (nothing when :meth:`close` has already put it in place)."""
        if not self.f.closed:
            self.f.close()
            self.tmp.unlink(missing_ok=True)


def drop_pages(*arrays) -> None:
    """Take the pages of memory-mapped ``arrays`` out of this process's resident set
    (``madvise(MADV_DONTNEED)``; a file's clean pages stay in the page cache): a pass over
    a file larger than memory would otherwise count every page it has read against the
    process's peak, though the kernel could drop them at will."""
    for a in arrays:
        m = getattr(a, "_mmap", None)
        if m is not None and hasattr(m, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
            m.madvise(mmap.MADV_DONTNEED)
