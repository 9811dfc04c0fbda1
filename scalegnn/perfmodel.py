"""Performance model of one training epoch (Plexus Section 4, adapted to 4D mini-batch ScaleGNN).

Legend: N vertices, nnz stored entries of the normalized adjacency (self loops
included), F input features, H hidden dim, C classes, L layers, B sampled vertices
per step, G_a the size of grid axis a in ``Gd x Gx x Gy x Gz``.

**Communication (Plexus Eq. 4.5).** Every collective of one training step is
listed from the layout table (:mod:`scalegnn.parallel.layout`): for layer l with
input on (r, c) and third axis t,

    forward    AR_r  (B/G_t)(H/G_c)      SpMM partial sums           (Eq. 27)
               AR_c  (B/G_t)(H/G_r)      GEMM partial sums           (Eq. 28)
               AR_r  (B/G_t)             RMSNorm sum of squares, FP32 (Eq. 29)
               AG_r, AG_c                residual reshard (r, c) -> (t, r)
    backward   AR_r  (B/G_t)(H/G_c)      dH                           (Eq. 16)
               AR_t  (H/G_c)(H/G_r)      dW                           (Eq. 15)
               AR_t  (B/G_r)(H/G_c)      dX through A^T               (Eq. 17)
               AR_r  (B/G_t), AR_t (H/G_r)   RMSNorm backward; AG_r, AG_t reshard back

plus the input projection (AR_z forward, AR_x for dW_in), the head, the loss and
accuracy reductions and the data-parallel all-reduce of every gradient shard. A
ring all-reduce of M bytes over n ranks costs ``2 (n-1)/n * M / beta + 2 (n-1) alpha``,
an all-gather of pieces of p bytes ``(n-1) p / beta + (n-1) alpha`` (Thakur et al.;
Plexus keeps only the bandwidth term, we keep alpha for small messages).

**Placement (Plexus Eq. 4.6).** Ranks are numbered z fastest, then y, x, dp, and
filled into nodes of ``gpus_per_node``. A group whose ranks share a node uses the
intra-node bandwidth; otherwise the node's injection bandwidth is shared by the k
groups of that axis that leave the node at the same time: ``beta = beta_inter / k``
(Plexus' ``min(G_node, Gx*Gy)`` for its slowest axis, generalized to any axis).

**Computation (Plexus Eq. 4.4).** SpMM cost per rank and step, summed over layers,
forward (A, common dim B/G_r) and backward (A^T, common dim B/G_t)::

    flops = 2 nnz_S / (G_t G_r) * H / G_c,     nnz_S = B + (nnz - N) B (B-1) / (N (N-1))
    cost  = flops * (1 + kappa * common_dim / (H / G_c))      (tall-skinny penalty)

with kappa = 1e-6, the ratio of Plexus' fitted penalty and FLOP coefficients
(7.8e-10 / 7.8e-4). Plexus fitted a negative backward coefficient, which we do not
carry over: a worse shape cannot make an SpMM faster. GEMM FLOPs are counted
exactly per rank. Sampling (Algorithm 2) touches ``(B/G_t) nnz/N`` entries per
adjacency plane, each with a binary search over the sample.

**Accelerators** (a profile with ``hbm_GBps``; docs/performance.md, "At the paper's scale").
SpMM, element-wise work and Algorithm 2's sampling are priced in bytes over device memory
bandwidth, each GEMM by the roofline of its FLOPs and bytes; an all-reduce costs the cheaper
of ring and double binary tree (``tree``); a fully connected node (``intra_links="full"``)
gives a ring of n devices n-1 pair links. ``Workload.prefetch``/``comm_overlap``/``fused``
model the paper's Section V switches; :func:`memory_breakdown` the bytes per rank, of which
:func:`shard_bytes` the rank's shard, array for array (checked against shard files:
``tests/parallel/test_shard_memory.py``, ``benchmarks/shard_memory.py``).

**Unified model and fit.** Per step, five times in seconds from the cluster
profile's constants: bandwidth, latency, compute, sampling and a fixed overhead.
Epoch time = ``steps * sum_k c_k * t_k`` with ``steps = ceil(ceil(N/B)/Gd)``. With
the profile's constants c = 1; :func:`fit` replaces c by non-negative least squares
on recorded runs (Plexus fits its coefficients by linear regression the same way).
Where ranks share cores (``compute_slots`` > 0: this CPU machine) compute,
sampling and overhead are scaled by ``ranks_per_node / min(slots, ranks * threads)``.
"""

from __future__ import annotations

import dataclasses

import math
import operator
from dataclasses import dataclass, field

from .sections.sampling import resolve_batch_size  # B as the trainers resolve it

__all__ = ["Workload", "Machine", "Collective", "step_collectives", "axis_bandwidth", "step_times", "predict",
           "Coefficients", "fit", "rank_grids", "memory_per_rank", "KNOWN_DATASETS", "TERMS", "epoch_time_from_rows",
           "predicted_bytes_per_step", "predicted_calls_per_step", "oversubscription", "memory_breakdown",
           "shard_bytes", "collective_cost", "comm_time_by_kind", "check_ranks", "MAX_RANKS"]

