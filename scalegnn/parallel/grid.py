"""The 4D process grid ``G = Gd x Gx x Gy x Gz`` (paper IV) and its named axes.

One :class:`ProcessGrid` is built once per process from the grid shape and the
already-initialized ``torch.distributed`` world, then passed explicitly to every
parallel component (no module-level process-group globals, no
``group=None`` fallbacks).

Axes ("axis" is a grid axis, "dim" a tensor dimension):

    dp  data parallel: groups hold the whole graph and model, see different batches
    x, y, z  the three axes of 3D parallel matrix multiplication (paper IV-C)

Rank order: ``dp`` slowest, then ``x``, ``y``, ``z`` fastest::

    rank = ((d * Gx + x) * Gy + y) * Gz + z

so the ``Gx*Gy*Gz`` ranks of one data-parallel group are contiguous and a ``z``
group is a run of consecutive ranks (on a GPU cluster, consecutive ranks share a
node, which keeps the most frequent 3D-PMM all-reduces intra-node).
"""

from __future__ import annotations

import itertools

import torch.distributed as dist

# The grid's shape arithmetic and the parallel section, declared where no torch loads (scalegnn.sections)
from ..sections.parallel import (AXES, DEFAULT_COLLECTIVE_TIMEOUT_S, PMM_AXES, ParallelConfig, cube_3d,
                                 factorizations_3d, format_grid, grid_flag, parse_grid)


__all__ = ["AXES", "PMM_AXES", "ProcessGrid", "ParallelConfig", "DEFAULT_COLLECTIVE_TIMEOUT_S", "parse_grid",
           "grid_flag", "format_grid", "cube_3d", "factorizations_3d",
           "third_axis"]


def third_axis(a: str, b: str) -> str:
    """The 3D-PMM axis that is neither ``a`` nor ``b``."""
    (t,) = [ax for ax in PMM_AXES if ax not in (a, b)]
    return t


def _world_timeout():
    """The collective timeout of the initialized world group (None: torch's default)."""
    import torch

    for device in ("cpu", "cuda"):
        try:
            pg = dist.distributed_c10d._get_default_group()
            return pg._get_backend(torch.device(device)).options._timeout
        except Exception:  # noqa: BLE001 - private API; an NCCL-only world has no CPU backend
            continue
    return None


