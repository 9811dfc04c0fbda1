"""A virtual GPU on a CPU-only torch: the code takes its GPU branches, and every rule a
real CUDA (or ROCm) device enforces is checked, on the CPU.

Tensors stay in host memory. What makes one a "device tensor" is a mark on its storage
(keyed by the storage's address): ``.to("cuda")``, ``.cuda()``, a factory given
``device="cuda"`` (or a tensor's ``.device``) mark what they return as ``cuda``; every
other new storage is ``cpu``; an ATen operator's outputs take the device of its
inputs. ``Tensor.device`` / ``is_cuda`` / ``get_device()`` read the mark, so the code
sees ``cuda:0`` and takes its GPU paths (CUDA events, side streams, fused AdamW on the
device, the torch sampler instead of numba); ``torch.cuda`` is stubbed (one device,
streams and events that do nothing, memory counters). Two modes watch every operator,
in every thread started while the device is open (the prefetch thread included) and
in backward (on a CPU build autograd runs on the calling thread):

    mixed devices    an ATen operator given a device tensor and a host tensor of one or
                     more dims (a host scalar is fine, as on CUDA), except the copies
                     between them and a device tensor indexed by host indices
    host-only kernel ``.numpy()`` of a device tensor (how numba and scipy kernels see
                     memory: on a GPU it raises), a host ``torch.Generator`` driving a
                     random operator on the device

Each breach is recorded (kind, operator, the scalegnn/baselines line that did it) and
raised as the ``RuntimeError`` / ``TypeError`` CUDA raises, so a caller that catches
errors cannot hide it: ``VirtualGpu.violations`` keeps it. Host reads of device values
inside a step are the business of ``tests/host_sync.py``, used beside this.

Three behaviours of the real runtime that CPU torch lacks are kept too:
``torch.cuda.set_device`` refuses a device without an index; the caching allocator
exists only once CUDA is initialized (``set_device``, ``init``, or a first device
tensor), so ``reset_peak_memory_stats`` before that raises "Invalid device argument"
as it does on a GPU; and gloo's broadcast of a device tensor writes the result back
into the source's tensor as well (it stages GPU tensors through the host), bumping
the version autograd checks.

``VirtualGpu(flavor="rocm")`` looks like a ROCm build: ``torch.version.hip`` set,
``torch.version.cuda`` None, RCCL's version from ``torch.cuda.nccl.version``.

    with VirtualGpu() as gpu:
        record = launch(make_config(device="cuda", ...))
    assert gpu.violations == []
"""

from __future__ import annotations

import threading
import traceback
import weakref
from dataclasses import dataclass

import torch
import torch.utils._pytree as pytree
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["VirtualGpu", "Violation", "device_of"]

GPU = torch.device("cuda", 0)
# Operators a real device runs with operands on both sides: the copies between host and device.
COPIES = {"aten.copy_", "aten._to_copy", "aten.copy", "aten.lift_fresh", "aten.lift_fresh_copy", "aten.set_",
          "aten.detach", "aten.alias", "aten._copy_from", "aten._copy_from_and_resize"}
# A device tensor may be indexed by (or scattered into at) host index tensors: CUDA moves them.
INDEXING = {"aten.index", "aten.index_put", "aten.index_put_", "aten._index_put_impl_"}
MOVES = {"to", "cuda", "cpu"}
_ORIGINAL_DEVICE = torch._C.TensorBase.device
_ORIGINAL_GET_DEVICE = torch._C.TensorBase.get_device


@dataclass(frozen=True)
class Violation:
    kind: str  # "mixed devices" | "host-only kernel"
    what: str  # the operator and its operands' devices and shapes
    where: str  # "file:line function" of the innermost project frame


# ----------------------------------------------------------------------------- storage marks
_marks: dict[int, tuple[str, weakref.ref]] = {}  # storage address -> ("cuda" | "cpu", the storage)
_runtime = {"initialized": False}  # CUDA (and its caching allocator) initialized in this process
_local = threading.local()  # .device: the device a call asked for; .context: "cuda" inside a call on device tensors