TERMS = ("bandwidth", "latency", "compute", "sampling", "overhead")
# The most ranks a grid may have here: twice the GPUs (or GPU tiles) of the largest machines. Every 4D grid of
# G ranks is predicted (rank_grids), so a count far above any machine's would take hours and all the memory.
MAX_RANKS = 1 << 17
KAPPA = 1e-6  # Plexus: 7.8e-10 / 7.8e-4

# Stored entries of A + I as this project loads each graph (undirected: both directions, one self loop per
# vertex), from Plexus Table 4 (vertices, edges, nonzeros), features and classes from the papers. Table 4's
# nonzeros are 2 x edges + vertices for every graph but ogbn-papers100M, whose 1,726,745,828 are its directed
# citations + vertices; its loader here symmetrizes them (A + A^T), so it is modelled with 2 x 1,615,685,872 +
# 111,059,956 (at most: a pair of papers citing each other is one edge each way; OGB counts no such pairs).
# OGB ships it with 128 features (Table 4 says 100). Isolate-3-8M: Table 4's 8,745,542 vertices and its
# nonzeros; the ScaleGNN text says 3.8 M vertices but gives no edges, so there is nothing else to model.
KNOWN_DATASETS = {
    "reddit": dict(num_nodes=232_965, nnz=114_848_857, num_features=602, num_classes=41),
    "ogbn-products": dict(num_nodes=2_449_029, nnz=126_167_053, num_features=100, num_classes=47),
    "isolate-3-8m": dict(num_nodes=8_745_542, nnz=1_317_986_044, num_features=128, num_classes=32),
    "products-14m": dict(num_nodes=14_249_639, nnz=245_036_907, num_features=128, num_classes=32),
    "europe-osm": dict(num_nodes=50_912_018, nnz=159_021_338, num_features=128, num_classes=32),
    "ogbn-papers100m": dict(num_nodes=111_059_956, nnz=2 * 1_615_685_872 + 111_059_956, num_features=128,
                            num_classes=172),
}


# ---------------------------------------------------------------------------- inputs
@dataclass(frozen=True)
class Workload:
    num_nodes: int
    nnz: int
    num_features: int
    num_classes: int
    hidden: int = 256
    layers: int = 3
    batch_size: int | None = None  # None: full graph (B = N)
    norm: bool = True
    residual: bool = True
    pmm_bytes: int = 4  # bytes per element of 3D-PMM partial sums (2 with BF16 communication)
    bucket: bool = True  # --bucket-collectives: weight/gain gradients one call per (axis, wire dtype)
    prefetch: bool = False  # --prefetch (V-A): sampling of step t+1 overlaps step t; only the excess is paid
    fused: bool = False  # --compile (V-C): RMSNorm, ReLU and dropout in one kernel (fewer HBM passes)
    comm_overlap: bool = False  # --comm-overlap (V-D): weight-gradient all-reduces hide behind backward compute

    @property
    def batch(self) -> int:
        return self.num_nodes if self.batch_size is None else int(self.batch_size)

    @property
    def sampled_nnz(self) -> float:
        """Expected stored entries of the sampled B x B matrix: the B self loops plus each
        off-diagonal entry kept when both ends are sampled, probability B(B-1)/(N(N-1))."""
        n, b = self.num_nodes, self.batch
        if b >= n:
            return float(self.nnz)
        return b + (self.nnz - n) * b * (b - 1) / (n * (n - 1))

    def steps_per_epoch(self, gd: int) -> int:
        return max(1, math.ceil(math.ceil(self.num_nodes / self.batch) / gd))

    @classmethod
    def from_record(cls, rec: dict) -> "Workload":
        cfg = rec.get("config", {})
        model = cfg.get("model", {})
        g = rec["graph"]
        pmm_bytes = 2 if str(_find(cfg, "comm_dtype") or "").lower() in ("bf16", "bfloat16", "torch.bfloat16") else 4
        batch = rec.get("batch_size")
        bucket = _find(cfg, "bucket_collectives")  # absent: a record from before bucketing
        return cls(num_nodes=g["num_nodes"], nnz=g.get("adjacency_nnz", g["num_edges"]), num_features=g["num_features"],
                   num_classes=g["num_classes"], hidden=model.get("hidden", 256), layers=model.get("layers", 3),
                   batch_size=None if batch is None or batch >= g["num_nodes"] else batch,
                   norm=model.get("norm", True), residual=model.get("residual", True), pmm_bytes=pmm_bytes,
                   bucket=bool(bucket))

    @classmethod
    def for_dataset(cls, name: str, *, hidden: int = 256, layers: int = 3, batch_ratio: float | None = 0.1,
                    batch_size: int | None = None, data_root: str | None = None, **kw) -> "Workload":
        """Statistics of the paper's datasets from Plexus Table 4; anything else is loaded."""
        key = name.lower().replace("_", "-")
        if key in KNOWN_DATASETS:
            stats = dict(KNOWN_DATASETS[key])
        else:
            from .datasets import load_dataset

            g = load_dataset(name, data_root=data_root).gcn_normalize()
            stats = dict(num_nodes=g.num_nodes, nnz=g.num_edges, num_features=g.num_features,
                         num_classes=g.num_classes)
        n = stats["num_nodes"]
        if batch_size is None and batch_ratio is not None and batch_ratio < 1.0:
            batch_size = resolve_batch_size(n, batch_ratio=batch_ratio)
        return cls(**stats, hidden=hidden, layers=layers, batch_size=batch_size, **kw)


