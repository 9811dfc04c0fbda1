"""A run's start and end (issue W, "Never surprise the user"): ``--nproc N`` alone is a grid
for every system, the first line comes before torch loads, ``--help`` and a refused flag
load no torch, and the process is gone with its record line.

- ``--nproc N`` without ``--grid``: ScaleGNN was refused ("--nproc 2 does not match the grid
  1x1x1x1") while graphsage and fullgraph-3d took it. Now ScaleGNN trains on ``Nx1x1x1``
  (data parallel: the planner needs the graph's sizes, known only after the first line;
  :func:`scalegnn.config.nproc_grid` says why), fullgraph-3d on the most cube-like 3D grid
  as before, and the first line names the grid and the rule.
- The first line (:func:`scalegnn.launch.first_line`) is logged by the launcher before the
  run's heavy imports: 0.17-0.20 s after the command on the idle 2-core machine (1.5 s of
  silence before "loading the graph" in one process, 3.1 s with --nproc 2, before).
- ``scalegnn --help`` took 1.7 s importing torch through the run configuration's sections;
  they are declared in :mod:`scalegnn.sections` now, which loads no torch.
- The process lingered 0.7-1.2 s after its record line (the interpreter's teardown of
  torch and torch._dynamo), and its output stayed open as long again with ``--nproc`` (the
  fork server's own teardown): the command now ends without the teardown
  (``scalegnn.cli._end_process``) and stops the fork server at exit.

The timings asserted here are generous bounds (a loaded CI machine); the measured numbers
are in the docstrings above and in the commit that added this file.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from scalegnn.cli import main
from scalegnn.config import make_config
from tests.files import REPO
from tests.runs import TINY

HEAVY = ("torch", "numpy", "scipy", "pandas", "numba")
FIRST_LINE_BOUND_S = 3.0  # the target is 1 s (measured 0.17-0.20 s idle); the bound leaves a loaded machine room
END_BOUND_S = 1.0  # after the record line, the process and its output; the target is 0.5 s (measured 0.03-0.06 s)


def _env() -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("SCALEGNN_LOG_LEVEL", None)
    return env


# ----------------------------------------------------------------------------- --nproc N alone
@pytest.mark.parametrize("system, grid", [("scalegnn", (4, 1, 1, 1)), ("fullgraph-3d", (1, 2, 2, 1)),
                                          ("graphsage", (4, 1, 1, 1))])
def test_nproc_alone_gives_every_system_a_grid(system, grid):
    """ScaleGNN used to keep 1x1x1x1 and be refused at launch; now each system's rule."""
    assert make_config(system, dataset=TINY, nproc=4).parallel.grid == grid
    assert make_config(dataset=TINY, nproc=4, batch_ratio=1.0).parallel.grid == (1, 2, 2, 1)  # the full graph's


def test_nproc_against_grid_is_refused_before_anything_loads():
    with pytest.raises(ValueError, match=r"--nproc 2 does not match the grid 1x2x2x1 \(Gd\*Gx\*Gy\*Gz = 4\); "
                                         r"pass --nproc 4 or change --grid"):
        make_config(dataset=TINY, nproc=2, grid=(1, 2, 2, 1))


@pytest.mark.distributed
@pytest.mark.parametrize("system, grid, rule", [("scalegnn", "2x1x1x1", "data parallel"),
                                                ("fullgraph-3d", "1x2x1x1", "the most cube-like 3D grid")])
def test_nproc_2_alone_trains_and_the_first_line_says_the_grid(tmp_path, capsys, system, grid, rule):
    code = main(["train", "--system", system, "--dataset", TINY, "--nproc", "2", "--epochs", "1", "--hidden", "8",
                 "--layers", "2", "--data-root", str(tmp_path / "data"), "--out", str(tmp_path / "runs")])
    out = capsys.readouterr().out
    assert code == 0, out
    record = json.loads(open(out.strip().splitlines()[-1].split("record: ")[1]).read())
    assert record["status"] == "ok" and record["config"]["parallel"]["grid"] == [int(g) for g in grid.split("x")]
    first = out.splitlines()[0]
    assert first.endswith(f"{system} on {TINY}: starting 2 local workers, grid {grid} (what --nproc 2 alone "
                          f"gives: {rule}), 1 epoch"), first


