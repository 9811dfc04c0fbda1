"""Compiled CPU kernel for Algorithm 2 (phases 2-4) with numba; optional.

Why a compiled kernel. The vectorized torch path (:func:`scalegnn.sampling.extract_block`)
makes about ten passes over arrays of ``nnz_rows`` entries (the stored entries of the
sampled rows, ~B x average degree), each one materialized in memory, and a sort for
the transpose; on a 2-core CPU that is 3-5x the time of one pass. This kernel makes
one pass over the sampled rows' column ids and touches the values only of the entries
it keeps:

  * membership and remap use a bitmap of S_c (one bit per vertex of the block's
    column range) with a rank count per 64-bit word: ``compact(v) = rank[w] +
    popcount(word_w below bit v)``. For 10^6 columns that is 125 KB + 125 KB, which
    stays in L2, instead of a random lookup into a 4-8 MB map;
  * the forward CSR is written in the same pass; the transpose is a counting sort
    by column (stable, so rows stay sorted within each column), O(kept + B).

numba is a well-kept, widely used JIT (PyData/Anaconda) with wheels for every
platform torch supports; ``nogil=True`` lets the prefetch thread run this kernel
while the main thread trains. ``cache=True`` keeps the compiled code next to this
file after the first call. Without numba, or for non-CPU tensors, the torch path
runs instead and gives bit-identical results (the division by p is float32 in
both, entry order is CSR order in both).
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["available", "extract", "first_distinct", "Unavailable", "PARALLEL_MIN_NNZ"]

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


def _run(kernel, *args):
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

        warnings.warn(f"numba sampler kernel unavailable ({type(exc).__name__}: {exc}); using the torch kernel",
                      RuntimeWarning, stacklevel=3)
        raise Unavailable(str(exc)) from exc


if _HAVE_NUMBA:
    _U1 = np.uint64(1)
    _M1 = np.uint64(0x5555555555555555)
    _M2 = np.uint64(0x3333333333333333)
    _M4 = np.uint64(0x0F0F0F0F0F0F0F0F)
    _H01 = np.uint64(0x0101010101010101)
    _AHEAD = 6  # rows prefetched ahead (a few cache misses in flight; 4-16 measure alike)

    @numba.njit(nogil=True, cache=True, inline="always")
    def _popcount(x):
        x = x - ((x >> _U1) & _M1)
        x = (x & _M2) + ((x >> np.uint64(2)) & _M2)
        x = (x + (x >> np.uint64(4))) & _M4
        return np.int64((x * _H01) >> np.uint64(56))

    from llvmlite import ir
    from numba.core import cgutils, types
    from numba.extending import intrinsic

    @intrinsic
    def _prefetch(typingctx, arr, idx):
        """``llvm.prefetch`` of ``arr[idx]`` (read, high locality): starts the cache
        miss of a row a few rows ahead, while the current row is scanned."""
        sig = types.void(arr, idx)

        def codegen(context, builder, signature, args):
            aryty = signature.args[0]
            ary = context.make_array(aryty)(context, builder, args[0])
            ptr = cgutils.get_item_pointer(context, builder, aryty, ary, [args[1]], wraparound=False)
            i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]),
                                                "llvm.prefetch")
            builder.call(fn, [builder.bitcast(ptr, i8p), ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
            return context.get_dummy_value()

        return sig, codegen

    @numba.njit(nogil=True, cache=True)
    def _bitmap_kernel(cols, c0, c1):
        # Bitmap of the sampled columns (local ids v - c0) and the rank of each 64-bit word.
        nwords = ((c1 - c0) >> 6) + 1
        bits = np.zeros(nwords, np.uint64)
        for j in range(cols.size):
            v = cols[j] - c0
            bits[v >> 6] |= _U1 << np.uint64(v & 63)
        rank = np.empty(nwords, np.int64)
        acc = 0
        for w in range(nwords):
            rank[w] = acc
            acc += _popcount(bits[w])
        return bits, rank

    @numba.njit(nogil=True, cache=True)
    def _row_work_kernel(indptr, rows):
        # Running total of the stored entries of the sampled rows (splits the work).
        work = np.empty(rows.size, np.int64)
        acc = 0
        for i in range(rows.size):
            acc += indptr[rows[i] + 1] - indptr[rows[i]]
            work[i] = acc
        return work

    @numba.njit(nogil=True, cache=True)
    def _scan_kernel(indptr, indices, values, rows, lo, hi, bits, rank, c0, n_cols, diag_shift, scale, rescale,
                     rkey, ckey, keyed):
        # Sampled rows lo..hi-1: their kept entries (compact column, rescaled value) in
        # CSR order, the kept count per row and per column. One pass over the rows'
        # column ids. Rows are sampled at random, so each row costs a few cache
        # misses: prefetch the row AHEAD positions on while scanning this one. Only
        # the kept prefix of the upper-bound buffers is ever touched (untouched pages
        # of a large allocation are never faulted in).
        total = 0
        for i in range(lo, hi):
            total += indptr[rows[i] + 1] - indptr[rows[i]]
        out_c = np.empty(total, np.int64)
        out_v = np.empty(total, np.float32)
        row_cnt = np.empty(hi - lo, np.int64)
        col_cnt = np.zeros(n_cols, np.int64)
        scale32 = np.float32(scale)
        k = 0
        for i in range(lo, hi):
            if i + 2 * _AHEAD < hi:  # two stages: the row pointer first, the row itself later
                _prefetch(indptr, rows[i + 2 * _AHEAD])
            if i + _AHEAD < hi:
                a, z = indptr[rows[i + _AHEAD]], indptr[rows[i + _AHEAD] + 1] - 1
                if z >= a:
                    _prefetch(indices, a)
                    _prefetch(indices, z)
                    _prefetch(values, a)
                    _prefetch(values, z)
            r = rows[i]
            k0 = k
            for e in range(indptr[r], indptr[r + 1]):
                v = indices[e] - c0
                word = bits[v >> 6]
                b = np.uint64(v & 63)
                if (word >> b) & _U1:
                    c = rank[v >> 6] + _popcount(word & ((_U1 << b) - _U1))
                    val = values[e]
                    # Eq. 24: off-diagonal / p. Diagonal <=> same position in S (or same key).
                    if rescale and ((rkey[i] != ckey[c]) if keyed else (c - i != diag_shift)):
                        val = val / scale32
                    out_c[k] = c
                    out_v[k] = val
                    col_cnt[c] += 1
                    k += 1
            row_cnt[i - lo] = k - k0
        return out_c[:k], out_v[:k], row_cnt, col_cnt

    @numba.njit(nogil=True, cache=True)
    def _scatter_kernel(out_c, out_v, row_cnt, row0, start, t_rows, t_vals):
        # Transpose by counting sort: this chunk's entries, rows in increasing order,
        # go to the next free slot of their column (``start``: this chunk's first
        # slot per column, advanced in place).
        j = 0
        for i in range(row_cnt.size):
            for _ in range(row_cnt[i]):
                c = out_c[j]
                pos = start[c]
                t_rows[pos] = row0 + i
                t_vals[pos] = out_v[j]
                start[c] = pos + 1
                j += 1

    @numba.njit(nogil=True, cache=True)
    def _first_distinct_kernel(draws, n, k):
        # First k distinct values of the draw stream, sorted: mark them in a bitmap
        # (in draw order, stopping at the k-th new value), then read the set bits out
        # in increasing order. Returns an empty array if the stream is too short.
        nwords = (n >> 6) + 1
        bits = np.zeros(nwords, np.uint64)
        found = 0
        for j in range(draws.size):
            d = draws[j]
            m = _U1 << np.uint64(d & 63)
            w = bits[d >> 6]
            if not (w & m):
                bits[d >> 6] = w | m
                found += 1
                if found == k:
                    break
        if found < k:
            return np.empty(0, np.int64)
        out = np.empty(k, np.int64)
        pos = 0
        for w in range(nwords):
            word = bits[w]
            while word:
                low = word & (~word + _U1)  # lowest set bit
                out[pos] = (w << 6) + _popcount(low - _U1)
                pos += 1
                word ^= low
        return out


def first_distinct(draws: torch.Tensor, n: int, k: int) -> torch.Tensor | None:
    """The first ``k`` distinct values of ``draws`` (ints in [0, n)), sorted; None if
    ``draws`` holds fewer than k distinct values. Same result as the torch path."""
    out = _run(_first_distinct_kernel, draws.numpy(), int(n), int(k))
    return torch.from_numpy(out) if out.size == k else None


_EMPTY = np.zeros(0, np.int64)


PARALLEL_MIN_NNZ = 1 << 17  # stored entries of the sampled rows below which one thread is faster


def _row_chunks(work: np.ndarray, parts: int) -> list[tuple[int, int]]:
    """``parts`` contiguous ranges of the sampled rows with about equal stored entries
    (``work``: their running total, :func:`_row_work_kernel`)."""
    if parts <= 1 or work.size < 2 * parts:
        return [(0, work.size)]
    cuts = np.searchsorted(work, work[-1] * np.arange(1, parts) / parts)
    bounds = [0, *[int(c) for c in cuts], work.size]
    return [(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]


def _in_threads(fn, jobs: list[tuple]) -> list:
    """``fn(*job)`` for every job, the first on this thread and the others on short-lived
    threads (the kernels release the GIL); joined before returning, so no thread
    outlives the call."""
    if len(jobs) == 1:
        return [fn(*jobs[0])]
    import threading

    results: list = [None] * len(jobs)
    errors: list = []

    def work(i):
        try:
            results[i] = fn(*jobs[i])
        except BaseException as exc:  # noqa: BLE001 - re-raised on the calling thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(1, len(jobs))]
    for t in threads:
        t.start()
    work(0)
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def extract(indptr: torch.Tensor, indices: torch.Tensor, values: torch.Tensor, rows: torch.Tensor,
            cols: torch.Tensor, c0: int, c1: int, diag_shift: int, scale: float, rkey: torch.Tensor | None = None,
            ckey: torch.Tensor | None = None, threads: int | None = None):
    """(fwd_ptr, cols, vals, t_ptr, t_rows, t_vals) of the rescaled sampled block.

    ``rows`` local row ids of S_r (sorted), ``cols`` global ids of S_c (sorted, in
    [c0, c1)), ``diag_shift = r_lo - c_lo`` (an entry is diagonal iff its compact
    column minus its compact row equals it) or, with ``rkey``/``ckey`` (a common
    vertex label per sampled row / column), iff the labels match. CPU tensors; int32
    or int64 ids, float32 values.

    ``threads`` (default ``torch.get_num_threads()``) split the sampled rows into
    ranges of equal work once they hold ``PARALLEL_MIN_NNZ`` entries: each thread
    scans its rows, then each scatters its entries into the transpose at offsets
    from the per-column counts of the ranges before it. Entry order, and so the
    result, is the same for any number of threads.
    """
    if values.dtype != torch.float32:
        raise Unavailable(f"the numba sampler kernel takes float32 values, got {values.dtype}")
    ip, ind, val = indptr.numpy(), indices.numpy(), values.numpy()
    r, c = rows.contiguous().numpy(), cols.contiguous().numpy()
    keyed = rkey is not None
    rk = _EMPTY if rkey is None else rkey.contiguous().numpy()
    ck = _EMPTY if ckey is None else ckey.contiguous().numpy()
    n_cols = c.size
    threads = torch.get_num_threads() if threads is None else threads
    chunks = [(0, r.size)]
    if threads > 1 and r.size:
        work = _run(_row_work_kernel, ip, r)
        chunks = _row_chunks(work, max(1, min(threads, int(work[-1]) // PARALLEL_MIN_NNZ)))
    bits, rank = _run(_bitmap_kernel, c, int(c0), int(c1))
    scanned = _in_threads(lambda lo, hi: _run(_scan_kernel, ip, ind, val, r, lo, hi, bits, rank, int(c0), n_cols,
                                              int(diag_shift), float(scale), scale != 1.0, rk, ck, keyed), chunks)
    row_cnt = np.concatenate([s[2] for s in scanned])
    fwd_ptr = np.zeros(r.size + 1, np.int64)
    np.cumsum(row_cnt, out=fwd_ptr[1:])
    # a fresh copy even for one range: the scans' outputs are views into upper-bound buffers
    out_c = np.concatenate([s[0] for s in scanned])
    out_v = np.concatenate([s[1] for s in scanned])
    col_total = np.zeros(n_cols, np.int64)
    starts = []
    for s in scanned:  # chunk j's first slot per column: after the columns before, and chunks < j
        starts.append(col_total.copy())
        col_total += s[3]
    t_ptr = np.zeros(n_cols + 1, np.int64)
    np.cumsum(col_total, out=t_ptr[1:])
    k = int(fwd_ptr[-1])
    t_rows = np.empty(k, np.int64)
    t_vals = np.empty(k, np.float32)
    _in_threads(lambda j: _run(_scatter_kernel, scanned[j][0], scanned[j][1], scanned[j][2], chunks[j][0],
                               t_ptr[:-1] + starts[j], t_rows, t_vals), [(j,) for j in range(len(scanned))])
    return tuple(torch.from_numpy(a) for a in (fwd_ptr, out_c, out_v, t_ptr, t_rows, t_vals))