def _find(d, key):
    """A key anywhere in a nested config (switch names belong to other components)."""
    if isinstance(d, dict):
        if key in d:
            return d[key]
        for v in d.values():
            found = _find(v, key)
            if found is not None:
                return found
    return None


@dataclass(frozen=True)
class Machine:
    """The performance-relevant part of a cluster profile, in SI units."""

    gpus_per_node: int
    intra_Bps: float
    inter_Bps: float
    latency_s: float
    spmm_flops: float
    gemm_flops: float
    step_overhead_s: float
    compute_slots: int = 0
    memory_bytes: float = 0.0
    name: str = ""
    # Accelerator terms (0 / False: the CPU model above, unchanged). hbm_Bps > 0 prices the
    # memory-bound kernels (SpMM, element-wise, sampling) in bytes over device memory bandwidth
    # and each GEMM by the roofline max(flops / gemm_flops, bytes / hbm_Bps).
    hbm_Bps: float = 0.0
    intra_links: str = "ring"  # "full": every pair of a node's devices has its own intra_Bps link
    tree: bool = False  # all-reduce: the cheaper of ring and double binary tree (NCCL/RCCL pick per size)

    def to_dict(self) -> dict:
        """What a sweep manifest records about its cluster (:meth:`from_dict` reads it back)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Machine":
        return cls(**{f.name: data[f.name] for f in dataclasses.fields(cls) if f.name in data})

    @classmethod
    def from_profile(cls, profile) -> "Machine":
        n, c = profile.network, profile.compute
        return cls(gpus_per_node=profile.gpus_per_node, intra_Bps=n.intra_node_GBps * 1e9,
                   inter_Bps=n.inter_node_GBps * 1e9, latency_s=n.latency_us * 1e-6, spmm_flops=c.spmm_gflops * 1e9,
                   gemm_flops=c.gemm_tflops * 1e12, step_overhead_s=c.step_overhead_ms * 1e-3,
                   compute_slots=c.compute_slots, memory_bytes=c.memory_gb * 2**30, name=profile.name,
                   hbm_Bps=getattr(c, "hbm_GBps", 0.0) * 1e9, intra_links=getattr(n, "intra_links", "ring"),
                   tree=bool(getattr(n, "tree_allreduce", False)))


# ---------------------------------------------------------------------------- communication
@dataclass(frozen=True)
class Collective:
    axis: str
    kind: str  # the CommStats kind it is recorded under: pmm_x, norm, reshard, loss, dp
    op: str  # "all_reduce" | "all_gather"
    elements: float  # all-reduce: buffer elements; all-gather: (padded) piece elements
    bytes_per_elem: int = 4
    bucket: tuple | None = None  # collectives with one key share one call (gradient buckets)
    backward: bool = False  # a weight/gain gradient reduction: --comm-overlap hides it behind backward compute
    feature_grad: bool = False  # a GEMM's input-gradient all-reduce: --comm-overlap runs it beside the dW GEMM

    @property
    def nbytes(self) -> float:
        return self.elements * self.bytes_per_elem


def _sizes(grid) -> dict:
    gd, gx, gy, gz = grid
    return {"dp": gd, "x": gx, "y": gy, "z": gz}


def step_collectives(w: Workload, grid) -> list[Collective]:
    """Every collective one rank takes part in during one training step (even splits)."""
    from .parallel.layout import head_layout, layer_layout

    g = _sizes(grid)
    B, H, F, C, pb = w.batch, w.hidden, w.num_features, w.num_classes, w.pmm_bytes
    out: list[Collective] = []

    def ar(axis, kind, elems, nbytes=4, grad=False, feature_grad=False):
        # A weight or gain gradient joins its step's bucket over (axis, wire bytes) when
        # bucketing is on (scalegnn.parallel.context.ParallelContext.weight_grad_hook).
        if g[axis] > 1 and elems > 0:
            out.append(Collective(axis, kind, "all_reduce", float(elems), nbytes,
                                  ("grad", axis, nbytes) if grad and w.bucket else None, backward=grad,
                                  feature_grad=feature_grad))

    def ag(axis, elems):
        if g[axis] > 1 and elems > 0:
            out.append(Collective(axis, "reshard", "all_gather", float(elems), 4))

    # input projection X_in[x, z] @ W_in[z, y] -> (x, y); dW_in over x
    ar("z", "pmm_z", B / g["x"] * H / g["y"], pb)
    ar("x", "pmm_x", F / g["z"] * H / g["y"], pb, grad=True)
    for layer in range(w.layers):
        lay = layer_layout(layer)
        r, c = lay.feat
        t = lay.adj[0]
        rows_t, rows_r = B / g[t], B / g[r]
        ar(r, f"pmm_{r}", rows_t * H / g[c], pb)  # SpMM forward
        ar(c, f"pmm_{c}", rows_t * H / g[r], pb)  # GEMM forward
        ar(r, f"pmm_{r}", rows_t * H / g[c], pb, feature_grad=True)  # dH
        ar(t, f"pmm_{t}", H / g[c] * H / g[r], pb, grad=True)  # dW
        ar(t, f"pmm_{t}", rows_r * H / g[c], pb)  # dX = A^T dH
        if w.norm:
            ar(r, "norm", rows_t)  # forward sum of squares
            ar(r, "norm", rows_t)  # backward dot
            ar(t, "norm", H / g[r], grad=True)  # dg
        if w.residual:
            # (r, c) -> (t, r): rows over r, then columns over c; backward in reverse.
            ag(r, min(rows_r, rows_t) * H / g[c])
            ag(c, rows_t * min(H / g[c], H / g[r]))
            ag(r, rows_t * min(H / g[c], H / g[r]))
            ag(t, min(rows_r, rows_t) * H / g[c])
    head = head_layout(w.layers)
    a, b = head.feat
    d = head.class_axis
    rows_a = B / g[a]
    ar(b, f"pmm_{b}", rows_a * C / g[d], pb)  # logits
    ar(d, f"pmm_{d}", rows_a * H / g[b], pb, feature_grad=True)  # dX
    ar(a, f"pmm_{a}", H / g[b] * C / g[d], pb, grad=True)  # dW_out
    # loss with the batch accuracy: max; sum-exp, target and two argmax counts; totals and counts
    ar(d, "loss", rows_a)
    ar(d, "loss", 4 * rows_a)
    ar(a, "loss", 4, 8)
    # data parallel: every gradient shard plus 4 scalars, one fused buffer
    params = F / g["z"] * H / g["y"] + H / g[b] * C / g[d]
    for layer in range(w.layers):
        r, c = layer_layout(layer).feat
        params += H / g[c] * H / g[r] + (H / g[r] if w.norm else 0)
    ar("dp", "dp", params + 4)
    return out


def predicted_bytes_per_step(w: Workload, grid) -> dict:
    """Bytes one rank hands to collectives per step, per CommStats kind (the records'
    ``comm_bytes`` divided by steps per epoch measure the same thing)."""
    out: dict[str, float] = {}
    for col in step_collectives(w, grid):
        out[col.kind] = out.get(col.kind, 0.0) + col.nbytes
    return out


def predicted_calls_per_step(w: Workload, grid) -> dict:
    """Collective calls one rank makes per step, per CommStats kind (the records'
    ``comm_calls`` divided by steps per epoch). A bucket is one call, counted under the
    kind that carries most of its bytes, as :class:`~scalegnn.parallel.collectives.CommStats`
    counts it."""
    out: dict[str, int] = {}
    buckets: dict[tuple, dict[str, float]] = {}
    for col in step_collectives(w, grid):
        if col.bucket is None:
            out[col.kind] = out.get(col.kind, 0) + 1
        else:
            members = buckets.setdefault(col.bucket, {})
            members[col.kind] = members.get(col.kind, 0.0) + col.nbytes
    for members in buckets.values():
        kind = max(members, key=members.get)
        out[kind] = out.get(kind, 0) + 1
    return out


def _strides(grid) -> dict:
    gd, gx, gy, gz = grid
    return {"z": 1, "y": gz, "x": gy * gz, "dp": gx * gy * gz}


def axis_bandwidth(grid, axis: str, machine: Machine) -> tuple[float, bool]:
    """(bytes/s, intra-node?) of the ring over ``axis`` (Plexus Eq. 4.6, generalized)."""
    g, stride = _sizes(grid), _strides(grid)
    n, s, gpn = g[axis], stride[axis], machine.gpus_per_node
    world = math.prod(grid)
    members = [i * s for i in range(n)]
    if len({m // gpn for m in members}) == 1:
        # "full": a ring of n devices of one node runs n-1 rings over disjoint pair links (NCCL's
        # channels), so each device sends at (n-1) times the pair bandwidth.
        return machine.intra_Bps * (max(1, n - 1) if machine.intra_links == "full" else 1), True
    # groups of this axis with a member on node 0: ranks differing only in the axis coordinate share a group
    groups = {r - ((r // s) % n) * s for r in range(min(gpn, world))}
    return machine.inter_Bps / max(1, len(groups)), False


# ---------------------------------------------------------------------------- computation
def oversubscription(grid, machine: Machine) -> float:
    if machine.compute_slots <= 0:
        return 1.0
    ranks = min(math.prod(grid), machine.gpus_per_node)
    threads = max(1, machine.compute_slots // ranks)
    return ranks / min(machine.compute_slots, ranks * threads)


def _compute_terms(w: Workload, grid) -> tuple[float, float, float]:
    """(SpMM cost with penalty, GEMM flops, sampling work) per rank and step."""
    from .parallel.layout import head_layout, layer_layout

    g = _sizes(grid)
    B, H, F = w.batch, w.hidden, w.num_features
    nnz_s = w.sampled_nnz
    spmm = gemm = 0.0
    for layer in range(w.layers):
        lay = layer_layout(layer)
        r, c = lay.feat
        t = lay.adj[0]
        cols = H / g[c]
        flops = 2.0 * nnz_s / (g[t] * g[r]) * cols
        spmm += flops * (1 + KAPPA * (B / g[r]) / cols)  # forward: A[t, r] @ X[r, c]
        spmm += flops * (1 + KAPPA * (B / g[t]) / cols)  # backward: A^T[r, t] @ dH[t, c]
        gemm += 3 * 2.0 * (B / g[t]) * (H / g[c]) * (H / g[r])  # forward, dH, dW
    gemm += 2 * 2.0 * (B / g["x"]) * (F / g["z"]) * (H / g["y"])  # input projection forward and dW
    head = head_layout(w.layers)
    a, b = head.feat
    gemm += 3 * 2.0 * (B / g[a]) * (H / g[b]) * (w.num_classes / g[head.class_axis])
    # Algorithm 2: per adjacency plane, the sampled rows of the shard are gathered
    # (B/G_rows * nnz/N entries) and each entry's column is binary-searched in the sample.
    planes = [layer_layout(i).adj for i in range(min(3, w.layers))]
    touched = sum(B / g[rows] * w.nnz / w.num_nodes for rows, _ in planes)
    sampling = touched * max(1.0, math.log2(max(B, 2)))
    return spmm, gemm, sampling


def collective_cost(op: str, nbytes: float, n: int, beta: float, alpha: float, tree: bool = False
                    ) -> tuple[float, float, str]:
    """(bandwidth s, latency s, algorithm) of one collective over n ranks at beta bytes/s.

    Ring all-reduce ``2 (n-1)/n M/beta + 2 (n-1) alpha``; with ``tree`` the double binary
    tree ``2 M/beta + 2 ceil(log2 n) alpha`` (NCCL's other algorithm: it wins where the
    ring's 2(n-1) latency steps outweigh its bandwidth advantage, i.e. small messages over
    many ranks) when that is cheaper. All-gather: ring, ``(n-1) p/beta + (n-1) alpha``."""
    if op == "all_reduce":
        ring = (2 * (n - 1) / n * nbytes / beta, 2 * (n - 1) * alpha, "ring")
        if tree and n > 2:
            tr = (2 * nbytes / beta, 2 * math.ceil(math.log2(n)) * alpha, "tree")
            if sum(tr[:2]) < sum(ring[:2]):
                return tr
        return ring
    return (n - 1) * nbytes / beta, (n - 1) * alpha, "ring"


# Device-memory passes over an activation block per layer (reads + writes of a tensor the size
# of the layer's output shard), counted from the layer's operators: forward RMSNorm (sum of
# squares 1, normalize 2), ReLU 2, dropout 2 (+ mask), residual add 3 = 10, backward twice that.
# --compile fuses norm + ReLU + dropout: forward 1 (sum of squares) + 2 (fused) + 3 (residual),
# backward twice that. A BF16 wire adds casts: read FP32 + write BF16, and back (12 bytes per
# element = 3 FP32 passes) per 3D-PMM all-reduce buffer.
ELEMENTWISE_PASSES = {False: 30.0, True: 18.0}
CAST_PASSES = 3.0
RANDPERM_BYTES_PER_VERTEX = 64  # Alg. 2 line 1 on a device: radix sort of N 64-bit (key, index) pairs, 4 passes
SECTOR_BYTES = 32  # a random device-memory read costs one sector (binary-search probes, row gathers)


def _device_terms(w: Workload, grid, machine: Machine) -> dict:
    """Accelerator costs of one step, seconds: SpMM, GEMM and element-wise work (roofline over
    HBM bandwidth and FP32 peak), its backward share, and Algorithm 2's sampling."""
    from .parallel.layout import head_layout, layer_layout

    g = _sizes(grid)
    B, H, F, C = w.batch, w.hidden, w.num_features, w.num_classes
    hbm, peak = machine.hbm_Bps, machine.gemm_flops
    nnz_s = w.sampled_nnz

    def gemm(m, k, n):  # one FP32 GEMM: roofline of its flops and its operands' bytes
        return max(2.0 * m * k * n / peak, 4.0 * (m * k + k * n + m * n) / hbm)

    fwd = bwd = dw = 0.0
    for layer in range(w.layers):
        lay = layer_layout(layer)
        r, c = lay.feat
        t = lay.adj[0]
        rows_t, rows_r, cols = B / g[t], B / g[r], H / g[c]
        nnz = nnz_s / (g[t] * g[r])
        # CSR SpMM: values + int64 columns, one gathered feature row (cols floats, whole sectors) per entry
        row_bytes = max(SECTOR_BYTES, 4 * cols)
        fwd += (nnz * (12 + row_bytes) + 4 * rows_t * cols) / hbm
        bwd += (nnz * (12 + row_bytes) + 4 * rows_r * cols) / hbm  # A^T dH
        k_in = H / g[r]
        fwd += gemm(rows_t, cols, k_in)
        bwd += gemm(rows_t, k_in, cols) + gemm(cols, rows_t, k_in)  # dH, dW
        dw += gemm(cols, rows_t, k_in)
        block = 4 * rows_t * cols
        passes = ELEMENTWISE_PASSES[w.fused]
        fwd += passes / 3 * block / hbm
        bwd += 2 * passes / 3 * block / hbm
        if w.pmm_bytes == 2:  # BF16 casts around the SpMM, GEMM, dH and dX all-reduces
            fwd += 2 * CAST_PASSES * block / hbm
            bwd += 2 * CAST_PASSES * block / hbm
    rows_x = B / g["x"]
    fwd += 4 * rows_x * F / g["z"] / hbm + gemm(rows_x, F / g["z"], H / g["y"])  # gather X_in, project
    bwd += gemm(F / g["z"], rows_x, H / g["y"])
    head = head_layout(w.layers)
    a, b = head.feat
    fwd += gemm(B / g[a], H / g[b], C / g[head.class_axis])
    bwd += 2 * gemm(B / g[a], H / g[b], C / g[head.class_axis])
    dw += gemm(H / g[b], B / g[a], C / g[head.class_axis])
    # Algorithm 2 on the device: draw S (a sort of N keys), then per adjacency plane gather the
    # sampled rows' CSR entries (B/G_rows * nnz/N, 12 bytes each) and binary-search each column
    # in the sorted sample: ceil(log2 B) dependent probes, one sector each.
    planes = [layer_layout(i).adj for i in range(min(3, w.layers))]
    touched = sum(B / g[rows] * w.nnz / w.num_nodes for rows, _ in planes)
    probes = math.ceil(math.log2(max(B, 2)))
    sampling = (RANDPERM_BYTES_PER_VERTEX * w.num_nodes + touched * (12 + probes * SECTOR_BYTES)) / hbm
    return {"forward": fwd, "backward": bwd, "dw": dw, "sampling": sampling}


