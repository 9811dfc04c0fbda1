"""numba, the optional JIT compiler of the CPU kernels (extra "fast"), loaded once.

    numba         the module, or None where it is not installed (the kernels' modules
                  compile their functions only when it is there)
    available()   whether the kernels may run: numba is installed and no kernel has
                  failed to compile in this process
    run(kernel, *args)
                  call a compiled kernel; one that fails to compile (an unusual
                  numba/LLVM build) is warned about once, turns every kernel off for
                  the rest of the process and raises :class:`Unavailable`
    Unavailable   the kernels cannot run here: the caller takes its torch path, which
                  gives the same result

Shared by the kernels that fall back to torch together: ScaleGNN's sampler kernel
(:mod:`scalegnn._sampling_kernel`), the layer tail's (:mod:`scalegnn._elementwise`) and
FastSample's sampler (:mod:`scalegnn.baselines.fastsample_kernel`); the row-sparse
AdamW (:mod:`scalegnn.optim`) takes the module from here and keeps its own fallback.
"""

from __future__ import annotations

__all__ = ["numba", "available", "run", "Unavailable"]

try:  # optional dependency: `pip install numba` (extra "fast")
    import numba

    _HAVE_NUMBA = True
except ImportError:  # pragma: no cover - exercised where numba is absent
    numba = None
    _HAVE_NUMBA = False


def available() -> bool:
    return _HAVE_NUMBA


class Unavailable(RuntimeError):
    """The kernels cannot run here; the caller takes the torch path (same result)."""


def run(kernel, *args):
    """Call a kernel; if it fails to compile (an unusual numba/LLVM build), warn once,
    disable the kernels for this process and raise :class:`Unavailable`."""
    global _HAVE_NUMBA
    if not _HAVE_NUMBA:
        raise Unavailable("numba is not installed")
    try:
        return kernel(*args)
    except (numba.core.errors.NumbaError, RuntimeError, OSError) as exc:
        _HAVE_NUMBA = False
        import warnings

        warnings.warn(f"numba kernels unavailable ({type(exc).__name__}: {exc}); using the torch path",
                      RuntimeWarning, stacklevel=3)
        raise Unavailable(str(exc)) from exc
