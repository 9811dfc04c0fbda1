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
pytestmark = pytest.mark.usefixtures("login_node")  # $USER of a login node: the tuolumne profile's site paths


def test_flux_script_matches_the_reviewed_file():
    """fig7's largest Flux batch (Tuolumne) and its first staging job; regenerate with
    UPDATE_EXPECTED=1 and review the diff."""
    out = sweep("fig7", "tuolumne", "/scratch/scalegnn/fig7-tuolumne", dry_run=True, data_root="/scratch/data",
                printer=lambda *a: None)
    sizes = [len(g) for g in group_runs(out.todo, load_profile("tuolumne")).values()]
    script = out.scripts[max(range(len(sizes)), key=lambda k: (sizes[k], -k))]
    for text, name in ((script, "flux_tuolumne.sh"), (out.stage_scripts[0], "flux_tuolumne_stage.sh")):
        if os.environ.get("UPDATE_EXPECTED"):
            (EXPECTED / name).write_text(text)
        assert text == (EXPECTED / name).read_text(), name
    assert "# flux: --nodes=16" in script and "# flux: --bank=<BANK>" in script and "#SBATCH" not in script
    python = '"${SCALEGNN_VENV}/bin/python"'
    runs = [line for line in script.splitlines() if line.startswith("flux run -N 16 -n 64 ")]
    assert len(runs) == max(sizes) and all("--signal=SIGUSR2@120s" in line and f" {python} -u -m " in line
                                           for line in runs)
    # staging is no longer inside the runs' allocation: a job per graph, which the runs' job waits for
    assert "flux run -N 1 -n 1 " not in script and "# flux: --dependency=afterok:'<staging job>'" in script
    assert len(out.stage_scripts) == 3 and all("# flux: --nodes=1\n# flux: --time-limit=120m" in st and
                                               "flux run -N 1 -n 1 --cores-per-task=84 " in st and "preflight" not in st
                                               for st in out.stage_scripts)
    check = f"{python} -m scalegnn.sweeps.preflight --device rocm --net-plugin librccl-net.so || exit 1"
    assert script.index("# setup") < script.index(check) < script.index("flux run ")
    assert 'export GLOO_SOCKET_IFNAME="hsi0"\nexport NCCL_SOCKET_IFNAME="hsi0"' in script
    with pytest.raises(ValueError, match="placeholders.*flux.bank"):
        sweep("fig7", "tuolumne", "/scratch/scalegnn/x", python="python3", printer=lambda *a: None)


TINY = "csbm:n=400,avg_degree=8,classes=4,feature_dim=16"


def _sim_profile(tmp_path) -> Path:
    text = Path(load_profile("tuolumne").source).read_text()
    head, tail = text.split("[network]", 1)
    assert 'socket_ifname = "hsi0"' in tail
    tail = tail.replace('socket_ifname = "hsi0"', 'socket_ifname = "lo"')  # GLOO_SOCKET_IFNAME, from [network]
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
[network]{tail}''')
    return profile


def _simulated_flux(tmp_path, monkeypatch) -> Path:
    """The simulated ``flux`` first on PATH, keeping job states (afterok) in a folder; the
    spec of a 1-rank and a 2-rank run on a tiny graph, for the fluxsim profile."""
    for var in LAUNCHER_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PATH", f"{FLUX_SIM}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    monkeypatch.setenv("FLUX_SIM_HOSTLIST", "localhost")
    (tmp_path / "flux-state").mkdir()
    monkeypatch.setenv("FLUX_SIM_STATE", str(tmp_path / "flux-state"))
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
    return spec


@pytest.mark.slow
def test_flux_sweep_end_to_end_under_a_simulated_flux(tmp_path, monkeypatch):
    """The scripts run: staging once in a job of its own that the runs' job depends on,
    every task joining from Flux's variables (the rendezvous host from `flux getattr
    hostlist`), offline, records landing; a resubmission submits nothing."""
    spec = _simulated_flux(tmp_path, monkeypatch)
    out = tmp_path / "out"
    data = tmp_path / "data"
    first = sweep(spec, str(_sim_profile(tmp_path)), out, data_root=str(data), printer=lambda *a: None)
    assert len(first.submitted) == 2 and all(j.startswith("ƒsim") for j in first.submitted)
    assert len(first.stages) == 1  # the 2-rank run reads staged shards; the 1-rank run loads the graph
    [staged] = first.staged
    scripts = {p.name: p.read_text() for p in (out / ".flux").glob("*.sh")}
    assert sum(f"# flux: --dependency=afterok:'{staged}'" in text for text in scripts.values()) == 1
    stage = next(iter(first.stages.values()))
    # the 2x1x1x1 run reads the shards of its 3D grid, staged once for 1x1x1x1
    assert stage.done() and json.loads((Path(stage.folder) / "manifest.json").read_text())["grid_shape"] == [1, 1, 1, 1]
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


@pytest.mark.slow
def test_a_failed_staging_job_stops_the_runs_that_depend_on_it(tmp_path, monkeypatch):
    """Staging fails (its shards folder cannot be made): its job exits non-zero, Flux
    does not start the job whose runs read its shards (afterok), and the run that loads
    the graph itself, in a job that does not depend on it, still finishes."""
    spec = _simulated_flux(tmp_path, monkeypatch)
    out = tmp_path / "out"
    out.mkdir()
    (out / "shards").write_text("")  # not a folder: no shard set can be written
    first = sweep(spec, str(_sim_profile(tmp_path)), out, data_root=str(tmp_path / "data"), printer=lambda *a: None)
    one, two = sorted(first.runs, key=lambda r: r.world_size)
    assert run_state(out / "runs" / one.key)[0] == "ok" and run_state(out / "runs" / two.key)[0] == "missing"
    logs = {p.name: p.read_text() for p in (out / ".flux").glob("*.out")}
    [stage_log] = [text for name, text in logs.items() if "-stage-" in name]
    assert "staging failed for 1 of 1 shard set(s)" in stage_log
    [blocked] = [text for text in logs.values() if "not run: dependency afterok:" in text]
    assert first.staged[0] in blocked


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
