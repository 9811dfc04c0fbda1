"""Paper V switches and the sampler kernels: each leaves the trained result unchanged.

Bit-identical where the arithmetic is identical:
  * sampler kernels (numba / vectorized torch, tagged map / binary search, int32 /
    int64 ids) produce the same CSR pair, entry for entry, value for value;
  * the sample draw is the same with and without numba;
  * prefetching (background thread) and communication overlap (asynchronous
    all-reduces of the same partial sums) give the same losses and weights;
  * BF16 + overlap + prefetch equals BF16 alone.
Within a stated tolerance where it is not:
  * BF16 3D-PMM communication: relative rounding 2^-8 per partial sum, losses within
    5e-2 over 4 steps (as tests/test_parallel_engine.py); its PMM bytes halve exactly;
  * fusion (``compile``): the fused RMSNorm + ReLU + dropout's backward is autograd's
    instead of the hand-written one, a float32 reordering: weights within 1e-5.
    Tests compile with the "aot_eager" backend (the same graphs without inductor's
    code generation, seconds instead of a minute); ``scalegnn bench ablation`` runs inductor.
Timings are never asserted.
"""

from __future__ import annotations

import collections
import threading

import pytest
import torch

from scalegnn import _numba, _sampling_kernel
from scalegnn import sampling as S
from scalegnn.model import ModelConfig
from scalegnn.numerics import NumericsConfig
from scalegnn.optim import OptimConfig
from scalegnn.parallel.engine import COMPONENTS
from scalegnn.perf import PerfConfig, Prefetcher
from scalegnn.timing import SpanTimer
from tests.devices import needs_gpu
from tests.reference import SerialReference
from tests.graphs import parallel_graph
from tests.graphs import random_graph

needs_numba = pytest.mark.skipif(not _sampling_kernel.available(), reason="numba not installed")


def _same_csr(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in ((a.crow_indices(), b.crow_indices()),
                                             (a.col_indices(), b.col_indices()), (a.values(), b.values())))


# ------------------------------------------------------------------------------ sampler kernels
@needs_numba
@pytest.mark.parametrize("batch", [2, 150, 300])
def test_sampler_kernels_agree_bit_for_bit(batch):
    g = random_graph(n=300, m=3000, seed=batch)
    sample = S.sample_vertices(300, batch, seed=1, step=batch)
    p = S.inclusion_probability(300, batch)
    for rows in ((0, 300), (0, 120), (120, 300)):
        for cols in ((0, 300), (0, 77), (77, 211), (211, 300)):
            blk = S.CSRBlock.from_graph(g, rows, cols)
            assert blk.indices.dtype == torch.int32
            blk64 = S.CSRBlock(blk.indptr, blk.indices.long(), blk.values, *rows, *cols)
            ref = S.extract_block(blk, sample, p, backend="torch")  # binary search
            outs = [S.extract_block(blk, sample, p, S.CompactIndexMap(cols[1] - cols[0], cols[0]), backend="torch"),
                    S.extract_block(blk, sample, p, backend="numba"),
                    S.extract_block(blk64, sample, p, backend="numba"),
                    S.extract_block(blk64, sample, p, backend="torch")]
            for out in outs:
                assert _same_csr(out.adj, ref.adj) and _same_csr(out.adj_t, ref.adj_t), (rows, cols)
                assert (out.row_offset, out.col_offset) == (ref.row_offset, ref.col_offset)
            dense = ref.adj.to_dense()
            assert torch.equal(ref.adj_t.to_dense(), dense.T)


