"""The losses (scalegnn/parallel/losses.py): the accuracy the loss computes from its own
collectives (first maximum, as torch.argmax, ties across class shards included) equals
parallel_accuracy_counts' and the serial count; the loss and its gradient equal the
serial ones; 3 calls for cross-entropy, 2 for BCE."""

from __future__ import annotations

import pytest
import torch

from scalegnn.launch.job import spawn
from scalegnn.parallel.collectives import CommStats
from scalegnn.parallel.grid import ProcessGrid


# ----------------------------------------------------------------------------- the loss carries the accuracy
def _loss_worker(rank, world, shape, num_classes, multilabel, compiled=None):
    from scalegnn._compiled import CompiledKernels
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
    pc = ParallelContext(grid, stats, fused=CompiledKernels(compiled) if compiled else None)
    if multilabel:
        loss, count, acc = parallel_bce(logits, y, mask, pc, "x", "z", num_classes, accuracy=True)
    else:
        loss, count, acc = parallel_cross_entropy(logits, y, mask, pc, "x", "z", c0, accuracy=True)
    calls = dict(stats.calls)
    loss.backward()
    ref = parallel_accuracy_counts(logits.detach(), y, [mask], ParallelContext(grid), "x", "z", c0, multilabel)
    return {"loss": float(loss.detach()), "count": int(count), "acc": acc, "ref": ref, "calls": calls,
            "grad": logits.grad, "block": (r0, r1, c0, c1), "full": full, "y": y_full, "mask": mask_full}


@pytest.mark.parametrize("compiled", [None, "aot_eager"], ids=["eager", "compiled phases"])
@pytest.mark.parametrize("num_classes,multilabel", [(5, False), (1, False), (4, True)],
                         ids=["5 classes", "1 class (a rank without classes)", "multi-label"])
def test_loss_returns_the_accuracy_counts_of_parallel_accuracy_counts(num_classes, multilabel, compiled):
    """The accuracy the loss computes from its own collectives (first maximum, as
    torch.argmax, ties across class shards included) equals parallel_accuracy_counts'
    and the serial count; the loss and its gradient equal the serial ones; 3 calls for
    cross-entropy (max and sum over the classes, sum over the rows), 2 for BCE. The same
    with the ``--compile`` phases (scalegnn._compiled, traced by Dynamo and AOTAutograd)."""
    results = spawn(_loss_worker, 4, (1, 2, 1, 2), num_classes, multilabel, compiled, timeout_s=180)
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


def test_inductor_compiled_cross_entropy_equals_the_eager_one():
    """The cross-entropy's phases compiled by inductor (C++ kernels here; Triton on a
    GPU) give the eager loss, count, accuracy counts and gradient on a block with ties at
    the maximum and unlabeled rows, with no labeled row (L = 0, zero gradient) too."""
    from scalegnn._compiled import CompiledKernels
    from scalegnn.parallel.context import ParallelContext
    from scalegnn.parallel.losses import parallel_cross_entropy

    gen = torch.Generator().manual_seed(4)
    logits = torch.randint(0, 3, (41, 6), generator=gen).float()
    y = torch.randint(-1, 6, (41,), generator=gen)
    for mask in (torch.rand(41, generator=gen) < 0.6, torch.zeros(41, dtype=torch.bool)):
        mask &= y >= 0
        outs = []
        for fused in (None, CompiledKernels("inductor")):
            leaf = logits.clone().requires_grad_()
            loss, count, acc = parallel_cross_entropy(leaf * 1, y, mask, ParallelContext(ProcessGrid.single(),
                                                      fused=fused), "x", "z", 0, accuracy=True)
            loss.backward()
            outs.append((loss.detach(), count, acc, leaf.grad))
        (l0, c0, a0, g0), (l1, c1, a1, g1) = outs
        assert torch.equal(c0, c1) and torch.equal(a0, a1)
        torch.testing.assert_close(l1, l0, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(g1, g0, rtol=1e-6, atol=1e-7)
        if not mask.any():
            assert float(l1) == 0.0 and not g1.any()