class ProcessGrid:
    """Owns this rank's coordinates and one process group per axis.

    Build it with :meth:`ProcessGrid.__init__` after ``torch.distributed`` is
    initialized (every rank must construct it, in the same program order, because
    ``new_group`` is collective over the world), with :meth:`single` for one
    process without ``torch.distributed``, or with :meth:`virtual` for the
    coordinates of any rank without process groups (planning, communication-free
    code such as sharding and sampling, tests). ``rank``/``world_size`` are used
    only by those two; a distributed grid reads them from ``torch.distributed``.

    Every axis group is created on every rank in the same order (torch requires
    it), including groups of size 1; a rank keeps only the groups it belongs to.
    Collectives over an axis of size 1 short-circuit in
    :mod:`scalegnn.parallel.collectives` and never touch the group.
    """

    def __init__(self, dp: int, x: int, y: int, z: int, *, rank: int | None = None,
                 world_size: int | None = None, backend: str | None = None, _groups: bool = True):
        shape = dict(zip(AXES, (dp, x, y, z)))
        for ax, size in shape.items():
            if not isinstance(size, int) or size < 1:
                raise ValueError(f"grid axis {ax} must be a positive integer, got {size!r}")
        if _groups:
            if not dist.is_available() or not dist.is_initialized():
                raise RuntimeError(
                    "ProcessGrid needs torch.distributed to be initialized first "
                    "(scalegnn.launch.environment.init_from_env or a local job), or use ProcessGrid.single() for one process"
                )
            rank, world_size = dist.get_rank(), dist.get_world_size()
        else:
            rank, world_size = (0, 1) if rank is None else (rank, world_size)
        product = dp * x * y * z
        if product != world_size:
            raise ValueError(
                f"grid {dp}x{x}x{y}x{z} has Gd*Gx*Gy*Gz = {product} ranks but the world size is {world_size}; "
                f"choose a grid whose product equals {world_size} (e.g. 1x1x1x{world_size}) "
                f"or launch {product} processes"
            )
        self.shape: dict[str, int] = shape
        self.rank = rank
        self.world_size = world_size
        self.coords: dict[str, int] = dict(zip(AXES, self.coords_of(rank)))
        self._groups: dict[str, object] = {}
        self._has_groups = _groups
        self._backend = backend  # of the axis groups (the tensors' device backend); None: the world's
        self._group_ranks: dict[str, list[int]] = {}
        for ax in AXES:
            self._group_ranks[ax] = self._ranks_along(ax, self.coords)
        if _groups:
            # Axis groups inherit the world group's collective timeout (torch would give
            # them its 30-minute default): a dead or silent peer fails every collective
            # after the timeout the launcher chose (RunConfig.collective_timeout_s).
            timeout = _world_timeout()
            # Every rank creates every group, in one fixed order: axis, then the
            # lexicographic order of the other coordinates.
            for ax in AXES:
                others = [o for o in AXES if o != ax]
                for fixed in itertools.product(*(range(shape[o]) for o in others)):
                    coord = dict(zip(others, fixed))
                    ranks = self._ranks_along(ax, coord)
                    group = dist.new_group(ranks=ranks, timeout=timeout, backend=backend)
                    if self.rank in ranks:
                        self._groups[ax] = group
        else:
            self._groups = {ax: None for ax in AXES}

    @classmethod
    def single(cls) -> "ProcessGrid":
        """The 1x1x1x1 grid of a single process; needs no ``torch.distributed``.

        Its groups are ``None``: every collective short-circuits on axes of size 1.
        """
        return cls(1, 1, 1, 1, rank=0, world_size=1, _groups=False)

    @classmethod
    def virtual(cls, dp: int, x: int, y: int, z: int, rank: int) -> "ProcessGrid":
        """Coordinates of ``rank`` in a grid, with no process groups: for planning and
        for communication-free code (sharding, sampling) in one process. Any
        collective over an axis of size > 1 on it fails."""
        if not 0 <= rank < dp * x * y * z:
            raise ValueError(f"rank {rank} is outside the grid {dp}x{x}x{y}x{z}")
        return cls(dp, x, y, z, rank=rank, world_size=dp * x * y * z, _groups=False)

    @classmethod
    def from_spec(cls, spec: str) -> "ProcessGrid":
        """Build from ``"GdxGxxGyxGz"`` on the initialized world (or single() if 1x1x1x1 and no world)."""
        shape = parse_grid(spec)
        if shape == (1, 1, 1, 1) and not (dist.is_available() and dist.is_initialized()):
            return cls.single()
        return cls(*shape)

    # ----------------------------------------------------------- coordinates
    def rank_of(self, dp: int, x: int, y: int, z: int) -> int:
        s = self.shape
        return ((dp * s["x"] + x) * s["y"] + y) * s["z"] + z

    def coords_of(self, rank: int) -> tuple[int, int, int, int]:
        s = self.shape
        rank, z = divmod(rank, s["z"])
        rank, y = divmod(rank, s["y"])
        dp, x = divmod(rank, s["x"])
        return dp, x, y, z

    def _ranks_along(self, ax: str, coord: dict) -> list[int]:
        ranks = []
        for i in range(self.shape[ax]):
            c = {**coord, ax: i}
            ranks.append(self.rank_of(c["dp"], c["x"], c["y"], c["z"]))
        return ranks

    def axis_size(self, ax: str) -> int:
        self._check_axis(ax)
        return self.shape[ax]

    def axis_index(self, ax: str) -> int:
        self._check_axis(ax)
        return self.coords[ax]

    def group(self, ax: str):
        """The process group of this rank's ``ax`` line (None only for single/virtual grids)."""
        self._check_axis(ax)
        return self._groups[ax]

    def group_ranks(self, ax: str) -> list[int]:
        """Global ranks of this rank's ``ax`` group, ordered by their ``ax`` index."""
        self._check_axis(ax)
        return list(self._group_ranks[ax])

    @property
    def mp_size(self) -> int:
        """Ranks per data-parallel group: Gx * Gy * Gz."""
        return self.shape["x"] * self.shape["y"] * self.shape["z"]

    @property
    def mp_rank(self) -> int:
        """This rank's index inside its data-parallel group (x, y, z order)."""
        return self.rank % self.mp_size

    @property
    def shape_tuple(self) -> tuple[int, int, int, int]:
        return tuple(self.shape[a] for a in AXES)

    @property
    def distributed(self) -> bool:
        """False for :meth:`single` and :meth:`virtual` grids (no process groups)."""
        return self._has_groups

    @property
    def backend(self) -> str:
        """The backend of the axis groups' collectives ("gloo", "nccl"), or "none" for
        :meth:`single`."""
        if not self.distributed:
            return "none"
        return self._backend or str(dist.get_backend())

    def device_mesh(self, device_type: str):
        """This grid as a ``torch.distributed.device_mesh.DeviceMesh`` with dims
        ("dp", "x", "y", "z") over the same process groups (none is created), for
        code that speaks DTensor / torchtitan. ``device_type``: "cpu" or "cuda".

        Why the grid is not *built* with ``init_device_mesh``: its one-split-per-axis
        path needs an NCCL world bound to a GPU and its subgroup timeouts go through
        backend options, while this constructor gives every axis group the run's
        collective timeout on any backend and torch version, and an NCCL world bound
        to its GPU (:func:`scalegnn.launch.environment.init_process_group`) already makes
        ``new_group`` split the world communicator."""
        import torch
        from torch.distributed.device_mesh import DeviceMesh

        if not self.distributed:
            raise ValueError("a DeviceMesh needs an initialized torch.distributed world; this grid has no groups")
        layout = torch.arange(self.world_size).view(*(self.shape[a] for a in AXES))
        return DeviceMesh.from_group([self._groups[a] for a in AXES], device_type, mesh=layout, mesh_dim_names=AXES)

    def gather_object(self, obj) -> list:
        """A picklable object from every rank, in rank order, on every rank (world group)."""
        if not self.distributed:
            return [obj]
        out = [None] * self.world_size
        dist.all_gather_object(out, obj, group=dist.group.WORLD)
        return out

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier(group=dist.group.WORLD)

    def spec(self) -> str:
        return "x".join(str(self.shape[a]) for a in AXES)

    @staticmethod
    def _check_axis(ax: str) -> None:
        if ax not in AXES:
            raise ValueError(f"unknown grid axis {ax!r}; the axes are {AXES}")

    def __repr__(self) -> str:
        c = ",".join(f"{a}={self.coords[a]}" for a in AXES)
        return f"ProcessGrid({self.spec()}, rank={self.rank}, {c})"