@needs_numba
@pytest.mark.parametrize("threads", [2, 3, 5])
def test_multithreaded_kernel_equals_one_thread_and_torch(threads, monkeypatch):
    """Rows split into ranges of equal work, scanned and scattered on several threads:
    the same CSR and transpose, entry for entry, as one thread and the torch path
    (the threshold is lowered so a small graph splits), and no thread is left behind."""
    import threading

    monkeypatch.setattr(_sampling_kernel, "PARALLEL_MIN_NNZ", 1)
    g = random_graph(n=400, m=6000, seed=threads)
    sample = S.sample_vertices(400, 170, seed=2, step=threads)
    p = S.inclusion_probability(400, 170)
    before = threading.active_count()
    for rows, cols in (((0, 400), (0, 400)), ((0, 250), (90, 400))):
        blk = S.CSRBlock.from_graph(g, rows, cols)
        r_lo, r_hi, c_lo, c_hi = torch.searchsorted(sample, torch.tensor([*rows, *cols])).tolist()
        args = (blk.indptr, blk.indices, blk.values, sample[r_lo:r_hi] - rows[0], sample[c_lo:c_hi], cols[0],
                cols[1], r_lo - c_lo, p)
        one = _sampling_kernel.extract(*args, threads=1)
        many = _sampling_kernel.extract(*args, threads=threads)
        assert all(torch.equal(a, b) for a, b in zip(one, many))
        assert len(_sampling_kernel._row_chunks(_sampling_kernel._row_work_kernel(blk.indptr.numpy(), args[3].numpy()),
                                           threads)) > 1
        ref = S.extract_block(blk, sample, p, backend="torch")
        assert torch.equal(many[0], ref.adj.crow_indices()) and torch.equal(many[1], ref.adj.col_indices())
        assert torch.equal(many[2], ref.adj.values()) and torch.equal(many[4], ref.adj_t.col_indices())
        assert torch.equal(many[3], ref.adj_t.crow_indices()) and torch.equal(many[5], ref.adj_t.values())
    assert threading.active_count() == before


def test_keyed_extraction_handles_two_labelings():
    """Double permutation: rows in sigma ids, columns in ids; self loops found by vertex.
    The block equals the serial rescaled sampled matrix with its rows reordered."""
    from scalegnn.parallel.sharding import double_permuted
    from scalegnn.permutation import double_sigma

    g = random_graph(n=120, m=700, seed=3)
    sigma = double_sigma(120, seed=5)
    rows_relabeled, cols_relabeled = double_permuted(g, sigma)
    sample = S.sample_vertices(120, 40, seed=2, step=1)
    p = S.inclusion_probability(120, 40)
    ref = S.extract_block(S.CSRBlock.from_graph(g), sample, p).adj.to_dense()
    alt = torch.sort(sigma[sample]).values
    ids = torch.argsort(sigma)[alt]  # vertex of every sigma id
    order = torch.searchsorted(sample, ids)  # row of ref for every row of the sigma-ordered block
    backends = ["torch"] + (["numba"] if _sampling_kernel.available() else [])
    for backend in backends:
        a = S.extract_block(S.CSRBlock.from_graph(rows_relabeled), alt, p, backend=backend, col_sample=sample,
                            keys=(ids, sample)).adj.to_dense()
        assert torch.equal(a, ref[order])
        b = S.extract_block(S.CSRBlock.from_graph(cols_relabeled), sample, p, backend=backend, col_sample=alt,
                            keys=(sample, ids)).adj.to_dense()
        assert torch.equal(b, ref[:, order])


def test_sample_draw_is_uniform_and_independent_of_numba(monkeypatch):
    # Every 2-subset of 5 vertices equally likely: 4000 draws, 10 subsets, each count
    # within 5 standard deviations of 400 (deterministic seeds, so never flaky).
    counts = collections.Counter(tuple(S.sample_vertices(5, 2, 0, step).tolist()) for step in range(4000))
    assert len(counts) == 10 and all(abs(c - 400) < 5 * (400 * 0.9) ** 0.5 for c in counts.values())
    for n, b in [(10, 7), (1000, 999), (70000, 5000), (70000, 60000)]:  # complement path for B > N/2 too
        s = S.sample_vertices(n, b, 3, 4)
        assert s.numel() == b and torch.equal(s, torch.unique(s))
    big = S.sample_vertices(200000, 20000, 1, 2)
    monkeypatch.setattr(_numba, "_HAVE_NUMBA", False)
    assert torch.equal(big, S.sample_vertices(200000, 20000, 1, 2))


