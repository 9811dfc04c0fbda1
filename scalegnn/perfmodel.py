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
from dataclasses import dataclass, field

__all__ = ["Workload", "Machine", "Collective", "step_collectives", "axis_bandwidth", "step_times", "predict",
           "Coefficients", "fit", "rank_grids", "memory_per_rank", "KNOWN_DATASETS", "TERMS", "epoch_time_from_rows",
           "predicted_bytes_per_step", "predicted_calls_per_step", "oversubscription"]

TERMS = ("bandwidth", "latency", "compute", "sampling", "overhead")
KAPPA = 1e-6  # Plexus: 7.8e-10 / 7.8e-4

# Plexus Table 4 (nonzeros include self loops), features/classes from the papers.
KNOWN_DATASETS = {
    "reddit": dict(num_nodes=232_965, nnz=114_848_857, num_features=602, num_classes=41),
    "ogbn-products": dict(num_nodes=2_449_029, nnz=126_167_053, num_features=100, num_classes=47),
    "isolate-3-8m": dict(num_nodes=8_745_542, nnz=1_317_986_044, num_features=128, num_classes=32),
    "products-14m": dict(num_nodes=14_249_639, nnz=245_036_907, num_features=128, num_classes=32),
    "europe-osm": dict(num_nodes=50_912_018, nnz=159_021_338, num_features=128, num_classes=32),
    "ogbn-papers100m": dict(num_nodes=111_059_956, nnz=1_726_745_828, num_features=100, num_classes=172),
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
        return cls(num_nodes=g["num_nodes"], nnz=g["num_edges"], num_features=g["num_features"],
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
            batch_size = max(2, int(round(batch_ratio * n)))
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
                   compute_slots=c.compute_slots, memory_bytes=c.memory_gb * 2**30, name=profile.name)


# ---------------------------------------------------------------------------- communication
@dataclass(frozen=True)
class Collective:
    axis: str
    kind: str  # the CommStats kind it is recorded under: pmm_x, norm, reshard, loss, dp
    op: str  # "all_reduce" | "all_gather"
    elements: float  # all-reduce: buffer elements; all-gather: (padded) piece elements
    bytes_per_elem: int = 4
    bucket: tuple | None = None  # collectives with one key share one call (gradient buckets)

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

    def ar(axis, kind, elems, nbytes=4, grad=False):
        # A weight or gain gradient joins its step's bucket over (axis, wire bytes) when
        # bucketing is on (scalegnn.parallel.context.ParallelContext.weight_grad_hook).
        if g[axis] > 1 and elems > 0:
            out.append(Collective(axis, kind, "all_reduce", float(elems), nbytes,
                                  ("grad", axis, nbytes) if grad and w.bucket else None))

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
        ar(r, f"pmm_{r}", rows_t * H / g[c], pb)  # dH
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
    ar(d, f"pmm_{d}", rows_a * H / g[b], pb)  # dX
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
        return machine.intra_Bps, True
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


def step_times(w: Workload, grid, machine: Machine) -> dict:
    """The five model terms of one step, in seconds with the machine's constants."""
    bw = lat = 0.0
    launched: set = set()  # a bucket pays its latency once
    for col in step_collectives(w, grid):
        n = _sizes(grid)[col.axis]
        beta, _ = axis_bandwidth(grid, col.axis, machine)
        if col.op == "all_reduce":
            bw += 2 * (n - 1) / n * col.nbytes / beta
            if col.bucket is None or col.bucket not in launched:
                lat += 2 * (n - 1) * machine.latency_s
                launched.add(col.bucket)
        else:
            bw += (n - 1) * col.nbytes / beta
            lat += (n - 1) * machine.latency_s
    spmm, gemm, sampling = _compute_terms(w, grid)
    over = oversubscription(grid, machine)
    return {
        "bandwidth": bw,
        "latency": lat,
        "compute": over * (spmm / machine.spmm_flops + gemm / machine.gemm_flops),
        "sampling": over * sampling / machine.spmm_flops,
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


def memory_per_rank(w: Workload, grid) -> float:
    """Rough peak bytes per rank: adjacency shards (CSR, int64 columns + FP32 values on
    min(3, L) planes), the feature shard, full-graph evaluation activations, weights."""
    from .parallel.layout import layer_layout

    g = _sizes(grid)
    N, H, F = w.num_nodes, w.hidden, w.num_features
    adj = 0.0
    for i in range(min(3, w.layers)):
        rows, cols = layer_layout(i).adj
        adj += w.nnz / (g[rows] * g[cols]) * 12 + N / g[rows] * 8
    feats = N / g["x"] * F / g["z"] * 4
    act = 6 * N / min(g["x"], g["y"], g["z"]) * H / max(g["x"], g["y"], g["z"]) * 4  # evaluation, B = N
    weights = 4 * 4 * (F * H + w.layers * H * H + H * w.num_classes) / (g["x"] * g["y"] * g["z"])
    return adj + feats + act + weights


def predict(w: Workload, grid, machine: Machine, coef: Coefficients | None = None) -> Prediction:
    coef = coef or Coefficients()
    grid = tuple(int(v) for v in grid)
    steps = w.steps_per_epoch(grid[0])
    parts = {k: steps * coef[k] * v for k, v in step_times(w, grid, machine).items()}
    mem = memory_per_rank(w, grid)
    return Prediction(grid, sum(parts.values()), steps, parts, mem,
                      fits=machine.memory_bytes <= 0 or mem <= machine.memory_bytes)


def rank_grids(w: Workload, gpus: int, machine: Machine, coef: Coefficients | None = None,
               gd: int | None = None) -> list[Prediction]:
    """Every 4D grid of ``gpus`` ranks (Gd fixed when given), fastest predicted first;
    shapes whose estimated memory exceeds the device's come last."""
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

