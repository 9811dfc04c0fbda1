"""The optimizer (scalegnn/optim.py): the fused AdamW and the lazy row-sparse AdamW
(``--sparse-input-update``).

What is held, and how strictly: the lazy update (compiled kernel and torch path alike)
equals a straightforward whole-tensor reference of the same rule bit for bit; it is
AdamW on a row touched at every step and SparseAdam's moments on the others (close, not
equal: those implementations round differently); dense gradients take the fused AdamW
bit for bit, and the optimizer state round-trips. The engine with the setting on is in
tests/parallel/test_engine.py.
"""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
import torch

from scalegnn import optim as so
from scalegnn.optim import OptimConfig, make_optimizer
from scalegnn.rowsparse import row_sparse_grad


# ----------------------------------------------------------------------------- the update rule
def _reference_rule(p, m, v, t, touched, g_dense, lr, b1, b2, eps, wd):
    """The rule of scalegnn.optim written over whole tensors with a row mask, for
    clarity: every row computed, the untouched ones put back."""
    f = torch.float32
    bc1, bc2 = 1 - b1 ** t, 1 - b2 ** t
    if wd:
        p = p * torch.tensor(1 - lr * wd, dtype=f)
    m_new = m * torch.tensor(b1, dtype=f) + g_dense * torch.tensor(1 - b1, dtype=f)
    v_new = v * torch.tensor(b2, dtype=f) + (g_dense * g_dense) * torch.tensor(1 - b2, dtype=f)
    root = torch.from_numpy(np.sqrt(v_new.numpy()))  # IEEE float32 sqrt (torch's CPU one may be an ulp off)
    denom = root / torch.tensor(math.sqrt(bc2), dtype=f) + torch.tensor(eps, dtype=f)
    p_new = p - (m_new / denom) * torch.tensor(lr / bc1, dtype=f)
    keep = touched[:, None]
    return torch.where(keep, p_new, p), torch.where(keep, m_new, m), torch.where(keep, v_new, v)


def _touch_pattern(steps, rows, seed):
    gen = torch.Generator().manual_seed(seed)
    return [torch.rand(rows, generator=gen) < 0.4 for _ in range(steps)]


@pytest.mark.parametrize("wd", [0.0, 0.05])
@pytest.mark.parametrize("kernel", [False, True], ids=["torch", "compiled"])
def test_lazy_update_equals_the_reference_rule_bit_for_bit(kernel, wd):
    if kernel and not so._HAVE_NUMBA:
        pytest.skip("numba is not installed")
    F, H, steps, lr, b1, b2, eps = 23, 7, 25, 3e-2, 0.9, 0.999, 1e-8
    gen = torch.Generator().manual_seed(0)
    p = torch.randn(F, H, generator=gen)
    state = {"step": torch.zeros(()), "exp_avg": torch.zeros(F, H), "exp_avg_sq": torch.zeros(F, H)}
    rp, rm, rv, t = p.clone(), torch.zeros(F, H), torch.zeros(F, H), 0
    skips = {7, 8}
    for s, touched in enumerate(_touch_pattern(steps, F, 1)):
        rows = touched.nonzero().squeeze(1)
        vals = torch.randn(rows.numel(), H, generator=gen) * 10.0 ** float(torch.randint(-4, 1, (), generator=gen))
        found_inf = torch.tensor(1.0 if s in skips else 0.0)
        so.lazy_adamw_rows_(p, row_sparse_grad(rows, vals, (F, H)), state, lr=lr, betas=(b1, b2), eps=eps,
                            weight_decay=wd, found_inf=found_inf, kernel=kernel)
        if s not in skips:
            t += 1
            g_dense = torch.zeros(F, H).index_copy_(0, rows, vals)
            rp, rm, rv = _reference_rule(rp, rm, rv, t, touched, g_dense, lr, b1, b2, eps, wd)
        assert float(state["step"]) == t
        assert torch.equal(p, rp) and torch.equal(state["exp_avg"], rm) and torch.equal(state["exp_avg_sq"], rv), s


def test_the_torch_path_without_host_reads_equals_the_host_path():
    """The branch a GPU takes (step count, constants and skip flag stay tensors, no host
    read) computes the CPU branch's numbers."""
    F, H = 11, 4
    gen = torch.Generator().manual_seed(3)
    p0 = torch.randn(F, H, generator=gen)
    results = []
    for host in (True, False):
        p = p0.clone()
        state = {"step": torch.zeros(()), "exp_avg": torch.zeros(F, H), "exp_avg_sq": torch.zeros(F, H)}
        g2 = torch.Generator().manual_seed(4)
        for s in range(6):
            rows = torch.tensor([1, 4, 5, 9]) if s % 2 else torch.tensor([0, 4])
            grad = row_sparse_grad(rows, torch.randn(rows.numel(), H, generator=g2), (F, H))
            so.lazy_adamw_rows_(p, grad, state, lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1,
                                found_inf=torch.tensor(1.0 if s == 3 else 0.0), kernel=False, host=host)
        results.append((p, state))
    (p1, s1), (p2, s2) = results
    # pow of a tensor vs the host's pow: the float32 constants may differ in the last bit
    torch.testing.assert_close(p1, p2, rtol=1e-6, atol=1e-7)
    assert torch.equal(s1["exp_avg_sq"], s2["exp_avg_sq"])  # the moments do not use the constants
    assert torch.equal(s1["exp_avg"], s2["exp_avg"])
    assert float(s1["step"]) == float(s2["step"]) == 5