def comm_time_by_kind(w: Workload, grid, machine: Machine) -> dict:
    """Seconds per step of the collectives of each CommStats kind (bandwidth + latency, no overlap)."""
    sizes, out, launched = _sizes(grid), {}, set()
    for col in step_collectives(w, grid):
        beta, _ = axis_bandwidth(grid, col.axis, machine)
        b, a, _ = collective_cost(col.op, col.nbytes, sizes[col.axis], beta, machine.latency_s, machine.tree)
        if col.op == "all_reduce" and col.bucket is not None and col.bucket in launched:
            a = 0.0
        launched.add(col.bucket)
        out[col.kind] = out.get(col.kind, 0.0) + a + b
    return out


def _dw_flops(w: Workload, grid) -> float:
    """FLOPs of the weight-gradient GEMMs of one step (the layers' and the head's)."""
    from .parallel.layout import head_layout, layer_layout

    g = _sizes(grid)
    B, H = w.batch, w.hidden
    out = sum(2.0 * B / g[layer_layout(i).adj[0]] * H / g[layer_layout(i).feat[1]] * H / g[layer_layout(i).feat[0]]
              for i in range(w.layers))
    head = head_layout(w.layers)
    a, b = head.feat
    return out + 2.0 * B / g[a] * H / g[b] * w.num_classes / g[head.class_axis]