def _parts(t: torch.Tensor) -> list[torch.Tensor]:
    if t.layout in (torch.sparse_csr, torch.sparse_bsr):
        return [t.values(), t.crow_indices(), t.col_indices()]
    if t.layout in (torch.sparse_csc, torch.sparse_bsc):
        return [t.values(), t.ccol_indices(), t.row_indices()]
    if t.layout == torch.sparse_coo:
        return [t._values(), t._indices()]
    return [t]


def _live_storages(t: torch.Tensor):
    """The non-empty storages of ``t``'s parts (a sparse tensor's values and indices)."""
    with torch._C.DisableTorchFunction():
        for part in _parts(t):
            try:
                storage = part.untyped_storage()
            except (RuntimeError, NotImplementedError):
                continue
            if storage.data_ptr():
                yield storage


def _storage(t: torch.Tensor):
    """The storage that carries ``t``'s mark (a sparse tensor's first non-empty part), or None."""
    return next(_live_storages(t), None)


def device_of(t: torch.Tensor) -> str:
    """"cuda" or "cpu": the virtual device of ``t`` (a storage never marked is the host's)."""
    storage = _storage(t)
    mark = _marks.get(storage.data_ptr()) if storage is not None else None
    return mark[0] if mark is not None and mark[1]() is storage else "cpu"


def _mark(t: torch.Tensor, device: str, fresh: bool = False) -> None:
    """Mark ``t``'s storages. A storage's device never changes: a storage already marked
    keeps its mark (views and in-place results share it) unless ``fresh`` (a storage
    just made for ``t``). A mark names its storage (torch keeps one Python object per
    live storage; the mark holds a weak reference to it), so memory freed and reused by
    a tensor no operator made (a C++ extension's own allocation) is the host's, whatever
    thread freed it and whenever."""
    if device == "cuda":
        _runtime["initialized"] = True  # a device allocation initializes CUDA and its caching allocator
    for storage in _live_storages(t):
        ptr = storage.data_ptr()
        old = _marks.get(ptr)
        if old is not None and old[1]() is storage and (old[0] == device or not fresh):
            continue
        _marks[ptr] = (device, weakref.ref(storage))


def _asks_for(device) -> str | None:
    if device is None:
        return None
    try:
        kind = torch.device(device).type
    except (RuntimeError, TypeError):
        return None
    return kind if kind in ("cuda", "cpu") else None


def _on_host(device):
    return "cpu" if _asks_for(device) is not None else device


