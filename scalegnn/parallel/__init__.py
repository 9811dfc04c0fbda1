"""4D parallel ScaleGNN (paper IV): the process grid, collectives with accounting,
3D-PMM operators, sharding, communication-free distributed sampling, the parallel
model and engine, and process launch.

    grid.py          ProcessGrid (axes dp, x, y, z), parse_grid, the grid chooser
    collectives.py   all_reduce / all_gather_uneven over named axes, CommStats
    layout.py        the layer-rotation table and row/column block ranges
    pmm.py           sharded SpMM / GEMM / reshard / RMSNorm / losses (autograd)
    sharding.py      per-rank shards, save_shards / load_shard / shard_command
    dist_sampling.py DistributedSampler (Algorithm 2, no collectives)
    model.py         ParallelScaleGNN (shards of the serial ScaleGNN)
    engine.py        ParallelEngine: the one engine, every grid (1x1x1x1 included), every device
    launch.py        init_from_env, spawn, run_distributed_training
"""

from .grid import ProcessGrid, parse_grid

__all__ = ["ProcessGrid", "parse_grid"]
