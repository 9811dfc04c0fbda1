"""All-reduce and all-gather on this machine's ranks (``scalegnn bench collectives``): the
latency and bandwidth the performance model's ``[network]`` constants stand for, measured.

    scalegnn bench collectives                          # 2 local ranks: gloo on CPUs, NCCL on 2+ GPUs
    scalegnn bench collectives --nproc 4 --sizes 64K,1M,16M,256M --reps 20 --profile perlmutter
    srun -N 2 --ntasks-per-node 1 scalegnn bench collectives    # the job's ranks: an inter-node value

For each size (bytes per rank, K/M/G = 1024 powers) and op -- an all-reduce (sum) of a
float32 buffer of that many bytes, an all-gather in which every rank contributes that
many bytes -- one warm-up call, then ``--reps`` timed calls, each after a barrier (and a
device synchronization on GPUs); a repetition's time is the slowest rank's, the reported
time the median of the repetitions. Bandwidths are reported as NCCL-tests does: the
algorithm bandwidth ``algbw = bytes / time`` (the all-gather's bytes: all n pieces) and the
bus bandwidth ``busbw = algbw * 2 (n-1)/n`` (all-reduce) or ``algbw * (n-1)/n``
(all-gather), which for a ring is the bandwidth of each link, the same at any n.

The constants are fitted to :func:`scalegnn.perfmodel.collective_cost`'s ring formulas,
whose terms are the columns of the design matrix (:func:`ring_terms`)::

    t = steps * alpha + volume / beta
    all-reduce of M bytes:     steps = 2 (n-1),  volume = 2 (n-1)/n * M
    all-gather of p per rank:  steps = n - 1,    volume = (n-1) * p

by least squares in relative error over every repetition (:func:`fit_ring`): per op, and
both ops together, whose (alpha, beta) is what the model prices both with. Ranks on one
host give a ring over the node's links, an ``intra_node_GBps`` value (with
``intra_links = "full"``, the model gives a ring of n devices n-1 pair links, so the
pair value is beta / (n-1)); ranks on several hosts give ``inter_node_GBps`` (a ring
over all the job's ranks uses a node's whole injection bandwidth,
:func:`scalegnn.perfmodel.axis_bandwidth`). ``--profile`` sets the measured values
beside the profile's (as the model reads them) and flags a ratio outside [0.5, 2].

Every repetition's time, the hosts, backend, device and the load average before and
after go to ``OUT/collectives.json``; the tables to ``OUT/collectives.md``.
"""

from __future__ import annotations

import dataclasses
import math
import re
import socket
import statistics
import time

from .common import machine_info, markdown_table

__all__ = ["OPS", "parse_sizes", "ring_terms", "bus_factor", "fit_ring", "RingFit", "collectives_bench",
           "collectives_report"]

OPS = ("all_reduce", "all_gather")
MIN_BYTES, MAX_BYTES = 4, 4 * 2**30  # one float32; a buffer no rank should be asked to hold several of
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}
LOW, HIGH = 0.5, 2.0  # measured / profile outside this range is flagged


# --------------------------------------------------------------------------- inputs
def parse_sizes(text: str) -> list[int]:
    """Bytes per rank of ``--sizes`` (``"4K,64K,1M"``: K, M, G are powers of 1024), sorted,
    duplicates dropped. Each must be a whole number of float32 elements in [4 B, 4 GiB]."""
    sizes = set()
    for item in str(text).split(","):
        m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)(?:i?B)?\s*", item, flags=re.IGNORECASE)
        if m is None:
            raise ValueError(f"--sizes {text!r}: {item.strip()!r} is no size; give bytes per rank such as 4096, "
                             "4K, 1M or 1G (powers of 1024), comma-separated")
        size = int(m.group(1)) * _UNITS[m.group(2).upper()]
        if not MIN_BYTES <= size <= MAX_BYTES:
            raise ValueError(f"--sizes: {item.strip()} = {size} bytes is outside [4 B, 4 GiB]; give sizes within it")
        if size % 4:
            raise ValueError(f"--sizes: {item.strip()} = {size} bytes is not a whole number of float32 elements; "
                             "give a multiple of 4 bytes")
        sizes.add(size)
    if len(sizes) < 2:
        raise ValueError(f"--sizes {text!r} gives one size; the fit of latency and bandwidth needs at least two "
                         "different sizes, e.g. --sizes 4K,16M")
    return sorted(sizes)


