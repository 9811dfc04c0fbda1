"""Uniform vertex sampling with unbiased edge rescaling (paper III-D, Algorithm 2).

Shape legend:
    N  vertices of the full graph      B  sampled vertices per step
    Br sampled vertices in a block's row range, Bc in its column range

One extraction routine, :func:`extract_block`, serves both the serial sampler (one
block covering the whole matrix) and every rank of the 3D grid (a block per
adjacency shard). It calls no collective: the sample is a pure function of
``(seed, dp_index, step)``, so every rank derives it independently (Algorithm 2,
line 1), and the rescaling factor ``p = (B-1)/(N-1)`` (Eq. 23) depends only on the
global constants B and N.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from .csr import _csr, _row_runs, _transpose_csr, select_rows, sparse_if_enough
from .graph import Graph
# declared where no torch loads (scalegnn.sections); B is resolved there too, for the torch-free cost model
from .sections.sampling import SAMPLER_BACKENDS, SamplingConfig, resolve_batch_size

__all__ = [
    "SamplingConfig",
    "resolve_batch_size",
    "steps_per_epoch",
    "sample_vertices",
    "inclusion_probability",
    "CSRBlock",
    "SampledBlock",
    "CompactIndexMap",
    "extract_block",
    "block_bounds",
    "sample_capacity",
    "SampledBatch",
    "UniformVertexSampler",
]



def steps_per_epoch(num_nodes: int, batch_size: int, dp_size: int = 1) -> int:
    """ceil(N / B) steps cover N vertices in expectation; Gd groups share them (paper IV-A)."""
    return max(1, math.ceil(math.ceil(num_nodes / batch_size) / dp_size))


def inclusion_probability(num_nodes: int, batch_size: int) -> float:
    """p = Pr[u in S | v in S] = (B-1)/(N-1) for u != v (Eq. 23); 1 for full-graph."""
    return 1.0 if num_nodes <= 1 else (batch_size - 1) / (num_nodes - 1)


def _step_seed(seed: int, dp_index: int, step: int) -> int:
    # SeedSequence mixes the three integers into well-separated streams, so
    # consecutive steps and neighbouring data-parallel groups are uncorrelated.
    return int(np.random.SeedSequence([seed & 0xFFFFFFFF, dp_index, step]).generate_state(1, np.uint64)[0] >> 1)


def sample_vertices(num_nodes: int, batch_size: int, seed: int, step: int, dp_index: int = 0) -> torch.Tensor:
    """The sorted sample S (B,), uniform without replacement (Eq. 20, Alg. 2 line 1).

    A pure function of its arguments: every rank of a data-parallel group calls it
    with the same (seed, dp_index, step) and gets the same S without communicating.
    B == N returns all vertices (full-graph training).

    Algorithm 2 writes the draw as ``Sort(RandPerm(N)[:B])``; a permutation of all
    N vertices costs O(N) per step (8-30 ms for N = 10^6), so the same distribution
    is drawn in O(B log B) instead: the first B *distinct* values of a stream of
    i.i.d. uniform draws from [0, N) are a uniform B-subset (each new distinct value
    is uniform over the values not seen yet, exactly as the next element of a
    random permutation). The stream comes from a CPU generator seeded by
    (seed, dp_index, step), so the sample is the same on every device. For B > N/2
    the N - B vertices left out are drawn instead.
    """
    if batch_size >= num_nodes:
        return torch.arange(num_nodes, dtype=torch.int64)
    gen = torch.Generator().manual_seed(_step_seed(seed, dp_index, step))
    if 2 * batch_size > num_nodes:
        left_out = _first_distinct(num_nodes, num_nodes - batch_size, gen)
        keep = torch.ones(num_nodes, dtype=torch.bool)
        keep[left_out] = False
        return keep.nonzero().squeeze(1)
    return _first_distinct(num_nodes, batch_size, gen)


def _first_distinct(n: int, k: int, gen: torch.Generator) -> torch.Tensor:
    """The first ``k`` distinct values of i.i.d. uniform draws from [0, n), sorted.

    Draws come in chunks sized from the expected number of draws to see k distinct
    values, ``-n log(1 - k/n)``, plus a margin; a short chunk (rare) is extended with
    more draws from the same generator, so the result depends only on the seed.
    """
    expected = -n * math.log1p(-k / n)
    chunk = int(expected + 6.0 * math.sqrt(expected) + 16)
    draws = torch.randint(0, n, (chunk,), generator=gen)
    while True:
        fast = _kernel_module() if k >= NUMBA_MIN_SAMPLE else None
        if fast is not None:  # same result in one pass over a bitmap (see _sampling_kernel)
            try:
                out = fast.first_distinct(draws, n, k)
            except fast.Unavailable:
                continue
            if out is not None:
                return out
            draws = torch.cat([draws, torch.randint(0, n, (max(chunk // 4, 16),), generator=gen)])
            continue
        # A stable sort puts each value's first occurrence first among its copies.
        vals, order = torch.sort(draws, stable=True)
        first = torch.ones_like(vals, dtype=torch.bool)
        first[1:] = vals[1:] != vals[:-1]
        uniq, pos = vals[first], order[first]  # distinct values (sorted) and first draw index
        if uniq.numel() >= k:
            break
        draws = torch.cat([draws, torch.randint(0, n, (max(chunk // 4, 16),), generator=gen)])
    if uniq.numel() > k:  # keep the k values drawn first: first-draw indices are distinct
        uniq = uniq[pos <= torch.kthvalue(pos, k).values]
    return uniq


@dataclass(frozen=True)
class CSRBlock:
    """A block of the normalized adjacency: rows [row_start, row_end), columns
    [col_start, col_end), stored as CSR with local row ids and GLOBAL column ids
    (sorted within each row). The serial sampler uses one block spanning N x N.

    ``from_graph`` stores the column ids as int32 when N < 2^31: the sampler streams
    them once per step, and half the bytes is a quarter less time (and half the
    shard memory); ``indptr`` stays int64 (nnz may exceed 2^31).

    ``host_indptr``: a block moved to a device (:meth:`to`) keeps its row pointers in
    host memory too (8 bytes a row), so a sampler counts a gather's entries on the
    host (:meth:`host_pointers`) instead of reading the count back."""

    indptr: torch.Tensor
    indices: torch.Tensor
    values: torch.Tensor
    row_start: int
    row_end: int
    col_start: int
    col_end: int
    host_indptr: torch.Tensor | None = field(default=None, compare=False, repr=False)

    @classmethod
    def from_graph(cls, graph: Graph, row_range=None, col_range=None) -> "CSRBlock":
        n = graph.num_nodes
        r0, r1 = row_range or (0, n)
        c0, c1 = col_range or (0, n)
        lo, hi = int(graph.indptr[r0]), int(graph.indptr[r1])
        indptr = graph.indptr[r0 : r1 + 1] - lo
        indices, values = graph.indices[lo:hi], graph.values[lo:hi]
        if (c0, c1) != (0, n):
            keep = (indices >= c0) & (indices < c1)
            dev = indptr.device
            counts = torch.zeros(r1 - r0, dtype=torch.int64, device=dev)
            rows = torch.repeat_interleave(torch.arange(r1 - r0, device=dev), indptr[1:] - indptr[:-1])
            counts.index_add_(0, rows[keep], torch.ones_like(rows[keep]))
            indptr = torch.cat([torch.zeros(1, dtype=torch.int64, device=dev), torch.cumsum(counts, 0)])
            indices, values = indices[keep], values[keep]
        if n < 2**31:
            indices = indices.to(torch.int32)
        return cls(indptr.contiguous(), indices.contiguous(), values.contiguous(), r0, r1, c0, c1)

    @property
    def nnz(self) -> int:
        return self.indices.numel()

    def storage_key(self) -> tuple:
        """Equal for blocks that are the same stored matrix block: the same arrays over
        the same row and column ranges (coinciding rotation planes share one block, in
        memory and as loaded back from a shard file)."""
        return self.indices.data_ptr(), self.row_start, self.row_end, self.col_start, self.col_end

    def host_pointers(self) -> torch.Tensor | None:
        """The row pointers in host memory: the array itself on the CPU, the copy kept
        by :meth:`to` on a device (None for a block made on a device)."""
        return self.indptr if self.indptr.device.type == "cpu" else self.host_indptr

    def to(self, device) -> "CSRBlock":
        """The same block with its arrays on ``device`` (and its row pointers kept on the host)."""
        host = self.host_pointers() if torch.device(device).type != "cpu" else None
        return CSRBlock(self.indptr.to(device), self.indices.to(device), self.values.to(device), self.row_start,
                        self.row_end, self.col_start, self.col_end, host)


@dataclass
class SampledBlock:
    """The local block of the rescaled sampled adjacency A~_S (Alg. 2 output).

    ``adj`` is (Br, Bc) CSR in compact local ids; ``adj_t`` is its transpose (Bc, Br),
    built in the same pass for the backward SpMM (Eq. 17). ``row_offset`` and
    ``col_offset`` locate the block inside the (B, B) sampled matrix. A padded block
    stores exactly ``capacity`` entries, the kept ones then zeros (see
    :func:`extract_block`).
    """

    adj: torch.Tensor
    adj_t: torch.Tensor
    row_offset: int
    col_offset: int
    capacity: int | None = None  # padded (extract_block's capacity): the entries stored
    kept: torch.Tensor | None = None  # padded: 0-d count on the device of the entries Algorithm 2 kept

    def overflowed(self) -> torch.Tensor | None:
        """A padded block's 0-d device flag: more entries were kept than its capacity
        holds (the block lost some; the sampler extracts it again with more room)."""
        return None if self.kept is None else self.kept > self.capacity

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.adj.shape)


class CompactIndexMap:
    """Persistent global-id -> compact-id map over a column range (Alg. 2 line 14).

    ``compact[v - offset]`` is the position of vertex v in the sampled columns S_c,
    or -1. :meth:`assign` first resets the entries the previous step wrote, then
    writes the new ones, so no range-sized array is ever cleared: O(B) work per step,
    the purpose of the paper's step tag, with one int32 lookup per gathered entry
    instead of two. The range is the block's column range, so three maps cost a rank
    4 bytes per vertex of its three column ranges (not of N).
    """

    def __init__(self, num_nodes: int, offset: int = 0, device=None):
        self.offset, self.size = int(offset), int(num_nodes)
        self.compact = torch.full((self.size,), -1, dtype=torch.int32, device=device)
        self._written: torch.Tensor | None = None
        self._tag = -1

    def covers(self, lo: int, hi: int) -> bool:
        return self.offset <= lo and hi <= self.offset + self.size

    def assign(self, ids: torch.Tensor) -> int:
        """Map ``ids[k] -> k`` (global ids inside the range); returns the step's tag."""
        if self._written is not None:
            self.compact.index_fill_(0, self._written, -1)
        local = ids - self.offset if self.offset else ids
        self.compact[local] = torch.arange(ids.numel(), dtype=torch.int32, device=self.compact.device)
        self._written = local
        self._tag += 1
        return self._tag

    def lookup_raw(self, ids: torch.Tensor, tag: int) -> torch.Tensor:
        """int32 compact ids of global ``ids`` under ``tag``; -1 where not sampled."""
        if tag != self._tag:
            raise ValueError(f"stale tag {tag}: the map now holds tag {self._tag}")
        return self.compact.index_select(0, ids - self.offset if self.offset else ids)

    def lookup(self, ids: torch.Tensor, tag: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(member mask, compact ids) for global ``ids`` under ``tag``."""
        raw = self.lookup_raw(ids, tag)
        return raw >= 0, raw.long()


def training_features(x: torch.Tensor) -> torch.Tensor:
    """``x`` as CSR when it is sparse enough to profit (the one feature layout rule,
    :data:`scalegnn.csr.SPARSE_FEATURE_DENSITY`), else unchanged: a dense ``x`` stays
    dense, a CSR ``x`` (sparse features kept sparse from the file on) stays CSR."""
    return sparse_if_enough(x)


# Sampler kernel: "auto" takes the compiled CPU kernel (numba, optional) for CPU
# blocks with at least this many stored entries and the vectorized torch path
# otherwise (any device; small blocks, where JIT start-up would dominate). Both give
# bit-identical results (tests/unit/test_sampling_kernel.py checks it).
NUMBA_MIN_NNZ = 1 << 15
NUMBA_MIN_SAMPLE = 1 << 12  # the sample draw (same result either way) from this B on


def _kernel_module():
    """The compiled sampler kernel (:mod:`scalegnn._sampling_kernel`), or None when numba is not installed."""
    from . import _sampling_kernel

    return _sampling_kernel if _sampling_kernel.available() else None


def _pick_backend(backend: str, block: "CSRBlock") -> str:
    if backend not in SAMPLER_BACKENDS:
        raise ValueError(f"sampler backend must be one of {SAMPLER_BACKENDS}, got {backend!r}")
    if backend == "torch" or block.indices.device.type != "cpu" or (backend == "auto" and block.nnz < NUMBA_MIN_NNZ):
        return "torch"  # (small blocks: not even the numba import is paid)
    from . import _sampling_kernel

    if backend == "numba":
        if not _sampling_kernel.available():
            raise ValueError("sampler backend 'numba' needs numba: pip install numba (or use backend 'torch')")
        return "numba"
    return "numba" if _sampling_kernel.available() else "torch"


def block_bounds(block: CSRBlock, sample: torch.Tensor, col_sample: torch.Tensor | None = None
                 ) -> tuple[int, int, int, int]:
    """Phase 1 of Algorithm 2: (r_lo, r_hi, c_lo, c_hi), where the block's row range
    starts and ends in the sorted ``sample`` and its column range in ``col_sample``
    (default ``sample``). Binary searches; call it on a host copy of the sample to
    keep a GPU free of the read-back."""
    col_sample = sample if col_sample is None else col_sample
    if sample.device.type == "cpu" and col_sample.device.type == "cpu":  # host memory: numpy's search
        r_lo, r_hi = np.searchsorted(sample.numpy(), [block.row_start, block.row_end])
        c_lo, c_hi = np.searchsorted(col_sample.numpy(), [block.col_start, block.col_end])
        return int(r_lo), int(r_hi), int(c_lo), int(c_hi)
    rows = torch.tensor([block.row_start, block.row_end], device=sample.device)
    cols = torch.tensor([block.col_start, block.col_end], device=col_sample.device)
    r_lo, r_hi = torch.searchsorted(sample, rows).tolist()
    c_lo, c_hi = torch.searchsorted(col_sample, cols).tolist()
    return r_lo, r_hi, c_lo, c_hi


def sample_capacity(entries: int, rows: int, scale: float, slack: float = 1.0) -> int:
    """Room for the entries Algorithm 2 keeps of a block whose ``rows`` sampled rows
    hold ``entries`` stored entries: the padded size of :func:`extract_block`.

    Given its row is sampled, an entry off the diagonal is kept when its column is
    sampled too, with probability p = ``scale`` (Eq. 23); a self loop always. So at most
    p * entries + (1 - p) * rows are kept in expectation; the room is that plus 1 %
    plus 8 binomial standard deviations, times ``slack`` (which the sampler grows when
    a block overflows: hub columns make the count vary more than a binomial's), never
    more than ``entries``, which cannot overflow."""
    expected = scale * entries + (1.0 - scale) * min(rows, entries)
    room = expected + slack * (0.01 * expected + 8.0 * math.sqrt(expected) + 16.0)
    return min(int(entries), int(math.ceil(room)))


def extract_block(
    block: CSRBlock,
    sample: torch.Tensor,
    scale: float,
    index_map: CompactIndexMap | None = None,
    backend: str = "auto",
    *,
    col_sample: torch.Tensor | None = None,
    keys: tuple[torch.Tensor, torch.Tensor] | None = None,
    bounds: tuple[int, int, int, int] | None = None,
    entries: int | None = None,
    capacity: int | None = None,
) -> SampledBlock:
    """Algorithm 2, phases 1-4, for one adjacency block. Calls no collective.

    Args:
        block: the local CSR block (rows local, columns global).
        sample: the sorted global sample S (B,).
        scale: p of Eq. 23; off-diagonal weights are divided by it (Eq. 24).
        index_map: a persistent compact map covering the block's column range for
            the torch kernel's remap; without one a binary search over S_c does the
            membership test and remap. The numba kernel needs neither (it builds a
            bitmap of S_c with rank counts per 64-bit word, which stays in cache).
        backend: "auto", "torch" or "numba" (see :data:`NUMBA_MIN_NNZ`).
        col_sample: the sample in the block's COLUMN id space when rows and columns
            are labeled differently (double permutation, :mod:`scalegnn.permutation`);
            default ``sample``.
        keys: (row_key, col_key), the vertex of every entry of ``sample`` and of
            ``col_sample`` in one common labeling, to find the self loops (the
            entries Eq. 24 leaves unscaled) when the two id spaces differ; default:
            the samples themselves.
        bounds: (r_lo, r_hi, c_lo, c_hi), the positions in ``sample`` / ``col_sample``
            where the block's row and column ranges start and end (phase 1), when the
            caller already has them: a sampler with the sample in host memory finds
            them there, so a GPU block needs no device-to-host read for them.
        entries: the stored entries of the sampled rows (the size of phase 2's gather),
            when the caller counted them on the host (:func:`scalegnn.csr.row_entries`).
        capacity: pad the block (torch kernel only) to exactly this many entries
            (:func:`sample_capacity`): the kept entries, then zeros in the last row and
            column (a product adds 0 * x to the last row, which changes no bit of a
            finite result). With ``entries`` too, nothing is read back from the device;
            the block's ``kept`` count says whether it fitted (:meth:`SampledBlock.overflowed`).

    Returns the block of A~_S as CSR and its transpose; entries are in CSR order
    (rows, then columns ascending) in both, whichever kernel ran. Unpadded, the torch
    path reads back from the device the sizes it was not given (the gathered entries
    without ``entries``, the kept ones without ``capacity``): the outputs' sizes depend
    on the data. The numba kernel (CPU) computes the exact sizes as it goes and pads
    nothing.
    """
    # Phase 1: the parts of S inside this block's row and column ranges (binary search).
    if col_sample is None:
        col_sample = sample
    if bounds is None:
        bounds = block_bounds(block, sample, col_sample)
    r_lo, r_hi, c_lo, c_hi = bounds
    s_rows, s_cols = sample[r_lo:r_hi], col_sample[c_lo:c_hi]
    n_rows, n_cols = s_rows.numel(), s_cols.numel()
    rows_local = s_rows - block.row_start if block.row_start else s_rows
    # Self loops: same position in S when rows and columns share the labeling, else same key.
    rkey, ckey = (keys[0][r_lo:r_hi], keys[1][c_lo:c_hi]) if keys is not None else (None, None)

    if _pick_backend(backend, block) == "numba":
        from . import _sampling_kernel

        try:
            fwd_ptr, cols_c, vals, t_ptr, t_rows, t_vals = _sampling_kernel.extract(
                block.indptr, block.indices, block.values, rows_local, s_cols, block.col_start, block.col_end,
                r_lo - c_lo, scale, rkey, ckey)
        except _sampling_kernel.Unavailable:
            if backend == "numba":
                raise
        else:
            adj = _csr(fwd_ptr, cols_c, vals, (n_rows, n_cols))
            adj_t = _csr(t_ptr, t_rows, t_vals, (n_cols, n_rows))
            return SampledBlock(adj=adj, adj_t=adj_t, row_offset=r_lo, col_offset=c_lo)

    # Phase 2: positions of the sampled rows' entries, then their columns (lines 7-10).
    counts, incl, total, flat = _row_runs(block.indptr, rows_local, block.nnz, entries)
    cols_g = block.indices.index_select(0, flat)

    # Phase 3: keep columns in S_c and remap them to compact ids (lines 12-14).
    if index_map is not None:
        if not index_map.covers(block.col_start, block.col_end):
            raise ValueError(f"index map covers [{index_map.offset}, {index_map.offset + index_map.size}), "
                             f"not the block's columns [{block.col_start}, {block.col_end})")
        compact = index_map.lookup_raw(cols_g, index_map.assign(s_cols))
        hit = compact >= 0
    else:
        cols_g = cols_g.long()
        compact = torch.searchsorted(s_cols, cols_g).clamp_(max=max(n_cols - 1, 0))
        hit = s_cols[compact] == cols_g if n_cols else torch.zeros_like(cols_g, dtype=torch.bool)
    kept_count = None
    if capacity is None:
        kept = hit.nonzero().squeeze(1)
        cols_c = compact.index_select(0, kept).long()
    else:
        # Padded: the kept positions then `total` (past every position) up to capacity. The
        # sentinels appended below make a padding entry an explicit zero at (last row, last
        # column): CSR order holds, and every size is a host number.
        capacity = capacity if n_rows and n_cols else 0
        kept = torch.nonzero_static(hit, size=capacity, fill_value=total).squeeze(1)
        kept_count = hit.sum()
        cols_c = torch.cat([compact, compact.new_full((1,), n_cols - 1)]).index_select(0, kept).long()
    # Kept positions are increasing, so each row's kept entries are a contiguous run:
    # the row of an entry and the forward row pointer are sorted searches over B rows.
    rows_c = torch.searchsorted(incl, kept, right=True)
    fwd_ptr = torch.searchsorted(kept, torch.cat([incl.new_zeros(1), incl]))
    if capacity is None:
        vals = block.values.index_select(0, flat.index_select(0, kept))
    else:
        rows_c.clamp_(max=n_rows - 1)
        fwd_ptr[-1:].fill_(capacity)  # the last row runs to the end of the padding
        src = torch.cat([flat, flat.new_zeros(1)]).index_select(0, kept)
        vals = block.values.index_select(0, src) if block.nnz else block.values.new_zeros(capacity)
        vals = vals.masked_fill(kept == total, 0.0)

    # Phase 4: rescale off-diagonal weights by 1/p (Eq. 24) and assemble both CSRs.
    # Diagonal <=> same global vertex <=> same position in S: cols_c + c_lo == rows_c + r_lo.
    if scale != 1.0:
        off_diag = (cols_c - rows_c != r_lo - c_lo) if rkey is None else \
            (rkey.index_select(0, rows_c) != ckey.index_select(0, cols_c))
        # Divide by a 0-dim tensor, not a Python float: CUDA turns division by a host scalar
        # into a multiplication by its reciprocal, 1 ulp off the CPU kernels on a third of
        # the values; tensor division is exact division on every device.
        vals = torch.where(off_diag, vals / vals.new_full((), scale), vals)
    t_ptr, t_rows, t_vals = _transpose_csr(rows_c, cols_c, vals, n_cols)
    adj = _csr(fwd_ptr, cols_c, vals, (n_rows, n_cols))
    adj_t = _csr(t_ptr, t_rows, t_vals, (n_cols, n_rows))
    return SampledBlock(adj=adj, adj_t=adj_t, row_offset=r_lo, col_offset=c_lo,
                        capacity=capacity, kept=kept_count)


@dataclass
class SampledBatch:
    """One serial mini-batch (Algorithm 1, lines 1-4).

    nodes (B,) sorted global ids; adj / adj_t (B, B) CSR of A~_S and its transpose;
    x (B, F), dense or CSR (see :func:`training_features`); y (B,) or (B, C); train_mask (B,) marks sampled vertices whose loss
    counts (training vertices that carry a label); step and scale p are kept for
    the record and for tests.
    """

    step: int
    nodes: torch.Tensor
    adj: torch.Tensor
    adj_t: torch.Tensor
    x: torch.Tensor
    y: torch.Tensor
    train_mask: torch.Tensor
    scale: float

    @property
    def batch_size(self) -> int:
        return self.nodes.numel()


def train_mask_of(graph: Graph) -> torch.Tensor:
    """The labeled training vertices as a bool mask, on the graph's device."""
    mask = torch.zeros(graph.num_nodes, dtype=torch.bool, device=graph.y.device)
    mask[graph.train_idx] = True
    if not graph.multilabel:
        mask &= graph.y >= 0
    return mask


class UniformVertexSampler:
    """Serial uniform vertex sampler over a GCN-normalized graph.

    ``sample(step)`` is deterministic in (seed, dp_index, step), so a resumed or a
    distributed run sees exactly the batches of an uninterrupted serial one. Its maps
    and masks live on the graph's device (a graph on a GPU is sampled on the GPU; the
    sample itself is drawn by the CPU generator, then moved, the same S everywhere).
    """

    def __init__(self, graph: Graph, batch_size: int, seed: int = 0, dp_index: int = 0, backend: str = "auto"):
        if graph.meta.get("normalized") != "gcn":
            raise ValueError("UniformVertexSampler needs the GCN-normalized graph: call graph.gcn_normalize() first")
        self.graph = graph
        self.batch_size = resolve_batch_size(graph.num_nodes, batch_size=batch_size)
        self.seed, self.dp_index = seed, dp_index
        self.scale = inclusion_probability(graph.num_nodes, self.batch_size)
        self.block = CSRBlock.from_graph(graph)
        self.index_map = CompactIndexMap(graph.num_nodes, device=graph.indptr.device)
        self.backend = backend
        self.train_mask = train_mask_of(graph)
        self.features = training_features(graph.x)

    def __len__(self) -> int:
        return steps_per_epoch(self.graph.num_nodes, self.batch_size)

    def sample(self, step: int) -> SampledBatch:
        nodes = sample_vertices(self.graph.num_nodes, self.batch_size, self.seed, step, self.dp_index)
        nodes = nodes.to(self.graph.indptr.device)  # drawn on the CPU generator: the same S on every device
        blk = extract_block(self.block, nodes, self.scale, self.index_map, backend=self.backend)
        return SampledBatch(
            step=step,
            nodes=nodes,
            adj=blk.adj,
            adj_t=blk.adj_t,
            x=select_rows(self.features, nodes),
            y=self.graph.y[nodes],
            train_mask=self.train_mask[nodes],
            scale=self.scale,
        )