def test_torch_fallback_without_numba(monkeypatch):
    g = random_graph(n=200, m=1500)
    blk = S.CSRBlock.from_graph(g)
    sample = S.sample_vertices(200, 60, 0, 0)
    ref = S.extract_block(blk, sample, 0.3, backend="torch")
    monkeypatch.setattr(_numba, "_HAVE_NUMBA", False)
    monkeypatch.setattr(S, "NUMBA_MIN_NNZ", 0)  # "auto" would pick numba for this block
    assert _same_csr(S.extract_block(blk, sample, 0.3).adj, ref.adj)
    with pytest.raises(ValueError, match="pip install numba"):
        S.extract_block(blk, sample, 0.3, backend="numba")
    with pytest.raises(ValueError, match="sampler backend"):
        S.extract_block(blk, sample, 0.3, backend="cuda")


# ------------------------------------------------------------------------------ prefetch
def test_prefetcher_order_errors_and_shutdown():
    seen = []

    def produce(step):
        seen.append((step, threading.current_thread().name))
        if step == 7:
            raise RuntimeError("boom at 7")
        return step * 10

    before = threading.active_count()
    pf = Prefetcher(produce)
    assert [pf.get(s) for s in range(4)] == [0, 10, 20, 30]
    assert pf.get(5) == 50  # a jump: the prefetched step 4 is dropped, 5 produced now
    assert any(name == "scalegnn-prefetch" for _, name in seen)
    pf.get(6)  # prefetches 7, which fails in the thread ...
    with pytest.raises(RuntimeError, match="boom at 7"):
        pf.get(7)  # ... and the consumer sees it
    pf.close()
    pf.close()  # idempotent
    assert not pf.alive and threading.active_count() == before
    with pytest.raises(RuntimeError, match="closed"):
        pf.get(8)


def test_single_process_prefetch_gives_identical_training_and_leaves_no_thread(tmp_path):
    from scalegnn.config import make_config
    from scalegnn.launch import launch

    before = {t.ident for t in threading.enumerate()}
    base = dict(dataset="csbm:n=400,avg_degree=6,classes=3,feature_dim=8", batch_ratio=0.3, epochs=2,
                out_dir=str(tmp_path), progress=False, data_root=str(tmp_path / "data"),
                model=ModelConfig(hidden=8, layers=2, dropout=0.3))
    plain = launch(make_config(**base))
    pre = launch(make_config(**base, perf=PerfConfig(prefetch=True)))
    assert [r["loss"] for r in pre["epochs"]] == [r["loss"] for r in plain["epochs"]]  # across the epoch boundary
    assert pre["epochs"][-1]["test_acc"] == plain["epochs"][-1]["test_acc"]
    assert pre["config"]["perf"]["prefetch"] is True and pre["compile_time_s"] == 0.0
    assert set(pre["epochs"][0]["components"]) == set(COMPONENTS)
    assert {t.ident for t in threading.enumerate()} <= before  # no orphan prefetch thread


def test_span_timer_cpu_and_off():
    t = SpanTimer("cpu")
    with t("a"):
        sum(range(1000))
    assert t.flush()["a"] > 0
    off = SpanTimer("cpu", enabled=False)
    with off("a"):
        pass
    assert dict(off.seconds) == {}


@pytest.mark.gpu
@needs_gpu
def test_span_timer_cuda_events():
    t = SpanTimer("cuda")
    x = torch.randn(1024, 1024, device="cuda")
    with t("mm"):
        x @ x
    assert t.flush()["mm"] > 0