# ----------------------------------------------------------------------------- the first line
FIRST_WRITE = r"""
import json, sys

class FirstWrite:  # notes, at the first line written to stdout, whether torch was loaded
    def __init__(self, stream):
        self.stream, self.first = stream, None

    def write(self, text):
        if self.first is None and text.strip():
            self.first = {"line": text.strip(), "loaded": sorted(m for m in %r if m in sys.modules)}
        return self.stream.write(text)

    def __getattr__(self, name):
        return getattr(self.stream, name)

sys.stdout = FirstWrite(sys.stdout)
from scalegnn.cli import main
code = main(sys.argv[1:])
print(json.dumps({"code": code, **sys.stdout.first}), file=sys.stderr)
""" % (HEAVY,)


def test_the_first_line_comes_before_torch_loads(tmp_path):
    """The launcher says what starts before the run's heavy imports; the first line used to
    be "loading the graph", after torch, the dataset modules and the graph itself."""
    argv = ["train", "--dataset", TINY, "--epochs", "1", "--hidden", "8", "--data-root", str(tmp_path / "data"),
            "--out", str(tmp_path / "runs")]
    done = subprocess.run([sys.executable, "-c", FIRST_WRITE, *argv], capture_output=True, text=True, timeout=300,
                          env=_env(), cwd=REPO)
    seen = json.loads(done.stderr.strip().splitlines()[-1])
    assert seen["code"] == 0, done.stderr
    assert seen["line"].endswith(f"INFO scalegnn.progress: scalegnn on {TINY}: starting in this process, grid "
                                 "1x1x1x1, 1 epoch"), seen
    assert seen["loaded"] == [], seen


@pytest.mark.distributed
def test_a_run_speaks_within_a_second_and_ends_with_its_record(tmp_path):
    """``scalegnn train --nproc 2`` as a user runs it: the first line's time after the
    command, and the time from the record line to the process's end and its output's
    end (the fork server holds the output too)."""
    argv = [sys.executable, "-m", "scalegnn", "train", "--dataset", TINY, "--nproc", "2", "--epochs", "1",
            "--hidden", "8", "--layers", "2", "--data-root", str(tmp_path / "data"), "--out", str(tmp_path / "runs")]
    start = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=_env(), cwd=REPO)
    ended = {}
    threading.Thread(target=lambda: ended.setdefault("at", (proc.wait(), time.monotonic())[1]), daemon=True).start()
    lines = []
    for raw in proc.stdout:  # until every holder of the output has closed it
        lines.append((time.monotonic() - start, raw.decode().rstrip()))
    eof = time.monotonic() - start
    assert proc.wait(timeout=60) == 0, lines
    first_s, first = lines[0]
    record_s = next(t for t, line in lines if line.startswith("record: "))
    assert "starting 2 local workers, grid 2x1x1x1 (what --nproc 2 alone gives: data parallel)" in first, lines
    assert first_s < FIRST_LINE_BOUND_S, lines
    assert ended["at"] - start - record_s < END_BOUND_S and eof - record_s < END_BOUND_S, (record_s, ended, eof)


TEARDOWN = r"""
import os, sys

class Teardown:  # written only if the interpreter tears its modules down after the command
    def __del__(self, write=os.write):
        write(2, b"interpreter teardown\n")

sentinel = Teardown()
sys.argv = ["scalegnn", *sys.argv[1:]]
from scalegnn.cli import main
sys.exit(main())
"""