def step_times(w: Workload, grid, machine: Machine) -> dict:
    """The five model terms of one step, in seconds with the machine's constants.

    With ``w.comm_overlap`` (paper V-D) each GEMM's input-gradient all-reduce
    (``Collective.feature_grad``) is paid only where it outlasts the weight-gradient GEMMs it
    runs beside, and the weight- and gain-gradient reductions (``Collective.backward``) only
    where they outlast the rest of the backward compute."""
    sizes = _sizes(grid)
    device = _device_terms(w, grid, machine) if machine.hbm_Bps > 0 else None
    bw = lat = 0.0
    grad_bw = grad_lat = fg_bw = fg_lat = 0.0
    launched: set = set()  # a bucket pays its latency once
    for col in step_collectives(w, grid):
        n = sizes[col.axis]
        beta, _ = axis_bandwidth(grid, col.axis, machine)
        b, a, _ = collective_cost(col.op, col.nbytes, n, beta, machine.latency_s, machine.tree)
        if col.op == "all_reduce" and col.bucket is not None and col.bucket in launched:
            a = 0.0
        launched.add(col.bucket)
        if col.backward and w.comm_overlap:
            grad_bw, grad_lat = grad_bw + b, grad_lat + a
        elif col.feature_grad and w.comm_overlap:
            fg_bw, fg_lat = fg_bw + b, fg_lat + a
        else:
            bw, lat = bw + b, lat + a
    over = oversubscription(grid, machine)
    if device is None:
        spmm, gemm, sampling = _compute_terms(w, grid)
        compute = over * (spmm / machine.spmm_flops + gemm / machine.gemm_flops)
        sampling_s = over * sampling / machine.spmm_flops
        backward = compute * 2 / 3
        dw = over * _dw_flops(w, grid) / machine.gemm_flops
    else:
        compute = device["forward"] + device["backward"]
        sampling_s = device["sampling"]
        backward = device["backward"]
        dw = device["dw"]

    def exposed(b, a, budget):  # the part of (b, a) not hidden by budget seconds, split pro rata
        if b + a <= 0:
            return 0.0, 0.0, budget
        f = max(0.0, b + a - budget) / (b + a)
        return f * b, f * a, max(0.0, budget - (b + a))

    eb, ea, left = exposed(fg_bw, fg_lat, dw)
    bw, lat = bw + eb, lat + ea
    eb, ea, _ = exposed(grad_bw, grad_lat, backward - (dw - left))
    bw, lat = bw + eb, lat + ea
    return {
        "bandwidth": bw,
        "latency": lat,
        "compute": compute,
        "sampling": sampling_s,
        "overhead": over * machine.step_overhead_s,
    }


