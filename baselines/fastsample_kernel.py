"""FastSample's fused neighbor sampler (the paper's section 3.2, Algorithm 1), all layers in one pass.

Shape legend: N vertices, E stored edges, B seeds, L layers (hops), k_h the fanout of
hop h (hop 0 is the seeds' hop, PyG's order), n_l = |V^l| the vertices of level l
(n_L = B, n_0 the input vertices), e_l the sampled edges of the block of layer l.

Topology. ``indptr (N+1,)``, ``indices (E,)`` int64: the CSC of the graph, the
column of target v listing its sources (in-neighbors) ``indices[indptr[v]:indptr[v+1]]``;
the whole topology is on every rank (hybrid partitioning), so sampling needs no
communication.

What one call computes (paper Eqs. 4-5 and Algorithm 1, for every level at once). Level
L is the seeds; for hop h = 0 .. L-1 (level l = L - h), every vertex of V^l, in
order, keeps ``min(k_h, deg)`` of its in-neighbors, a uniform random subset without
replacement (all of them when ``k_h < 0`` or ``deg <= k_h``), written straight into the
block's CSC ``(R_l, C_l)``: ``R_l`` is the running count (Algorithm 1's first loop) and
``C_l`` the sampled source's *local* id, assigned by the map ``M`` (Algorithm 1's second
loop): a vertex seen for the first time gets the next id and joins V^{l-1}. ``M`` starts
with V^l itself (as DGL's ``to_block`` puts the destination vertices first), so
V^l is a prefix of V^{l-1} and one id map serves all levels: the blocks' local ids all
index ``n_id``, whose first ``n_l`` entries are V^l. Every level samples its own
neighbors (a vertex of V^l and V^{l-1} is sampled again at the lower level, with an
independent draw), as DGL's message flow graphs do.

The draw. The subset is Floyd's algorithm (k draws for a k-subset of deg positions,
each k-subset equally likely): for j = 0 .. k-1, with m = deg - k + j, draw t uniform
in [0, m]; keep position t unless it is already kept, then keep m. The j-th draw of
vertex v at hop h is a counter-based hash, ``u = mix32(mix32(hop_key ^ v) ^ j)``,
``t = (u * (m + 1)) >> 32`` (Lemire's multiply-shift; bias below (m+1) / 2^32), so the
sample is a pure function of (key, hop, vertex) whatever the order or the thread that
computes it. ``mix32`` is Wellons' "lowbias32" (both multipliers below 2^31, so every
product fits an int64 and the torch path computes the same bits). The kept positions
are listed in the order Floyd keeps them; vertices with ``deg <= k`` list all their
neighbors in adjacency order.

Two implementations, the same result bit for bit (a test holds them equal): a numba
kernel (one compiled call for all L levels: per level Algorithm 1's two loops, the
draws written straight into each vertex's CSC slots, then the relabel; the first loop
optionally over threads, as the paper parallelizes it; ``nogil`` so a prefetch thread
may run it) and a plain torch path (vectorized over the vertices of a
level: Floyd's k steps as k vector steps; the relabel as unique + first occurrence),
built from the pieces it shares with the pure-torch PyG samplers of
:mod:`scalegnn.baselines.torch_sampling` (the CSC topology, one hop's vectorized Floyd
draws given a draw function, the relabel): only the draw, the hash above, is its own.
Without numba the torch path runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["SampledBlocks", "Block", "TopologyCSC", "Scratch", "sample_blocks", "step_key", "hop_keys", "mix32",
           "available"]

M32 = 0xFFFFFFFF
_C1, _C2 = 0x21F0AAAD, 0x735A2D97  # lowbias32 multipliers (< 2^31: products of 32-bit values fit an int64)

from scalegnn._numba import available, numba  # numba, optional: None without it (the torch path runs)

from .torch_sampling import TopologyCSC, hop_entries, relabel  # the topology, one hop's Floyd, the relabel

_HAVE_NUMBA = available()


def mix32(x):
    """lowbias32 on 32-bit values held in int64 (Python ints, numpy or torch int64)."""
    x = x ^ (x >> 16)
    x = (x * _C1) & M32
    x = x ^ (x >> 15)
    x = (x * _C2) & M32
    return x ^ (x >> 15)


def step_key(*words: int) -> int:
    """A 32-bit sampling key from integers (seed, epoch, step, rank ...)."""
    return int(np.random.SeedSequence([int(w) & (2**63 - 1) for w in words]).generate_state(1, np.uint32)[0])


def hop_keys(key: int, hops: int) -> list[int]:
    """One 32-bit key per hop, derived from the step's ``key``."""
    return [mix32(key ^ mix32((h + 1) * 0x1F123BB5 & M32)) for h in range(hops)]