# ------------------------------------------------------------------------------ parallel switches
STEPS = 4
_BASE = dict(model=ModelConfig(hidden=10, layers=3, dropout=0.3), optim=OptimConfig(lr=1e-2, grad_clip=0.5))
_NORES = dict(model=ModelConfig(hidden=10, layers=3, dropout=0.3, residual=False), optim=OptimConfig(lr=1e-2))
RUNS = {  # name: (model and optimizer, the engine's perf and numerics sections)
    "base": (_BASE, dict(perf=PerfConfig())),
    "prefetch": (_BASE, dict(perf=PerfConfig(prefetch=True))),
    "overlap": (_BASE, dict(perf=PerfConfig(comm_overlap=True))),
    "bf16": (_BASE, dict(numerics=NumericsConfig(comm_dtype="bf16"))),
    "bf16+overlap+prefetch": (_BASE, dict(numerics=NumericsConfig(comm_dtype="bf16"),
                                          perf=PerfConfig(comm_overlap=True, prefetch=True))),
    "gemm-bf16": (_BASE, dict(numerics=NumericsConfig(gemm_dtype="bf16"))),
    "compile": (_BASE, dict(perf=PerfConfig(compile=True, compile_backend="aot_eager"))),
    "uninstrumented": (_BASE, dict(perf=PerfConfig(instrument=False))),
    "double": (_NORES, dict(numerics=NumericsConfig(permute="double"))),
}


def _switch_worker(rank, world, shape):
    import time

    from scalegnn.parallel.engine import ParallelEngine
    from scalegnn.parallel.grid import ProcessGrid

    grid = ProcessGrid(*shape)
    out = {}
    for name, (cfg, sections) in RUNS.items():
        eng = ParallelEngine(parallel_graph(seed=0), cfg["model"], cfg["optim"], 23, seed=0, epochs=2, grid=grid,
                             **sections)
        t0 = time.perf_counter()
        steps = [eng.train_step(s) for s in range(STEPS)]
        wall = time.perf_counter() - t0
        eng.close()
        out[name] = {"steps": [(r.loss, r.correct, r.count) for r in steps], "wall": wall,
                     "params": {k: v["value"] for k, v in eng.parameters_for_test().items()},
                     "shards": {k: (v["rows"], v["cols"]) for k, v in eng.parameters_for_test().items()},
                     "bytes": dict(eng.comm_bytes), "components": dict(eng.components),
                     "compile_time_s": eng.compile_time_s, "eval": eng.evaluate().as_dict(),
                     "threads": threading.active_count()}
    return out


@pytest.mark.distributed
def test_parallel_switches_leave_training_unchanged():
    from scalegnn.launch.job import spawn

    results = spawn(_switch_worker, 4, (1, 2, 1, 2), timeout_s=240)
    for res in results:
        base = res["base"]

        def identical(name):
            other = res[name]
            assert other["steps"] == base["steps"], name
            assert all(torch.equal(other["params"][k], v) for k, v in base["params"].items()), name

        identical("prefetch")
        identical("overlap")
        identical("uninstrumented")
        # BF16: PMM bytes exactly half, every other kind unchanged; close losses; switches on top identical.
        bf = res["bf16"]
        for kind, nbytes in base["bytes"].items():
            assert bf["bytes"][kind] * (2 if kind.startswith("pmm_") else 1) == nbytes, kind
        assert [s[0] for s in bf["steps"]] == pytest.approx([s[0] for s in base["steps"]], abs=5e-2)
        # BF16 GEMM operands: the same collectives and bytes, close but different losses.
        gb = res["gemm-bf16"]
        assert gb["bytes"] == base["bytes"]
        assert [s[0] for s in gb["steps"]] == pytest.approx([s[0] for s in base["steps"]], abs=5e-2)
        assert gb["steps"] != base["steps"]
        combo = res["bf16+overlap+prefetch"]
        assert combo["steps"] == bf["steps"]
        assert all(torch.equal(combo["params"][k], v) for k, v in bf["params"].items())
        # Fusion: same math, autograd's backward: float32 reordering only.
        comp = res["compile"]
        assert comp["compile_time_s"] > 0
        for k, v in base["params"].items():
            torch.testing.assert_close(comp["params"][k], v, atol=1e-5, rtol=1e-5)
        # Instrumentation: the components partition the step time; off, no compute timer runs.
        c = base["components"]
        assert set(c) == {"sampling", "spmm", "gemm", "elementwise", "pmm_comm", "dp_comm", "optimizer", "other"}
        assert 0 < sum(c.values()) <= base["wall"] * 1.05 + 1e-3
        off = res["uninstrumented"]["components"]
        assert off["spmm"] == off["gemm"] == off["pmm_comm"] == 0.0
        assert res["uninstrumented"]["bytes"] == base["bytes"]  # bytes are always counted
        assert res["base"]["threads"] == res["prefetch"]["threads"]  # the prefetch thread was stopped
    # Double permutation (no residual): equal to the serial reference on the same (P_c-relabeled) graph.
    ser = SerialReference(parallel_graph(seed=0), _NORES["model"], _NORES["optim"], 23, seed=0, epochs=2)
    ref = [ser.train_step(s) for s in range(STEPS)]
    full = {n: p.detach() for n, p in ser.model.named_parameters()}
    for res in results:
        dbl = res["double"]
        assert [s[0] for s in dbl["steps"]] == pytest.approx([r.loss for r in ref], abs=2e-5, rel=1e-4)
        for k, v in dbl["params"].items():
            rows, cols = dbl["shards"][k]
            want = full[k][cols[0]:cols[1]] if rows is None else full[k][rows[0]:rows[1], cols[0]:cols[1]]
            torch.testing.assert_close(v, want, atol=2e-5, rtol=1e-4)
        assert dbl["eval"] == pytest.approx(ser.evaluate().as_dict(), abs=1e-12)


