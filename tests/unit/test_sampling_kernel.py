"""The sampler's kernels (scalegnn/_sampling_kernel.py, numba loaded by scalegnn/_numba.py)
against the torch reference path of extract_block, entry for entry.

Random directed graphs with self loops and isolated vertices, blocks over row and
column ranges of a plane, one thread and several, keyed self loops, the reused
per-thread buffers (growth, reuse over different blocks, a bitmap left clean, a call
that dies half way, two threads at once), and the fallback when numba is absent.
Bit-identical where the arithmetic is identical: numba / vectorized torch, tagged map /
binary search, int32 / int64 ids give the same CSR pair, entry for entry, value for
value; the sample draw is the same with and without numba. On a GPU (``gpu`` marker)
Algorithm 2's torch path gives the CPU kernels' blocks.
"""

from __future__ import annotations

import collections
import threading

import pytest
import torch

from scalegnn import _numba, _sampling_kernel
from scalegnn import sampling as S
from tests.devices import needs_gpu
from tests.graphs import random_graph


needs_numba = pytest.mark.skipif(not _sampling_kernel.available(), reason="numba not installed")


def directed_block(n, m, seed, rows=None, cols=None, isolated=5) -> S.CSRBlock:
    """A random directed N x N matrix (A != A^T), a self loop on every third vertex, the
    last ``isolated`` vertices with no edge at all, float32 values in (0, 1], as the
    block over ``rows`` x ``cols`` (default the whole matrix)."""
    gen = torch.Generator().manual_seed(seed)
    live = n - isolated
    src, dst = torch.randint(0, live, (m,), generator=gen), torch.randint(0, live, (m,), generator=gen)
    loops = torch.arange(0, live, 3)
    key = torch.unique(torch.cat([src * n + dst, loops * n + loops]))  # sorted, no duplicates
    r, c = key // n, key % n
    indptr = torch.zeros(n + 1, dtype=torch.int64)
    indptr[1:] = torch.cumsum(torch.bincount(r, minlength=n), 0)
    values = 1.0 - torch.rand(key.numel(), generator=gen)
    r0, r1 = rows or (0, n)
    c0, c1 = cols or (0, n)
    lo, hi = int(indptr[r0]), int(indptr[r1])
    ptr, ind, val = indptr[r0: r1 + 1] - lo, c[lo:hi], values[lo:hi]
    keep = (ind >= c0) & (ind < c1)
    before = torch.zeros(ind.numel() + 1, dtype=torch.int64)
    before[1:] = torch.cumsum(keep, 0)
    return S.CSRBlock(before[ptr].contiguous(), ind[keep].to(torch.int32).contiguous(), val[keep].contiguous(),
                      r0, r1, c0, c1)


def same(a: S.SampledBlock, b: S.SampledBlock) -> bool:
    parts = lambda x: (x.crow_indices(), x.col_indices(), x.values())  # noqa: E731
    return (a.row_offset, a.col_offset) == (b.row_offset, b.col_offset) and all(
        x.dtype == y.dtype and torch.equal(x, y) for m, r in ((a.adj, b.adj), (a.adj_t, b.adj_t))
        for x, y in zip(parts(m), parts(r)))


PLANE_RANGES = [((0, 500), (0, 500)), ((0, 180), (0, 500)), ((180, 500), (97, 333)), ((333, 500), (0, 97)),
                ((97, 333), (333, 500))]


@needs_numba
@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("batch", [2, 61, 250, 499])
def test_kernel_equals_torch_reference_on_directed_blocks(batch, threads, monkeypatch):
    monkeypatch.setattr(_sampling_kernel, "PARALLEL_MIN_NNZ", 1)  # several threads split even these small blocks
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for seed, (rows, cols) in enumerate(PLANE_RANGES):
            blk = directed_block(500, 6000, seed, rows, cols)
            sample = S.sample_vertices(500, batch, seed=seed, step=batch)
            p = S.inclusion_probability(500, batch)
            ref = S.extract_block(blk, sample, p, backend="torch")
            assert same(S.extract_block(blk, sample, p, backend="numba"), ref), (rows, cols)
            blk64 = S.CSRBlock(blk.indptr, blk.indices.long(), *[getattr(blk, f) for f in
                                                                 ("values", "row_start", "row_end", "col_start",
                                                                  "col_end")])
            assert same(S.extract_block(blk64, sample, p, backend="numba"), ref)
            no_rescale = S.extract_block(blk, sample, 1.0, backend="numba")  # full-graph: values untouched
            assert same(no_rescale, S.extract_block(blk, sample, 1.0, backend="torch"))
    finally:
        torch.set_num_threads(before)