# --------------------------------------------------------------------------- data
@dataclass
class Block:
    """The bipartite graph G_l = (V^{l-1}, V^l; E^{l-1}) of one layer, in CSC: the sources
    of destination i (local id i < n_l) are ``indices[indptr[i]:indptr[i+1]]``, local ids
    < n_{l-1} into the batch's ``n_id``."""

    indptr: torch.Tensor  # (n_l + 1,) int64
    indices: torch.Tensor  # (e_l,) int64
    num_src: int  # n_{l-1}
    num_dst: int  # n_l

    @property
    def edge_index(self) -> torch.Tensor:
        """(2, e_l) ``[source; target]`` local ids, PyG's convention."""
        dst = torch.repeat_interleave(torch.arange(self.num_dst, device=self.indptr.device),
                                      self.indptr[1:] - self.indptr[:-1])
        return torch.stack([self.indices, dst])


@dataclass
class SampledBlocks:
    """One mini-batch: ``n_id (n_0,)`` global ids of V^0 with every V^l a prefix (the
    seeds first); ``blocks[i]`` the block of model layer i + 1 (input layer first, so
    ``blocks[-1]`` has the seeds as destinations)."""

    n_id: torch.Tensor
    blocks: list[Block]

    @property
    def num_seeds(self) -> int:
        return self.blocks[-1].num_dst if self.blocks else self.n_id.numel()

    def level_sizes(self) -> list[int]:
        """[n_0, n_1, ..., n_L]."""
        return [self.blocks[0].num_src] + [b.num_dst for b in self.blocks] if self.blocks else [self.n_id.numel()]


# --------------------------------------------------------------------------- numba kernel
def _levels(indptr, indices, seeds, fanouts, keys, slot):  # pragma: no cover - compiled by numba below
    # All levels in one call; per level Algorithm 1's two loops. ``slot`` (N,) is the map
    # M: -1 everywhere on entry and on exit (only the batch's vertices are touched, and
    # reset at the end). Returns n_id, the per-hop CSC pointers and local indices (flat,
    # with offsets) and the destination count of every hop. Compiled twice: serial, and
    # with loop 1 over threads (``prange``; each vertex writes its own slice, and the
    # draws depend on (key, hop, vertex, j) only, so the result is the same).
    hops = fanouts.size
    n = seeds.size
    n_id = np.empty(max(16, min(slot.size, 4 * n)), np.int64)
    for i in range(n):
        n_id[i] = seeds[i]
        slot[seeds[i]] = i
    ptr_parts = []
    idx_parts = []
    dst_counts = np.zeros(hops, np.int64)
    for h in range(hops):
        k = fanouts[h]
        n_dst = n
        dst_counts[h] = n_dst
        ptr = np.empty(n_dst + 1, np.int64)  # R_l: the kept counts are known before drawing
        ptr[0] = 0
        for i in range(n_dst):
            d = indptr[n_id[i] + 1] - indptr[n_id[i]]
            ptr[i + 1] = ptr[i] + (d if (k < 0 or d <= k) else k)
        sampled = np.empty(ptr[n_dst], np.int64)  # S_l, global ids, in CSC order
        hk = keys[h]
        for i in numba.prange(n_dst):  # loop 1: choose at most k neighbors of every v in V^l
            v = n_id[i]
            base = indptr[v]
            d = indptr[v + 1] - base
            out = ptr[i]
            if k < 0 or d <= k:
                for j in range(d):
                    sampled[out + j] = indices[base + j]
            else:
                a = _mix(hk ^ (v & 0xFFFFFFFF))
                for j in range(k):  # Floyd: a position in [0, m], m = d - k + j, else m
                    m = d - k + j
                    t = (_mix(a ^ j) * (m + 1)) >> 32
                    for q in range(j):
                        if sampled[out + q] == t:
                            t = m
                            break
                    sampled[out + j] = t
                for j in range(k):
                    sampled[out + j] = indices[base + sampled[out + j]]
        idx = np.empty(sampled.size, np.int64)  # C_l
        for e in range(sampled.size):  # loop 2: relabel through M; new vertices join V^{l-1}
            u = sampled[e]
            s = slot[u]
            if s == -1:
                if n == n_id.size:
                    grown = np.empty(min(2 * n_id.size, slot.size), np.int64)
                    grown[:n] = n_id[:n]
                    n_id = grown
                s = n
                slot[u] = s
                n_id[n] = u
                n += 1
            idx[e] = s
        ptr_parts.append(ptr)
        idx_parts.append(idx)
    for i in range(n):
        slot[n_id[i]] = -1
    ptr_off = np.zeros(hops + 1, np.int64)
    idx_off = np.zeros(hops + 1, np.int64)
    for h in range(hops):
        ptr_off[h + 1] = ptr_off[h] + ptr_parts[h].size
        idx_off[h + 1] = idx_off[h] + idx_parts[h].size
    ptr_all = np.empty(ptr_off[hops], np.int64)
    idx_all = np.empty(idx_off[hops], np.int64)
    for h in range(hops):
        ptr_all[ptr_off[h]:ptr_off[h + 1]] = ptr_parts[h]
        idx_all[idx_off[h]:idx_off[h + 1]] = idx_parts[h]
    return n_id[:n].copy(), ptr_all, ptr_off, idx_all, idx_off, dst_counts


