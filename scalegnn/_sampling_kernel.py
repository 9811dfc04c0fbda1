"""ScaleGNN's sampler kernel: Algorithm 2 (phases 2-4) compiled for the CPU with numba; optional.

(Not the FastSample baseline's sampler, which is :mod:`scalegnn.baselines.fastsample_kernel`.)

Why a compiled kernel. The vectorized torch path (:func:`scalegnn.sampling.extract_block`)
makes about ten passes over arrays of ``nnz_rows`` entries (the stored entries of the
sampled rows, ~B x average degree), each one materialized in memory, and a sort for
the transpose; on a 2-core CPU that is 3-5x the time of one pass. This kernel makes
one pass over the sampled rows' column ids and touches the values only of the entries
it keeps. On one thread a block is one compiled call, in four passes:

  * mark: a bitmap of S_c (one bit per vertex of the block's column range) with a
    rank per 64-bit word, ``compact(v) = rank[w] + popcount(word_w below bit v)``:
    125 KB + 125 KB for 10^6 columns, in L2, instead of a random lookup into a 4-8 MB
    map. S_c is sorted, so the ranks are written in O(B) and the bitmap is cleared in
    O(B) afterwards: no pass over the column range per step;
  * scan (the one pass over the rows' column ids, which bounds the step): rows are
    sampled at random, so each costs cache misses; the row pointer 2*AHEAD rows on
    and the row AHEAD rows on are prefetched so that many are in flight. The
    membership loop is branch-free (it writes every position and advances only on a
    hit: no mispredicted branch per kept entry) over unsigned ids (no negative-index
    check per access); it records the compact column and stored position of each kept
    entry in per-thread buffers reused from step to step;
  * gather: the kept entries' values, read in increasing position order with a
    prefetch ahead, rescaled (Eq. 24) into the exactly sized forward CSR; then the
    column counts, in a pass of their own;
  * transpose: a counting sort by column (stable, so rows stay sorted within each
    column), O(kept + B), with int32 slot pointers.

Measured on one thread (N = 10^6, nnz = 2x10^7, B = 10^5): half the CPU time of the
single-pass kernel that read the values and counted the columns inside the scan.

numba is a well-kept, widely used JIT (PyData/Anaconda) with wheels for every
platform torch supports, loaded once by :mod:`scalegnn._numba` (``available``,
``Unavailable``: a kernel that cannot compile turns the compiled path off);
``nogil=True`` lets the prefetch thread run this kernel while the main thread
trains. ``cache=True`` keeps the compiled code next to this file after the first
call. Without numba, or for non-CPU tensors, the torch path
runs instead and gives bit-identical results (the division by p is float32 in
both, entry order is CSR order in both).
"""

from __future__ import annotations

import threading

import numpy as np
import torch

from ._numba import Unavailable, available, numba, run as _run

__all__ = ["available", "extract", "first_distinct", "Unavailable", "PARALLEL_MIN_NNZ"]