# ---------------------------------------------------------------------------- prediction and fit
@dataclass(frozen=True)
class Coefficients:
    """Multipliers of the model terms (1.0 = the profile's constants as given)."""

    values: dict = field(default_factory=lambda: {t: 1.0 for t in TERMS})
    fitted_on: int = 0  # number of runs; 0 = not fitted

    def __getitem__(self, term: str) -> float:
        return self.values.get(term, 0.0)


@dataclass(frozen=True)
class Prediction:
    grid: tuple[int, int, int, int]
    epoch_s: float
    steps: int
    parts: dict  # seconds per epoch per term, coefficients applied
    memory_bytes: float
    fits: bool

    @property
    def comm_s(self) -> float:
        return self.parts["bandwidth"] + self.parts["latency"]

    @property
    def grid_str(self) -> str:
        return "x".join(map(str, self.grid))


# Tensors of a layer's output block alive from forward until backward: SpMM output, GEMM output,
# RMSNorm output and its inverse RMS, ReLU output (mask), dropout mask (1 byte) and output, and
# the resharded residual: about 7 FP32 blocks per layer.
SAVED_PER_LAYER = 7.0


def shard_bytes(w: Workload, grid, coords: dict | None = None, *, multilabel: bool = False) -> dict:
    """Bytes of one rank's shard as this implementation holds it, for workload ``w``
    (:func:`scalegnn.shards.shard_storage_bytes`, where the shard format
    lives: adjacency, features, labels and total)."""
    from .shards.format import shard_storage_bytes

    return shard_storage_bytes(w.num_nodes, w.nnz, w.num_features, w.num_classes, tuple(grid), coords,
                               multilabel=multilabel)


