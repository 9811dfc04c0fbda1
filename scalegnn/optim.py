"""The optimizer of every run: its settings, its construction, and AdamW's row-sparse update.

    OptimConfig       the run configuration's ``optim`` section (lr, weight decay,
                      schedule, gradient clipping, the sparse input update)
    make_optimizer    fused AdamW (or :class:`RowSparseAdamW`) and the LR schedule
    RowSparseAdamW    AdamW with a row-sparse ("lazy") update for a weight whose
                      gradient is row-sparse: the rest of this doc

Why. With sparse bag-of-words features (Facebook: 4,714 columns) a mini-batch touches
only the input features present in its rows, so the input projection's weight
gradient ``dW_in = X^T dZ`` is zero outside those rows. Dense AdamW still reads and
writes every row of W_in and both moments each step. Here the gradient of W_in
arrives row-sparse (:mod:`scalegnn.rowsparse`: the touched rows and their values, built
by :func:`scalegnn.parallel.products.sharded_gemm`) and only those rows are updated.

What is and is not exact. Dense AdamW moves a row whose gradient is zero too:

    m <- b1 m,  v <- b2 v,  p <- p (1 - lr wd) - lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps)

so no row-sparse update equals it in general:

* the decoupled weight decay does not depend on the gradient. It stays exact here:
  every step multiplies ALL rows by ``1 - lr wd`` (one pass over W_in, and only when
  wd > 0). Catching it up on touch by exponentiation, ``p * prod_s (1 - lr_s wd)``,
  would be O(touched) and exact in real arithmetic, but leaves untouched rows stale
  between touches: evaluation and checkpoints would then need a flush, and a flush at
  a checkpoint changes the rounding of the run after it (resume would no longer be
  bit-exact). One multiply per step keeps parameters true at every step.
* the moments of an untouched row could be caught up exactly too (``b1^k m``), but
  the parameter's momentum drift in the skipped steps (the last term above with g = 0)
  has no closed form: it sums terms in ``b1^j / (sqrt(b2^j v) + eps)`` with the bias
  corrections of each skipped step. Decaying the moments while dropping that drift
  would shrink every rare feature's total movement by about (1 - b1) = 10x. So the
  moments follow torch.optim.SparseAdam (TensorFlow's LazyAdam): an untouched row's
  moments are left as they are, and a touched row takes the full Adam step with the
  global step count's bias corrections.

The rule, for each step t that learns (``found_inf`` = 0) with touched rows R:

    p    <- p * (1 - lr wd)                              all rows (when wd > 0)
    m[R] <- m[R] b1 + g[R] (1 - b1)
    v[R] <- v[R] b2 + (g[R] g[R]) (1 - b2)
    p[R] <- p[R] - (m[R] / (sqrt(v[R]) / sqrt(bc2) + eps)) * (lr / bc1)

in float32, each operation correctly rounded as written (sqrt too), with bc1 = 1 - b1^t, bc2 = 1 - b2^t
(t counted as dense AdamW counts it). A step with ``found_inf`` = 1 changes nothing
(weights, moments, step count), as the fused AdamW does. A row touched at every step
follows dense AdamW up to rounding. Two implementations: a compiled CPU kernel (numba,
one in-place pass over the touched rows) and a torch path (any device, no host read);
they give bit-identical results (tests/unit/test_optim.py).

The optimizer is :class:`RowSparseAdamW`: ``torch.optim.AdamW(fused=True)`` for every
dense gradient, the rule above for each parameter whose gradient is sparse COO. Its
state has AdamW's keys and dtypes (``step``, ``exp_avg``, ``exp_avg_sq``), so
``state_dict`` round-trips and a checkpoint moves between the two modes.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ._numba import numba
from .sections.optim import SPARSE_INPUT_UPDATE, OptimConfig  # declared where no torch loads (scalegnn.sections)

__all__ = ["OptimConfig", "make_optimizer", "RowSparseAdamW", "SPARSE_INPUT_UPDATE", "use_sparse_input_update",
           "lazy_adamw_rows_"]

_HAVE_NUMBA = numba is not None  # optional (extra "fast"); this kernel keeps its own fallback (_KERNEL_OK)


def use_sparse_input_update(mode: str, sparse_features: bool, device: torch.device) -> bool:
    """Whether W_in gets the row-sparse gradient and update (``--sparse-input-update``).

    ``on``: whenever the features are sparse (CSR). ``off``: never (dense AdamW over all
    of W_in). ``auto``: with sparse features on the CPU with the compiled kernel (numba);
    the torch path's gathers and scatters cost more than the dense fused update, and on
    a GPU the dense fused update of W_in costs microseconds while the touched-row set is
    a data-dependent size (one host read per step). Dense features: never (every row
    is touched)."""
    if mode not in SPARSE_INPUT_UPDATE:
        raise ValueError(f"sparse_input_update must be one of {SPARSE_INPUT_UPDATE}, got {mode!r}")
    if not sparse_features or mode == "off":
        return False
    return mode == "on" or (torch.device(device).type == "cpu" and _KERNEL_OK)


# ------------------------------------------------------------------------------ the rule
def _scalars(step: float, lr: float, b1: float, b2: float, eps: float, wd: float) -> tuple:
    """The float32 constants of one step, computed in float64 on the host as the rule
    states them (the same numbers for both implementations)."""
    bc1, bc2 = 1.0 - b1 ** step, 1.0 - b2 ** step
    f = np.float32
    return (f(b1), f(1.0 - b1), f(b2), f(1.0 - b2), f(math.sqrt(bc2)), f(eps), f(lr / bc1), f(1.0 - lr * wd))


def _scalars_device(step: torch.Tensor, lr: float, b1: float, b2: float, eps: float, wd: float) -> tuple:
    """:func:`_scalars` from a device step count without reading it (float64 tensors
    cast to float32; on the CPU the caller uses :func:`_scalars` instead)."""
    t = step.double()
    bc1, bc2 = 1.0 - torch.pow(b1, t), 1.0 - torch.pow(b2, t)
    f = np.float32
    return (f(b1), f(1.0 - b1), f(b2), f(1.0 - b2), bc2.sqrt().float(), f(eps), (lr / bc1).float(), f(1.0 - lr * wd))


def _sqrt(t: torch.Tensor) -> torch.Tensor:
    """The correctly rounded float32 square root (through float64, exact for float32).
    torch's vectorized CPU ``sqrt`` of float32 is not always correctly rounded; numba's
    and CUDA's are: this makes the rule's bits the same on every path."""
    return t.double().sqrt().to(t.dtype)


def _rows_torch(p, m, v, rows, g, consts, skip):
    """The touched-row part of the rule with torch operations (any device). ``skip``: a
    0-dim bool tensor, or None; when true every row keeps its old values."""
    b1, c1, b2, c2, bc2s, eps, step_size, _ = consts
    pr, mr, vr = p.index_select(0, rows), m.index_select(0, rows), v.index_select(0, rows)
    m_new = mr * b1 + g * c1
    v_new = vr * b2 + (g * g) * c2
    denom = _sqrt(v_new) / bc2s + eps
    p_new = pr - (m_new / denom) * step_size
    if skip is not None:
        p_new, m_new, v_new = (torch.where(skip, old, new) for old, new in ((pr, p_new), (mr, m_new), (vr, v_new)))
    p.index_copy_(0, rows, p_new)
    m.index_copy_(0, rows, m_new)
    v.index_copy_(0, rows, v_new)


if _HAVE_NUMBA:
    # error_model="numpy": no division-by-zero branch per element, so the row loop
    # vectorizes (IEEE semantics, as torch; eps > 0 keeps the denominator positive).
    @numba.njit(nogil=True, cache=True, error_model="numpy")
    def _rows_kernel(p, m, v, rows, g, b1, c1, b2, c2, bc2s, eps, step_size):  # pragma: no cover - compiled
        # float32 throughout (every constant is np.float32), no fastmath: each operation
        # is correctly rounded (np.sqrt too), as in _rows_torch, so both give the same bits.
        h = p.shape[1]
        for i in range(rows.shape[0]):
            pr, mr, vr, gr = p[rows[i]], m[rows[i]], v[rows[i]], g[i]
            for j in range(h):
                gi = gr[j]
                mi = mr[j] * b1 + gi * c1
                vi = vr[j] * b2 + (gi * gi) * c2
                pr[j] = pr[j] - (mi / (np.sqrt(vi) / bc2s + eps)) * step_size
                mr[j] = mi
                vr[j] = vi
else:  # pragma: no cover
    _rows_kernel = None

_KERNEL_OK = _HAVE_NUMBA


def _kernel_usable(*tensors) -> bool:
    return _KERNEL_OK and all(t.device.type == "cpu" and t.is_contiguous() for t in tensors) and \
        all(t.dtype == torch.float32 for t in tensors[:4])


def lazy_adamw_rows_(p: torch.Tensor, grad: torch.Tensor, state: dict, *, lr: float, betas: tuple[float, float],
                     eps: float, weight_decay: float, found_inf: torch.Tensor | None = None,
                     kernel: bool | None = None, host: bool | None = None) -> None:
    """One step of the rule (module doc) on ``p`` (F, H) in place, with ``grad`` the
    row-sparse gradient (:func:`scalegnn.rowsparse.row_sparse_grad`) and ``state``
    AdamW's state of ``p`` (``step`` a float32 0-dim tensor, ``exp_avg``,
    ``exp_avg_sq``), updated in place.

    ``found_inf``: 0-dim float tensor, 1 = skip this step entirely. ``kernel``: None
    picks the compiled CPU kernel when it can run, False forces the torch path (the
    tests compare the two), True requires the kernel. ``host``: None reads the step
    count and the skip flag on the host when they are CPU tensors (free there); False
    keeps them on their device as a GPU run does (no host read; the tests use it)."""
    global _KERNEL_OK
    b1, b2 = betas
    rows, g = grad._indices()[0], grad._values()
    step, m, v = state["step"], state["exp_avg"], state["exp_avg_sq"]
    use_kernel = _kernel_usable(p, m, v, g, rows) if kernel is None else kernel
    if use_kernel and not _kernel_usable(p, m, v, g, rows):
        raise RuntimeError("the compiled row update needs numba and contiguous float32 CPU tensors")
    if host is None:
        host = step.device.type == "cpu" and (found_inf is None or found_inf.device.type == "cpu")
    if host:  # CPU: reading the step count and the skip flag costs nothing
        if found_inf is not None and float(found_inf) != 0.0:
            return
        step += 1
        consts = _scalars(float(step), lr, b1, b2, eps, weight_decay)
        skip = None
    else:  # a device: count, constants and the skip stay on it (no host read)
        step += 1 if found_inf is None else 1 - found_inf.to(step.dtype)
        consts = _scalars_device(step, lr, b1, b2, eps, weight_decay)
        skip = None if found_inf is None else found_inf.to(p.device) != 0
    if weight_decay != 0:  # decoupled decay: exact, every row (module doc)
        decay = float(consts[-1])
        if skip is not None:  # x * 1 == x: a skipped step leaves p as it was
            decay = torch.where(skip, 1.0, torch.full((), decay, dtype=p.dtype, device=p.device))
        p.mul_(decay)
    if rows.numel() == 0:
        return
    if use_kernel and skip is None:
        try:
            _rows_kernel(p.detach().numpy(), m.numpy(), v.numpy(), rows.numpy(), g.detach().numpy(), *consts[:-1])
            return
        except (numba.core.errors.NumbaError, OSError) as exc:  # an unusual numba/LLVM build: torch path
            if kernel:
                raise
            _KERNEL_OK = False
            import warnings

            warnings.warn(f"the compiled row-sparse AdamW kernel failed ({exc}); using the torch path")
    _rows_torch(p, m, v, rows, g.to(p.dtype), consts, skip)


# ------------------------------------------------------------------------------ optimizer
class RowSparseAdamW(torch.optim.AdamW):
    """``torch.optim.AdamW(fused=True)`` for dense gradients, :func:`lazy_adamw_rows_`
    for each parameter whose gradient is sparse COO (row-sparse). The fused step and
    the row step read the same ``found_inf`` (the engine's skip flag) and the same
    param-group ``lr`` (the LR schedule works unchanged)."""

    def __init__(self, params, **kw):
        kw.setdefault("fused", True)
        super().__init__(params, **kw)
        for group in self.param_groups:
            if group["amsgrad"] or group["maximize"]:
                raise ValueError("RowSparseAdamW implements AdamW without amsgrad and maximize")

    @torch.no_grad()
    def step(self, closure=None):
        if closure is not None:
            raise ValueError("RowSparseAdamW.step takes no closure")
        sparse = [(group, p, p.grad) for group in self.param_groups for p in group["params"]
                  if p.grad is not None and p.grad.is_sparse]
        for _, p, _ in sparse:  # the fused step updates the dense-gradient parameters only
            p.grad = None
        try:
            super().step()
        finally:
            for _, p, g in sparse:
                p.grad = g
        found_inf = getattr(self, "found_inf", None)
        for group, p, g in sparse:
            state = self.state[p]
            if len(state) == 0:  # AdamW's state, as its fused path creates it
                state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            lazy_adamw_rows_(p, g, state, lr=group["lr"], betas=group["betas"], eps=group["eps"],
                             weight_decay=group["weight_decay"], found_inf=found_inf)
        return None


def device_lr(value: float, device: torch.device) -> torch.Tensor:
    """A learning rate as a 0-d tensor on ``device``, in the precision the fused AdamW
    kernel takes a float lr in there (CUDA: float32, the CPU: float64), so that a tensor
    lr updates the weights bit for bit as the float would."""
    dtype = torch.float32 if torch.device(device).type == "cuda" else torch.float64
    return torch.tensor(value, dtype=dtype, device=device)


def make_optimizer(params, cfg: OptimConfig, total_steps: int, row_sparse: bool = False,
                   lr_device: torch.device | None = None):
    """Fused AdamW (one kernel over all parameters, on CPU and GPU alike; it also takes
    the device-side ``found_inf`` skip the engine uses) and the LR schedule, a
    function of the step index. ``row_sparse``: some parameter receives row-sparse
    (sparse COO) gradients, which :class:`scalegnn.optim.RowSparseAdamW` updates
    lazily while the others keep the fused AdamW; without it, plain fused AdamW.
    ``lr_device``: the learning rate as a tensor there (:func:`device_lr`), which the
    update reads on the device and the schedule fills in place (a step captured as a
    CUDA graph), and on a GPU ``capturable=True``."""
    kind = RowSparseAdamW if row_sparse else torch.optim.AdamW
    lr = cfg.lr if lr_device is None else device_lr(cfg.lr, lr_device)
    capturable = lr_device is not None and torch.device(lr_device).type == "cuda"
    opt = kind(params, lr=lr, weight_decay=cfg.weight_decay, fused=True, capturable=capturable)
    if cfg.schedule == "cosine":
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: 0.5 * (1 + math.cos(math.pi * min(s, total_steps) / max(total_steps, 1)))
        )
    else:
        sched = None
    return opt, sched