if numba is not None:
    _U1 = np.uint64(1)
    _M1 = np.uint64(0x5555555555555555)
    _M2 = np.uint64(0x3333333333333333)
    _M4 = np.uint64(0x0F0F0F0F0F0F0F0F)
    _H01 = np.uint64(0x0101010101010101)
    _U6, _U63 = np.uint64(6), np.uint64(63)
    _AHEAD = 16  # rows prefetched ahead by the scan (its pointer twice as far): enough misses in flight
    _AHEAD_KEPT = 48  # kept entries whose value is prefetched ahead by the gather

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
    def _mark_kernel(cols, c0, bits, rank):
        # Set the bit of every sampled column (local id v - c0) in ``bits`` (all zero on
        # entry) and, for every word holding one, the number of sampled columns before
        # it. ``cols`` is sorted, so that count is the position of the word's first
        # column: O(B), no pass over the column range. Words without a sampled column
        # keep a stale rank, never read (their bits are zero).
        prev = -1
        for j in range(cols.size):
            v = cols[j] - c0
            w = v >> 6
            if w != prev:
                rank[w] = j
                prev = w
            bits[w] |= _U1 << np.uint64(v & 63)

    @numba.njit(nogil=True, cache=True)
    def _clear_kernel(cols, c0, bits):
        # Back to all zero in O(B): only the words _mark_kernel wrote.
        for j in range(cols.size):
            bits[(cols[j] - c0) >> 6] = 0

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
    def _scan_kernel(indptr, indices, rows, lo, hi, bits, rank, c0, buf_c, buf_e, row_end):
        # Sampled rows lo..hi-1: the compact column (buf_c) and the stored position
        # (buf_e) of every kept entry, in CSR order, and the running kept count after
        # each row (row_end[i - lo]). Returns the kept count, or -1 as soon as a row
        # might not fit in the buffers (the caller grows them and calls again).
        #
        # This is the one pass over the sampled rows' column ids, so it is written for
        # the two things that bound it: memory latency (rows are sampled at random:
        # their pointer is prefetched 2*AHEAD rows on, the row itself AHEAD rows on,
        # so many misses are in flight at once) and instructions per entry (a
        # branch-free membership loop that writes every position and advances the
        # output only on a hit, so a 10 %-kept row costs no mispredicted branch per
        # kept entry; unsigned ids, so no index needs a negative-wraparound check).
        # Values are not read here: _gather_kernel reads the kept ones afterwards.
        cap = np.uint64(buf_c.size)
        c0u = np.uint64(c0)
        k = np.uint64(0)
        for i in range(lo, hi):
            if i + 2 * _AHEAD < hi:
                _prefetch(indptr, rows[i + 2 * _AHEAD])
            if i + _AHEAD < hi:
                a, z = indptr[rows[i + _AHEAD]], indptr[rows[i + _AHEAD] + 1] - 1
                if z >= a:
                    _prefetch(indices, a)
                    _prefetch(indices, z)
            r = rows[i]
            start, stop = np.uint64(indptr[r]), np.uint64(indptr[r + 1])
            if k + (stop - start) > cap:
                return -1
            m = k
            for e in range(start, stop):  # membership: a bit of S_c's bitmap
                v = np.uint64(indices[e]) - c0u
                buf_e[m] = e
                m += (bits[v >> _U6] >> (v & _U63)) & _U1
            for t in range(k, m):  # compact id: sampled columns before v
                v = np.uint64(indices[buf_e[t]]) - c0u
                buf_c[t] = rank[v >> _U6] + _popcount(bits[v >> _U6] & ((_U1 << (v & _U63)) - _U1))
            k = m
            row_end[i - lo] = k
        return np.int64(k)

    @numba.njit(nogil=True, cache=True)
    def _gather_kernel(values, buf_c, buf_e, row_end, lo, diag_shift, scale, rescale, rkey, ckey, keyed,
                       out_c, out_v):
        # The kept entries of rows lo.. (as _scan_kernel left them) into the output:
        # compact columns copied, values read (prefetched a few entries ahead: kept
        # positions increase, but with gaps) and rescaled.
        scale32 = np.float32(scale)
        k = row_end[row_end.size - 1] if row_end.size else 0
        for i in range(row_end.size):
            row = lo + i
            for t in range(row_end[i - 1] if i else 0, row_end[i]):
                if t + _AHEAD_KEPT < k:
                    _prefetch(values, buf_e[t + _AHEAD_KEPT])
                c = buf_c[t]
                val = values[buf_e[t]]
                # Eq. 24: off-diagonal / p. Diagonal <=> same position in S (or same key).
                if rescale and ((rkey[row] != ckey[c]) if keyed else (c - row != diag_shift)):
                    val = val / scale32
                out_c[t] = c
                out_v[t] = val

    @numba.njit(nogil=True, cache=True)
    def _count_kernel(out_c, col_cnt):
        # One more per kept entry in its column's count. A pass of its own: inside the
        # gather, these scattered increments wait behind the value misses (3x the time).
        for t in range(out_c.size):
            col_cnt[out_c[t]] += 1

    @numba.njit(nogil=True, cache=True)
    def _scatter_kernel(out_c, out_v, row_end, row0, start, t_rows, t_vals):
        # Transpose by counting sort: this range's entries, rows in increasing order,
        # go to the next free slot of their column (``start``: this range's first
        # slot per column, advanced in place).
        for i in range(row_end.size):
            for j in range(row_end[i - 1] if i else 0, row_end[i]):
                c = out_c[j]
                pos = start[c]
                t_rows[pos] = row0 + i
                t_vals[pos] = out_v[j]
                start[c] = pos + 1

    @numba.njit(nogil=True, cache=True)
    def _serial_kernel(indptr, indices, values, rows, cols, c0, diag_shift, scale, rescale, rkey, ckey, keyed,
                       bits, rank, buf_c, buf_e):
        # The whole extraction in one call (one thread): mark S_c, scan the rows into the
        # reused buffers, then the exactly sized outputs: the forward CSR, and the
        # transpose by a counting sort (stable: rows stay sorted within each column).
        # An empty ``fwd_ptr`` says the buffers were too small (nothing else is returned).
        n_rows, n_cols = rows.size, cols.size
        _mark_kernel(cols, c0, bits, rank)
        fwd_ptr = np.empty(n_rows + 1, np.int64)
        fwd_ptr[0] = 0
        k = _scan_kernel(indptr, indices, rows, 0, n_rows, bits, rank, c0, buf_c, buf_e, fwd_ptr[1:])
        _clear_kernel(cols, c0, bits)
        if k < 0:
            none_i, none_f = np.empty(0, np.int64), np.empty(0, np.float32)
            return none_i, none_i, none_f, none_i, none_i, none_f
        out_c = np.empty(k, np.int64)
        out_v = np.empty(k, np.float32)
        t_ptr = np.zeros(n_cols + 1, np.int64)
        _gather_kernel(values, buf_c, buf_e, fwd_ptr[1:], 0, diag_shift, scale, rescale, rkey, ckey, keyed,
                       out_c, out_v)
        _count_kernel(out_c, t_ptr[1:])
        for c in range(n_cols):
            t_ptr[c + 1] += t_ptr[c]
        t_rows = np.empty(k, np.int64)
        t_vals = np.empty(k, np.float32)
        if k < 2**31:  # int32 slot pointers: half the bytes of the scattered updates
            _scatter_kernel(out_c, out_v, fwd_ptr[1:], 0, t_ptr[:n_cols].astype(np.int32), t_rows, t_vals)
        else:
            _scatter_kernel(out_c, out_v, fwd_ptr[1:], 0, t_ptr[:n_cols].copy(), t_rows, t_vals)
        return fwd_ptr, out_c, out_v, t_ptr, t_rows, t_vals

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