# ----------------------------------------------------------------------------- the two modes
class _Functions(TorchFunctionMode):
    """Python-level calls: device requests become host requests whose results are marked."""

    def __init__(self, gpu: VirtualGpu):
        super().__init__()
        self.gpu = gpu

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if isinstance(func, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)) and \
                str(func).split(".")[0] in ("aten", "prim"):
            return func(*args, **kwargs)  # an ATen operator the dispatch mode runs (inside backward)
        # (an extension's operator, e.g. torch_sparse's: its kernel allocates in C++ from its inputs' options)
        name = getattr(func, "__name__", "")
        if name in MOVES and args and isinstance(args[0], torch.Tensor):
            return self._move(name, args[0], args[1:], kwargs)
        if name == "pin_memory":
            return args[0]  # a CPU build cannot pin; the copy that follows is the same
        if name == "numpy" and args and device_of(args[0]) == "cuda":
            self.gpu.breach("host-only kernel", f".numpy() of a device tensor {tuple(args[0].shape)}",
                            TypeError("can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() to "
                                      "copy the tensor to host memory first."))
        wanted = _asks_for(kwargs.get("device"))
        if wanted is not None:
            kwargs["device"] = "cpu"
        elif not any(isinstance(t, torch.Tensor) for t in pytree.tree_leaves((args, kwargs))):
            wanted = "cpu"  # a factory with no device: torch's default, the host
        generator = kwargs.get("generator")
        if wanted == "cuda" and isinstance(generator, torch.Generator) and generator.device.type == "cpu":
            self.gpu.breach("host-only kernel", f"{name}: a host torch.Generator for a device tensor",
                            RuntimeError("Expected a 'cuda' device type for generator but found 'cpu'"))
        outer = getattr(_local, "device", None), getattr(_local, "context", None)
        on_gpu = any(isinstance(t, torch.Tensor) and device_of(t) == "cuda" for t in pytree.tree_leaves((args, kwargs)))
        inside = wanted or ("cuda" if on_gpu else outer[1]) or "cpu"
        _local.device = wanted or outer[0]
        _local.context = inside  # what the call makes without a tensor to follow is on its device
        try:
            if name == "backward" and args and isinstance(args[0], torch.Tensor):
                out = self._backward(*args, **kwargs)
            else:
                out = func(*args, **kwargs)
        finally:
            _local.device, _local.context = outer
        if name == "__deepcopy__":  # a storage-level copy: the copy is on its original's device
            _mark(out, device_of(args[0]), fresh=True)
        for t in pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                _mark(t, inside)  # what a call asked for, or made outside the operators (from_numpy)
        return out

    def _backward(self, loss, gradient=None, retain_graph=None, create_graph=False, inputs=None):
        """``Tensor.backward`` with this mode open inside: the gradient hooks it runs (the
        engine's bucketed all-reduces) are Python calls the mode must see, and a mode is
        closed inside its own handler, so the autograd engine is called directly."""
        from torch.autograd import _make_grads
        from torch.autograd.graph import _engine_run_backward

        grads = _make_grads((loss,), (gradient,), is_grads_batched=False)
        inputs = () if inputs is None else tuple(inputs) if isinstance(inputs, (list, tuple)) else (inputs,)
        with _Functions(self.gpu):
            _engine_run_backward((loss,), grads, create_graph if retain_graph is None else retain_graph,
                                 create_graph, inputs, allow_unreachable=True, accumulate_grad=True)

    def _move(self, name, src, rest, kwargs):
        target = {"cuda": "cuda", "cpu": "cpu"}.get(name)
        if name == "to":
            for a in (*rest, kwargs.get("device")):
                if isinstance(a, torch.Tensor):
                    target = device_of(a)
                elif _asks_for(a) is not None:
                    target = _asks_for(a)
            rest = tuple(a.dtype if isinstance(a, torch.Tensor) else _on_host(a) for a in rest)
            kwargs = {k: _on_host(v) for k, v in kwargs.items()}
        with torch._C.DisableTorchFunction():
            out = src.to(*rest, **kwargs) if name == "to" else src
            if target is None or device_of(src) == target:
                return out
            if _storage(out) is _storage(src):  # a move makes a new storage
                out = out.clone() if out.layout == torch.strided else _clone_sparse(out)
        _mark(out, target, fresh=True)
        return out


def _clone_sparse(t):
    if t.layout == torch.sparse_csr:
        return torch.sparse_csr_tensor(t.crow_indices().clone(), t.col_indices().clone(), t.values().clone(),
                                       t.shape)
    return t.clone()


class _Operators(TorchDispatchMode):
    """ATen operators (forward and backward): the device rules, and the marks of outputs."""

    def __init__(self, gpu: VirtualGpu):
        super().__init__()
        self.gpu = gpu

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = str(func.overloadpacket) if hasattr(func, "overloadpacket") else str(func)
        leaves = pytree.tree_leaves((args, kwargs))
        tensors = [t for t in leaves if isinstance(t, torch.Tensor)]
        devices = [device_of(t) for t in tensors]
        on_gpu = "cuda" in devices
        if on_gpu and name not in COPIES:
            # a host scalar is fine, as on CUDA; an empty tensor has no storage to carry a mark
            host = [tuple(t.shape) for t, d in zip(tensors, devices) if d == "cpu" and t.dim() > 0 and t.numel()]
            indexed_on_gpu = name in INDEXING and device_of(args[0]) == "cuda"
            if host and not indexed_on_gpu:
                self.gpu.breach("mixed devices", f"{name}: device operands with host operands of shapes {host}",
                                RuntimeError(f"Expected all tensors to be on the same device, but found at least "
                                             f"two devices, cuda:0 and cpu! ({name})"))
            if any(isinstance(g, torch.Generator) and g.device.type == "cpu" for g in leaves):
                self.gpu.breach("host-only kernel", f"{name}: a host torch.Generator for a device tensor",
                                RuntimeError("Expected a 'cuda' device type for generator but found 'cpu'"))
        out = func(*args, **kwargs)
        device = getattr(_local, "device", None) or ("cuda" if on_gpu else "cpu" if tensors else
                                                      getattr(_local, "context", None) or "cpu")
        for t in pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                _mark(t, device)
        return out