def _check_inputs(args) -> tuple[list[int], int, str | None, object]:
    """(sizes, reps, backend, profile or None) of the command's arguments, or a one-line
    ValueError naming the bad one, before any rank starts."""
    sizes = parse_sizes(args.sizes)
    if args.reps < 1:
        raise ValueError(f"--reps {args.reps}: the median needs at least one timed repetition; give --reps 1 or more")
    backend = None if args.backend is None else str(args.backend).strip().lower()
    if backend not in (None, "gloo", "nccl"):
        raise ValueError(f"--backend {args.backend!r} is none of gloo, nccl; give one of them or leave it out")
    profile = None
    if args.profile is not None:
        from scalegnn.sweeps import load_profile

        profile = load_profile(args.profile)  # a ProfileError (a ValueError) names the known profiles
    return sizes, args.reps, backend, profile


def _local_backend(requested: str | None, ranks_on_node: int) -> str:
    """The backend of ``ranks_on_node`` ranks of this node: NCCL when there is a GPU for
    each, else gloo (on CPU tensors); ``requested`` NCCL without them is refused."""
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if requested == "nccl" and gpus < ranks_on_node:
        raise ValueError(f"--backend nccl with {ranks_on_node} ranks on this node, which has {gpus} GPU(s): NCCL "
                         f"runs one rank per GPU; use at most {gpus} ranks per node, or --backend gloo" if gpus else
                         "--backend nccl needs a GPU per rank but this process sees none; use --backend gloo")
    if requested is not None:
        return requested
    return "nccl" if gpus >= ranks_on_node else "gloo"


# --------------------------------------------------------------------------- the model's terms and the fit
def ring_terms(op: str, nbytes: float, n: int) -> tuple[float, float]:
    """(volume bytes, latency steps) of a ring ``op`` over n ranks: the coefficients of
    1/beta and alpha in :func:`scalegnn.perfmodel.collective_cost` (read off it at
    beta = 1 B/s and alpha = 1 s). ``nbytes``: the all-reduce's buffer, or the piece each
    rank contributes to the all-gather."""
    from scalegnn.perfmodel import collective_cost

    if op not in OPS:
        raise ValueError(f"op {op!r} is none of {', '.join(OPS)}")
    volume, steps, algorithm = collective_cost(op, nbytes, n, 1.0, 1.0, tree=False)
    assert algorithm == "ring", algorithm
    return volume, steps


def bus_factor(op: str, n: int) -> float:
    """busbw / algbw of NCCL-tests: 2 (n-1)/n for an all-reduce, (n-1)/n for an all-gather."""
    return (2.0 if op == "all_reduce" else 1.0) * (n - 1) / n


def algbw_bytes(op: str, nbytes: int, n: int) -> int:
    """The bytes of the algorithm bandwidth: the all-reduce's buffer, all n all-gather pieces."""
    return nbytes if op == "all_reduce" else n * nbytes


@dataclasses.dataclass(frozen=True)
class RingFit:
    """alpha (s per step) and beta (bytes/s) of ``t = steps * alpha + volume / beta``;
    ``residual`` the RMS relative error of the fitted times; beta is infinite where the
    times show no bandwidth term (sizes too small to see it)."""

    alpha_s: float
    beta_Bps: float
    residual: float
    points: int

    def to_dict(self) -> dict:
        return {"alpha_s": self.alpha_s, "beta_Bps": self.beta_Bps if math.isfinite(self.beta_Bps) else None,
                "latency_us": self.alpha_s * 1e6,
                "bandwidth_GBps": self.beta_Bps / 1e9 if math.isfinite(self.beta_Bps) else None,
                "residual": self.residual, "points": self.points}


