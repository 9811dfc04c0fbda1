"""``--compile`` on a GPU that cannot build kernels: a preflight names what is missing
(Triton, a C compiler, Python.h) and the engine runs the fused tail eager, with one
warning and the reason in the record, instead of losing the run in its constructor;
a first compilation that fails falls back the same way."""

from __future__ import annotations

import sys
import types

import pytest
import torch

import scalegnn.parallel.engine as E
from scalegnn.config import make_config
from scalegnn.launch import launch
from tests.vgpu.virtual import VirtualGpu

SMALL = "csbm:n=300,avg_degree=6,classes=3,feature_dim=8"


def run(tmp_path, name, **over):
    cfg = make_config(dataset=SMALL, data_root=str(tmp_path / "d"), epochs=2, out_dir=str(tmp_path / name), hidden=8,
                      layers=2, device="cuda", batch_ratio=0.3, **over)
    with VirtualGpu() as gpu:
        rec = launch(cfg)
    assert rec["status"] == "ok" and gpu.report() == ""
    return rec


def test_compile_preflight_names_what_is_missing(monkeypatch, tmp_path):
    cuda = torch.device("cuda", 0)
    assert E.compile_preflight(cuda, "aot_eager") is None  # builds nothing
    monkeypatch.setitem(sys.modules, "triton", None)
    assert "needs Triton" in E.compile_preflight(cuda)
    monkeypatch.setitem(sys.modules, "triton", types.ModuleType("triton"))
    monkeypatch.setattr("shutil.which", lambda name: None)
    monkeypatch.delenv("CC", raising=False)
    assert E.compile_preflight(cuda).startswith("no C compiler on PATH (tried cc, gcc, clang)")
    assert E.compile_preflight("cpu").startswith("no C++ compiler on PATH")
    monkeypatch.setattr("shutil.which", lambda name: f"/usr/bin/{name}")
    assert E.compile_preflight(cuda) is None
    monkeypatch.setattr("sysconfig.get_paths", lambda: {"include": str(tmp_path)})
    assert "Python.h, which is not at" in E.compile_preflight(cuda)


def test_compile_without_a_working_toolchain_runs_eager_and_says_so(tmp_path, monkeypatch, caplog):
    eager = run(tmp_path, "eager")
    monkeypatch.setattr(E, "compile_preflight", lambda device, backend: "no C compiler on PATH (planted)")
    rec = run(tmp_path, "fallback", compile=True)
    assert rec["compile_fallback"] == "no C compiler on PATH (planted)" and rec["compile_time_s"] == 0.0
    assert [r["loss"] for r in rec["epochs"]] == [r["loss"] for r in eager["epochs"]]
    assert eager["compile_fallback"] is None
    assert any("--compile: no C compiler on PATH (planted); the fused tail runs eager" in m for m in caplog.messages)


def test_a_first_compilation_that_fails_falls_back(tmp_path, monkeypatch):
    def broken(fn, **kw):
        def call(*a, **k):
            raise RuntimeError("Failed to build the Triton launcher: Python.h: No such file\nmore")
        return call

    monkeypatch.setattr(E, "compile_preflight", lambda device, backend: None)
    monkeypatch.setattr(torch, "compile", broken)
    rec = run(tmp_path, "broken", compile=True)
    assert rec["compile_fallback"] == ("the first compilation failed: RuntimeError: Failed to build the Triton "
                                       "launcher: Python.h: No such file")


def test_compiled_tail_on_the_virtual_gpu_is_recorded_without_fallback(tmp_path):
    from scalegnn.perf import PerfConfig

    rec = run(tmp_path, "compiled", perf=PerfConfig(compile=True, compile_backend="aot_eager"))
    assert rec["compile_fallback"] is None and rec["compile_time_s"] > 0
