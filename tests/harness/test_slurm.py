"""The real-scheduler tier: sweeps against a one-node SLURM cluster on this machine.

``make test-slurm`` (``pytest -m slurm tests/harness/test_slurm.py``) runs it; the plain
``make test`` deselects it (``-m "not slurm"`` in pyproject.toml). The cluster is
started by ``tests/slurm/localslurm.sh`` (slurmctld + slurmd + munge, installed
with apt-get if missing; root on Debian, as CI is) in a scratch folder, and stopped
by pid at the end; ``SCALEGNN_SLURM_CONF=<slurm.conf>`` uses a cluster that already
runs instead. Without root or apt-get the tier is skipped (reported as skipped).

What runs for real here: sbatch job arrays of multi-rank runs (one task per rank,
srun), the staging job they depend on, records landing, a resubmission leaving done
and queued runs alone, USR2 preemption -> checkpoint -> requeue -> a resumed run
whose losses equal an uninterrupted run's (``==``), a real time limit (``--time 3``
and SLURM's own USR2 120 s ahead) followed by ``scancel`` recorded as
``cancelled``, a rank killed by SIGKILL recorded as ``failed``, DistDGL as one task
on one node (refused on two; skipped without the DGL environment), and the fig7
sweep on stand-in graphs with its report. No timings are asserted.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from scalegnn import records
from scalegnn.sweeps.folders import run_dir, run_state, submitted_job
from scalegnn.sweeps.launcher import sweep
from tests.slurm_cluster import cancel_all_and_wait, slurm_clients, squeue, wait_for

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
LOCALSLURM = REPO / "tests" / "slurm" / "localslurm.sh"
SMALL = "csbm:n=600,avg_degree=8,classes=4,feature_dim=16"
# A run long enough to be interrupted (tens of steps per epoch, many epochs).
LONG = "csbm:n=20000,avg_degree=8,classes=4,feature_dim=16"


# ---------------------------------------------------------------------------- the cluster
@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A running one-node SLURM cluster: SLURM_CONF set for this process and its jobs,
    this checkout first on every job's PYTHONPATH (sbatch exports the environment)."""
    own = None
    conf = os.environ.get("SCALEGNN_SLURM_CONF")
    if not conf:
        if os.geteuid() != 0:
            pytest.skip("the SLURM tier starts slurmd and munged: it needs root (or SCALEGNN_SLURM_CONF of a "
                        "running cluster)")
        if shutil.which("slurmctld") is None and shutil.which("apt-get") is None:
            pytest.skip("no SLURM here and no apt-get to install it (set SCALEGNN_SLURM_CONF to a running cluster)")
        own = tmp_path_factory.mktemp("slurm")
        proc = subprocess.run(["bash", str(LOCALSLURM), "up", str(own)], capture_output=True, text=True,
                              timeout=600)
        assert proc.returncode == 0, f"localslurm.sh up failed:\n{proc.stdout}\n{proc.stderr}"
        conf = str(own / "slurm.conf")
    with slurm_clients(conf):
        try:
            yield conf
        finally:
            if own is not None:
                cancel_all_and_wait()
                subprocess.run(["bash", str(LOCALSLURM), "down", str(own)], timeout=120)








def _spec(folder: Path, name: str, dataset: str, grids: list[str], epochs: int, extra: str = "") -> Path:
    gpus = sorted({_world(g) for g in grids})
    path = folder / f"{name}.toml"
    path.write_text(f'''
name = "{name}"
figure = "demo"
systems = ["scalegnn"]
seeds = [0]
[train]
hidden = 16
layers = 2
batch-ratio = 0.05
epochs = {epochs}
eval-every = {epochs}
{extra}
[[experiments]]
cluster = "localslurm"
dataset = "{dataset}"
gpus = {gpus}
grids = {json.dumps(grids)}
''')
    return path


def _world(grid: str) -> int:
    n = 1
    for g in grid.split("x"):
        n *= int(g)
    return n


def _run(spec, out, data, lines=None, dry_run=False, **overrides):
    return sweep(spec, "localslurm", out, data_root=str(data), dry_run=dry_run,
                 printer=(lines.append if lines is not None else (lambda *a: None)), overrides=overrides or None)