def fit_ring(points, n: int) -> RingFit:
    """Least-squares (alpha, 1/beta) of ``points`` = [(op, nbytes, seconds), ...] over n
    ranks, both non-negative. Each equation is divided by its measured time, so a 4 KiB
    message's microseconds weigh as much as a 16 MiB one's milliseconds (the sizes span
    orders of magnitude; unweighted, the largest would decide alpha too), and a repetition
    slowed down by another process (far above the fit) pulls with a relative error of at
    most 1. Needs two points whose (steps, volume) are not proportional: two sizes of one
    op, or both ops."""
    import numpy as np

    rows, times = [], []
    for op, nbytes, seconds in points:
        if not (math.isfinite(seconds) and seconds > 0):
            raise ValueError(f"{op} of {nbytes} bytes took {seconds} s; times to fit must be positive and finite")
        volume, steps = ring_terms(op, nbytes, n)
        rows.append((steps, volume))
        times.append(seconds)
    a = np.asarray(rows, dtype=np.float64)
    t = np.asarray(times, dtype=np.float64)
    w = a / t[:, None]  # relative error: (a x - t) / t = w x - 1
    scale = np.linalg.norm(w, axis=0)  # steps ~ 1..10, volumes ~ 1e3..1e9: unit columns keep the solve conditioned
    if len(t) < 2 or np.linalg.matrix_rank(w / scale) < 2:
        raise ValueError("the fit of latency and bandwidth needs times at two or more different sizes")
    coef = np.linalg.lstsq(w / scale, np.ones_like(t), rcond=None)[0] / scale
    if coef.min() < 0:  # noise made one term negative: fit the other alone (non-negative least squares, 2 unknowns)
        best = None
        for keep in (0, 1):
            c = np.zeros(2)
            col = w[:, keep]
            c[keep] = max(0.0, float(col @ np.ones_like(t)) / float(col @ col))
            err = float(np.sum((w @ c - 1.0) ** 2))
            if best is None or err < best[0]:
                best = (err, c)
        coef = best[1]
    alpha, inv_beta = float(coef[0]), float(coef[1])
    residual = float(np.sqrt(np.mean((w @ coef - 1.0) ** 2)))
    return RingFit(alpha, 1.0 / inv_beta if inv_beta > 0 else math.inf, residual, len(t))


