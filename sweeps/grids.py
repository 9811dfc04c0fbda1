"""Grid policies: which 4D grid ``(Gd, Gx, Gy, Gz)`` a sweep uses for a GPU count.

    cube       Gd = 1 and the most cube-like Gx x Gy x Gz
               (:func:`scalegnn.parallel.grid.cube_3d`, paper VII-C)
    scale-dp   the paper's strong scaling (Fig. 7/8): the ``cube`` grid at the
               smallest GPU count of the list (Gd = 1), then the same 3D grid with
               Gd = G / G_min data-parallel replicas.
    dp         pure data parallelism, Gd = G (the baselines' layout).
    all-3d     every ordered factorization with Gd = 1 (the performance model's
               candidates, Plexus Fig. 5).
    explicit   a list of "GdxGxxGyxGz" strings in the spec.
"""

from __future__ import annotations

from scalegnn.sections.parallel import cube_3d, factorizations_3d, parse_grid

__all__ = ["grids_for", "all_4d", "POLICIES"]

POLICIES = ("cube", "scale-dp", "dp", "all-3d")


def grids_for(policy, gpus: list[int]) -> dict[int, list[tuple[int, int, int, int]]]:
    """{G: [grids]} for the GPU counts ``gpus`` under ``policy`` (a name or a list of grid strings)."""
    gpus = sorted(int(g) for g in gpus)
    if not gpus:
        raise ValueError("a sweep experiment needs at least one GPU count")
    if isinstance(policy, (list, tuple)):
        out: dict[int, list] = {}
        for spec in policy:
            grid = parse_grid(spec)
            world = grid[0] * grid[1] * grid[2] * grid[3]
            if world in gpus:
                out.setdefault(world, []).append(grid)
        missing = [g for g in gpus if g not in out]
        if missing:
            raise ValueError(f"explicit grids {list(policy)} give no grid for GPU counts {missing}")
        return out
    if policy == "cube":
        return {g: [(1, *cube_3d(g))] for g in gpus}
    if policy == "dp":
        return {g: [(g, 1, 1, 1)] for g in gpus}
    if policy == "all-3d":
        return {g: [(1, *f) for f in factorizations_3d(g)] for g in gpus}
    if policy == "scale-dp":
        base = gpus[0]
        bad = [g for g in gpus if g % base]
        if bad:
            raise ValueError(f"grid policy scale-dp grows Gd from the smallest count {base}; "
                             f"GPU counts {bad} are not multiples of it")
        cube = cube_3d(base)
        return {g: [(g // base, *cube)] for g in gpus}
    raise ValueError(f"unknown grid policy {policy!r}; use one of {POLICIES} or a list of grids like ['1x2x2x2']")


def all_4d(g: int) -> list[tuple[int, int, int, int]]:
    """Every (Gd, Gx, Gy, Gz) with product g (for ``scalegnn plan``)."""
    out = []
    for gd in range(1, g + 1):
        if g % gd == 0:
            out.extend((gd, *f) for f in factorizations_3d(g // gd))
    return out

