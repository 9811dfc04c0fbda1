"""Element-wise kernels of a layer's tail (paper Eqs. 7-10, V-C): the counter-based
dropout mask and the fused RMSNorm + ReLU + dropout + residual, forward and backward.

Shape legend: B rows of the block, H its columns (a column slice of the hidden dim).

The dropout mask (the definition, :func:`keep_mask_torch`). Entry (i, j) of the keep
mask of a block with global row ids r_i and global column ids c_j is

    h = r_i * GOLD + c_j * M2 + key              (mod 2^64)
    h = splitmix64 finalizer (h)                 (xor-shift 30, * M1, xor-shift 27, * M2, xor-shift 31)
    keep_ij = (h >> 11) >= floor(p * 2^53)       (a uniform 53-bit draw against p)

It depends only on (key, r_i, c_j), so any block of the global mask is computed alone
and the 3D-parallel dropout equals the serial one bit for bit.

Why kernels. In torch the hash is ~12 passes over (B, H) int64 temporaries (about a
quarter of a Facebook epoch before issue 12); the norm / ReLU / dropout / residual
chain and its autograd backward another ~12 passes with bool-to-float copies. The numba kernels here make one
pass per phase that needs one: the forward is a row sum of squares (its all-reduce
over the column axis, Eq. 29, sits between the phases, in the caller) and one pass
that writes the output and a 1-byte "gradient passes" mask; the backward is one pass
for the two reductions (row dot for dx, column sums for dg: their all-reduces again
sit between the phases) and one pass that writes dx. Without numba, or for tensors
not on the CPU (CUDA), the torch path runs the same formulas (a few fused-friendly
passes, no int64 temporaries beyond two hash buffers): the same mask bits, and the
same values up to the order of the two reductions' additions.

Bit-exactness. Every element-wise value is computed in the tensor's dtype with the
operations, in the order, of the unfused torch chain ``x * rinv``, ``* g``, ``relu``,
``* keep``, ``/ (1 - p)``, ``+ res`` (torch divides a float32 tensor by a Python
scalar as ``x / float32(s)``, which is what the kernels do), so given the same row
statistics the forward output and dx equal the unfused path's bit for bit (dx for
finite gradients: a dropped inf/NaN gradient gives 0 here, NaN there). Only the
reductions (sum of squares, the backward's row dot and column sums) are summed in
another order (float64 accumulators here, float32 pairwise in torch): they differ by
float rounding, the one tolerance the tests allow.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ._numba import Unavailable, available as _numba_available, numba, run as _run

__all__ = ["DropoutBlock", "keep_mask", "keep_mask_torch", "hash_terms", "keep_from_terms", "threshold", "available",
           "row_sum_squares", "tail_forward", "tail_backward_stats", "tail_backward_input", "stats_dtype", "warm_up"]

# splitmix64 constants as unsigned ints (the torch path uses their int64 two's complements)
GOLD = 0x9E3779B97F4A7C15
M1 = 0xBF58476D1CE4E5B9
M2 = 0x94D049BB133111EB


def _signed(u: int) -> int:
    return u - (1 << 64) if u >= 1 << 63 else u


# Set to False (tests monkeypatch it) to force the torch path while numba is installed.
_ENABLED = True


def available() -> bool:
    """True when the numba kernels run for CPU tensors (numba installed, not disabled)."""
    return _ENABLED and _numba_available()


def threshold(p: float) -> int:
    """floor(p * 2^53): an entry is kept when its 53-bit draw is at least this."""
    return int(p * float(1 << 53))


def stats_dtype(dtype: torch.dtype) -> torch.dtype:
    """Row statistics in FP32 at least (Eq. 29), FP64 for FP64 tensors."""
    return torch.float64 if dtype == torch.float64 else torch.float32


# ----------------------------------------------------------------------------- mask: torch
def _lsr_(h: torch.Tensor, k: int, out: torch.Tensor) -> torch.Tensor:
    """out = h >>> k (logical: torch's >> on int64 is arithmetic), in place into ``out``."""
    torch.bitwise_right_shift(h, k, out=out)
    return out.bitwise_and_((1 << (64 - k)) - 1)


def hash_terms(key: int | torch.Tensor, row_ids: torch.Tensor,
               col_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The row and column terms of the hash, (B,) ``r_i * GOLD + key`` and (H,)
    ``c_j * M2`` as int64 (mod 2^64): entry (i, j) hashes their sum. Small vectors a
    kernel takes in place of the (B, H) hash, so it computes the mask in registers."""
    return row_ids.to(torch.int64) * _signed(GOLD) + key, col_ids.to(torch.int64) * _signed(M2)


def keep_from_terms(row_terms: torch.Tensor, col_terms: torch.Tensor, thr: int) -> torch.Tensor:
    """The keep mask (B, H) from :func:`hash_terms` and ``floor(p * 2^53)``: the
    definition (module docstring) in int64 torch ops, two (B, H) buffers updated in
    place. Written once for eager torch (any device) and for ``torch.compile``, which
    fuses it into the kernel that applies the mask (:mod:`scalegnn._compiled`):
    there the buffers never exist."""
    h = torch.add(row_terms[:, None], col_terms[None, :])
    t = torch.empty_like(h)
    h.bitwise_xor_(_lsr_(h, 30, t)).mul_(_signed(M1))
    h.bitwise_xor_(_lsr_(h, 27, t)).mul_(_signed(M2))
    h.bitwise_xor_(_lsr_(h, 31, t))
    return _lsr_(h, 11, t) >= thr


def keep_mask_torch(key: int | torch.Tensor, row_ids: torch.Tensor, col_ids: torch.Tensor,
                    p: float) -> torch.Tensor:
    """The keep mask (len(row_ids), len(col_ids)) in torch int64 ops, on any device."""
    return keep_from_terms(*hash_terms(key, row_ids, col_ids), threshold(p))


# ----------------------------------------------------------------------------- numba kernels
if numba is not None:
    _GOLD, _M1, _M2 = np.uint64(GOLD), np.uint64(M1), np.uint64(M2)
    _S11, _S27, _S30, _S31 = np.uint64(11), np.uint64(27), np.uint64(30), np.uint64(31)

    @numba.njit(nogil=True, cache=True, inline="always")
    def _keep(h, thr):
        """splitmix64 finalizer of h, then the 53-bit draw against the threshold."""
        h = (h ^ (h >> _S30)) * _M1
        h = (h ^ (h >> _S27)) * _M2
        h = h ^ (h >> _S31)
        return (h >> _S11) >= thr

    @numba.njit(nogil=True, cache=True)
    def _col_terms(cols):
        ct = np.empty(cols.shape[0], np.uint64)
        for j in range(cols.shape[0]):
            ct[j] = np.uint64(cols[j]) * _M2
        return ct

    @numba.njit(nogil=True, cache=True)
    def _mask_kernel(key, rows, cols, thr, out):
        ct = _col_terms(cols)
        for i in range(rows.shape[0]):
            a = np.uint64(rows[i]) * _GOLD + key
            o = out[i]
            for j in range(ct.shape[0]):
                o[j] = _keep(a + ct[j], thr)

    @numba.njit(nogil=True, cache=True, fastmath={"reassoc"})
    def _sum_squares_kernel(x, out):
        # reassoc only here: it lets LLVM vectorize the float64 accumulation (the
        # result's rounding is the tolerance anyway); element-wise kernels keep IEEE order
        for i in range(x.shape[0]):
            xi = x[i]
            acc = 0.0
            for j in range(xi.shape[0]):
                v = np.float64(xi[j])
                acc += v * v
            out[i] = acc

    @numba.njit(nogil=True, cache=True)
    def _tail_fwd_kernel(x, rinv, g, res, key, rows, cols, thr, den, zero, one, out, pas,
                         norm, has_g, drop, residual, save):
        ct = _col_terms(cols) if drop else np.empty(0, np.uint64)
        for i in range(x.shape[0]):
            xi, oi = x[i], out[i]
            r = rinv[i] if norm else one
            a = np.uint64(rows[i]) * _GOLD + key if drop else np.uint64(0)
            for j in range(xi.shape[0]):
                y = xi[j]
                if norm:
                    y = y * r
                    if has_g:
                        y = y * g[j]
                v = zero if y <= zero else y  # relu (NaN stays NaN, as torch's)
                ok = v > zero  # relu's backward passes where its output is > 0
                if drop:
                    k = _keep(a + ct[j], thr)
                    v = (v * (one if k else zero)) / den
                    ok = ok and k
                if residual:
                    v = v + res[i, j]
                oi[j] = v
                if save:
                    pas[i, j] = ok

    @numba.njit(nogil=True, cache=True, fastmath={"reassoc"})
    def _tail_bwd_stats_kernel(dout, x, rinv, g, pas, den, zero, dot, dg, has_g, want_dg):
        # reassoc: only reductions are written here (see _sum_squares_kernel)
        for i in range(x.shape[0]):
            r = rinv[i]
            acc = 0.0
            for j in range(x.shape[1]):
                dy = dout[i, j] / den if pas[i, j] else zero
                u = dy * g[j] if has_g else dy
                acc += np.float64(u) * np.float64(x[i, j])
                if want_dg:
                    dg[j] += np.float64(dy * x[i, j] * r)
            dot[i] = acc

    @numba.njit(nogil=True, cache=True)
    def _tail_bwd_input_kernel(dout, x, rinv, c, g, pas, den, zero, gx, norm, has_g):
        for i in range(dout.shape[0]):
            r = rinv[i] if norm else zero
            ci = c[i] if norm else zero
            for j in range(dout.shape[1]):
                dy = dout[i, j] / den if pas[i, j] else zero
                if norm:
                    u = dy * g[j] if has_g else dy
                    gx[i, j] = u * r - x[i, j] * ci
                else:
                    gx[i, j] = dy


def _np(t: torch.Tensor | None, like: np.ndarray | None = None, dtype=None) -> np.ndarray:
    """A C-contiguous numpy view of a CPU tensor (a 1-element dummy for None)."""
    if t is None:
        return np.zeros(1, dtype=dtype if dtype is not None else like.dtype)
    return t.detach().contiguous().numpy()


def _numba_ok(*tensors: torch.Tensor | None) -> bool:
    """The kernels take CPU float32/float64 tensors of one dtype (and int64 ids)."""
    if not available():
        return False
    floats = [t for t in tensors if t is not None and t.is_floating_point()]
    return (all(t.device.type == "cpu" for t in tensors if t is not None)
            and floats[0].dtype in (torch.float32, torch.float64)
            and all(t.dtype == floats[0].dtype for t in floats))


def _call(kernel, *args) -> bool:
    """Run a kernel; False (torch path) when numba cannot compile here (warned once)."""
    try:
        _run(kernel, *args)
        return True
    except Unavailable:
        return False


# ----------------------------------------------------------------------------- mask: dispatch
def keep_mask(key: int | torch.Tensor, row_ids: torch.Tensor, col_ids: torch.Tensor, p: float) -> torch.Tensor:
    """Bool keep mask (len(row_ids), len(col_ids)): the numba kernel on the CPU (one
    pass writing 1 byte per entry, no temporaries), :func:`keep_mask_torch` elsewhere;
    the same bits."""
    if row_ids.dim() != 1 or col_ids.dim() != 1:
        raise ValueError(f"row_ids and col_ids must be 1-D, got shapes {tuple(row_ids.shape)} and "
                         f"{tuple(col_ids.shape)}")
    if available() and isinstance(key, int) and row_ids.device.type == "cpu" and col_ids.device.type == "cpu":
        out = torch.empty(row_ids.numel(), col_ids.numel(), dtype=torch.bool)
        rows = row_ids.to(torch.int64).contiguous().numpy()
        cols = col_ids.to(torch.int64).contiguous().numpy()
        if _call(_mask_kernel, np.uint64(key), rows, cols, np.uint64(threshold(p)), out.numpy()):
            return out
    return keep_mask_torch(key, row_ids, col_ids, p)


@dataclass(frozen=True)
class DropoutBlock:
    """Dropout (Eq. 9) of a block: its global row ids (B,), global column ids (H,),
    the layer's key and the probability p; the mask is :func:`keep_mask`'s."""

    key: int | torch.Tensor  # a 0-d int64 tensor in a captured step (scalegnn.model.dropout_key)
    rows: torch.Tensor
    cols: torch.Tensor
    p: float

    def __post_init__(self):
        if not 0.0 <= self.p < 1.0:
            raise ValueError(f"dropout probability must be in [0, 1), got {self.p}")

    @property
    def den(self) -> float:
        return 1.0 - self.p

    def keep(self) -> torch.Tensor:
        return keep_mask(self.key, self.rows, self.cols, self.p)


# ----------------------------------------------------------------------------- tail phases
def row_sum_squares(x: torch.Tensor) -> torch.Tensor:
    """sum_j x_ij^2 per row, (B,) in :func:`stats_dtype` (the local part of Eq. 29)."""
    acc = stats_dtype(x.dtype)
    if _numba_ok(x):
        s64 = torch.empty(x.shape[0], dtype=torch.float64)  # a torch tensor the kernel fills (no from_numpy)
        if _call(_sum_squares_kernel, _np(x), s64.numpy()):
            return s64.to(acc)
    return x.to(acc).pow(2).sum(-1)


def tail_forward(x: torch.Tensor, rinv: torch.Tensor | None, g: torch.Tensor | None, drop: DropoutBlock | None,
                 res: torch.Tensor | None, save: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """out = dropout(relu(x * rinv * g)) + res for x (B, H), rinv (B,) in x's dtype
    (None: no norm), g (H,), ``drop`` (None: no dropout), res (B, H) (None: no
    residual). With ``save`` also the bool mask (B, H) of the entries through which
    the gradient passes (kept by dropout and relu output > 0), for the backward."""
    if drop is not None and (drop.rows.numel(), drop.cols.numel()) != tuple(x.shape):
        raise ValueError(f"dropout ids ({drop.rows.numel()}, {drop.cols.numel()}) do not match the block "
                         f"{tuple(x.shape)}")
    # A tensor key (a captured step's) stays on the device: the torch path.
    if ((drop is None or isinstance(drop.key, int))
            and _numba_ok(x, rinv, g, res, drop.rows if drop else None, drop.cols if drop else None)):
        xa = _np(x)
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
        pas = torch.empty(x.shape, dtype=torch.bool) if save else None
        dt = xa.dtype.type
        ids = np.zeros(1, np.int64)
        ok = _call(_tail_fwd_kernel, xa, _np(rinv, xa), _np(g, xa), _np(res, xa) if res is not None else
                   np.zeros((1, 1), xa.dtype), np.uint64(drop.key if drop else 0),
                   _np(drop.rows.to(torch.int64)) if drop else ids, _np(drop.cols.to(torch.int64)) if drop else ids,
                   np.uint64(threshold(drop.p) if drop else 0), dt(drop.den if drop else 1.0), dt(0), dt(1),
                   out.numpy(), pas.numpy() if save else np.zeros((1, 1), np.bool_),
                   rinv is not None, g is not None, drop is not None, res is not None, save)
        if ok:
            return out, pas
    y = x * rinv[:, None] if rinv is not None else x
    if g is not None:
        y = y * g
    y = torch.relu(y)
    pas = y > 0 if save else None
    if drop is not None:
        keep = drop.keep()
        y = y.mul_(keep).div_(drop.den)  # y is a fresh tensor; the bool factor is cast on the fly
        if save:
            pas &= keep
    if res is not None:
        y = y.add_(res)
    return y, pas


def tail_backward_stats(dout: torch.Tensor, x: torch.Tensor, rinv: torch.Tensor, g: torch.Tensor | None,
                        pas: torch.Tensor, den: float, want_dg: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The backward's two local reductions, in :func:`stats_dtype`, with
    dy = dout / den where the gradient passes (else 0) and u = dy * g:
    dot_i = sum_j u_ij x_ij (B,) and dg_j = sum_i dy_ij x_ij rinv_i (H,) (None unless
    ``want_dg``). ``rinv`` (B,) in x's dtype."""
    acc = stats_dtype(x.dtype)
    if _numba_ok(dout, x, rinv, g):
        xa = _np(x)
        dot = torch.empty(x.shape[0], dtype=torch.float64)  # torch tensors the kernel fills (no from_numpy)
        dg = torch.zeros(x.shape[1] if want_dg else 1, dtype=torch.float64)
        if _call(_tail_bwd_stats_kernel, _np(dout), xa, _np(rinv), _np(g, xa), _np(pas), xa.dtype.type(den),
                 xa.dtype.type(0), dot.numpy(), dg.numpy(), g is not None, want_dg):
            return dot.to(acc), dg.to(acc) if want_dg else None
    dy = torch.where(pas, dout / den, 0.0)
    u = dy * g if g is not None else dy
    dot = (u.to(acc) * x.to(acc)).sum(-1)
    dg = (dy * x * rinv[:, None]).to(acc).sum(0) if want_dg else None
    return dot, dg


def tail_backward_input(dout: torch.Tensor, x: torch.Tensor | None, rinv: torch.Tensor | None,
                        c: torch.Tensor | None, g: torch.Tensor | None, pas: torch.Tensor, den: float) -> torch.Tensor:
    """dx = u * rinv - x * c (with norm; u, dy as in :func:`tail_backward_stats` and
    c_i = rinv_i^3 dot_i / H from the all-reduced dot), or dx = dy without norm
    (``rinv`` None; ``x`` is not read and may be None). ``rinv`` and ``c`` (B,) in the dtype."""
    if _numba_ok(dout, x, rinv, c, g):
        da = _np(dout)
        gx = torch.empty(dout.shape, dtype=dout.dtype)
        if _call(_tail_bwd_input_kernel, da, _np(x, da) if x is not None else np.zeros((1, 1), da.dtype),
                 _np(rinv, da), _np(c, da), _np(g, da), _np(pas), da.dtype.type(den), da.dtype.type(0), gx.numpy(),
                 rinv is not None, g is not None):
            return gx
    dy = torch.where(pas, dout / den, 0.0)
    if rinv is None:
        return dy
    u = dy * g if g is not None else dy
    return u * rinv[:, None] - x * c[:, None]


def warm_up(dtype: torch.dtype = torch.float32) -> float:
    """Compile (first run) or load from numba's cache (later runs) every kernel for
    ``dtype`` on a tiny block, and return the seconds it took: a caller that times
    epochs calls it first, so the first step does not carry it (0 without numba)."""
    import time

    if not available():
        return 0.0
    t0 = time.perf_counter()
    x = torch.ones(2, 3, dtype=dtype)
    drop = DropoutBlock(1, torch.arange(2), torch.arange(3), 0.5)
    keep_mask(1, drop.rows, drop.cols, 0.5)
    rinv = row_sum_squares(x).to(dtype)
    out, pas = tail_forward(x, rinv, x[0], drop, x, save=True)
    tail_backward_stats(out, x, rinv, x[0], pas, 0.5, want_dg=True)
    tail_backward_input(out, x, rinv, rinv, x[0], pas, 0.5)
    return time.perf_counter() - t0