# --------------------------------------------------------------------------- the ranks
def _measure(rank: int, world: int, sizes: list[int], reps: int, device_kind: str) -> dict | None:
    """Every rank: each op at each size, one warm-up (checked against its closed form)
    and ``reps`` timed calls. Returns, on rank 0, the slowest rank's time of every
    repetition, the ranks' hosts and devices; None on the other ranks."""
    import torch
    import torch.distributed as dist

    device = torch.device("cuda", torch.cuda.current_device()) if device_kind == "cuda" else torch.device("cpu")
    # torch 2.13 renamed all_gather_into_tensor (and warns on the old name); the project's floor (2.6) has only that.
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    local: list[float] = []
    for nbytes in sizes:
        elems = nbytes // 4
        for op in OPS:
            send = torch.full((elems,), float(rank + 1), dtype=torch.float32, device=device)
            if op == "all_reduce":
                def call(send=send):
                    dist.all_reduce(send)
            else:
                recv = torch.empty(world * elems, dtype=torch.float32, device=device)

                def call(send=send, recv=recv):
                    gather(recv, send)
            call()  # warm-up: connections, buffers; its result has a closed form (ranks hold rank + 1)
            sync()
            _check_warmup(op, send if op == "all_reduce" else recv, world, elems)
            send.zero_()  # timed all-reduces of zeros stay finite however many there are
            for _ in range(reps):
                dist.barrier()
                sync()
                t0 = time.perf_counter()
                call()
                sync()
                local.append(time.perf_counter() - t0)
            del send, call
            if op == "all_gather":
                del recv
    # The slowest rank's time of each repetition: one all-reduce (max) after the timed calls, not between them.
    slowest = torch.tensor(local, dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    placement = [None] * world
    dist.all_gather_object(placement, (socket.gethostname(), str(device), name))
    if rank != 0:
        return None
    values = slowest.cpu().tolist()
    times, i = {op: {} for op in OPS}, 0
    for nbytes in sizes:
        for op in OPS:
            times[op][nbytes] = values[i:i + reps]
            i += reps
    return {"times": times, "hosts": [p[0] for p in placement], "devices": [p[1] for p in placement],
            "device_names": sorted({p[2] for p in placement})}


def _check_warmup(op: str, out, world: int, elems: int) -> None:
    """The warm-up call's result against its closed form: a benchmark of a collective that
    returns the wrong numbers measures nothing (ranks contribute rank + 1)."""
    if op == "all_reduce":
        want = world * (world + 1) / 2
        got = [float(out[0]), float(out[-1])]
        ok = all(g == want for g in got)
    else:
        want = [float(r + 1) for r in range(world)]
        got = [float(out[r * elems]) for r in range(world)]
        ok = got == want and float(out[-1]) == float(world)
    if not ok:
        raise RuntimeError(f"{op} of {elems} float32 over {world} ranks returned {got}, expected {want}: the "
                           "backend's collective is broken on this machine")


def _timeout_s(sizes: list[int], reps: int, world: int) -> float:
    """A deadline for the local job: two minutes plus the bytes its calls move at 20 MB/s
    (slower than any loopback gloo ring), so a hung rank ends the command, a slow one not."""
    moved = sum(sizes) * world * (reps + 1) * 3  # all-reduce ~2x its buffer, all-gather ~1x, per rank
    return 120.0 + moved / 20e6


# --------------------------------------------------------------------------- the command
def collectives_bench(args) -> tuple[dict | None, str]:
    """``scalegnn bench collectives``: (payload, Markdown) on rank 0 (or this process,
    which starts ``--nproc`` local ranks); (None, "") on the other ranks of a launched job."""
    from scalegnn.launch.environment import detect_env, init_from_env, launched_rank

    sizes, reps, requested, profile = _check_inputs(args)
    env = detect_env()
    launched = launched_rank(env)
    if not launched and args.nproc < 2:
        raise ValueError(f"--nproc {args.nproc}: a collective needs at least 2 ranks; give --nproc 2 or more (or "
                         "start the ranks with torchrun / srun)")
    machine_before = machine_info()
    if launched:
        import torch.distributed as dist

        backend = _local_backend(requested, env.local_world_size)
        owned = not dist.is_initialized()
        info = init_from_env(backend=backend, device="cuda" if backend == "nccl" else "cpu")
        try:
            measured = _measure(info.rank, info.world_size, sizes, reps, "cuda" if backend == "nccl" else "cpu")
        finally:
            if owned:
                dist.destroy_process_group()
        if measured is None:
            return None, ""
        world = info.world_size
    else:
        from scalegnn.launch.job import spawn

        world = args.nproc
        backend = _local_backend(requested, world)
        measured = spawn(_measure, world, sizes, reps, "cuda" if backend == "nccl" else "cpu",
                         timeout_s=_timeout_s(sizes, reps, world), backend=backend)[0]
    after = machine_info()["load_avg_1m"]
    return collectives_report(measured, sizes, reps, world, backend, profile, machine_before, after)


def collectives_report(measured: dict, sizes: list[int], reps: int, n: int, backend: str, profile,
                       machine: dict, load_after: float) -> tuple[dict, str]:
    """Payload and Markdown of rank 0's measurements (:func:`_measure`'s result): the
    per-op tables, the fits, the ``[network]`` snippet and the profile's comparison."""
    hosts = measured["hosts"]
    same_node = len(set(hosts)) == 1
    per_node = max(hosts.count(h) for h in set(hosts))
    device = measured["devices"][0].split(":")[0]
    ops, points, md_ops = {}, {op: [] for op in OPS}, []
    for op in OPS:
        rows, table = [], []
        for nbytes in sizes:
            ts = measured["times"][op][nbytes]
            med = statistics.median(ts)
            moved = algbw_bytes(op, nbytes, n)
            algbw = moved / med / 1e9
            busbw = algbw * bus_factor(op, n)
            rows.append({"bytes_per_rank": nbytes, "algbw_bytes": moved, "times_s": ts, "median_s": med,
                         "algbw_GBps": algbw, "busbw_GBps": busbw})
            points[op] += [(op, nbytes, t) for t in ts]
            cells = [_size_text(nbytes)] + ([_size_text(moved)] if op == "all_gather" else [])
            table.append(cells + [med * 1e3, algbw, busbw])
        ops[op] = rows
        header = ["size per rank"] + (["bytes gathered"] if op == "all_gather" else []) + \
                 ["median ms", "algbw GB/s", "busbw GB/s"]
        md_ops.append((op, markdown_table(header, table)))
    fits = {op: fit_ring(points[op], n) for op in OPS}
    fits["both"] = fit_ring(points["all_reduce"] + points["all_gather"], n)
    joint = fits["both"]

    key = "intra_node_GBps" if same_node else "inter_node_GBps"
    full = same_node and profile is not None and profile.network.intra_links == "full"
    links = (n - 1) if full else 1  # the model's ring of n devices of a fully connected node: n-1 pair links
    value_GBps = joint.beta_Bps / links / 1e9 if math.isfinite(joint.beta_Bps) else None
    where = f"{n} ranks on one node ({hosts[0]})" if same_node else \
        f"{n} ranks on {len(set(hosts))} nodes (up to {per_node} per node)"
    payload = {"bench": "collectives", "ranks": n, "hosts": hosts, "same_node": same_node, "ranks_per_node": per_node,
               "backend": backend, "device": device, "devices": measured["devices"],
               "device_names": measured["device_names"], "reps": reps, "sizes": sizes,
               "bus_factor": {op: bus_factor(op, n) for op in OPS}, "ops": ops,
               "fit": {k: f.to_dict() for k, f in fits.items()},
               "network": {"key": key, "value_GBps": value_GBps, "latency_us": joint.alpha_s * 1e6,
                           "pair_links_per_ring": links},
               "machine": machine, "load_avg_1m_after": load_after}

    names = f" ({', '.join(measured['device_names'])})" if device == "cuda" else ""
    md = (f"Collectives on {where}, {backend} on {device}{names}: median of "
          f"{reps} repetitions, each the slowest rank's time after a barrier; load average "
          f"{machine['load_avg_1m']} before, {load_after} after. algbw = bytes / time; busbw = algbw x "
          f"{bus_factor('all_reduce', n):.3g} (all-reduce, 2(n-1)/n) or x {bus_factor('all_gather', n):.3g} "
          "(all-gather, (n-1)/n).\n")
    for op, table in md_ops:
        what = "float32 sum, bytes per rank" if op == "all_reduce" else "each rank contributes the size; " \
            "algbw over all bytes gathered"
        md += f"\n{op} ({what}):\n\n{table}\n"
    fit_rows = [[k if k != "both" else "both ops (the model's constants)", f.alpha_s * 1e6,
                 f.beta_Bps / 1e9 if math.isfinite(f.beta_Bps) else "not resolved", f.residual, f.points]
                for k, f in fits.items()]
    md += ("\nFitted ring constants, t = steps x alpha + volume / beta (scalegnn.perfmodel.collective_cost's ring: "
           f"all-reduce 2(n-1) = {2 * (n - 1)} steps and 2(n-1)/n x M bytes, all-gather n-1 = {n - 1} step"
           f"{'s' if n > 2 else ''} and (n-1) x p bytes), "
           "least squares in relative error over every repetition:\n\n")
    md += markdown_table(["fit", "latency us", "bandwidth GB/s", "RMS rel. residual", "points"], fit_rows) + "\n"
    md += "\n" + _snippet(key, value_GBps, joint.alpha_s, where, f"{backend} on {device}", n, links, same_node) + "\n"
    if profile is not None:
        comparison, payload["profile"] = _compare(profile, fits, n, same_node, per_node, ops)
        md += "\n" + comparison + "\n"
    return payload, md


def _snippet(key: str, value_GBps: float | None, alpha_s: float, where: str, how: str, n: int, links: int,
             same_node: bool) -> str:
    """The ``[network]`` lines of the measured constants (``links``: the pair links of the
    model's ring, n-1 on a fully connected node of the compared profile, else 1)."""
    if value_GBps is None:  # the times did not grow with size: no bandwidth to paste, the latency still
        bandwidth = f"# {key}: not resolved (the times do not grow with size); rerun with larger --sizes, e.g. 1M,64M"
    else:
        note = f" (the ring's beta / {links}: intra_links = \"full\")" if links > 1 else ""
        bandwidth = f"{key} = {_sig(value_GBps)}   # {where}, {how}{note}"
    lines = ["To paste into the profile's [network] table (measured by scalegnn bench collectives):", "", "```toml",
             "[network]", bandwidth, f"latency_us = {_sig(alpha_s * 1e6)}", "```"]
    if value_GBps is not None and same_node and links == 1 and n > 2:
        lines += ["", f"With intra_links = \"full\" (each pair of the node's devices its own link), the model gives a "
                  f"ring of n devices n-1 links: use {key} = {_sig(value_GBps / (n - 1))}."]
    return "\n".join(lines)


def _compare(profile, fits: dict, n: int, same_node: bool, per_node: int, ops: dict) -> tuple[str, dict]:
    """The profile's constants as the model reads them for this ring (its bandwidth by
    :func:`scalegnn.perfmodel.axis_bandwidth` for n ranks, ``per_node`` to a node) beside
    the measured ones, and the model's time of each size against the measured median."""
    from scalegnn.perfmodel import Machine, axis_bandwidth, collective_cost

    machine = dataclasses.replace(Machine.from_profile(profile), gpus_per_node=per_node)
    model_beta, intra = axis_bandwidth((1, 1, 1, n), "z", machine)
    key = "intra_node_GBps" if same_node else "inter_node_GBps"
    joint = fits["both"]
    rows, data = [], {"name": profile.name, "key": key, "model_ring_GBps": model_beta / 1e9,
                      "latency_us": profile.network.latency_us, "model_intra_node": intra}

    def ratio_row(label, model, measured):
        ratio = measured / model if measured is not None and model > 0 else None
        flag = "" if ratio is None or LOW <= ratio <= HIGH else f"outside [{LOW:g}, {HIGH:g}] of the profile"
        rows.append([label, model, measured if measured is not None else "not resolved",
                     f"{ratio:.2f}" if ratio is not None else "-", flag])
        return ratio

    beta = joint.beta_Bps / 1e9 if math.isfinite(joint.beta_Bps) else None
    pairs = f" x {n - 1} pair link{'s' if n > 2 else ''} (intra_links = \"full\")"
    source = f"{key} = {getattr(profile.network, key):g}" + (pairs if intra and machine.intra_links == "full" else "")
    data["bandwidth_ratio"] = ratio_row(f"ring bandwidth GB/s ({source})", model_beta / 1e9, beta)
    data["latency_ratio"] = ratio_row("latency us (latency_us)", profile.network.latency_us, joint.alpha_s * 1e6)
    md = (f"Against profile {profile.name!r} (its [network] as scalegnn.perfmodel prices a ring of {n} ranks, "
          f"{per_node} per node: {'intra' if intra else 'inter'}-node), measured / profile:\n\n")
    md += markdown_table(["constant", "profile", "measured", "ratio", "check"], rows)
    times, table = {}, []
    for op in OPS:
        for row in ops[op]:
            bw, lat, algo = collective_cost(op, row["bytes_per_rank"], n, model_beta, machine.latency_s, machine.tree)
            ratio = row["median_s"] / (bw + lat)
            times.setdefault(op, []).append({"bytes_per_rank": row["bytes_per_rank"], "model_s": bw + lat,
                                             "algorithm": algo, "ratio": ratio})
            flag = "" if LOW <= ratio <= HIGH else f"outside [{LOW:g}, {HIGH:g}] of the profile"
            table.append([op, _size_text(row["bytes_per_rank"]), (bw + lat) * 1e3, row["median_s"] * 1e3,
                          f"{ratio:.2f}", flag])
    data["model_times"] = times
    md += ("\n\nThe model's time of each call with the profile's constants (collective_cost, the profile's "
           "tree choice) against the measured median:\n\n")
    md += markdown_table(["op", "size per rank", "profile model ms", "measured ms", "ratio", "check"], table)
    return md, data


def _sig(v: float) -> str:
    """Three significant digits, as a TOML number without an exponent where it reads better."""
    text = f"{float(f'{v:.3g}'):.6f}".rstrip("0").rstrip(".")
    return text if abs(v) >= 1e-3 else f"{v:.3g}"


def _size_text(nbytes: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"