@needs_numba
def test_kernel_equals_reference_with_keys_and_a_separate_column_sample():
    """Rows and columns labeled differently (double permutation): the self loops are
    the entries whose row and column keys agree."""
    n = 300
    blk = directed_block(n, 4000, 7, (40, 260), (10, 290))
    gen = torch.Generator().manual_seed(3)
    sample = torch.sort(torch.randperm(n, generator=gen)[:90]).values
    col_sample = torch.sort(torch.randperm(n, generator=gen)[:90]).values
    keys = (torch.randperm(n, generator=gen)[sample], torch.randperm(n, generator=gen)[col_sample])
    keys[1][5:20] = keys[0][5:20]  # some matching keys, so some entries stay unscaled
    p = S.inclusion_probability(n, 90)
    kw = dict(col_sample=col_sample, keys=keys)
    assert same(S.extract_block(blk, sample, p, backend="numba", **kw),
                S.extract_block(blk, sample, p, backend="torch", **kw))


@needs_numba
def test_reused_buffers_grow_are_left_clean_and_recover():
    """The per-thread buffers start empty and grow on the first call that overflows them;
    a block over a wider column range grows the bitmap; every call leaves the bitmap all
    zero; a call that died between marking and clearing is not trusted afterwards."""
    scratch = _sampling_kernel._scratch
    scratch.__init__()  # this thread's buffers as a fresh thread finds them
    results = []
    for n, batch in ((300, 100), (2000, 700), (300, 100), (5000, 30)):
        blk = directed_block(n, 8 * n, n)
        sample = S.sample_vertices(n, batch, 0, 1)
        p = S.inclusion_probability(n, batch)
        out = S.extract_block(blk, sample, p, backend="numba")
        assert same(out, S.extract_block(blk, sample, p, backend="torch"))
        assert not scratch.bits.any() and not scratch.dirty
        results.append(out)
    assert scratch.bits.size >= 5000 // 64 + 1
    assert same(results[0], results[2])  # a larger buffer gives the same block
    scratch.bits[3] = 1  # as a crash between mark and clear would leave it
    scratch.dirty = True
    blk = directed_block(300, 2400, 300)
    sample = S.sample_vertices(300, 100, 0, 1)
    assert same(S.extract_block(blk, sample, 0.3, backend="numba"), S.extract_block(blk, sample, 0.3,
                                                                                    backend="torch"))
    assert not scratch.bits.any()


@needs_numba
def test_two_threads_sampling_at_once_each_use_their_own_buffers():
    """The prefetch thread and the main thread may sample at the same time."""
    n = 4000
    blocks = [directed_block(n, 60000, s) for s in range(2)]
    samples = [S.sample_vertices(n, 900 + 300 * s, 0, s) for s in range(2)]
    ps = [S.inclusion_probability(n, 900 + 300 * s) for s in range(2)]
    refs = [S.extract_block(blocks[s], samples[s], ps[s], backend="torch") for s in range(2)]
    ok, errors = [True, True], []

    def work(s):
        try:
            for _ in range(30):
                ok[s] &= same(S.extract_block(blocks[s], samples[s], ps[s], backend="numba"), refs[s])
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and all(ok)


def test_without_numba_the_sampler_gives_the_same_batches(monkeypatch):
    """numba absent: "auto" runs the torch path, and a sampler's batches (sample, both
    CSRs) are those the kernel gives."""
    from tests.graphs import random_graph

    g = random_graph(n=600, m=9000, seed=4)
    monkeypatch.setattr(S, "NUMBA_MIN_NNZ", 0)  # "auto" would take the kernel for this graph
    with_kernel = [S.UniformVertexSampler(g, 150, seed=2).sample(step) for step in range(3)]
    monkeypatch.setattr(_numba, "_HAVE_NUMBA", False)
    without = [S.UniformVertexSampler(g, 150, seed=2).sample(step) for step in range(3)]
    for a, b in zip(with_kernel, without):
        assert torch.equal(a.nodes, b.nodes)
        assert same(S.SampledBlock(a.adj, a.adj_t, 0, 0), S.SampledBlock(b.adj, b.adj_t, 0, 0))
    with pytest.raises(_sampling_kernel.Unavailable):
        _sampling_kernel.extract(torch.zeros(2, dtype=torch.int64), torch.zeros(1, dtype=torch.int64), torch.ones(1),
                            torch.zeros(1, dtype=torch.int64), torch.zeros(1, dtype=torch.int64), 0, 1, 0, 0.5)


