"""CSR matrices as torch tensors: row gathers, row selection, blocks, transposes, the
one constructor of sparse node-feature matrices, and the one rule for when node
features are held as CSR.

Shape legend:
    R  rows of a matrix     K  its columns     nnz  its stored entries

torch's ``sparse_csr`` layout has no ``index_select`` and no slicing, and the sampler,
the graph container and the shards all need rows (and blocks) of a CSR matrix; they
take them here. :func:`csr_matrix` is how a sparse feature matrix enters the house
(files, the dataset cache, ``Graph(x=...)``): validated with one-line errors, then
canonical (columns sorted within each row, duplicates summed, explicit zeros dropped),
so two stores of the same matrix give bit-identical products downstream.
"""

from __future__ import annotations

import torch

__all__ = ["SPARSE_FEATURE_DENSITY", "unique_keys", "runs", "sparse_enough", "sparse_if_enough", "feature_layout",
           "is_csr", "csr_matrix",
           "csr_block", "select_rows", "row_entries", "gather_csr_rows", "csr_transpose"]


# The one layout rule for node features. A feature matrix with fewer than
# SPARSE_FEATURE_DENSITY * R * K nonzeros is held as CSR: the built-in loaders build it
# so (never the dense matrix), the dataset cache stores it so, and the trainers' input
# (sampling.training_features) takes a dense one so. Multi-hot bag-of-words features
# (Facebook 0.3 %, Twitch 0.6 %, Planetoid ~1 %) make the input projection 10-20x
# cheaper that way and their storage 20-100x smaller (12 bytes per nonzero, not 4 per entry).
SPARSE_FEATURE_DENSITY = 0.05


def sparse_enough(nnz: int, rows: int, cols: int) -> bool:
    """Whether an (rows, cols) matrix with ``nnz`` nonzeros is held as CSR (the rule above).
    An empty matrix is not: there is nothing to save."""
    return rows * cols > 0 and nnz < SPARSE_FEATURE_DENSITY * rows * cols


def sparse_if_enough(x: torch.Tensor) -> torch.Tensor:
    """A dense ``x`` that the rule holds as CSR, as CSR (``to_sparse_csr``: drops exact
    zeros, so the values are equal); any other ``x`` (a CSR one included) itself. Reads
    every entry of a dense ``x`` once (``count_nonzero``)."""
    if x.layout == torch.strided and x.dim() == 2 and sparse_enough(int(torch.count_nonzero(x)), *x.shape):
        return x.to_sparse_csr()
    return x


def feature_layout(x: torch.Tensor) -> torch.Tensor:
    """``x`` in the layout the rule gives it: a CSR ``x`` dense enough to fail the rule
    becomes dense, a dense one sparse enough becomes CSR (:func:`sparse_if_enough`);
    otherwise ``x`` itself."""
    if is_csr(x):
        return x if sparse_enough(x.values().numel(), *x.shape) else x.to_dense()
    return sparse_if_enough(x)


def is_csr(x) -> bool:
    """Whether ``x`` is a torch tensor in the ``sparse_csr`` layout."""
    return isinstance(x, torch.Tensor) and x.layout == torch.sparse_csr


def _csr(indptr, indices, values, shape) -> torch.Tensor:
    return torch.sparse_csr_tensor(indptr, indices, values, shape, check_invariants=False)


def _integers(t, name: str, what: str) -> torch.Tensor:
    t = torch.as_tensor(t)
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise ValueError(f"{what}: '{name}' must hold integers, got dtype {t.dtype}; save it as an int64 array")
    if t.dim() != 1:
        raise ValueError(f"{what}: '{name}' must be 1-D, got shape {tuple(t.shape)}")
    return t.to(torch.int64)


