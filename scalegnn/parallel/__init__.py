"""4D parallel ScaleGNN (paper IV): the process grid, collectives with accounting,
3D-PMM operators, sharding, communication-free distributed sampling, the parallel
model and engine. Launching the processes is not here: :mod:`scalegnn.launch` starts
them and runs each rank (``launch``, ``environment.init_from_env``, ``job.spawn``).

The parallel core, lowest first (each imports only the ones above it and the
foundations; never an application module such as scalegnn.model or scalegnn.sampling):

    grid.py          ProcessGrid (axes dp, x, y, z), parse_grid, the grid chooser
    collectives.py   all_reduce / all_gather_uneven over named axes, CommStats
    layout.py        the layer-rotation table and row/column block ranges
    context.py       ParallelContext: grid, accounting, timers, wire dtypes, the
                     deferred (bucketed) weight-gradient reductions
    products.py      sharded SpMM / GEMM (autograd), reshard, the evaluation's row pieces
    tail.py          RMSNorm + ReLU + dropout + residual of a sharded block (V-C)
    losses.py        cross-entropy / BCE over class-sharded logits, argmax, accuracy counts

Above the application components (model, sampling, optim, loop, ...), in order:

    sharding.py      RankShard, the per-rank shard, and cutting it from a graph in memory
    dist_sampling.py DistributedSampler (Algorithm 2, no collectives)
    model.py         ParallelScaleGNN (shards of the serial ScaleGNN)
    step_graph.py    a training step captured as a CUDA graph and replayed (--cuda-graphs)
    engine.py        ParallelEngine: the one engine, every grid (1x1x1x1 included), every device

Shard files on disk, written in memory or out of core and mapped by each rank, are the
package above these, :mod:`scalegnn.shards`. tests/harness/test_architecture.py holds
these floors.

Gradient convention of the operators (products, tail, losses). A matrix laid out on
(a, b) is replicated along the third axis. Every operator returns *complete*
gradients: after its backward, each replica of an input block holds the full gradient
of that block (identical on all replicas), never a partial sum. The all-reduces that
make this true follow from the forward by the chain rule (paper III-C, Eqs. 13-19;
:mod:`~scalegnn.parallel.products` derives them for the 3D PMM). Operators whose
replicas consume a replicated value *differently* (RMSNorm's row sum of squares: each
replica uses it for its own columns) need an all-reduce in backward as well; operators
whose replicas consume it identically (the cross-entropy's log-sum-exp: every class
replica computes the same row loss) do not. Each backward states which case it is.
The one exception is asked for by name: a weight gradient left partial (``defer_dw``,
an RMSNorm gain under bucketing) for the reduction of
:class:`~scalegnn.parallel.context.ParallelContext`.
"""

from .grid import ProcessGrid, parse_grid

__all__ = ["ProcessGrid", "parse_grid"]