def _same_csr(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in ((a.crow_indices(), b.crow_indices()),
                                             (a.col_indices(), b.col_indices()), (a.values(), b.values())))


# ------------------------------------------------------------------------------ sampler kernels
@needs_numba
@pytest.mark.parametrize("batch", [2, 150, 300])
def test_sampler_kernels_agree_bit_for_bit(batch):
    g = random_graph(n=300, m=3000, seed=batch)
    sample = S.sample_vertices(300, batch, seed=1, step=batch)
    p = S.inclusion_probability(300, batch)
    for rows in ((0, 300), (0, 120), (120, 300)):
        for cols in ((0, 300), (0, 77), (77, 211), (211, 300)):
            blk = S.CSRBlock.from_graph(g, rows, cols)
            assert blk.indices.dtype == torch.int32
            blk64 = S.CSRBlock(blk.indptr, blk.indices.long(), blk.values, *rows, *cols)
            ref = S.extract_block(blk, sample, p, backend="torch")  # binary search
            outs = [S.extract_block(blk, sample, p, S.CompactIndexMap(cols[1] - cols[0], cols[0]), backend="torch"),
                    S.extract_block(blk, sample, p, backend="numba"),
                    S.extract_block(blk64, sample, p, backend="numba"),
                    S.extract_block(blk64, sample, p, backend="torch")]
            for out in outs:
                assert _same_csr(out.adj, ref.adj) and _same_csr(out.adj_t, ref.adj_t), (rows, cols)
                assert (out.row_offset, out.col_offset) == (ref.row_offset, ref.col_offset)
            dense = ref.adj.to_dense()
            assert torch.equal(ref.adj_t.to_dense(), dense.T)


@needs_numba
@pytest.mark.parametrize("threads", [2, 3, 5])
def test_multithreaded_kernel_equals_one_thread_and_torch(threads, monkeypatch):
    """Rows split into ranges of equal work, scanned and scattered on several threads:
    the same CSR and transpose, entry for entry, as one thread and the torch path
    (the threshold is lowered so a small graph splits), and no thread is left behind."""
    import threading

    monkeypatch.setattr(_sampling_kernel, "PARALLEL_MIN_NNZ", 1)
    g = random_graph(n=400, m=6000, seed=threads)
    sample = S.sample_vertices(400, 170, seed=2, step=threads)
    p = S.inclusion_probability(400, 170)
    before = threading.active_count()
    for rows, cols in (((0, 400), (0, 400)), ((0, 250), (90, 400))):
        blk = S.CSRBlock.from_graph(g, rows, cols)
        r_lo, r_hi, c_lo, c_hi = torch.searchsorted(sample, torch.tensor([*rows, *cols])).tolist()
        args = (blk.indptr, blk.indices, blk.values, sample[r_lo:r_hi] - rows[0], sample[c_lo:c_hi], cols[0],
                cols[1], r_lo - c_lo, p)
        one = _sampling_kernel.extract(*args, threads=1)
        many = _sampling_kernel.extract(*args, threads=threads)
        assert all(torch.equal(a, b) for a, b in zip(one, many))
        assert len(_sampling_kernel._row_chunks(_sampling_kernel._row_work_kernel(blk.indptr.numpy(), args[3].numpy()),
                                           threads)) > 1
        ref = S.extract_block(blk, sample, p, backend="torch")
        assert torch.equal(many[0], ref.adj.crow_indices()) and torch.equal(many[1], ref.adj.col_indices())
        assert torch.equal(many[2], ref.adj.values()) and torch.equal(many[4], ref.adj_t.col_indices())
        assert torch.equal(many[3], ref.adj_t.crow_indices()) and torch.equal(many[5], ref.adj_t.values())
    assert threading.active_count() == before