def csr_matrix(indptr, indices, data, shape, what: str = "features") -> torch.Tensor:
    """The canonical float32 CSR tensor of (indptr (R+1,), indices (nnz,), data (nnz,),
    shape (R, K)), the scipy ``csr_matrix`` convention.

    Raises ``ValueError`` naming ``what``, the bad array and the fix: a shape that is
    not two sizes, row pointers that do not run from 0 to nnz without decreasing, a
    column id outside [0, K), values that are not real or not finite. The result has
    int64 indices, columns sorted within each row, duplicate (row, column) entries
    summed (scipy's meaning) and explicit zeros dropped; input already in that form is
    returned without a copy of its arrays.
    """
    shape = tuple(int(s) for s in torch.as_tensor(shape).reshape(-1).tolist())
    if len(shape) != 2 or min(shape) < 0:
        raise ValueError(f"{what}: the shape must be two sizes (rows, columns), got {shape}")
    rows, cols = shape
    indptr = _integers(indptr, "indptr", what)
    indices = _integers(indices, "indices", what)
    data = torch.as_tensor(data)
    if data.dtype.is_complex or data.dim() != 1:
        raise ValueError(f"{what}: 'data' must be a 1-D array of real values, got dtype {data.dtype}, "
                         f"shape {tuple(data.shape)}")
    data = data.to(torch.float32)
    if indptr.numel() != rows + 1:
        raise ValueError(f"{what}: 'indptr' has {indptr.numel()} entries; a matrix of {rows} rows needs {rows + 1}")
    if indices.numel() != data.numel():
        raise ValueError(f"{what}: 'indices' has {indices.numel()} entries but 'data' has {data.numel()}; "
                         "they are one entry per stored value")
    if int(indptr[0]) != 0 or int(indptr[-1]) != indices.numel() or bool((indptr[1:] < indptr[:-1]).any()):
        raise ValueError(f"{what}: 'indptr' must rise from 0 to nnz={indices.numel()} without decreasing, got "
                         f"{int(indptr[0])} .. {int(indptr[-1])}; it is the row pointer array of a CSR matrix")
    if indices.numel() and (int(indices.min()) < 0 or int(indices.max()) >= cols):
        bad = int(indices.max()) if int(indices.max()) >= cols else int(indices.min())
        raise ValueError(f"{what}: column id {bad} is outside [0, {cols}) for a matrix of {cols} columns; "
                         "fix the column ids or the shape")
    if not bool(torch.isfinite(data).all()):
        row = int(torch.searchsorted(indptr, (~torch.isfinite(data)).nonzero()[0, 0], right=True)) - 1
        raise ValueError(f"{what}: values contain NaN or inf (first at row {row}); clean or impute them first")
    row_of = torch.repeat_interleave(torch.arange(rows), indptr[1:] - indptr[:-1], output_size=indices.numel())
    key = row_of * max(cols, 1) + indices
    if bool((key[1:] > key[:-1]).all()) and bool((data != 0).all()):
        return _csr(indptr, indices, data, shape)
    # Not canonical: sort by (row, column), sum duplicates, drop zeros.
    key, order = torch.sort(key, stable=True)
    uniq, inverse = torch.unique_consecutive(key, return_inverse=True)
    summed = torch.zeros(uniq.numel(), dtype=torch.float32).index_add_(0, inverse, data[order])
    keep = summed != 0
    uniq, summed = uniq[keep], summed[keep]
    new_rows = torch.div(uniq, max(cols, 1), rounding_mode="floor")
    new_ptr = torch.zeros(rows + 1, dtype=torch.int64)
    new_ptr[1:] = torch.cumsum(torch.bincount(new_rows, minlength=rows), 0)
    return _csr(new_ptr, uniq - new_rows * max(cols, 1), summed, shape)


def csr_block(x: torch.Tensor, rows: tuple[int, int], cols: tuple[int, int]) -> torch.Tensor:
    """``x[r0:r1, c0:c1]`` of a CSR matrix, as CSR with columns shifted by -c0 (torch
    does not slice CSR). The kept entries of each row stay in order, so the block of a
    canonical matrix is canonical."""
    (r0, r1), (c0, c1) = rows, cols
    crow = x.crow_indices()
    lo, hi = int(crow[r0]), int(crow[r1])
    ptr, col, val = crow[r0: r1 + 1] - lo, x.col_indices()[lo:hi], x.values()[lo:hi]
    if (c0, c1) != (0, x.shape[1]):
        keep = (col >= c0) & (col < c1)
        kept_before = torch.zeros(col.numel() + 1, dtype=torch.int64, device=col.device)
        torch.cumsum(keep, 0, out=kept_before[1:])
        ptr, col, val = kept_before[ptr], col[keep] - c0, val[keep]
    return _csr(ptr.clone(), col.clone(), val.clone(), (r1 - r0, c1 - c0))


def _transpose_csr(rows, cols, vals, n_cols):
    """CSR of the transpose from row-major (rows, cols, vals) triples: a stable sort by
    column (rows stay sorted inside each column) and the column starts found in the
    sorted columns by binary search (a bincount would read the column range back to
    the host on a GPU)."""
    sorted_cols, order = torch.sort(cols, stable=True)
    t_ptr = torch.searchsorted(sorted_cols, torch.arange(n_cols + 1, dtype=sorted_cols.dtype, device=cols.device))
    return t_ptr.to(torch.int64), rows.index_select(0, order), vals.index_select(0, order)


