"""Fewer, larger collectives (issue L item 6): ``bucketed_all_reduce``, the weight-gradient
buckets of :class:`ParallelContext`, the loss that carries the batch accuracy, the
one-call clip norm, and the calls they save, counted per step and recorded.

Exactness. A bucket sums every element with the same operands as the separate calls;
over an axis of 2 ranks the sum is a + b, commutative, so bucketed training equals
unbucketed training bit for bit on grids whose axes have at most 2 ranks (the tests
use ``torch.equal``). Over 3 ranks a chunked ring may add in another order: float32
rounding (checked to 1e-6). The bucketed clip norm sums the same float64 squares in
another order (one world all-reduce): weights equal to 1e-9, where a wrong norm (a
group counted twice) moves them by ~lr.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict

import pytest
import torch

from scalegnn.launch.job import spawn
from scalegnn.model import ModelConfig
from scalegnn.numerics import NumericsConfig
from scalegnn.optim import OptimConfig
from scalegnn.parallel.collectives import CommStats, all_reduce, bucketed_all_reduce
from scalegnn.parallel.grid import ProcessGrid
from scalegnn.perf import PerfConfig
from tests.graphs import nprocs, parallel_graph


pytestmark = pytest.mark.distributed


# ----------------------------------------------------------------------------- collectives, closed form
def _closed_form_worker(rank, world, shape):
    grid = ProcessGrid(*shape)
    out = {}
    for axis in ("x", "y", "z"):
        i = grid.axis_index(axis)
        stats = CommStats(timing=False)
        a = torch.full((4, 3), float(i + 1))
        b = torch.arange(5, dtype=torch.float32) * (i + 1)
        empty = torch.empty(0)
        assert bucketed_all_reduce([(a, f"pmm_{axis}"), (b, "norm"), (empty, "norm")], grid, axis, stats) is None
        hi = torch.full((2,), float(i + 1), dtype=torch.float64)
        bucketed_all_reduce([(hi, "loss"), (hi.clone(), "loss")], grid, axis, stats, op="max")
        out[axis] = {"a": a, "b": b, "max": hi, "bytes": dict(stats.bytes), "calls": dict(stats.calls)}
    # Asynchronous, BF16 wire for 3D-PMM kinds (small integers: exact in BF16).
    stats = CommStats(timing=False)
    i = grid.axis_index("x")
    a, b = torch.full((3, 2), float(i + 1)), torch.full((7,), float(2 * i))
    handle = bucketed_all_reduce([(a, "pmm_x"), (b, "pmm_x")], grid, "x", stats, comm_dtype=torch.bfloat16,
                                 async_op=True)
    handle.wait()
    out["bf16"] = {"a": a, "b": b, "bytes": dict(stats.bytes), "calls": dict(stats.calls)}
    # Against separate calls: random members, the same every run.
    gen = torch.Generator().manual_seed(rank)
    members = [torch.randn(n, generator=gen) for n in (17, 1, 64)]
    for axis in ("x", "y"):
        sep = [m.clone() for m in members]
        for m in sep:
            all_reduce(m, grid, axis, None, "norm")
        buck = [m.clone() for m in members]
        bucketed_all_reduce([(m, "norm") for m in buck], grid, axis, None)
        out[f"vs_{axis}"] = (sep, buck)
    # Bad buckets fail on every rank before any communication.
    errors = []
    for bad in ([(torch.ones(2), "norm")], [(torch.ones(2), "pmm_x"), (torch.ones(2, dtype=torch.float64), "pmm_x")]):
        try:
            bucketed_all_reduce(bad, grid, "x", None, comm_dtype=torch.bfloat16 if len(bad) == 1 else None)
        except ValueError as exc:
            errors.append(str(exc))
    out["errors"] = errors
    out["sizes"] = {ax: grid.axis_size(ax) for ax in ("x", "y", "z")}
    return out


def test_bucketed_all_reduce_closed_form_accounting_and_errors():
    """Rank-valued members (axis index + 1): every member holds the closed-form sum (max)
    after one call; bytes per member kind, one call under the kind with most bytes;
    nothing over an axis of size 1; BF16 only for 3D-PMM kinds; one dtype a bucket."""
    for res in spawn(_closed_form_worker, 6, (1, 3, 2, 1), timeout_s=120):
        for axis, n in res["sizes"].items():
            r, tri = res[axis], n * (n + 1) / 2
            assert torch.equal(r["a"], torch.full((4, 3), tri)), axis
            assert torch.equal(r["b"], torch.arange(5, dtype=torch.float32) * tri), axis
            assert torch.equal(r["max"], torch.full((2,), float(n), dtype=torch.float64)), axis
            if n == 1:
                assert r["bytes"] == {} and r["calls"] == {}
            else:  # 48 bytes of pmm, 20 of norm: the call counts under pmm_<axis>; the max bucket under loss
                assert r["bytes"] == {f"pmm_{axis}": 48, "norm": 20, "loss": 32}, axis
                assert r["calls"] == {f"pmm_{axis}": 1, "loss": 1}, axis
        bf = res["bf16"]
        assert torch.equal(bf["a"], torch.full((3, 2), 6.0)) and torch.equal(bf["b"], torch.full((7,), 6.0))
        assert bf["bytes"] == {"pmm_x": 13 * 2} and bf["calls"] == {"pmm_x": 1}
        sep, buck = res["vs_y"]  # 2 ranks: a + b, bit for bit
        assert all(torch.equal(s, b) for s, b in zip(sep, buck))
        sep, buck = res["vs_x"]  # 3 ranks: the ring may add in another order
        for s, b in zip(sep, buck):
            torch.testing.assert_close(b, s, rtol=1e-6, atol=1e-6)
        assert len(res["errors"]) == 2
        assert "only for 3D-PMM partial sums" in res["errors"][0] and "one dtype" in res["errors"][1]


# ----------------------------------------------------------------------------- the loss carries the accuracy
def _loss_worker(rank, world, shape, num_classes, multilabel):
    from scalegnn.parallel.layout import col_bounds
    from scalegnn.parallel.context import ParallelContext
    from scalegnn.parallel.losses import parallel_accuracy_counts, parallel_bce, parallel_cross_entropy
    from scalegnn.ranges import split_range

    grid = ProcessGrid(*shape)
    gen = torch.Generator().manual_seed(0)
    rows = 29
    full = torch.randint(0, 3, (rows, num_classes), generator=gen).float()  # integers: many ties at the max
    if multilabel:
        y_full = (torch.rand(rows, num_classes, generator=gen) < 0.4).float()
    else:
        y_full = torch.randint(-1, num_classes, (rows,), generator=gen)
    mask_full = torch.rand(rows, generator=gen) < 0.7  # the loss's rows: labeled ones (as training vertices are)
    if not multilabel:
        mask_full &= y_full >= 0
    r0, r1 = split_range(rows, grid.axis_size("x"), grid.axis_index("x"))
    cb = col_bounds(num_classes, grid, "z")
    c0, c1 = cb[grid.axis_index("z")], cb[grid.axis_index("z") + 1]
    logits = full[r0:r1, c0:c1].clone().requires_grad_()
    y = y_full[r0:r1, c0:c1] if multilabel else y_full[r0:r1]
    mask = mask_full[r0:r1]
    stats = CommStats(timing=False)
    pc = ParallelContext(grid, stats)
    if multilabel:
        loss, count, acc = parallel_bce(logits, y, mask, pc, "x", "z", num_classes, accuracy=True)
    else:
        loss, count, acc = parallel_cross_entropy(logits, y, mask, pc, "x", "z", c0, accuracy=True)
    calls = dict(stats.calls)
    loss.backward()
    ref = parallel_accuracy_counts(logits.detach(), y, [mask], ParallelContext(grid), "x", "z", c0, multilabel)
    return {"loss": float(loss.detach()), "count": int(count), "acc": acc, "ref": ref, "calls": calls,
            "grad": logits.grad, "block": (r0, r1, c0, c1), "full": full, "y": y_full, "mask": mask_full}


@pytest.mark.parametrize("num_classes,multilabel", [(5, False), (1, False), (4, True)],
                         ids=["5 classes", "1 class (a rank without classes)", "multi-label"])
def test_loss_returns_the_accuracy_counts_of_parallel_accuracy_counts(num_classes, multilabel):
    """The accuracy the loss computes from its own collectives (first maximum, as
    torch.argmax, ties across class shards included) equals parallel_accuracy_counts'
    and the serial count; the loss and its gradient equal the serial ones; 3 calls for
    cross-entropy (max and sum over the classes, sum over the rows), 2 for BCE."""
    results = spawn(_loss_worker, 4, (1, 2, 1, 2), num_classes, multilabel, timeout_s=120)
    first = results[0]
    full = first["full"].clone().requires_grad_()
    keep = first["mask"]
    if multilabel:
        per = torch.nn.functional.binary_cross_entropy_with_logits(full, first["y"], reduction="none")
        ref_loss = per[keep].sum() / (keep.sum() * num_classes)
        pred, truth = full.detach() > 0, first["y"] > 0.5
        tp = (pred & truth & keep[:, None]).sum()
        wrong = (pred & ~truth & keep[:, None]).sum() + (~pred & truth & keep[:, None]).sum()
        ref_acc = [float(2 * tp), float(2 * tp + wrong)]
    else:
        y = first["y"]
        keep_acc = keep & (y >= 0)
        assert bool((y < 0).any()) and torch.equal(keep_acc, keep)  # unlabeled rows exist, outside the mask
        ref_loss = torch.nn.functional.cross_entropy(full[keep], y[keep], reduction="sum") / keep.sum()
        ref_acc = [float(((full.detach().argmax(-1) == y) & keep_acc).sum()), float(keep_acc.sum())]
    ref_loss.backward()
    for res in results:
        assert torch.equal(res["acc"], res["ref"])
        assert res["acc"].tolist() == ref_acc
        assert res["loss"] == pytest.approx(float(ref_loss.detach()), rel=1e-5)
        r0, r1, c0, c1 = res["block"]
        torch.testing.assert_close(res["grad"], full.grad[r0:r1, c0:c1], rtol=1e-6, atol=1e-7)
        assert res["calls"] == ({"loss": 2} if multilabel else {"loss": 3})
    if not multilabel and num_classes > 1:  # the test can fail: ties were there to break
        top = first["full"].max(-1, keepdim=True).values
        assert ((first["full"] == top).sum(-1) > 1).any()


# ----------------------------------------------------------------------------- the engine, bucketed vs not
def expected_calls_saved(shape, layers: int, norm: bool, bf16: bool, clip: bool) -> int:
    """Calls a step saves with buckets, from the layout table (DESIGN section 3), not
    from the code: each weight gradient is summed over the axis along which its shard is
    replicated and H's rows differ, each RMSNorm gain over its layer output's row axis;
    gradients sharing (axis, wire dtype) go in one call. The clip norm: one call over
    the world instead of one per 3D axis with several ranks (when two or more have)."""
    size = dict(zip(("dp", "x", "y", "z"), shape))
    dw_axis = ("z", "y", "x")  # layer l mod 3: W on (y,x) / (x,z) / (z,y), H rows on z / y / x
    out_row = ("z", "y", "x")  # layer l mod 3: output on (z,x) / (y,z) / (x,y)
    members = defaultdict(int)

    def add(axis, pmm):
        if size[axis] > 1:
            members[(axis, "bf16" if pmm and bf16 else "fp32")] += 1

    add("x", True)  # W_in on (z, y), input rows on x (Eq. 18)
    for layer in range(layers):
        add(dw_axis[layer % 3], True)
        if norm:
            add(out_row[layer % 3], False)
    add(out_row[(layers - 1) % 3] if layers else "x", True)  # W_out: head rows = the last output's rows
    saved = sum(m - 1 for m in members.values())
    spread = sum(size[a] > 1 for a in ("x", "y", "z"))
    if clip and spread > 1:
        saved += spread - 1
    return saved


_HIDDEN, _BATCH, _STEPS = 10, 23, 3
_HIDDEN, _BATCH, _STEPS = 10, 23, 3
_HIDDEN, _BATCH, _STEPS = 10, 23, 3
VARIANTS = {  # name: (graph kwargs, model, optim, switches: perf and numerics settings)
    "plain": ({}, ModelConfig(hidden=_HIDDEN, layers=3, dropout=0.3), OptimConfig(lr=1e-2), {}),
    "overlap": ({}, ModelConfig(hidden=_HIDDEN, layers=3, dropout=0.3), OptimConfig(lr=1e-2),
                {"comm_overlap": True}),
    "sparse input grad": ({"sparse": True, "f": 40}, ModelConfig(hidden=_HIDDEN, layers=2, dropout=0.0),
                          OptimConfig(lr=1e-2, sparse_input_update="on"), {}),
    "sparse + overlap": ({"sparse": True, "f": 40}, ModelConfig(hidden=_HIDDEN, layers=3, dropout=0.0),
                         OptimConfig(lr=1e-2, sparse_input_update="on"), {"comm_overlap": True}),
    "bf16 L4": ({}, ModelConfig(hidden=_HIDDEN, layers=4, dropout=0.2), OptimConfig(lr=1e-2),
                {"comm_dtype": "bf16"}),
    "bf16 + overlap": ({}, ModelConfig(hidden=_HIDDEN, layers=3, dropout=0.2), OptimConfig(lr=1e-2),
                       {"comm_dtype": "bf16", "comm_overlap": True}),
    "no norm": ({}, ModelConfig(hidden=_HIDDEN, layers=2, dropout=0.0, norm=False), OptimConfig(lr=1e-2), {}),
    "clip + overlap": ({}, ModelConfig(hidden=_HIDDEN, layers=3, dropout=0.3),
                       OptimConfig(lr=1e-2, grad_clip=0.05), {"comm_overlap": True}),
}


def _engine_pair_worker(rank, world, shape, names):
    from scalegnn.parallel.engine import ParallelEngine

    grid = ProcessGrid(*shape)
    out = {}
    for name in names:
        gkw, model, optim, switches = VARIANTS[name]
        numeric = {f.name for f in dataclasses.fields(NumericsConfig)}
        perf = {k: v for k, v in switches.items() if k not in numeric}
        numerics = NumericsConfig(**{k: v for k, v in switches.items() if k in numeric})
        for bucket in (False, True):
            eng = ParallelEngine(parallel_graph(seed=1, **gkw), model, optim, _BATCH, seed=0, epochs=2, grid=grid,
                                 perf=PerfConfig(bucket_collectives=bucket, **perf), numerics=numerics)
            eng.train_step(0)
            eng.reset_counters()
            steps = [eng.train_step(s) for s in range(1, _STEPS + 1)]
            _, nbytes, calls = eng.counters()
            out[(name, bucket)] = {"steps": [r.stats.tolist() for r in steps],
                                   "params": {k: v["value"] for k, v in eng.parameters_for_test().items()},
                                   "bytes": nbytes, "calls": calls, "sparse": eng.sparse_input_update}
            eng.close()
    return out


def _check_pairs(results, shape, names, exact: bool):
    for res in results:
        for name in names:
            off, on = res[(name, False)], res[(name, True)]
            _, model, optim, switches = VARIANTS[name]
            clip = optim.grad_clip is not None
            if name.startswith("sparse"):
                assert on["sparse"] and off["sparse"]
            if exact and not clip:
                assert on["steps"] == off["steps"], name
                assert all(torch.equal(on["params"][k], v) for k, v in off["params"].items()), name
            else:
                tol = dict(rtol=0, atol=1e-9) if exact else dict(rtol=1e-5, atol=1e-6)
                torch.testing.assert_close(torch.tensor(on["steps"]), torch.tensor(off["steps"]), **tol)
                for k, v in off["params"].items():
                    torch.testing.assert_close(on["params"][k], v, **tol, msg=lambda m: f"{name} {k} {m}")
            # Same bytes per kind (the clip norm: 8 bytes in one call instead of 8 per axis).
            spread = sum(s > 1 for s in shape[1:])
            for kind, nbytes in off["bytes"].items():
                want = 8 * _STEPS if kind == "clip" and spread > 1 else nbytes
                assert on["bytes"][kind] == want, (name, kind)
            saved = expected_calls_saved(shape, model.layers, model.norm, switches.get("comm_dtype") == "bf16",
                                         clip)
            assert saved > 0, name
            assert sum(off["calls"].values()) - sum(on["calls"].values()) == saved * _STEPS, name
            # The loss and the batch accuracy: 3 calls a step where rows and classes are both split.
            assert on["calls"]["loss"] == off["calls"]["loss"] <= 3 * _STEPS


def test_bucketed_training_equals_unbucketed_bit_for_bit_1x2x2x2():
    """8 ranks, every axis of 2 ranks: bucketed steps (losses, accuracy counts) and
    weights equal the unbucketed ones bit for bit, with overlap on and off, row-sparse
    input gradients, BF16 partial sums (L = 4: two RMSNorm gains share a bucket) and no
    norm; with clipping to 1e-9. Bytes per kind are unchanged and the calls per step fall
    by what the layout table predicts."""
    shape = (1, 2, 2, 2)
    names = list(VARIANTS)
    results = spawn(_engine_pair_worker, nprocs(shape), shape, names, timeout_s=600)
    _check_pairs(results, shape, names, exact=True)


@pytest.mark.parametrize("shape", [(2, 2, 1, 2), (1, 3, 2, 1)], ids=["2x2x1x2", "1x3x2x1"])
def test_bucketed_training_with_data_parallel_and_a_three_rank_axis(shape):
    """Data parallel (the clip norm's world all-reduce counts group 0 alone): bit for bit
    but the clip; an axis of 3 ranks: float32 rounding."""
    names = ["overlap", "sparse + overlap", "clip + overlap"]
    results = spawn(_engine_pair_worker, nprocs(shape), shape, names, timeout_s=600)
    _check_pairs(results, shape, names, exact=max(shape[1:]) <= 2)


# ----------------------------------------------------------------------------- fused tail: deferred dg
def _fused_worker(rank, world, shape):
    from scalegnn.parallel.dist_sampling import DistributedSampler
    from scalegnn.parallel.context import ParallelContext
    from scalegnn.parallel.losses import parallel_cross_entropy
    from scalegnn.parallel.model import ParallelScaleGNN
    from scalegnn.parallel.sharding import build_rank_shard
    from scalegnn.parallel.tail import norm_relu_dropout

    grid = ProcessGrid(*shape)
    graph = parallel_graph(seed=2)
    cfg = ModelConfig(hidden=_HIDDEN, layers=4, dropout=0.3)
    batch = DistributedSampler(build_rank_shard(graph, grid), grid, _BATCH, seed=1).sample(0)
    out = {}
    for fused in (None, norm_relu_dropout):
        for overlap, bucket in ((False, False), (False, True), (True, True)):
            model = ParallelScaleGNN(graph.num_features, graph.num_classes, cfg, grid, seed=3).train()
            pc = ParallelContext(grid, CommStats(timing=False), fused=fused, overlap=overlap, bucket=bucket)
            if pc.defers_weight_grads:
                model.defer_weight_grad_sync(pc)
            logits = model(batch, pc, 5, 0)
            head = model.head
            loss, _ = parallel_cross_entropy(logits, batch.y[head.row_axis], batch.train_mask[head.row_axis], pc,
                                             head.row_axis, head.class_axis, model.class_range[0])
            loss.backward()
            pc.wait_pending()
            out[(fused is not None, overlap, bucket)] = {n: p.grad.clone() for n, p in model.named_parameters()}
    return out


def test_deferred_norm_gradients_in_the_fused_and_unfused_tails():
    """RMSNorm gains' gradients left partial by the fused (torch function) and the
    unfused (numba kernel) tails and reduced in buckets equal the in-backward reduction,
    bit for bit, on 8 ranks; with asynchronous buckets too."""
    for res in spawn(_fused_worker, 8, (1, 2, 2, 2), timeout_s=180):
        for fused in (False, True):
            base = res[(fused, False, False)]
            for key in ((fused, False, True), (fused, True, True)):
                assert all(torch.equal(res[key][n], g) for n, g in base.items()), key


def test_reset_counters_restores_the_calls_of_a_partial_epoch():
    """A checkpoint's partial epoch gives its calls back with its bytes (one process: no
    collective adds to them)."""
    from scalegnn.parallel.engine import ParallelEngine

    eng = ParallelEngine(parallel_graph(), ModelConfig(hidden=4, layers=1), OptimConfig(), 8)
    eng.reset_counters({"spmm": 1.0}, {"pmm_x": 10}, {"pmm_x": 2})
    eng.train_step(0)
    _, nbytes, calls = eng.counters()
    assert nbytes == {"pmm_x": 10} and calls == {"pmm_x": 2}
    eng.reset_counters()
    assert eng.counters()[1:] == ({}, {})
    eng.close()