def memory_breakdown(w: Workload, grid) -> dict:
    """Peak bytes per rank, by what holds them:

    shard        the largest rank's shard (:func:`shard_bytes`): its adjacency planes
                 (CSR, planes that coincide stored once), input features, labels and masks
    optimizer    weights, gradients and AdamW's two moments of this rank's weight shards
    block        the sampled blocks (CSR on each plane) and Algorithm 2's scratch (the gathered
                 columns and their positions, 16 bytes per touched entry); twice with --prefetch
    activations  what training keeps for backward: SAVED_PER_LAYER blocks of (B/G_t) x (H/G_c)
                 per layer, the gathered input features and the logits
    evaluation   full-graph evaluation (no autograd): three live (N/G_t) x (H/G_c) blocks
    peak         shard + optimizer + max(block + activations, evaluation)"""
    from .parallel.layout import head_layout, layer_layout

    g = _sizes(grid)
    N, B, H, F, C = w.num_nodes, w.batch, w.hidden, w.num_features, w.num_classes
    block = 0.0
    planes = [layer_layout(i).adj for i in range(min(3, w.layers))]
    for rows, cols in planes:
        block += w.sampled_nnz / (g[rows] * g[cols]) * 12 + B / g[rows] * 8
        block += B / g[rows] * w.nnz / w.num_nodes / g[cols] * 16
    if w.prefetch:
        block *= 2
    params = F / g["z"] * H / g["y"]
    act = eval_act = 0.0
    for layer in range(w.layers):
        lay = layer_layout(layer)
        r, c = lay.feat
        params += H / g[c] * H / g[r] + H / g[r]
        act += SAVED_PER_LAYER * 4 * B / g[lay.adj[0]] * H / g[c]
        eval_act = max(eval_act, 3 * 4 * N / g[lay.adj[0]] * H / g[c])
    head = head_layout(w.layers)
    a, b = head.feat
    params += H / g[b] * C / g[head.class_axis]
    act += 4 * B / g["x"] * F / g["z"] + 2 * 4 * B / g[a] * C / g[head.class_axis]
    out = {"shard": shard_bytes(w, grid)["total"], "optimizer": 4 * 4 * params, "block": block, "activations": act,
           "evaluation": eval_act}
    out["peak"] = out["shard"] + out["optimizer"] + max(block + act, eval_act)
    return out