def _row_runs(indptr: torch.Tensor, rows: torch.Tensor, nnz: int, total: int | None = None):
    """Flat positions of the stored entries of ``rows`` (Alg. 2 lines 7-10).

    Returns (counts, incl, total, flat): entries per row, their inclusive prefix
    sum, the total, and ``flat`` (total,) indexing indices/values in CSR order. One
    prefix sum and one repeat_interleave (no O(total log B) sorted search):
    ``flat[k] = start[row(k)] + (k - excl[row(k)])``. ``nnz`` is the matrix's stored
    entry count (host metadata: it picks the index width without reading the device).
    The output size of a gather is data-dependent: without ``total`` (the caller's
    host-side count, :func:`row_entries`) it is read back from the device, the one
    device-to-host read of this routine.
    """
    starts = indptr.index_select(0, rows)
    counts = indptr.index_select(0, rows + 1) - starts
    incl = torch.cumsum(counts, 0)
    if total is None:
        total = int(incl[-1]) if rows.numel() else 0
    # int32 positions when the block allows: half the bytes in the widest arrays.
    dtype = torch.int32 if nnz < 2**31 else torch.int64
    flat = torch.repeat_interleave((starts - (incl - counts)).to(dtype), counts, output_size=total)
    flat += torch.arange(total, dtype=dtype, device=flat.device)
    return counts, incl, total, flat


def row_entries(host_indptr: torch.Tensor, host_rows: torch.Tensor) -> int:
    """How many stored entries the rows ``host_rows`` hold, from host copies of the row
    pointers and the rows (numpy: host memory, no device read): the size of their
    gather, known before it is queued."""
    ptr, rows = host_indptr.numpy(), host_rows.numpy()
    return int((ptr[rows + 1] - ptr[rows]).sum()) if rows.size else 0


def gather_csr_rows(indptr: torch.Tensor, rows: torch.Tensor, nnz: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions of the stored entries of ``rows`` in CSR order (Alg. 2 lines 7-10).

    Returns (owner, flat): ``flat[k]`` indexes indices/values (``nnz`` of them),
    ``owner[k]`` is the position in ``rows`` of the row it belongs to. No Python loop
    over rows.
    """
    counts, _, total, flat = _row_runs(indptr, rows, nnz)
    owner = torch.repeat_interleave(torch.arange(rows.numel(), device=rows.device), counts, output_size=total)
    return owner, flat


def select_rows(x: torch.Tensor, rows: torch.Tensor, entries: int | None = None) -> torch.Tensor:
    """``x[rows]`` for a dense or a CSR matrix (CSR has no index_select in torch).
    ``entries``: the selected rows' stored entries when the caller knows it
    (:func:`row_entries`), which spares a CSR ``x`` on a device the read of it."""
    if x.layout == torch.strided:
        return x[rows]
    indptr = x.crow_indices()
    _, _, total, flat = _row_runs(indptr, rows, x.values().numel(), entries)
    new_ptr = torch.zeros(rows.numel() + 1, dtype=torch.int64, device=indptr.device)
    new_ptr[1:] = torch.cumsum(indptr[rows + 1] - indptr[rows], 0)
    return torch.sparse_csr_tensor(new_ptr, x.col_indices()[flat], x.values()[flat], (rows.numel(), x.shape[1]),
                                   check_invariants=False)


def csr_transpose(x: torch.Tensor) -> torch.Tensor:
    """The CSR of ``x^T`` for a CSR matrix ``x``. The input projection's weight gradient
    is ``X^T dZ``: with ``X^T`` as CSR it is a CSR x dense product on every device (a
    transposed CSR is CSC, which CUDA converts back to CSR inside the product on every
    call, waiting for the host)."""
    crow, n_rows = x.crow_indices(), x.shape[0]
    rows = torch.repeat_interleave(torch.arange(n_rows, device=crow.device), crow[1:] - crow[:-1],
                                   output_size=x.values().numel())
    t_ptr, t_rows, t_vals = _transpose_csr(rows, x.col_indices(), x.values(), x.shape[1])
    return _csr(t_ptr, t_rows, t_vals, (x.shape[1], n_rows))


def unique_keys(keys):
    """``np.unique(keys)`` of a 1-D numpy integer array (edge keys ``row * n + col``), by one
    sort and a mask of the first of each run: numpy 2.4's ``np.unique`` took 3.6 s on 4.2 M
    int64 keys where this takes 0.1 s (it dominated generating and staging big graphs)."""
    import numpy as np

    s = np.sort(keys)
    return s[_run_starts(s)]


def _run_starts(s):
    import numpy as np

    first = np.ones(s.size, dtype=bool)
    np.not_equal(s[1:], s[:-1], out=first[1:])
    return first


def runs(sorted_keys):
    """(distinct values, index of each one's first occurrence, its count) of an already
    sorted 1-D numpy array: ``np.unique(a, return_index=True, return_counts=True)``
    without its sort (and its numpy 2.4 slowness, :func:`unique_keys`)."""
    import numpy as np

    starts = np.flatnonzero(_run_starts(sorted_keys))
    return sorted_keys[starts], starts, np.diff(np.append(starts, sorted_keys.size))
