"""No path to data loss through an output path, and quiet ends (issue X).

The two data-loss cases found by a hostile probe, each reproduced: ``train --out`` a
symbolic link to nothing (the run trained, then lost its record to ``FileExistsError``)
and ``export --out`` onto the newest checkpoint's own rank file (exit 0, and the run could
no longer resume). Then the ends a user causes: stdout's reader leaving (``| head``), a
SIGTERM while the command is still importing, a SIGTERM during ``data generate``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scalegnn import records
from scalegnn.cli import main
from tests.files import REPO
from tests.runs import TINY

pytestmark = pytest.mark.distributed  # real runs, some in their own process


def _train(tmp_path: Path, out, *extra: str) -> list[str]:
    return ["train", "--dataset", TINY, "--data-root", str(tmp_path / "data"), "--out", str(out), "--epochs", "2",
            "--hidden", "8", "--layers", "2", "--quiet", *extra]


def _env(tmp_path: Path) -> dict:
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
            "SCALEGNN_CACHE_DIR": str(tmp_path / "cache"), "SCALEGNN_OFFLINE": "1"}


def _one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_out_a_symbolic_link_to_nothing_is_refused_before_the_run(tmp_path, isolated_data, capsys, monkeypatch):
    """Before: the run trained, then creating the record's folder raised FileExistsError (the
    link is there, its target is not) and the finished run was lost."""
    import scalegnn.launch

    (tmp_path / "runs").symlink_to(tmp_path / "gone" / "runs")
    started = []
    monkeypatch.setattr(scalegnn.launch, "first_line", lambda *a, **k: started.append(1) or "")
    assert main(_train(tmp_path, tmp_path / "runs")) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("scalegnn: error: --out ") and "symbolic link" in line and "does not exist" in line
    assert not started, "the run started before its output folder was checked"
    assert not (tmp_path / "gone").exists()


def test_export_never_overwrites_the_checkpoint_it_reads(tmp_path, isolated_data, capsys):
    """Before: ``export CK --out CK/step-N/rank-00000.pt`` exited 0 after overwriting the newest
    checkpoint's own rank file with the model, and the run could no longer resume."""
    ck = tmp_path / "ck"
    argv = _train(tmp_path, tmp_path / "runs", "--checkpoint-dir", str(ck), "--checkpoint-every", "2")
    assert main(argv) == 0
    newest = sorted(ck.glob("step-*"))[-1]
    files = {path: path.read_bytes() for path in ck.rglob("*") if path.is_file()}
    capsys.readouterr()
    for target in (newest / "rank-00000.pt", newest / "meta.json", ck / "model.pt"):
        assert main(["export", str(ck), "--out", str(target)]) == 2
        line = _one_line(capsys.readouterr().err)
        assert "which this command reads" in line and str(target) in line
    assert {path: path.read_bytes() for path in ck.rglob("*") if path.is_file()} == files
    assert main(argv[:-4] + ["--checkpoint-dir", str(ck), "--resume", "--epochs", "3"]) == 0  # still resumable
    assert main(["export", str(ck), "--out", str(tmp_path / "model.pt")]) == 0


def test_a_closed_stdout_ends_the_command_quietly_with_its_record(tmp_path):
    """``scalegnn train ... | head -1``: the progress lines stop once the reader has left (not a
    '--- Logging error ---' traceback per line), the run finishes and keeps its record, and
    the process ends as one whose pipe closed (141), with nothing on stderr."""
    argv = [a for a in _train(tmp_path, tmp_path / "runs") if a != "--quiet"]
    cmd = f"{sys.executable} -m scalegnn {' '.join(argv)} | head -c 1 > /dev/null; echo ${{PIPESTATUS[0]}} >&2"
    done = subprocess.run(["bash", "-c", cmd], env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert done.stderr.strip() == "141", done.stderr
    (path,) = (tmp_path / "runs").glob("*.json")
    assert records.read_record(path)["status"] == "ok"


def _catches_sigterm(pid: int) -> bool:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    return False


def _sigterm_once_caught(proc: subprocess.Popen) -> None:
    """SIGTERM as soon as the process has a handler for it (the first thing ``scalegnn.cli.main``
    does), while torch and the rest still import."""
    end = time.monotonic() + 30
    while not _catches_sigterm(proc.pid):
        assert proc.poll() is None and time.monotonic() < end, "the command never handled SIGTERM"
        time.sleep(0.002)
    proc.send_signal(signal.SIGTERM)


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="reads the signal mask from /proc (Linux)")
def test_sigterm_while_the_command_starts_leaves_an_interrupted_record(tmp_path):
    """Before: a SIGTERM in the first 1.5 s (imports) ended the process silently, with no record."""
    proc = subprocess.Popen([sys.executable, "-m", "scalegnn", *_train(tmp_path, tmp_path / "runs")],
                            env=_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _sigterm_once_caught(proc)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, (out, err)
    assert _one_line(err).startswith("scalegnn: interrupted by SIGTERM")
    (path,) = (tmp_path / "runs").glob("*.json")
    assert records.read_record(path)["status"] == "interrupted"


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="reads the signal mask from /proc (Linux)")
def test_sigterm_at_the_start_of_another_command_is_one_line(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "scalegnn", "data", "info", TINY],
                            env=_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _sigterm_once_caught(proc)
    out, err = proc.communicate(timeout=120)
    if proc.returncode == 0:  # it finished before it looked: nothing to see (the machine was fast)
        pytest.skip("data info finished before the signal was acted on")
    assert proc.returncode == 128 + signal.SIGTERM and _one_line(err) == "scalegnn: interrupted by SIGTERM", err


def test_sigterm_during_data_generate_leaves_nothing_behind(tmp_path):
    """Before: the default SIGTERM killed the generation and left its bucket files (157 MB at
    the size of the probe) and a half-written graph."""
    out = tmp_path / "gen"
    proc = subprocess.Popen([sys.executable, "-m", "scalegnn", "data", "generate", "csbm:n=2000000,avg_degree=16",
                             "--out", str(out), "--chunk-edges", "200000"],
                            env=_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    end = time.monotonic() + 120
    while not (out / ".buckets").is_dir() or not any((out / ".buckets").iterdir()):
        assert proc.poll() is None and time.monotonic() < end, proc.communicate()
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "nothing was left" in _one_line(err)
    assert not out.exists()


def test_a_rescued_record_honours_the_cache_dir_and_the_command_fails(tmp_path, monkeypatch, capsys):
    """A record that cannot be written where it was asked goes to $SCALEGNN_CACHE_DIR's rescue
    folder (not the home folder the user moved the cache away from), and ``train`` exits 1."""
    monkeypatch.delenv("SCALEGNN_RESCUE_DIR", raising=False)
    monkeypatch.setenv("SCALEGNN_CACHE_DIR", str(tmp_path / "cache"))
    assert records.rescue_folders()[0] == tmp_path / "cache" / "rescued-records"
    real_write = records.atomic_write_json

    def full_in_runs(target, obj, **kw):
        if Path(target).parent == tmp_path / "runs":
            raise OSError(28, "No space left on device")
        return real_write(target, obj, **kw)

    monkeypatch.setattr(records, "atomic_write_json", full_in_runs)
    assert main(_train(tmp_path, tmp_path / "runs")) == 1
    (path,) = (tmp_path / "cache" / "rescued-records").glob("*.json")
    assert records.read_record(path)["status"] == "ok"
    assert f"it is in {path} instead" in capsys.readouterr().err