def _ok(out, run):
    state, path, _ = run_state(run_dir(out, run))
    return path if state == "ok" else None


def _state(out, run):
    return run_state(run_dir(out, run))


def _restarts(job: str) -> int:
    out = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True, timeout=30).stdout
    fields = dict(tok.split("=", 1) for tok in out.split() if "=" in tok)
    return int(fields.get("Restarts", 0))


def _requeued(job: str) -> bool:
    """Requeued and waiting (a requeued job is eligible only 120 s later: BeginTime)."""
    return squeue("%T", job) == ["PENDING"] and _restarts(job) >= 1


def _job(out, run) -> str:
    return submitted_job(run_dir(out, run))


def _logs(out) -> str:
    return "".join(p.read_text(errors="replace") for p in sorted((Path(out) / ".submitit").rglob("*_log.*")))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return tmp_path_factory.mktemp("data")


@pytest.fixture(autouse=True)
def no_job_left_behind(cluster):
    """Whatever a test submitted and left in the queue (a failed assertion mid-test) is
    cancelled when it ends, so no training process outlives it."""
    before = set(squeue("%A"))
    yield
    left = sorted(set(squeue("%A")) - before)
    if left:
        subprocess.run(["scancel", *left], capture_output=True, timeout=30)
        end = time.monotonic() + 90
        while time.monotonic() < end and set(squeue("%A")) & set(left):
            time.sleep(2)


# ---------------------------------------------------------------------------- the tests
def test_job_array_of_multi_rank_runs_staged_then_resubmission_skips_queued_and_done(cluster, tmp_path, data):
    spec = _spec(tmp_path, "arr", SMALL, ["2x1x1x1", "1x2x1x1"], epochs=3)
    out = tmp_path / "out"
    lines = []
    first = _run(spec, out, data, lines)
    assert len(first.submitted) == 2 and len({j.split("_")[0] for j in first.submitted}) == 1  # one job array
    assert len(first.staged) == 1 and len(first.stages) == 2  # a shard set per grid, one staging task for the graph
    assert any("after staging job(s)" in line for line in lines)
    # submitted a moment ago (the staging job runs first): both runs are still queued
    again = _run(spec, out, data)
    assert len(again.queued) == 2 and again.todo == [] and again.submitted == [] and again.staged == []
    for run in first.runs:
        wait_for(lambda r=run: _ok(out, r), 300, f"an ok record of {run.key}")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    for run in first.runs:
        rec = records.read_record(_ok(out, run))
        assert rec["world_size"] == 2 and len(rec["peak_memory_bytes_per_rank"]) == 2
        stage = first.stages[run.key]
        assert rec["config"]["data"]["shard_dir"] == stage.folder and stage.done()  # read only its shard
        assert rec["config"]["data"]["data_root"] == str(Path(data).resolve())
        assert rec["env"]["git_commit"] == (head or None)  # the jobs ran this checkout's code
    assert f"scalegnn from {REPO / 'scalegnn'}" in _logs(out)
    done = _run(spec, out, data)
    assert len(done.done) == 2 and done.submitted == [] and done.staged == []