def test_the_command_ends_without_the_interpreter_teardown(tmp_path):
    """After a run the teardown (torch's and torch._dynamo's objects freed one by one)
    kept the process 0.7-1.2 s past its record line: the command now ends once its
    output is out, its atexit handlers run (the record, flushed logs)."""
    argv = ["train", "--dataset", TINY, "--epochs", "1", "--hidden", "8", "--data-root", str(tmp_path / "data"),
            "--out", str(tmp_path / "runs")]
    done = subprocess.run([sys.executable, "-c", TEARDOWN, *argv], capture_output=True, text=True, timeout=300,
                          env=_env(), cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert "record: " in done.stdout.strip().splitlines()[-1] and "epoch 1/1" in done.stdout
    assert "interpreter teardown" not in done.stderr


FORK_SERVER = r"""
import atexit, json, operator, os, time
from multiprocessing import forkserver
from scalegnn.launch.job import spawn

assert spawn(operator.add, 2, timeout_s=120) == [2, 3]
pid = forkserver._forkserver._forkserver_pid
start = time.monotonic()
atexit._run_exitfuncs()  # what this process's exit runs first
while time.monotonic() - start < 10 and os.waitpid(pid, os.WNOHANG) == (0, 0):
    time.sleep(0.01)
print(json.dumps({"gone": os.path.exists(f"/proc/{pid}") is False, "after_s": time.monotonic() - start}))
"""


@pytest.mark.distributed
def test_the_fork_server_ends_with_the_process():
    """The fork server of ``--nproc`` holds the program's stdout; left to see the exit
    itself (its pipe from this process closes only when this process is gone) it tore
    down its own torch for 0.3-0.7 s more, and ``scalegnn train ... | tee`` waited for it.
    Now the exit's handlers end it: gone before this process is."""
    done = subprocess.run([sys.executable, "-c", FORK_SERVER], capture_output=True, text=True, timeout=300,
                          env=_env(), cwd=REPO)
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["gone"] and seen["after_s"] < END_BOUND_S, (seen, done.stderr[-2000:])


# ----------------------------------------------------------------------------- --help and refusals
HELP = r"""
import contextlib, io, json, sys
from scalegnn.cli import main

seen = {}
for argv in json.loads(sys.argv[1]):
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
    seen[" ".join(argv)] = {"code": code, "loaded": sorted(m for m in %r if m in sys.modules),
                            "last": out.getvalue().strip().splitlines()[-1]}
print(json.dumps(seen))
""" % (HEAVY,)


def test_help_and_refused_flags_load_no_torch(tmp_path):
    """``scalegnn --help`` took 1.7 s (3.4 s on a loaded machine) importing torch through the
    configuration's sections; every help and every flag refused before a run starts now
    loads none of torch, numpy, scipy, pandas or numba (checked in one fresh interpreter)."""
    file = tmp_path / "FILE"
    file.write_text("x")
    train = ["train", "--dataset", TINY]
    helps = [["--help"], ["train", "--help"], ["train", "--help-all"], ["train", "--help-topic", "parallel"],
             ["train", "--system", "fullgraph-3d", "--help"], ["data", "shard", "--help"], ["bench", "--help"],
             ["plan", "--help"], ["sweep", "--help"]]
    refusals = [train + ["--grid", "2x2"], train + ["--epochs", "0"], train + ["--split", "random:0.9,0.9,0.9"],
                train + ["--hidden", "2", "--grid", "1x4x1x1", "--nproc", "4"],
                train + ["--grid", "1x2x2x1", "--nproc", "2"], train + ["--out", str(file)]]
    done = subprocess.run([sys.executable, "-c", HELP, json.dumps(helps + refusals)], capture_output=True, text=True,
                          timeout=120, env=_env(), cwd=REPO)
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert {case: s["loaded"] for case, s in seen.items() if s["loaded"]} == {}
    assert [seen[" ".join(a)]["code"] for a in helps] == [0] * len(helps), seen
    assert [seen[" ".join(a)]["code"] for a in refusals] == [2] * len(refusals), seen
    assert "GdxGxxGyxGz" in seen[" ".join(refusals[0])]["last"]
    assert seen[" ".join(refusals[4])]["last"] == \
        "scalegnn: error: --nproc 2 does not match the grid 1x2x2x1 (Gd*Gx*Gy*Gz = 4); pass --nproc 4 or change --grid"


def test_help_takes_a_fraction_of_a_second():
    """Measured 0.17-0.19 s for ``python -m scalegnn --help`` on the idle machine (1.7 s before)."""
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "scalegnn", "--help"], capture_output=True, text=True, timeout=60,
                          env=_env(), cwd=REPO)
    assert done.returncode == 0 and "train" in done.stdout
    assert time.monotonic() - start < 1.5  # generous: a loaded machine; the target is 0.5 s
