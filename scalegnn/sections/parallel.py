"""The ``parallel`` section: where and how many (read by :mod:`scalegnn.parallel.grid`,
:mod:`scalegnn.launch` and :mod:`scalegnn.device`), with the grid's shape arithmetic
(parse, format, the 3D grid chooser) and the device and backend names it checks."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..fileio import check_declared_size
from ..settings import setting
from ..threads import AUTO, thread_setting

__all__ = ["ParallelConfig", "AXES", "PMM_AXES", "DEVICES", "BACKENDS", "DEFAULT_COLLECTIVE_TIMEOUT_S",
           "check_device_spec", "parse_grid", "grid_flag", "format_grid", "cube_3d", "factorizations_3d"]

AXES = ("dp", "x", "y", "z")
PMM_AXES = ("x", "y", "z")
DEVICES = ("auto", "cpu", "cuda")
BACKENDS = ("auto", "gloo", "nccl")


def check_device_spec(spec: str) -> str:
    """``spec`` if it names a device this module understands ("auto", "cpu", "cuda",
    "cuda:N"); a one-line error naming the choices otherwise. Does not look at the
    hardware (configurations are validated before any process starts)."""
    text = str(spec).strip().lower()
    if text in DEVICES:
        return text
    if text.startswith("cuda:") and text[5:].isdigit():
        return text
    raise ValueError(f"--device must be one of auto, cpu, cuda or cuda:N (a GPU index), got {spec!r}")


def parse_grid(spec: str) -> tuple[int, int, int, int]:
    """``"1x2x2x2"`` -> ``(Gd, Gx, Gy, Gz)``; every factor a positive integer."""
    if not isinstance(spec, str):
        raise ValueError(f"grid must be a string like '1x2x2x2' (Gd x Gx x Gy x Gz), got {spec!r}")
    parts = re.split(r"[x,*X]", spec.strip())
    if len(parts) != 4:
        raise ValueError(
            f"grid {spec!r} must be GdxGxxGyxGz, 4 factors Gd x Gx x Gy x Gz, e.g. '1x2x2x2' (use 1 for unused "
            f"axes), got {len(parts)}"
        )
    out = []
    for name, p in zip(AXES, parts):
        if not p.strip().isdigit() or int(p) < 1:
            raise ValueError(f"grid {spec!r}: factor for axis {name} must be a positive integer, got {p!r}")
        out.append(int(p))
    return tuple(out)


def format_grid(grid) -> str:
    return "x".join(str(int(g)) for g in grid)


def factorizations_3d(g: int) -> list[tuple[int, int, int]]:
    """All ordered (Gx, Gy, Gz) with Gx * Gy * Gz = g."""
    if g < 1:
        raise ValueError(f"GPU count must be >= 1, got {g}")
    out = []
    for gx in range(1, g + 1):
        if g % gx:
            continue
        for gy in range(1, g // gx + 1):
            if (g // gx) % gy == 0:
                out.append((gx, gy, g // gx // gy))
    return out


def cube_3d(g: int) -> tuple[int, int, int]:
    """The grid chooser: the most cube-like (Gx, Gy, Gz) for g ranks (paper VII-C,
    following Agarwal et al. and Plexus), the factorization with the smallest max/min
    ratio, ties by the smallest sum of squares; the larger factors go to the slower
    axes (x, then y, then z), so that z and y groups, runs of consecutive ranks,
    stay inside a node longest."""
    best = min({tuple(sorted(f, reverse=True)) for f in factorizations_3d(g)},
               key=lambda f: (max(f) / min(f), sum(v * v for v in f)))
    return best


def grid_flag(text: str) -> tuple[int, int, int, int]:
    """``--grid``'s parser: :func:`parse_grid` with the flag's own message."""
    try:
        return parse_grid(text)
    except ValueError:
        raise ValueError(f"--grid must be GdxGxxGyxGz with four positive integers, e.g. 1x2x2x2; got {text!r}") \
            from None


DEFAULT_COLLECTIVE_TIMEOUT_S = 600.0
# The least memory of one local worker (--nproc): an interpreter with torch, whatever it trains (a worker of
# the smallest run here peaks at 0.4 GiB), so that a count no machine could start is refused before any spawn.
WORKER_BYTES = 64 << 20


@dataclass(kw_only=True)
class ParallelConfig:
    """Where and how many: the 4D grid, local worker processes, the device, the
    collective backend, the time after which a silent peer fails the run, and the
    threads of each process."""

    grid: tuple[int, int, int, int] = setting((1, 1, 1, 1), type=grid_flag, render=format_grid,
                                              metavar="GdxGxxGyxGz",
                                              help="4D process grid GdxGxxGyxGz (data parallel x 3D PMM; the "
                                              "compared systems: Gdx1x1x1, data parallel only)")
    nproc: int | None = setting(None, help="spawn this many local worker processes (without --grid: Nx1x1x1, data "
                                "parallel; fullgraph-3d: a 3D grid); without it, a multi-rank grid expects to be "
                                "started by torchrun, srun or submitit")
    device: str = setting("auto", metavar="{auto,cpu,cuda,cuda:N}",
                          help="where to compute: auto takes the local rank's GPU when CUDA or ROCm is visible, "
                          "else the CPU")
    backend: str = setting("auto", choices=BACKENDS,
                           help="torch.distributed backend: auto follows the device (NCCL/RCCL for GPUs, gloo for "
                           "CPU); gloo with GPUs lets several ranks share one GPU (tests)")
    collective_timeout_s: float = setting(DEFAULT_COLLECTIVE_TIMEOUT_S, flag="--collective-timeout",
                                          metavar="SECONDS", help="a collective that waits longer (a rank died or "
                                          "hangs) fails the run")
    threads: int | str = setting(AUTO, type=thread_setting, metavar="auto|N",
                                 help="intra-op threads of each process: auto takes the cores that are free now "
                                 "(affinity, CPU quota, other processes' load), shared among the run's ranks on "
                                 "the node, at most OMP_NUM_THREADS if set; N: exactly N (scalegnn.threads)")

    def __post_init__(self):
        self.grid = parse_grid(self.grid) if isinstance(self.grid, str) else tuple(int(g) for g in self.grid)
        if len(self.grid) != 4 or min(self.grid) < 1:
            raise ValueError(f"grid must be four positive sizes (Gd, Gx, Gy, Gz), got {self.grid}")
        if self.nproc is not None and self.nproc < 1:
            raise ValueError(f"--nproc must be >= 1, got {self.nproc}")
        if self.nproc is not None:
            check_declared_size(f"--nproc {self.nproc}", "the local workers (64 MiB each at the least)", self.nproc,
                                WORKER_BYTES, fix="start fewer workers, or the ranks under torchrun or srun")
        self.device = check_device_spec(self.device)
        if self.backend not in BACKENDS:
            raise ValueError(f"--backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        if self.backend == "nccl" and self.device == "cpu":
            raise ValueError("--backend nccl needs GPU tensors but --device is cpu; use --backend gloo or "
                             "--device cuda")
        self.threads = thread_setting(self.threads)
        if not self.collective_timeout_s > 0:
            raise ValueError(f"--collective-timeout must be > 0 seconds, got {self.collective_timeout_s}")

    @property
    def world_size(self) -> int:
        return self.grid[0] * self.grid[1] * self.grid[2] * self.grid[3]