def test_usr2_preemption_checkpoints_requeues_and_resumes_exactly(cluster, tmp_path, data):
    """scancel --signal=USR2 mid-run: every rank saves at the same step, submitit requeues,
    the requeued job resumes; its per-epoch losses equal an uninterrupted run's exactly."""
    spec = _spec(tmp_path, "pre", LONG, ["1x2x1x1"], epochs=30)
    ref_out, out = tmp_path / "reference", tmp_path / "preempted"
    ref = _run(spec, ref_out, data, checkpoint_every="1000")
    pre = _run(spec, out, data, checkpoint_every="5")
    run = pre.runs[0]
    job = _job(out, run)
    ckpt = run_dir(out, run) / "checkpoint"
    wait_for(lambda: list(ckpt.glob("step-*/meta.json")), 300, "the first periodic checkpoint", every_s=0.5)
    subprocess.run(["scancel", "--signal=USR2", job], check=True, timeout=30)
    wait_for(lambda: _requeued(job), 120, "the requeue", every_s=1)
    subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], check=True, timeout=30)
    path = wait_for(lambda: _ok(out, run), 400, "the resumed run's ok record")
    rec = records.read_record(path)
    assert rec["resumed"] and rec["checkpoint"]["saves"] >= 2
    log = _logs(out)
    assert "preempted (SIGUSR2): checkpoint saved at step" in log and "(restart 1)" in log
    ref_path = wait_for(lambda: _ok(ref_out, ref.runs[0]), 400, "the uninterrupted run's ok record")
    want = records.read_record(ref_path)
    assert rec["run_id"] != want["run_id"]
    for key in ("loss", "batch_train_acc", "test_acc"):
        assert [e[key] for e in rec["epochs"]] == [e[key] for e in want["epochs"]], key
    assert len(rec["epochs"]) == 30


def test_real_time_limit_requeues_and_resumes_then_scancel_is_recorded_cancelled(cluster, tmp_path, data):
    """--time 3: SLURM itself sends USR2 120 s before the limit; the run saves, is
    requeued and resumes; then scancel ends it, and the run is recorded as cancelled
    (not left silently unfinished), with its resumed history."""
    spec = _spec(tmp_path, "limit", LONG, ["1x2x1x1"], epochs=400)
    out = tmp_path / "out"
    first = _run(spec, out, data, time_min=3, checkpoint_every="10")
    run = first.runs[0]
    job = _job(out, run)
    wait_for(lambda: _requeued(job), 240, "SLURM's time-limit signal and the requeue", every_s=1)
    subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], check=True, timeout=30)
    wait_for(lambda: "(restart 1)" in _logs(out), 120, "the requeued job to start", every_s=1)
    assert "Caught signal SIGUSR2" in _logs(out)  # nobody but SLURM sent it here: the time limit's warning
    ckpt = run_dir(out, run) / "checkpoint"
    resumed_from = max(int(p.parent.name.split("-")[1]) for p in ckpt.glob("step-*/meta.json"))
    wait_for(lambda: max(int(p.parent.name.split("-")[1]) for p in ckpt.glob("step-*/meta.json")) > resumed_from,
          180, "a checkpoint of the resumed attempt", every_s=1)
    subprocess.run(["scancel", job], check=True, timeout=30)
    wait_for(lambda: _state(out, run)[0] == "cancelled", 90, "the cancelled record", every_s=1)
    state, path, error = _state(out, run)
    rec = records.read_record(path)
    assert f"SLURM job {job} was cancelled" in error and rec["resumed"]
    assert rec["resumed"][0]["step"] == resumed_from
    wait_for(lambda: not squeue("%i", job), 90, "the job to leave the queue")
    again = _run(spec, out, data, dry_run=True)  # (a dry run: submits nothing)
    assert [r.key for r in again.todo] == [run.key] and not again.done  # cancelled is not done: a resubmission resumes it


def _rank_pid(job: str, rank: int) -> int | None:
    """The pid of the task of ``job`` (an array task id such as 12_0 is its own job) with SLURM_PROCID == rank."""
    ids = {job}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            env = dict(v.split("=", 1) for v in (proc / "environ").read_bytes().decode(errors="replace").split("\0")
                       if "=" in v)
            cmd = (proc / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if "submitit.core._submit" in cmd and env.get("SLURM_PROCID") == str(rank) and \
                (env.get("SLURM_JOB_ID") in ids or
                 f"{env.get('SLURM_ARRAY_JOB_ID')}_{env.get('SLURM_ARRAY_TASK_ID')}" in ids):
            return int(proc.name)
    return None


def _epochs_saved(ckpt: Path) -> int:
    """Epochs completed at the newest complete checkpoint (0 without one)."""
    done = 0
    for meta in ckpt.glob("step-*/meta.json"):
        try:
            done = max(done, int(json.loads(meta.read_text())["epoch"]))
        except (OSError, ValueError, KeyError):
            continue  # pruned or being written
    return done


def test_a_rank_killed_mid_run_is_recorded_as_failed(cluster, tmp_path, data):
    spec = _spec(tmp_path, "fail", LONG, ["2x1x1x1"], epochs=400)
    out = tmp_path / "out"
    first = _run(spec, out, data, checkpoint_every="5")
    run = first.runs[0]
    job = _job(out, run)
    wait_for(lambda: _epochs_saved(run_dir(out, run) / "checkpoint") >= 1, 300, "the first epoch", every_s=0.5)
    pid = wait_for(lambda: _rank_pid(job, 1), 30, "rank 1's process")
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: _state(out, run)[0] == "failed", 120, "the failed record", every_s=1)
    state, path, error = _state(out, run)
    rec = records.read_record(path)
    assert error and rec["epochs"] and rec["world_size"] == 2  # rank 0 wrote it, with the epochs done before
    wait_for(lambda: not squeue("%i", job), 120, "the job to leave the queue")
    again = _run(spec, out, data, dry_run=True)  # (a dry run: submits nothing)
    assert [r.key for r in again.todo] == [run.key] and not again.done