def test_a_row_touched_every_step_follows_adamw_and_the_others_sparse_adams_moments():
    F, H = 9, 5
    gen = torch.Generator().manual_seed(5)
    w0 = torch.randn(F, H, generator=gen)
    # every row touched: AdamW itself (torch's reference implementation, fused=False)
    lazy = torch.nn.Parameter(w0.clone())
    ref = torch.nn.Parameter(w0.clone())
    opt_l = so.RowSparseAdamW([lazy], lr=1e-2, weight_decay=0.02)
    opt_r = torch.optim.AdamW([ref], lr=1e-2, weight_decay=0.02, fused=False)
    for _ in range(20):
        g = torch.randn(F, H, generator=gen)
        lazy.grad = row_sparse_grad(torch.arange(F), g.clone(), (F, H))
        ref.grad = g.clone()
        opt_l.step()
        opt_r.step()
    torch.testing.assert_close(lazy.detach(), ref.detach(), rtol=1e-5, atol=1e-6)
    # some rows: torch.optim.SparseAdam (no weight decay; eps placed differently, hence close)
    lazy = torch.nn.Parameter(w0.clone())
    ref = torch.nn.Parameter(w0.clone())
    opt_l = so.RowSparseAdamW([lazy], lr=1e-2, weight_decay=0.0)
    opt_r = torch.optim.SparseAdam([ref], lr=1e-2)
    for touched in _touch_pattern(20, F, 6):
        rows = touched.nonzero().squeeze(1)
        vals = torch.randn(rows.numel(), H, generator=gen)
        lazy.grad = row_sparse_grad(rows, vals.clone(), (F, H))
        ref.grad = row_sparse_grad(rows, vals.clone(), (F, H))
        opt_l.step()
        opt_r.step()
    torch.testing.assert_close(lazy.detach(), ref.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(opt_l.state[lazy]["exp_avg"], opt_r.state[ref]["exp_avg"])


def test_dense_gradients_take_the_fused_adamw_bit_for_bit_and_the_state_round_trips():
    gen = torch.Generator().manual_seed(7)
    w0, b0 = torch.randn(8, 3, generator=gen), torch.randn(3, generator=gen)
    grads = [(torch.randn(8, 3, generator=gen), torch.randn(3, generator=gen), torch.rand(8, generator=gen) < 0.5)
             for _ in range(10)]

    def run(kind, steps, state=None):
        w, b = torch.nn.Parameter(w0.clone()), torch.nn.Parameter(b0.clone())
        opt = kind([w, b], lr=1e-2, weight_decay=0.01, fused=True)
        if state is not None:
            w.data.copy_(state["w"])
            b.data.copy_(state["b"])
            buf = io.BytesIO()
            torch.save(state["opt"], buf)
            buf.seek(0)
            opt.load_state_dict(torch.load(buf, weights_only=True))
        for gw, gb, touched in steps:
            rows = touched.nonzero().squeeze(1)
            w.grad = row_sparse_grad(rows, gw[rows], w.shape) if kind is so.RowSparseAdamW else gw.clone()
            b.grad = gb.clone()
            opt.step()
        return w.detach(), b.detach(), opt

    # bias's dense gradient: the fused AdamW itself, bit for bit
    _, b_lazy, _ = run(so.RowSparseAdamW, grads)
    _, b_fused, _ = run(torch.optim.AdamW, grads)
    assert torch.equal(b_lazy, b_fused)
    # state_dict round trip: 4 steps, save, load into a fresh optimizer, 6 more == 10 steps
    w_all, b_all, _ = run(so.RowSparseAdamW, grads)
    w4, b4, opt4 = run(so.RowSparseAdamW, grads[:4])
    w_res, b_res, _ = run(so.RowSparseAdamW, grads[4:], {"w": w4, "b": b4, "opt": opt4.state_dict()})
    assert torch.equal(w_res, w_all) and torch.equal(b_res, b_all)


def test_the_setting_is_validated_and_resolved():
    with pytest.raises(ValueError, match="sparse_input_update must be one of auto, on, off"):
        OptimConfig(sparse_input_update="lazy")
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    assert so.use_sparse_input_update("auto", True, cpu) == so._HAVE_NUMBA
    assert not so.use_sparse_input_update("auto", True, gpu)
    assert so.use_sparse_input_update("on", True, gpu) and not so.use_sparse_input_update("on", False, cpu)
    assert not so.use_sparse_input_update("off", True, cpu)
    assert OptimConfig().sparse_input_update == "off"  # the default: dense AdamW, as before
    opt, _ = make_optimizer([torch.nn.Parameter(torch.ones(2))], OptimConfig(), 10)
    assert type(opt) is torch.optim.AdamW and opt.defaults["fused"]
