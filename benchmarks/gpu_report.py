"""One command for a GPU machine (``make gpu-report``): the GPU tests and the GPU benchmark,
and one file that says everything they found, which docs/gpu.md publishes.

    python3 -m scalegnn.benchmarks.gpu_report --tests "tests/... tests/..." --out results/gpu/report.md

It uses the machine's own python and torch and installs nothing. It writes, section by
section as each finishes (a run cut short keeps what it found):

    versions     python, torch and its CUDA / HIP build, NCCL (RCCL), Triton, PyG,
                 torch-sparse, numba, scalegnn's commit
    device       :func:`scalegnn.device.device_info` of ``cuda`` (name, capability,
                 memory), or that no GPU is visible
    tests        every test of ``pytest -m gpu`` on the given files with its outcome
                 (passed, failed, skipped, error) and, for the others, the reason
    benchmark    every number of ``python -m scalegnn.benchmarks.gpu`` (its gpu.json,
                 and its Markdown), or why it did not run (no GPU: skipped)

The exit status is 0 when no test failed and the benchmark had no failed section.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

__all__ = ["main", "versions", "test_outcomes", "render"]

ROOT = Path(__file__).resolve().parent.parent


def _version(module: str) -> str | None:
    try:
        return getattr(importlib.import_module(module), "__version__", "present")
    except Exception:  # absent, or broken on import: the report says which
        return None


def versions() -> dict:
    import torch

    nccl = None
    try:
        v = torch.cuda.nccl.version()
        nccl = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    except Exception:  # a build without NCCL
        pass
    from scalegnn.records import git_commit

    # A tree copied to a GPU machine may carry no .git, or a stale one: the sender says which commit it is.
    commit = os.environ.get("SCALEGNN_COMMIT") or git_commit(short=12)
    return {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "hip": getattr(torch.version, "hip", None), "nccl": nccl, "triton": _version("triton"),
            "torch_geometric": _version("torch_geometric"), "torch_sparse": _version("torch_sparse"),
            "pyg_lib": _version("pyg_lib"), "numba": _version("numba"), "scalegnn_commit": commit,
            "host": platform.node(), "platform": platform.platform()}


def device() -> dict:
    import torch

    from scalegnn.device import device_info

    if not torch.cuda.is_available():
        return {"type": None, "reason": "no CUDA or ROCm GPU is visible to this process"}
    return device_info(torch.device("cuda", 0))


def test_outcomes(junit: Path) -> list[dict]:
    """Every test case of a pytest JUnit XML file: id, outcome, seconds, message."""
    out = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                outcome = {"failure": "failed"}.get(tag, tag)
                message = (node.get("message") or node.text or "").strip().splitlines()[0][:300] \
                    if (node.get("message") or node.text) else ""
                break
        out.append({"id": f"{case.get('classname', '')}::{case.get('name', '')}", "outcome": outcome,
                    "seconds": float(case.get("time") or 0.0), "message": message})
    return out


def run_tests(files: list[str], python: str, junit: Path, timeout_s: float, log: Path | None = None) -> dict:
    """``pytest -m gpu`` on ``files``; its whole output goes to ``log`` (the report keeps
    each test's first line), also when the run is cut off at ``timeout_s``."""
    cmd = [python, "-m", "pytest", "-m", "gpu", "-p", "no:cacheprovider", "-q", "-rfE", f"--junitxml={junit}", *files]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)
        text, status = proc.stdout + proc.stderr, None
    except subprocess.TimeoutExpired as exc:
        text = "".join(b.decode(errors="replace") if isinstance(b, bytes) else (b or "")
                       for b in (exc.stdout, exc.stderr))
        status = "timed out"
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(text)
    if status:
        return {"command": " ".join(cmd), "status": status, "seconds": timeout_s, "cases": [], "tail": text[-3000:]}
    cases = test_outcomes(junit) if junit.is_file() else []
    counts = {k: sum(c["outcome"] == k for c in cases) for k in ("passed", "failed", "skipped", "error")}
    return {"command": " ".join(cmd), "exit_code": proc.returncode, "seconds": round(time.monotonic() - t0, 1),
            "counts": counts, "cases": cases, "tail": text[-3000:]}


def run_benchmark(python: str, out: Path, args: list[str], timeout_s: float) -> dict:
    cmd = [python, "-m", "scalegnn.benchmarks.gpu", "--out", str(out), *args]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)
        status = "ok" if proc.returncode == 0 else f"exit {proc.returncode}"
        tail = (proc.stdout + proc.stderr)[-3000:]
    except subprocess.TimeoutExpired:
        status, tail = f"timed out after {timeout_s:.0f} s (what it measured so far is below)", ""
    result = json.loads((out / "gpu.json").read_text()) if (out / "gpu.json").is_file() else None
    markdown = (out / "gpu.md").read_text() if (out / "gpu.md").is_file() else None
    return {"command": " ".join(cmd), "status": status, "numbers": result, "markdown": markdown, "tail": tail}


