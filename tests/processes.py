"""Whole runs in subprocesses of their own, tagged so that every process they start is
found in /proc (forked workers inherit the tag): ``scalegnn train`` with 4 local ranks
(:class:`CliRun`) or under torchrun (:class:`TorchrunRun`), to be killed, stopped or
signalled mid-epoch, then checked for the record they leave and for processes left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from scalegnn import records
from tests.files import REPO
from tests.runs import MEDIUM


def tagged_processes(tag: str) -> dict[int, str]:
    """{pid: name} of live processes whose environment carries ``SCALEGNN_TEST_TAG=tag``."""
    found = {}
    needle = f"SCALEGNN_TEST_TAG={tag}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle not in f.read():
                    continue
            with open(f"/proc/{entry}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
            with open(f"/proc/{entry}/comm") as f:
                found[int(entry)] = f.read().strip()
        except (OSError, IndexError):
            continue
    return found


class CliRun:
    """``python -m scalegnn train`` with 4 local ranks (prefetch threads on) in a
    subprocess, tagged for /proc."""

    def __init__(self, tmp_path: Path, *extra: str, epochs: int = 60):
        self.tmp, self.tag = tmp_path, uuid.uuid4().hex
        self.ck = tmp_path / "ck"
        cmd = [sys.executable, "-m", "scalegnn", "train", "--dataset", MEDIUM, "--data-root", str(tmp_path / "data"),
               "--out", str(tmp_path / "runs"), "--nproc", "4", "--grid", "1x2x2x1", "--batch-size", "300",
               "--hidden", "32", "--layers", "2", "--epochs", str(epochs), "--quiet", "--prefetch",
               "--checkpoint-every", "3", "--checkpoint-dir", str(self.ck), *extra]
        env = {**os.environ, "SCALEGNN_TEST_TAG": self.tag, "PYTHONPATH": str(REPO)}
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     cwd=str(REPO))
        self.t0 = time.monotonic()

    def wait_for_training(self, timeout_s: float = 50.0) -> None:
        """Until the first checkpoint (step 3 of 10 in epoch 1) is complete: mid-epoch."""
        while not list(self.ck.glob("step-*/meta.json")):
            if self.proc.poll() is not None:
                raise AssertionError(f"run ended early: {self.proc.communicate()}")
            if time.monotonic() - self.t0 > timeout_s:
                self.kill_all()
                raise AssertionError("training did not reach its first checkpoint")
            time.sleep(0.1)

    def rank_pid(self, rank: int) -> int:
        names = tagged_processes(self.tag)
        pids = [pid for pid, name in names.items() if name == f"scalegnn-r{rank}"]
        assert len(pids) == 1, names
        return pids[0]

    def record(self) -> dict:
        """The run's record: after a resume, the resumed run's (which names the record it continued)."""
        found = [records.read_record(path) for path in (self.tmp / "runs").glob("*.json")]
        (latest,) = [r for r in found if r["run_id"] not in {other["resumed_from"] for other in found}]
        return latest

    def wait_no_processes(self, timeout_s: float) -> None:
        end = time.monotonic() + timeout_s
        while tagged_processes(self.tag) and time.monotonic() < end:
            time.sleep(0.2)
        left = tagged_processes(self.tag)
        self.kill_all()
        assert not left, f"processes left behind: {left}"

    def kill_all(self) -> None:
        for pid in tagged_processes(self.tag):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class TorchrunRun(CliRun):
    """``torchrun --nproc-per-node 2 -m scalegnn train`` (grid 1x2x1x1), tagged for /proc;
    ``entry``: a script to run instead of ``-m scalegnn`` (fault injection)."""

    def __init__(self, tmp_path: Path, entry: list[str] | None = None):
        self.tmp, self.tag, self.ck = tmp_path, uuid.uuid4().hex, tmp_path / "ck"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               "--monitor-interval", "0.5", *(entry or ["-m", "scalegnn"]), "train", "--dataset", MEDIUM,
               "--data-root", str(tmp_path / "data"), "--out", str(tmp_path / "runs"), "--grid", "1x2x1x1",
               "--batch-size", "300", "--hidden", "32", "--layers", "2", "--epochs", "60", "--quiet",
               "--checkpoint-every", "3", "--checkpoint-dir", str(self.ck), "--collective-timeout", "20"]
        env = {**os.environ, "SCALEGNN_TEST_TAG": self.tag, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     cwd=str(REPO))
        self.t0 = time.monotonic()

    def rank_pid(self, rank: int) -> int:
        pids = [pid for pid in tagged_processes(self.tag) if _env_of(pid).get("RANK") == str(rank)]
        assert len(pids) == 1, tagged_processes(self.tag)
        return pids[0]

    def finish(self, timeout_s: float = 60.0) -> tuple[float, str]:
        """Wait for torchrun to exit; (seconds waited, its stderr). Kills leftovers."""
        t0 = time.monotonic()
        try:
            _, err = self.proc.communicate(timeout=timeout_s)
        finally:
            self.kill_all()
        return time.monotonic() - t0, err


def _env_of(pid: int) -> dict:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            items = f.read().split(b"\0")
    except OSError:
        return {}
    return dict(item.decode(errors="replace").split("=", 1) for item in items if b"=" in item)