def test_keyed_extraction_handles_two_labelings():
    """Double permutation: rows in sigma ids, columns in ids; self loops found by vertex.
    The block equals the serial rescaled sampled matrix with its rows reordered."""
    from scalegnn.parallel.sharding import double_permuted
    from scalegnn.permutation import double_sigma

    g = random_graph(n=120, m=700, seed=3)
    sigma = double_sigma(120, seed=5)
    rows_relabeled, cols_relabeled = double_permuted(g, sigma)
    sample = S.sample_vertices(120, 40, seed=2, step=1)
    p = S.inclusion_probability(120, 40)
    ref = S.extract_block(S.CSRBlock.from_graph(g), sample, p).adj.to_dense()
    alt = torch.sort(sigma[sample]).values
    ids = torch.argsort(sigma)[alt]  # vertex of every sigma id
    order = torch.searchsorted(sample, ids)  # row of ref for every row of the sigma-ordered block
    backends = ["torch"] + (["numba"] if _sampling_kernel.available() else [])
    for backend in backends:
        a = S.extract_block(S.CSRBlock.from_graph(rows_relabeled), alt, p, backend=backend, col_sample=sample,
                            keys=(ids, sample)).adj.to_dense()
        assert torch.equal(a, ref[order])
        b = S.extract_block(S.CSRBlock.from_graph(cols_relabeled), sample, p, backend=backend, col_sample=alt,
                            keys=(sample, ids)).adj.to_dense()
        assert torch.equal(b, ref[:, order])


def test_sample_draw_is_uniform_and_independent_of_numba(monkeypatch):
    # Every 2-subset of 5 vertices equally likely: 4000 draws, 10 subsets, each count
    # within 5 standard deviations of 400 (deterministic seeds, so never flaky).
    counts = collections.Counter(tuple(S.sample_vertices(5, 2, 0, step).tolist()) for step in range(4000))
    assert len(counts) == 10 and all(abs(c - 400) < 5 * (400 * 0.9) ** 0.5 for c in counts.values())
    for n, b in [(10, 7), (1000, 999), (70000, 5000), (70000, 60000)]:  # complement path for B > N/2 too
        s = S.sample_vertices(n, b, 3, 4)
        assert s.numel() == b and torch.equal(s, torch.unique(s))
    big = S.sample_vertices(200000, 20000, 1, 2)
    monkeypatch.setattr(_numba, "_HAVE_NUMBA", False)
    assert torch.equal(big, S.sample_vertices(200000, 20000, 1, 2))


def test_torch_fallback_without_numba(monkeypatch):
    g = random_graph(n=200, m=1500)
    blk = S.CSRBlock.from_graph(g)
    sample = S.sample_vertices(200, 60, 0, 0)
    ref = S.extract_block(blk, sample, 0.3, backend="torch")
    monkeypatch.setattr(_numba, "_HAVE_NUMBA", False)
    monkeypatch.setattr(S, "NUMBA_MIN_NNZ", 0)  # "auto" would pick numba for this block
    assert _same_csr(S.extract_block(blk, sample, 0.3).adj, ref.adj)
    with pytest.raises(ValueError, match="pip install numba"):
        S.extract_block(blk, sample, 0.3, backend="numba")
    with pytest.raises(ValueError, match="sampler backend"):
        S.extract_block(blk, sample, 0.3, backend="cuda")


# ----------------------------------------------------------------------------- on a GPU
gpu = pytest.mark.gpu


@gpu
@needs_gpu
@pytest.mark.parametrize("backend", ["torch", "auto"])
def test_algorithm2_on_the_gpu_gives_the_cpu_blocks(backend):
    """Algorithm 2's vectorized torch path on CUDA tensors against the CPU kernels
    (numba where installed, else torch) for the same (seed, step): identical CSR
    pairs, entry for entry (int32 and int64 column ids, row/column sub-blocks)."""
    from tests.graphs import random_graph

    g = random_graph(n=3000, m=60000, seed=4)
    for step in range(3):
        sample = S.sample_vertices(3000, 700, seed=2, step=step)
        p = S.inclusion_probability(3000, 700)
        for rows, cols in (((0, 3000), (0, 3000)), ((500, 2100), (1000, 2999))):
            blk = S.CSRBlock.from_graph(g, rows, cols)
            ref = S.extract_block(blk, sample, p, S.CompactIndexMap(cols[1] - cols[0], cols[0]), backend="auto")
            gblk, gsample = blk.to("cuda"), sample.cuda()
            cmap = S.CompactIndexMap(cols[1] - cols[0], cols[0], "cuda")
            got = S.extract_block(gblk, gsample, p, cmap, backend=backend, bounds=S.block_bounds(blk, sample))
            for a, b in ((got.adj, ref.adj), (got.adj_t, ref.adj_t)):
                assert torch.equal(a.crow_indices().cpu(), b.crow_indices())
                assert torch.equal(a.col_indices().cpu(), b.col_indices())
                assert torch.equal(a.values().cpu(), b.values())