def earlier_benchmark(folder: Path) -> dict:
    """The benchmark of an earlier ``make gpu-report`` (its ``gpu.json`` and ``gpu.md`` in
    ``folder``), taken as it is: a re-run of the tests after a fix that leaves the
    benchmarked code alone need not spend the benchmark's minutes again. The report says
    where the numbers came from (their own command and commit)."""
    numbers = folder / "gpu.json"
    if not numbers.is_file():
        raise SystemExit(f"--bench-from {folder}: no gpu.json there; give the --out folder of an earlier "
                         "`python -m scalegnn.benchmarks.gpu` run")
    md = folder / "gpu.md"
    return {"command": f"(not run: the numbers of an earlier run, read from {folder})",
            "status": f"ok, from an earlier run ({folder})", "numbers": json.loads(numbers.read_text()),
            "markdown": md.read_text() if md.is_file() else None, "tail": ""}


def render(report: dict) -> str:
    """The report as Markdown: what docs/gpu.md publishes."""
    v, d = report["versions"], report["device"]
    lines = ["## Latest GPU report", "",
             f"Written {report['written']} by `make gpu-report` on {v['host']}.", "",
             "| | |", "|---|---|"]
    lines += [f"| {k} | {v[k] if v[k] is not None else 'absent'} |" for k in v]
    lines += ["", f"Device: {d.get('name') or d.get('reason')}" +
              (f" (capability {d['capability']}, {d['total_memory_bytes'] / 2**30:.0f} GiB)"
               if d.get("capability") else ""), ""]
    t = report.get("tests")
    if t:
        c = t.get("counts", {})
        lines += [f"### GPU tests: {c.get('passed', 0)} passed, {c.get('failed', 0)} failed, "
                  f"{c.get('skipped', 0)} skipped, {c.get('error', 0)} errors ({t.get('seconds')} s)", "",
                  f"`{t['command']}`", "", "| test | outcome | s | message |", "|---|---|---|---|"]
        lines += [f"| `{c['id']}` | {c['outcome']} | {c['seconds']:.1f} | {c['message'].replace('|', '/')} |"
                  for c in t["cases"]]
        lines.append("")
    b = report.get("benchmark")
    if b:
        lines += [f"### GPU benchmark: {b['status']}", ""]
        if b.get("reason"):
            lines += [b["reason"], ""]
        if b.get("markdown"):
            lines += [line.replace("# ", "#### ", 1) if line.startswith("#") else line
                      for line in b["markdown"].splitlines()] + [""]
        if b.get("numbers"):
            lines += ["Every number (gpu.json):", "", "```json", json.dumps(b["numbers"], indent=1, default=str),
                      "```", ""]
    return "\n".join(lines)


def _write(out: Path, report: dict) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=1, default=str))
    out.write_text(render(report) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m scalegnn.benchmarks.gpu_report", description=__doc__.split("\n\n")[0])
    ap.add_argument("--tests", required=True, help="the GPU test files (the Makefile's GPU_TESTS), space-separated")
    ap.add_argument("--out", default="results/gpu/report.md",
                    help="the report (its .json and the tests' whole output, .tests.log, beside it)")
    ap.add_argument("--bench-out", default="results/bench/gpu", help="the benchmark's own folder")
    ap.add_argument("--bench-args", default="", help="more arguments for the benchmark (e.g. '--nodes 200000')")
    ap.add_argument("--bench-from", default="", metavar="DIR",
                    help="report the benchmark of an earlier run (its gpu.json in DIR) instead of running it")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--tests-timeout", type=float, default=3600.0)
    ap.add_argument("--bench-timeout", type=float, default=3600.0)
    args = ap.parse_args(argv)
    out = Path(args.out)
    report = {"written": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "versions": versions(),
              "device": device()}
    _write(out, report)
    with tempfile.TemporaryDirectory() as tmp:
        report["tests"] = run_tests(args.tests.split(), args.python, Path(tmp) / "junit.xml", args.tests_timeout,
                                    log=out.with_suffix(".tests.log"))
    _write(out, report)
    if args.bench_from:
        report["benchmark"] = earlier_benchmark(Path(args.bench_from))
    elif report["device"]["type"] is None:
        report["benchmark"] = {"status": "skipped", "reason": "No GPU is visible: the benchmark needs one "
                               "(`python3 -m scalegnn.benchmarks.gpu --device cpu --nodes 20000` is its CPU smoke "
                               "test)."}
    else:
        report["benchmark"] = run_benchmark(args.python, Path(args.bench_out), args.bench_args.split(),
                                            args.bench_timeout)
    _write(out, report)
    print(render(report))
    t, b = report["tests"], report["benchmark"]
    bad = t.get("status") == "timed out" or t.get("counts", {}).get("failed") or t.get("counts", {}).get("error") \
        or (b.get("numbers") or {}).get("failed_sections") or not b["status"].startswith(("ok", "skipped"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
