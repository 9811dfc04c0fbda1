"""The memory-lean full-graph evaluation (``ParallelScaleGNN.evaluate_logits``) against
the evaluation it replaces (the training forward in eval mode on the full batch) and
the serial reference.

Its logits must EQUAL the forward's bit for bit on the CPU: the same operators on row
chunks of the same blocks, per-row kernels, and all-reduces with at most two members
on every grid here (a two-term float sum does not depend on the order). Chunk sizes of 2 and 3
rows make every block run in several chunks with a short last one, and the default
size runs each block in one. The pieces held between layers must be 1/G_t of the block.
"""

from __future__ import annotations

import pytest
import torch

from scalegnn.device import resolve_device
from scalegnn.model import ModelConfig
from scalegnn.numerics import NumericsConfig
from scalegnn.optim import OptimConfig
from scalegnn.parallel.engine import ParallelEngine
from scalegnn.parallel.grid import ProcessGrid
from scalegnn.launch.job import spawn
from scalegnn.parallel.products import row_chunks
from tests.devices import DEVICES
from tests.graphs import nprocs, parallel_graph
from tests.reference import SerialReference

pytestmark = pytest.mark.distributed

STEPS = 2
ROW_BYTES = 4 * 8  # float32 rows of hidden 8: chunk_bytes = k * ROW_BYTES gives k-row chunks
CHUNKS = (2 * ROW_BYTES, 3 * ROW_BYTES, None)  # None: the engine's default (one chunk per block here)

RUNS = [
    dict(name="residual+norm L3", graph=dict(seed=0), model=ModelConfig(hidden=8, layers=3, dropout=0.2)),
    dict(name="plain L4", graph=dict(seed=1), model=ModelConfig(hidden=8, layers=4, dropout=0.0, norm=False,
                                                                residual=False)),
    dict(name="residual, no norm, L2, sparse features", graph=dict(seed=4, f=23, sparse=True),
         model=ModelConfig(hidden=8, layers=2, dropout=0.1, norm=False)),
    dict(name="multilabel L1", graph=dict(seed=2, multilabel=True), model=ModelConfig(hidden=8, layers=1)),
]
DOUBLE = [
    dict(name="double permutation L3", graph=dict(seed=3), model=ModelConfig(hidden=8, layers=3, residual=False),
         numerics=NumericsConfig(permute="double")),
    dict(name="double permutation L2 norm off", graph=dict(seed=5),
         model=ModelConfig(hidden=8, layers=2, residual=False, norm=False), numerics=NumericsConfig(permute="double")),
]


def _eval_worker(rank, world, shape, runs, device="cpu"):
    grid = ProcessGrid(*shape)
    out = []
    for run in runs:
        graph = parallel_graph(**run["graph"])
        eng = ParallelEngine(graph, run["model"], OptimConfig(lr=1e-2), 11, seed=7, grid=grid,
                             numerics=run.get("numerics"), device=resolve_device(device, rank))
        for step in range(STEPS):
            eng.train_step(step)
        batch = eng.sampler.full_batch()
        eng.model.eval()
        with torch.no_grad():
            before = eng.model(batch, eng._eval_pc)  # the evaluation before issue L's lean one
        lean = {cb: (eng.model.evaluate_logits(batch, eng._eval_pc) if cb is None else
                     eng.model.evaluate_logits(batch, eng._eval_pc, chunk_bytes=cb)) for cb in CHUNKS}
        head = eng.model.head
        out.append({"before": before.cpu(), "lean": {k: v.cpu() for k, v in lean.items()},
                    "eval": eng.evaluate().as_dict(), "device": str(before.device),
                    "rows": batch.rows.block(head.row_axis), "classes": eng.model.class_range,
                    "double": batch.alt is not None})
        eng.close()
    return out


