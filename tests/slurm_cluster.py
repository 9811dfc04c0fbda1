"""What the two real-SLURM tiers share (tests/harness/test_slurm.py on one node,
tests/harness/test_cluster.py on several): a running cluster's clients set up for this
process and the jobs it submits, the queue, waiting, and leaving nothing behind."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time

from tests.files import REPO


@contextlib.contextmanager
def slurm_clients(conf: str):
    """SLURM_CONF set for this process and every job it submits (sbatch and srun pass the
    environment on), this checkout first on their PYTHONPATH, one torch thread per rank
    (the ranks share the machine's cores); all three restored afterwards."""
    saved = {k: os.environ.get(k) for k in ("SLURM_CONF", "PYTHONPATH", "OMP_NUM_THREADS")}
    os.environ["SLURM_CONF"] = conf
    os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in [saved["PYTHONPATH"]] if p])
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        yield conf
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def squeue(fmt: str, job: str | None = None) -> list[str]:
    """``squeue -o fmt`` lines, one per job (one per array task: ``-r``)."""
    cmd = ["squeue", "-h", "-r", "-o", fmt] + (["-j", job] if job else [])
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout
    return [line.strip() for line in out.splitlines() if line.strip()]


def cancel_all_and_wait(timeout_s: float = 90) -> None:
    """Leave no job (hence no process) behind before the daemons stop."""
    subprocess.run(["scancel", "-u", "root"], capture_output=True, timeout=30)
    end = time.monotonic() + timeout_s
    while time.monotonic() < end and squeue("%i"):
        time.sleep(2)


def wait_for(predicate, timeout_s: float, what: str, every_s: float = 2.0):
    """``predicate()``'s first true value, polled every ``every_s``; an AssertionError
    naming ``what`` and the queue after ``timeout_s``."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}; queue: {squeue('%i %T %R')}")