# ----------------------------------------------------------------------------- torch.cuda stubs
class _Event:
    def __init__(self, *a, **k):
        pass

    def record(self, *a, **k):
        pass

    def query(self):
        return True

    def synchronize(self):
        pass

    def wait(self, *a, **k):
        pass

    def elapsed_time(self, other):
        return 0.001


class _Stream:
    def __init__(self, *a, **k):
        pass

    def wait_event(self, event):
        pass

    def wait_stream(self, stream):
        pass

    def synchronize(self):
        pass

    def query(self):
        return True

    def record_event(self, event=None):
        return event or _Event()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _initialize() -> None:
    _runtime["initialized"] = True


def _set_device(device) -> None:
    """torch's own check (a device without an index is refused, also by a CPU build), then
    CUDA initialized on it."""
    from torch.cuda._utils import _get_device_index

    _get_device_index(device)
    _initialize()


def _reset_peak_memory_stats(device=None) -> None:
    if not _runtime["initialized"]:  # no caching allocator yet: what torch.cuda raises on a GPU
        raise RuntimeError("Invalid device argument 0: did you call init?")


def _memory_allocated(device=None) -> int:
    return 1 << 20 if _runtime["initialized"] else 0  # torch.cuda's counters read 0 before initialization


def _gloo_broadcast(broadcast):
    """``dist.broadcast`` as gloo runs it for a GPU tensor: staged through the host and
    copied back into every rank's tensor, the source's too (an in-place write: the
    tensor's version goes up, as autograd sees it on a GPU)."""
    import torch.distributed as dist

    def run(tensor, src=None, group=None, async_op=False, **kwargs):
        work = broadcast(tensor, src=src, group=group, async_op=async_op, **kwargs)
        if device_of(tensor) == "cuda" and dist.get_backend(group) == "gloo":
            if work is not None:
                work.wait()
            with torch.no_grad():  # below autograd, as c10d's own copy; the version still goes up
                tensor.copy_(tensor.detach().clone())
        return work

    return run


class _Properties:
    name, major, minor, total_memory, multi_processor_count = "Virtual GPU", 9, 0, 80 * 2**30, 132


