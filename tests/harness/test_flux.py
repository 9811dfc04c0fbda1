"""Flux (sweeps/flux.py): the batch script of a Flux sweep, a sweep end to end under a
simulated ``flux`` command (tests/flux_sim), and the task's checks. How a process reads
Flux's variables is in tests/integration/test_launch_environment.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from scalegnn import records
from scalegnn.sweeps import load_profile
from scalegnn.sweeps.folders import run_state
from scalegnn.sweeps.jobs import group_runs
from scalegnn.sweeps.launcher import sweep
from tests.files import REPO
from tests.launchers import FLUX_SIM, LAUNCHER_VARS, clean_env, flux_task_env  # noqa: F401 (clean_env: a fixture)

EXPECTED = REPO / "tests" / "expected"


def test_flux_script_matches_the_reviewed_file():
    """fig7's largest Flux batch (Tuolumne); regenerate with UPDATE_EXPECTED=1 and review the diff."""
    out = sweep("fig7", "tuolumne", "/scratch/scalegnn/fig7-tuolumne", dry_run=True, python="python3",
                data_root="/scratch/data", printer=lambda *a: None)
    sizes = [len(g) for g in group_runs(out.todo, load_profile("tuolumne")).values()]
    script = out.scripts[max(range(len(sizes)), key=lambda k: (sizes[k], -k))]
    expected = EXPECTED / "flux_tuolumne.sh"
    if os.environ.get("UPDATE_EXPECTED"):
        expected.write_text(script)
    assert script == expected.read_text()
    assert "# flux: --nodes=16" in script and "# flux: --bank=<BANK>" in script and "#SBATCH" not in script
    runs = [line for line in script.splitlines() if line.startswith("flux run -N 16 -n 64 ")]
    assert len(runs) == max(sizes) and all("--signal=SIGUSR2@120s" in line for line in runs)
    assert script.count("flux run -N 1 -n 1 ") == max(sizes)  # one staging step per shard set
    with pytest.raises(ValueError, match="placeholders.*flux.bank"):
        sweep("fig7", "tuolumne", "/scratch/scalegnn/x", python="python3", printer=lambda *a: None)


TINY = "csbm:n=400,avg_degree=8,classes=4,feature_dim=16"


def _sim_profile(tmp_path) -> Path:
    text = Path(load_profile("tuolumne").source).read_text()
    head, tail = text.split("[network]", 1)
    profile = tmp_path / "fluxsim.toml"
    profile.write_text(f'''
name = "fluxsim"
description = "this machine under a simulated flux command (tests/flux_sim)"
scheduler = "flux"
gpus_per_node = 2
cpus_per_task = 1
threads_per_task = 1
device = "cpu"
torch_backend = "gloo"
comm_library = "gloo"
time_min = 10
checkpoint_every = "10m"
offline = true
setup = []
[flux]
bank = "sim"
queue = "debug"
run_args = ["-o", "cpu-affinity=per-task"]
[env]
OMP_NUM_THREADS = "1"
GLOO_SOCKET_IFNAME = "lo"
[network]{tail}''')
    return profile


@pytest.mark.slow
def test_flux_sweep_end_to_end_under_a_simulated_flux(tmp_path, monkeypatch):
    """The scripts run: staging once, every task joining from Flux's variables (the
    rendezvous host from `flux getattr hostlist`), offline, records landing; a
    resubmission submits nothing."""
    for var in LAUNCHER_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PATH", f"{FLUX_SIM}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    monkeypatch.setenv("FLUX_SIM_HOSTLIST", "localhost")
    spec = tmp_path / "tiny.toml"
    spec.write_text(f'''
name = "tiny"
figure = "demo"
systems = ["scalegnn"]
seeds = [0]
[train]
hidden = 16
layers = 2
batch-ratio = 0.25
epochs = 2
eval-every = 1
[[experiments]]
cluster = "fluxsim"
dataset = "{TINY}"
gpus = [1, 2]
grids = "scale-dp"
''')
    out = tmp_path / "out"
    data = tmp_path / "data"
    first = sweep(spec, str(_sim_profile(tmp_path)), out, data_root=str(data), printer=lambda *a: None)
    assert len(first.submitted) == 2 and all(j.startswith("ƒsim") for j in first.submitted)
    assert len(first.stages) == 1  # the 2-rank run reads staged shards; the 1-rank run loads the graph
    stage = next(iter(first.stages.values()))
    assert stage.done() and json.loads((Path(stage.folder) / "manifest.json").read_text())["grid_shape"] == [2, 1, 1, 1]
    for run in first.runs:
        state, path, err = run_state(out / "runs" / run.key)
        assert state == "ok", (state, err, [p.read_text()[-3000:] for p in (out / ".flux").glob("*.out")])
        rec = records.read_record(path)
        assert rec["world_size"] == run.world_size and rec["config"]["data"]["data_root"] == str(data.resolve())
        assert rec["config"]["data"]["shard_dir"] == (stage.folder if run.world_size == 2 else None)
        assert len(rec["peak_memory_bytes_per_rank"]) == run.world_size
    logs = "".join(p.read_text() for p in (out / ".flux").glob("*.out"))
    assert "Flux job ƒsim" in logs  # the task's start line (rank 0)
    again = sweep(spec, str(_sim_profile(tmp_path)), out, data_root=str(data), printer=lambda *a: None)
    assert again.submitted == [] and len(again.done) == 2


def test_flux_task_refuses_a_wrong_task_count(tmp_path, clean_env, capsys):
    from scalegnn.sweeps.flux import main as flux_task

    flux_task_env(clean_env, 0, 3, 0)
    clean_env.setenv("MASTER_ADDR", "127.0.0.1")
    task = tmp_path / "t.json"
    task.write_text(json.dumps({"kind": "run", "backend": "gloo", "threads": 1,
                                "run": {"key": "k", "world_size": 2, "system": "scalegnn", "argv": ["train"]}}))
    assert flux_task([str(task)]) == 2
    assert "run k needs 2 task(s), this `flux run` has 3 (flux); launch it with -n 2" in capsys.readouterr().err
    assert flux_task([]) == 2 and "usage: python -m scalegnn.sweeps.flux TASK_FILE" in capsys.readouterr().err