def _serial(run):
    graph = parallel_graph(**run["graph"])
    ref = SerialReference(graph, run["model"], OptimConfig(lr=1e-2), 11, seed=7, epochs=1)
    for step in range(STEPS):
        ref.train_step(step)
    adj = graph.to_torch_csr()
    ref.model.eval()
    with torch.no_grad():
        logits = ref.model(adj, adj.t().to_sparse_csr(), ref.sampler.features)
    return logits, ref.evaluate().as_dict()


def _check(results, runs, serial=True, exact=True):
    """Lean == before on every rank (``exact=False``: up to float rounding, for axes of
    three members, whose all-reduce order depends on an element's place in the buffer,
    and on a GPU);
    with one data-parallel group (the serial reference trains one sample a step) both
    equal the serial logits and accuracies."""
    for i, run in enumerate(runs):
        ref_logits, ref_eval = _serial(run) if serial else (None, None)
        evals = []
        for rank, res in enumerate(r[i] for r in results):
            name = (run["name"], rank)
            for cb, logits in res["lean"].items():
                assert logits.shape == res["before"].shape, (name, cb)
                if exact:
                    assert torch.equal(logits, res["before"]), (name, cb, (logits - res["before"]).abs().max())
                else:
                    torch.testing.assert_close(logits, res["before"], atol=1e-6, rtol=1e-5)
            if serial:
                (r0, r1), (c0, c1) = res["rows"], res["classes"]
                torch.testing.assert_close(res["before"], ref_logits[r0:r1, c0:c1], atol=1e-5, rtol=1e-4,
                                           msg=lambda m: f"{name}: {m}")
                for split, acc in ref_eval.items():
                    assert res["eval"][split] == pytest.approx(acc, abs=1e-12), (name, split)
            evals.append(res["eval"])
        assert all(e == evals[0] for e in evals), run["name"]  # identical on every rank and dp group


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (1, 2, 1, 1), (1, 2, 2, 1), (1, 2, 2, 2), (2, 1, 2, 1),
                                   (1, 1, 1, 2)])
def test_lean_evaluation_equals_the_forward_and_the_serial_reference(shape, device):
    results = spawn(_eval_worker, nprocs(shape), shape, RUNS, device, timeout_s=300)
    assert all(res["device"].startswith(device) for rank in results for res in rank)
    # A GPU library may pick another kernel for another number of rows: equal up to rounding there.
    _check(results, RUNS, serial=shape[0] == 1, exact=device == "cpu")


UNEVEN = [
    dict(name="3x2 uneven, residual+norm L4", graph=dict(seed=6), model=ModelConfig(hidden=10, layers=4)),
    dict(name="hidden 2 < Gx: empty hidden blocks, L3", graph=dict(seed=7), model=ModelConfig(hidden=2, layers=3)),
]


@pytest.mark.parametrize("shape", [(1, 3, 2, 1), (1, 3, 1, 2)])
def test_lean_evaluation_on_axes_of_three_and_empty_blocks(shape):
    """Axis sizes 3 divide none of N = 37, H = 10 or the pieces; H = 2 < Gx = 3 leaves
    ranks with no hidden columns (empty pieces and chunks), which must still work."""
    results = spawn(_eval_worker, nprocs(shape), shape, UNEVEN, timeout_s=300)
    _check(results, UNEVEN, exact=False)


@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (1, 2, 2, 2)])
def test_lean_evaluation_equals_the_forward_with_double_permutation(shape):
    """Layers alternate between the two labelings; the pieces follow the output rows."""
    results = spawn(_eval_worker, nprocs(shape), shape, DOUBLE, timeout_s=300)
    assert all(res["double"] for rank in results for res in rank)
    _check(results, DOUBLE, serial=False)


def test_chunks_cover_a_block_once():
    for n in (0, 1, 2, 5, 7, 8, 37):
        for rows in (1, 2, 3, 4, 100):
            ch = row_chunks(n, rows)
            assert [r for c in ch for r in range(*c)] == list(range(n))
            assert all(r1 - r0 >= 2 for r0, r1 in ch) or n < 2  # no one-row product (its rounding differs)
