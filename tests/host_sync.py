"""Find every place where code makes the host wait for a device value.

On a GPU, reading a tensor's value on the host (``.item()``, ``float(t)``, ``if t:``,
``.tolist()``), an operation whose output size depends on the data (``nonzero``,
boolean-mask indexing, ``unique``, ``repeat_interleave`` without ``output_size``),
a copy between host and device, or building a tensor from Python data stalls the
host until the GPU has finished everything queued before it. On the CPU the same
calls cost nothing, so a CPU run cannot *feel* them; :class:`HostSyncDetector` sees
them anyway, by name, on any device: a torch function mode for the Python-level
calls and a dispatch mode for the ATen operators, both thread-local, so work on
other threads (the prefetch thread's sampling) is not counted.

    with HostSyncDetector() as det:
        engine.train_step(step)
    assert det.events == []
"""

from __future__ import annotations

import traceback

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["HostSyncDetector"]

# Python-level tensor methods and torch functions that read device values on the host.
# Not ``numpy``: it only exists for CPU tensors (a CUDA tensor's raises, so it can never
# hide a GPU stall; the ``cpu()`` before it would be counted) and is how the CPU's
# compiled kernels (numba) see a tensor's memory, without a copy.
_FUNCTIONS = {"item", "tolist", "cpu", "__float__", "__int__", "__bool__", "__index__",
              "tensor", "as_tensor", "nonzero", "argwhere", "unique", "unique_consecutive", "masked_select",
              "equal", "allclose", "is_nonzero"}
# ATen operators that synchronize a GPU (output sizes that depend on the data, scalar reads).
_OPS = {"aten._local_scalar_dense", "aten.nonzero", "aten.masked_select", "aten._unique2", "aten.unique_dim",
        "aten.unique_consecutive", "aten.is_nonzero", "aten.equal", "aten.lift_fresh"}


def _op_name(func) -> str:
    return str(func.overloadpacket) if hasattr(func, "overloadpacket") else str(func)


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v)


class _Functions(TorchFunctionMode):
    def __init__(self, sink):
        super().__init__()
        self.sink = sink

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in _FUNCTIONS:
            self.sink(f"{name}()")
        return func(*args, **(kwargs or {}))


class _Ops(TorchDispatchMode):
    def __init__(self, sink):
        super().__init__()
        self.sink = sink

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = _op_name(func)
        if name in _OPS:
            self.sink(name)
        elif name in ("aten.index", "aten.index_put", "aten.index_put_", "aten._index_put_impl_"):
            indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
            if any(t is not None and t.dtype == torch.bool for t in _tensors(list(indices or ()))):
                self.sink(f"{name} with a boolean mask")
        elif name == "aten.repeat_interleave" and kwargs.get("output_size") is None and \
                (len(args) < 4 or args[3] is None) and isinstance(args[0], torch.Tensor) and len(args) >= 2 \
                and isinstance(args[1], torch.Tensor):
            self.sink("aten.repeat_interleave without output_size")
        elif name in ("aten._to_copy", "aten.copy_", "aten.to"):
            devices = {t.device for t in _tensors(list(args))}
            target = kwargs.get("device")
            if len(devices) > 1 or (target is not None and any(torch.device(target) != d for d in devices)):
                self.sink(f"{name} between devices")
        return func(*args, **kwargs)


class HostSyncDetector:
    """Context manager recording host-device synchronization points on this thread:
    ``events`` lists (what, where) with the innermost scalegnn frame of each."""

    def __init__(self):
        self.events: list[tuple[str, str]] = []
        self._modes = (_Functions(self._record), _Ops(self._record))

    def _record(self, what: str) -> None:
        # This file's frames are the modes'; a C-level call (``bool(t)``) adds no frame of its own.
        frames = [f for f in traceback.extract_stack() if f.filename != __file__
                  and "scalegnn" in f.filename and "tests" not in f.filename]
        where = f"{frames[-1].filename.split('scalegnn', 1)[-1]}:{frames[-1].lineno} {frames[-1].name}" \
            if frames else "outside scalegnn"
        self.events.append((what, where))

    def __enter__(self) -> "HostSyncDetector":
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc):
        for mode in reversed(self._modes):
            mode.__exit__(*exc)
        return False