if _HAVE_NUMBA:

    @numba.njit(nogil=True, cache=True, inline="always")
    def _mix(x):
        x = x ^ (x >> 16)
        x = (x * 0x21F0AAAD) & 0xFFFFFFFF
        x = x ^ (x >> 15)
        x = (x * 0x735A2D97) & 0xFFFFFFFF
        return x ^ (x >> 15)

    _fused_kernel = numba.njit(nogil=True, cache=True)(_levels)
    _fused_kernel_parallel = numba.njit(nogil=True, cache=True, parallel=True)(_levels)


# --------------------------------------------------------------------------- torch path
def _hash_draw(hk: int):
    """Floyd's draws of one hop from the counter-based hash (the module docstring)."""
    def draw(j: int, m: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return (mix32(mix32(hk ^ (v & M32)) ^ j) * (m + 1)) >> 32
    return draw


def _torch_sample(topo: TopologyCSC, seeds: torch.Tensor, fanouts, keys) -> SampledBlocks:
    n_id = seeds.clone()
    hops = []
    for h, k in enumerate(fanouts):
        n_dst = n_id.numel()
        ptr, entries = hop_entries(topo, n_id, int(k), _hash_draw(keys[h]))
        local, n_id = relabel(n_id, topo.indices[entries])
        hops.append((ptr, local, n_dst))
    return _assemble(n_id, hops)


def _assemble(n_id, hops) -> SampledBlocks:
    """Blocks in model order (the input layer's first) from the hops (the seeds' first)."""
    blocks = []
    for h, (ptr, local, n_dst) in enumerate(hops):
        n_src = hops[h + 1][2] if h + 1 < len(hops) else n_id.numel()
        blocks.append(Block(ptr, local, n_src, n_dst))
    return SampledBlocks(n_id=n_id, blocks=blocks[::-1])


class Scratch:
    """The map M of the numba kernel, kept between calls (all -1 outside a call)."""

    def __init__(self):
        self.slot = np.zeros(0, np.int64)

    def get(self, n: int) -> np.ndarray:
        if self.slot.size != n:
            self.slot = np.full(n, -1, np.int64)
        return self.slot


_SCRATCH = Scratch()


def sample_blocks(topo: TopologyCSC, seeds: torch.Tensor, fanouts, key: int, backend: str = "auto",
                  scratch: Scratch | None = None, threads: int = 1) -> SampledBlocks:
    """The L blocks of ``seeds`` (unique global ids) for ``fanouts`` (hop 0 = the seeds' hop;
    -1 = all neighbors) under the 32-bit ``key``; see the module docstring.

    ``backend``: "numba", "torch" or "auto" (numba when installed). Both give the same
    result. ``scratch``: the numba kernel's map (one per thread that samples concurrently).
    ``threads`` > 1: the numba kernel's first loop (the draws) on that many threads
    (numba's own pool; the same result).
    """
    if backend not in ("auto", "numba", "torch"):
        raise ValueError(f"backend must be auto, numba or torch, got {backend!r}")
    if topo.num_nodes >= 2**32:
        raise ValueError(f"the fused sampler hashes 32-bit vertex ids; this graph has {topo.num_nodes} vertices")
    seeds = seeds.to(torch.int64).contiguous()
    if seeds.numel() and (int(seeds.min()) < 0 or int(seeds.max()) >= topo.num_nodes):
        raise ValueError(f"seeds must be vertex ids in [0, {topo.num_nodes}), got {int(seeds.min())}.."
                         f"{int(seeds.max())}")
    if seeds.unique().numel() != seeds.numel():
        raise ValueError("seeds must be unique (the seeds are the top level's vertex set); pass seeds.unique()")
    keys = hop_keys(int(key) & M32, len(fanouts))
    if backend == "torch" or (backend == "auto" and not _HAVE_NUMBA):
        return _torch_sample(topo, seeds, fanouts, keys)
    if not _HAVE_NUMBA:
        raise ValueError("backend 'numba' needs numba installed (pip install numba), or use backend='torch'")
    slot = (scratch or _SCRATCH).get(topo.num_nodes)
    args = (topo.indptr.numpy(), topo.indices.numpy(), seeds.numpy(), np.asarray(list(fanouts), np.int64),
            np.asarray(keys, np.int64), slot)
    if threads > 1:
        numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
        out = _fused_kernel_parallel(*args)
    else:
        out = _fused_kernel(*args)
    n_id, ptr_all, ptr_off, idx_all, idx_off, dst_counts = out
    n_id, ptr_all, idx_all = (torch.from_numpy(a) for a in (n_id, ptr_all, idx_all))
    hops = [(ptr_all[ptr_off[h]:ptr_off[h + 1]], idx_all[idx_off[h]:idx_off[h + 1]], int(dst_counts[h]))
            for h in range(len(fanouts))]
    return _assemble(n_id, hops)