def test_distdgl_runs_as_one_task_on_one_node_and_is_refused_on_two(cluster, tmp_path, data, monkeypatch):
    """DistDGL starts its own servers and trainers: its job has one task (2 trainers inside
    it, one record), and a run that would need two nodes is refused with the reason."""
    dgl = os.environ.get("SCALEGNN_DGL_PYTHON") or str(REPO / ".venv-dgl" / "bin" / "python")
    if not Path(dgl).is_file():
        pytest.skip(f"no DGL environment ({dgl}); build it with `make dgl-env` or set SCALEGNN_DGL_PYTHON")
    monkeypatch.setenv("SCALEGNN_DGL_PYTHON", dgl)  # the job inherits it
    spec = tmp_path / "dgl.toml"
    spec.write_text(f'''
name = "dgl"
figure = "demo"
systems = ["distdgl"]
seeds = [0]
[train]
epochs = 2
eval-every = 2
[[experiments]]
cluster = "localslurm"
dataset = "{SMALL}"
gpus = [2, 16]
''')
    out = tmp_path / "out"
    lines = []
    first = _run(spec, out, data, lines)
    assert [r.world_size for r in first.runs] == [2] and [r.world_size for r, _ in first.refused] == [16]
    assert any("refused (1 run(s)): distdgl starts its servers and trainers on one host" in line for line in lines)
    run = first.runs[0]
    rec = records.read_record(wait_for(lambda: _ok(out, run), 300, "the DistDGL run's ok record"))
    assert rec["system"] == "distdgl" and rec["world_size"] == 2 and len(list(run_dir(out, run).glob("2*.json"))) == 1
    logs = sorted(p.name for p in (out / ".submitit").rglob("*_log.out"))
    assert logs and all("_0_log.out" in name for name in logs)  # one task: no task 1 log
    manifest = json.loads((out / "dgl-localslurm.manifest").read_text())
    assert [r["world_size"] for r in manifest["refused"]] == [16] and "127.0.0.1" in manifest["refused"][0]["reason"]


def test_fig7_stand_in_sweep_on_slurm_then_the_report(cluster, tmp_path, data):
    """The must-show: `scalegnn sweep fig7 --cluster localslurm` (stand-in graph, 2, 4 and
    8 ranks, data staged) runs to completion and the report renders from its records."""
    from scalegnn.cli import main

    out = tmp_path / "fig7"
    first = _run("fig7", out, data)
    assert [r.world_size for r in first.runs] == [2, 4, 8] and len(first.staged) == 1  # 3 shard sets, 1 graph
    for run in first.runs:
        wait_for(lambda r=run: _ok(out, r), 600, f"an ok record of {run.key}")
    assert main(["report", str(out), "--out", str(tmp_path / "report")]) == 0
    report = (tmp_path / "report" / "report.md").read_text()
    assert "fig7_strong_scaling.png" in report and (tmp_path / "report" / "fig7_strong_scaling.pdf").exists()
    assert "every run of every sweep manifest has an ok record" in report