def memory_per_rank(w: Workload, grid) -> float:
    """Peak bytes per rank (:func:`memory_breakdown`'s ``peak``)."""
    return memory_breakdown(w, grid)["peak"]


def predict(w: Workload, grid, machine: Machine, coef: Coefficients | None = None) -> Prediction:
    coef = coef or Coefficients()
    grid = tuple(int(v) for v in grid)
    steps = w.steps_per_epoch(grid[0])
    parts = {k: steps * coef[k] * v for k, v in step_times(w, grid, machine).items()}
    if w.prefetch:  # V-A: the next batch is sampled while this step trains; only the excess waits
        train = sum(v for k, v in parts.items() if k != "sampling")
        parts["sampling"] = max(0.0, parts["sampling"] - train)
    mem = memory_per_rank(w, grid)
    return Prediction(grid, sum(parts.values()), steps, parts, mem,
                      fits=machine.memory_bytes <= 0 or mem <= machine.memory_bytes)


def check_ranks(gpus, what: str = "gpus") -> int:
    """``gpus`` if it is a rank count the model takes (a whole number in [1, :data:`MAX_RANKS`]);
    else ``ValueError`` naming ``what`` (the flag or argument), the value and the range."""
    try:
        count = None if isinstance(gpus, bool) else operator.index(gpus)
    except TypeError:
        count = None
    if count is None or not 1 <= count <= MAX_RANKS:
        raise ValueError(f"{what} {gpus!r}: a rank count is a whole number in [1, {MAX_RANKS:,}] (twice the GPUs "
                         "of the largest machines)")
    return count


def rank_grids(w: Workload, gpus: int, machine: Machine, coef: Coefficients | None = None,
               gd: int | None = None) -> list[Prediction]:
    """Every 4D grid of ``gpus`` ranks (Gd fixed when given), fastest predicted first;
    shapes whose estimated memory exceeds the device's come last."""
    check_ranks(gpus)
    out = []
    for gdv in range(1, gpus + 1):
        if gpus % gdv or (gd is not None and gdv != gd):
            continue
        rest = gpus // gdv
        for gx in range(1, rest + 1):
            if rest % gx:
                continue
            for gy in range(1, rest // gx + 1):
                if (rest // gx) % gy == 0:
                    out.append(predict(w, (gdv, gx, gy, rest // gx // gy), machine, coef))
    return sorted(out, key=lambda p: (not p.fits, p.epoch_s))


def fit(samples: list[tuple[dict, float]], terms=TERMS) -> Coefficients:
    """Non-negative least squares: observed epoch seconds ~ sum_k c_k * term_k.

    ``samples`` are (per-epoch term seconds with c = 1, observed epoch seconds).
    Rows are weighted by 1/observed so the fit minimizes *relative* error (runs of
    a few ms and of a few s count alike)."""
    import numpy as np
    from scipy.optimize import nnls

    if len(samples) < len(terms):
        raise ValueError(f"need at least {len(terms)} recorded runs to fit {len(terms)} coefficients, "
                         f"got {len(samples)}")
    a = np.array([[s[0][t] for t in terms] for s in samples], dtype=float)
    y = np.array([s[1] for s in samples], dtype=float)
    wts = 1.0 / y
    scale = a.max(axis=0)
    scale[scale == 0] = 1.0
    sol, _ = nnls(a / scale * wts[:, None], y * wts)
    return Coefficients({t: float(v) for t, v in zip(terms, sol / scale)}, fitted_on=len(samples))


def epoch_time_from_rows(train_times: list[float]) -> float | None:
    """Observed epoch time from cumulative training times: the mean epoch, the first
    (warm-up: allocation, caches) excluded when there are at least two (as
    ``analysis.load_runs``' ``epoch_time_s``)."""
    if not train_times:
        return None
    deltas = [train_times[0]] + [b - a for a, b in zip(train_times, train_times[1:])]
    if len(deltas) > 1:
        deltas = deltas[1:]
    return sum(deltas) / len(deltas)