def test_double_permutation_needs_no_residual():
    from scalegnn.parallel.engine import ParallelEngine
    from scalegnn.parallel.grid import ProcessGrid

    with pytest.raises(ValueError, match="--no-residual"):
        ParallelEngine(parallel_graph(), ModelConfig(hidden=8), OptimConfig(), 10, grid=ProcessGrid.single(),
                       numerics=NumericsConfig(permute="double"))


# ------------------------------------------------------------------------------ loop, record, CLI
def test_compile_time_is_recorded_apart_and_profile_writes_a_trace(tmp_path):
    import json

    from scalegnn.config import make_config
    from scalegnn.launch import launch

    base = dict(dataset="csbm:n=300,avg_degree=6,classes=3,feature_dim=8", batch_ratio=0.1, epochs=1,
                out_dir=str(tmp_path), progress=False, data_root=str(tmp_path / "data"),
                model=ModelConfig(hidden=8, layers=2, dropout=0.2))
    plain = launch(make_config(**base))
    fused = launch(make_config(**base, perf=PerfConfig(compile=True, compile_backend="aot_eager",
                                                           profile=str(tmp_path / "prof"))))
    assert fused["compile_time_s"] > 0 and plain["compile_time_s"] == 0.0
    assert fused["epochs"][0]["loss"] == pytest.approx(plain["epochs"][0]["loss"], rel=1e-5)
    assert fused["epochs"][0]["test_acc"] == plain["epochs"][0]["test_acc"]
    trace = json.loads((tmp_path / "prof" / "trace_rank0.json").read_text())
    assert trace["traceEvents"]


def test_cli_flags_fill_perf_and_numerics_config():
    from scalegnn.config import parse_train_args

    cfg, _ = parse_train_args(
        ["--dataset", "cora", "--prefetch", "--comm-dtype", "bf16", "--compile", "--comm-overlap",
         "--profile", "/tmp/p", "--permute", "double", "--no-residual", "--sampler", "torch", "--gemm-dtype", "bf16"])
    perf, numerics = cfg.perf, cfg.numerics
    assert (perf.prefetch, numerics.comm_dtype, perf.compile, perf.comm_overlap, perf.profile, numerics.permute,
            perf.sampler, numerics.gemm_dtype) == (True, "bf16", True, True, "/tmp/p", "double", "torch", "bf16")
    assert numerics.local_gemm_dtype is torch.bfloat16
    assert parse_train_args(["--dataset", "cora"])[0].perf == PerfConfig()
    assert parse_train_args(["--dataset", "cora"])[0].numerics == NumericsConfig()
    with pytest.raises(ValueError, match="comm_dtype"):
        NumericsConfig(comm_dtype="fp8")
    with pytest.raises(ValueError, match="gemm_dtype"):
        NumericsConfig(gemm_dtype="fp16")