class _Scratch(threading.local):
    """Work buffers reused from call to call, one set per calling thread (the prefetch
    thread and the main thread may both sample): the bitmap of S_c and its word ranks
    (sized to the largest column range seen; the bitmap is all zero between calls, the
    kernel clears the words it set), and the kept-entry buffers of the one-thread scan
    (sized to the largest sampled-row entry count that ever overflowed them; only the
    kept prefix is ever written, so the untouched rest costs address space, not memory).
    Reusing them saves a fresh, page-faulted allocation of each per step."""

    def __init__(self):
        self.bits = np.zeros(0, np.uint64)
        self.rank = np.zeros(0, np.int64)
        self.buf_c = np.zeros(0, np.int64)
        self.buf_e = np.zeros(0, np.uint64)
        self.dirty = False

    def bitmap(self, width: int) -> tuple[np.ndarray, np.ndarray]:
        nwords = (width >> 6) + 1
        if self.bits.size < nwords or self.dirty:  # dirty: a call died between mark and clear
            self.bits = np.zeros(max(nwords, self.bits.size), np.uint64)
            self.rank = np.empty(self.bits.size, np.int64)
            self.dirty = False
        return self.bits, self.rank


_scratch = _Scratch()


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
    result, is the same for any number of threads. One range (one thread, or a small
    block) is a single compiled call over reused buffers.
    """
    if values.dtype != torch.float32:
        raise Unavailable(f"the numba sampler kernel takes float32 values, got {values.dtype}")
    ip, ind, val = indptr.numpy(), indices.numpy(), values.numpy()
    r, c = rows.contiguous().numpy(), cols.contiguous().numpy()
    keyed = rkey is not None
    rk = _EMPTY if rkey is None else rkey.contiguous().numpy()
    ck = _EMPTY if ckey is None else ckey.contiguous().numpy()
    c0, diag_shift, scale = int(c0), int(diag_shift), float(scale)
    threads = torch.get_num_threads() if threads is None else threads
    chunks = [(0, r.size)]
    if threads > 1 and r.size:
        work = _run(_row_work_kernel, ip, r)
        chunks = _row_chunks(work, max(1, min(threads, int(work[-1]) // PARALLEL_MIN_NNZ)))
    scratch = _scratch
    bits, rank = scratch.bitmap(int(c1) - c0)
    if len(chunks) == 1:
        while True:
            scratch.dirty = True
            out = _run(_serial_kernel, ip, ind, val, r, c, c0, diag_shift, scale, scale != 1.0, rk, ck, keyed,
                       bits, rank, scratch.buf_c, scratch.buf_e)
            scratch.dirty = False
            if out[0].size:
                return tuple(torch.from_numpy(a) for a in out)
            # The kept entries did not fit: room for every stored entry of the sampled rows.
            need = int(_run(_row_work_kernel, ip, r)[-1])
            scratch.buf_c, scratch.buf_e = np.empty(need, np.int64), np.empty(need, np.uint64)
    return _extract_chunks(ip, ind, val, r, c, c0, diag_shift, scale, rk, ck, keyed, bits, rank, chunks, work)


def _extract_chunks(ip, ind, val, r, c, c0, diag_shift, scale, rk, ck, keyed, bits, rank, chunks, work):
    """:func:`extract` over several row ranges, one thread each (see there)."""
    n_cols = c.size
    _scratch.dirty = True
    _run(_mark_kernel, c, c0, bits, rank)

    def scan(lo, hi):
        need = int(work[hi - 1] - (work[lo - 1] if lo else 0))
        # upper-bound buffers: only the kept prefix is ever touched (the rest is never faulted in)
        buf_c, buf_e, row_end = np.empty(need, np.int64), np.empty(need, np.uint64), np.empty(hi - lo, np.int64)
        k = _run(_scan_kernel, ip, ind, r, lo, hi, bits, rank, c0, buf_c, buf_e, row_end)
        return buf_c, buf_e, row_end, k

    try:
        scanned = _in_threads(scan, chunks)
    finally:
        _run(_clear_kernel, c, c0, bits)
        _scratch.dirty = False
    fwd_ptr = np.zeros(r.size + 1, np.int64)
    base = [0]
    for (lo, hi), s in zip(chunks, scanned):
        fwd_ptr[lo + 1: hi + 1] = s[2] + base[-1]
        base.append(base[-1] + s[3])
    k = base[-1]
    out_c, out_v = np.empty(k, np.int64), np.empty(k, np.float32)
    col_cnt = [np.zeros(n_cols, np.int64) for _ in chunks]

    def gather(j):
        _run(_gather_kernel, val, scanned[j][0], scanned[j][1], scanned[j][2], chunks[j][0], diag_shift, scale,
             scale != 1.0, rk, ck, keyed, out_c[base[j]: base[j + 1]], out_v[base[j]: base[j + 1]])
        _run(_count_kernel, out_c[base[j]: base[j + 1]], col_cnt[j])

    _in_threads(gather, [(j,) for j in range(len(chunks))])
    col_total = np.zeros(n_cols, np.int64)
    starts = []
    for cnt in col_cnt:  # range j's first slot per column: after the columns before, and ranges < j
        starts.append(col_total.copy())
        col_total += cnt
    t_ptr = np.zeros(n_cols + 1, np.int64)
    np.cumsum(col_total, out=t_ptr[1:])
    t_rows = np.empty(k, np.int64)
    t_vals = np.empty(k, np.float32)
    _in_threads(lambda j: _run(_scatter_kernel, out_c[base[j]: base[j + 1]], out_v[base[j]: base[j + 1]],
                               scanned[j][2], chunks[j][0], t_ptr[:-1] + starts[j], t_rows, t_vals),
                [(j,) for j in range(len(chunks))])
    return tuple(torch.from_numpy(a) for a in (fwd_ptr, out_c, out_v, t_ptr, t_rows, t_vals))