class VirtualGpu:
    """The virtual device, open inside ``with`` (module doc). ``violations``: every breach
    of a device rule seen while it was open, first occurrence per (kind, place)."""

    def __init__(self, flavor: str = "cuda"):
        if flavor not in ("cuda", "rocm"):
            raise ValueError(f"flavor must be 'cuda' or 'rocm', got {flavor!r}")
        self.flavor = flavor
        self.violations: list[Violation] = []
        self._saved: list[tuple[object, str, object]] = []

    def breach(self, kind: str, what: str, error: Exception):
        violation = Violation(kind, what, _project_frame())
        if violation not in self.violations:
            self.violations.append(violation)
        raise type(error)(f"{error} [virtual GPU: {what}, at {violation.where}]")

    # ------------------------------------------------------------------ patching
    def _set(self, owner, attr, value):
        self._saved.append((owner, attr, owner.__dict__.get(attr, _ABSENT) if isinstance(owner, type)
                            else getattr(owner, attr, _ABSENT)))
        setattr(owner, attr, value)

    def __enter__(self):
        _marks.clear()
        _runtime["initialized"] = False
        cuda, version = torch.cuda, torch.version
        stubs = dict(is_available=lambda: True, device_count=lambda: 1, set_device=_set_device, init=_initialize,
                     current_device=lambda: 0, Stream=_Stream, Event=_Event, current_stream=lambda *a, **k: _Stream(),
                     default_stream=lambda *a, **k: _Stream(), set_stream=lambda s: None,
                     stream=lambda s: s if s is not None else _Stream(),
                     synchronize=lambda *a, **k: None, reset_peak_memory_stats=_reset_peak_memory_stats,
                     max_memory_allocated=_memory_allocated, memory_allocated=_memory_allocated,
                     empty_cache=lambda: None, get_device_properties=lambda *a, **k: _Properties(),
                     get_device_name=lambda *a, **k: _Properties.name, get_device_capability=lambda *a, **k: (9, 0),
                     is_bf16_supported=lambda *a, **k: True, _lazy_init=_initialize,
                     is_initialized=lambda: _runtime["initialized"],
                     get_rng_state_all=lambda: [], set_rng_state_all=lambda states: None,
                     manual_seed=lambda seed: None, manual_seed_all=lambda seed: None)
        for attr, value in stubs.items():
            self._set(cuda, attr, value)
        rccl = self.flavor == "rocm"
        self._set(cuda.nccl, "version", lambda: (2, 20, 5) if not rccl else (2, 18, 3))
        self._set(version, "cuda", None if rccl else "12.4")
        self._set(version, "hip", "6.2.41133" if rccl else None)
        tensor = torch.Tensor
        self._set(tensor, "device", property(lambda t: GPU if device_of(t) == "cuda" else _ORIGINAL_DEVICE.__get__(t)))
        self._set(tensor, "is_cuda", property(lambda t: device_of(t) == "cuda"))
        self._set(tensor, "is_cpu", property(lambda t: device_of(t) != "cuda"))
        self._set(tensor, "get_device", lambda t: 0 if device_of(t) == "cuda" else _ORIGINAL_GET_DEVICE(t))
        self._set(tensor, "record_stream", lambda t, stream: None)
        self._set(tensor, "is_pinned", lambda t, *a, **k: True)
        gpu, run = self, threading.Thread.run

        def run_watched(thread):  # every thread started while the device is open is watched too
            with _Functions(gpu), _Operators(gpu):
                return run(thread)

        self._set(threading.Thread, "run", run_watched)
        # DDP's reducer allocates its gradient buckets in C++ from the parameters' options
        # (at construction and when it rebuilds them in forward): on the device on a GPU.
        from torch.nn.parallel import DistributedDataParallel as DDP

        for attr in ("__init__", "forward"):
            self._set(DDP, attr, _on_parameters_device(getattr(DDP, attr)))
        import torch.distributed as dist

        self._set(dist, "broadcast", _gloo_broadcast(dist.broadcast))
        self._modes = [_Functions(self), _Operators(self)]
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc):
        for mode in reversed(self._modes):
            mode.__exit__(*exc)
        for owner, attr, value in reversed(self._saved):
            if value is _ABSENT:
                delattr(owner, attr)
            else:
                setattr(owner, attr, value)
        self._saved.clear()
        _marks.clear()
        return False

    def report(self) -> str:
        return "\n".join(f"{v.kind}: {v.what}\n    at {v.where}" for v in self.violations)


_ABSENT = object()


def _on_parameters_device(method):
    def run(ddp, *args, **kwargs):
        module = ddp.module if "module" in ddp.__dict__.get("_modules", {}) else (args[0] if args else kwargs["module"])
        first = next(iter(module.parameters()), None)
        outer = getattr(_local, "context", None)
        _local.context = device_of(first) if first is not None else outer
        try:
            return method(ddp, *args, **kwargs)
        finally:
            _local.context = outer

    return run


def _project_frame() -> str:
    frames = [f for f in traceback.extract_stack()[:-2] if "/tests/vgpu/" not in f.filename]
    ours = [f for f in frames if any(p in f.filename for p in ("/scalegnn/", "/baselines/", "/benchmarks/"))
            and "/torch/" not in f.filename]
    f = (ours or frames)[-1]
    return f"{f.filename.rsplit('/', 2)[-2]}/{f.filename.rsplit('/', 1)[-1]}:{f.lineno} {f.name}"


def virtual_rank(rank: int, world: int, cfg, graph, run_id: str, backend: str):
    """A local job's worker on its own virtual GPU (``launch(cfg, rank_main=virtual_rank)``):
    :func:`scalegnn.launch.local_rank` inside :class:`VirtualGpu`; a breach fails the rank."""
    from scalegnn.launch import local_rank

    with VirtualGpu() as gpu:
        record = local_rank(rank, world, cfg, graph, run_id, backend)
    if gpu.violations:
        raise AssertionError(f"rank {rank} on its virtual GPU:\n{gpu.report()}")
    return record
