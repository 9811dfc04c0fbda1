"""Sweeps: profiles and specs as data, expansion, batch scripts, the local end-to-end sweep."""

import json
import os
from pathlib import Path

import pytest

from scalegnn import records
from scalegnn.cli import main
from sweeps import expand, list_profiles, list_specs, load_profile, load_spec
from sweeps.grids import cube_3d, grids_for
from sweeps.launcher import (SweepTask, checkpoint_args, collective_timeout_s, group_runs, run_dir, run_state,
                             submitted_job, supported_systems, sweep)
from sweeps.profiles import ProfileError
from sweeps.spec import SpecError

EXPECTED = Path(__file__).parent / "expected"
SLURM_CLUSTERS = ("perlmutter", "frontier", "tuolumne")


# ---------------------------------------------------------------------------- profiles
def test_every_profile_loads_with_its_documented_fields():
    assert set(list_profiles()) >= {"perlmutter", "frontier", "tuolumne", "local"}
    per, fro, tuo, loc = (load_profile(n) for n in ("perlmutter", "frontier", "tuolumne", "local"))
    assert (per.gpus_per_node, fro.gpus_per_node, tuo.gpus_per_node) == (4, 8, 4)
    assert per.torch_backend == fro.torch_backend == tuo.torch_backend == "nccl" and loc.torch_backend == "gloo"
    assert "RCCL" in fro.comm_library and "RCCL" in tuo.comm_library and "NCCL" in per.comm_library
    # Perlmutter: NCCL over the Slingshot hsn interfaces with GPU-direct RDMA through libfabric/CXI
    assert per.env["NCCL_SOCKET_IFNAME"] == "hsn" and per.env["NCCL_NET_GDR_LEVEL"] == "PHB"
    assert per.env["FI_CXI_DISABLE_HOST_REGISTER"] == "1"
    # Frontier / Tuolumne: RCCL with the CXI provider settings
    for p in (fro, tuo):
        assert p.env["FI_PROVIDER"] == "cxi" and p.env["FI_CXI_ATS"] == "0" and p.env["NCCL_SOCKET_IFNAME"] == "hsn0"
    for p in (per, fro, tuo):
        assert p.scheduler == "slurm" and p.placeholders() and p.setup
        assert p.network.inter_node_GBps == 100  # 4 NICs x 25 GB/s per node (paper VI-A)
    assert loc.scheduler == "local" and loc.placeholders() == []


def test_placement_and_user_errors():
    per, loc = load_profile("perlmutter"), load_profile("local")
    assert per.placement(2) == (1, 2) and per.placement(8) == (2, 4) and per.placement(2048) == (512, 4)
    with pytest.raises(ValueError, match="multiple of 4"):
        per.placement(6)
    with pytest.raises(ValueError, match="local"):
        loc.placement(16)
    with pytest.raises(ProfileError, match="known: .*perlmutter"):
        load_profile("summit")
    assert per.with_overrides(account="m1234", qos="debug").slurm.account == "m1234"


def test_overrides_fill_placeholders(tmp_path):
    with pytest.raises(ValueError, match="placeholders"):
        sweep("fig8", "perlmutter", tmp_path, printer=lambda *a: None)  # refuses before touching SLURM


# ---------------------------------------------------------------------------- grids and specs
def test_cube_grids_and_scale_dp():
    assert [cube_3d(g) for g in (1, 2, 4, 8, 16, 32, 64)] == [
        (1, 1, 1), (2, 1, 1), (2, 2, 1), (2, 2, 2), (4, 2, 2), (4, 4, 2), (4, 4, 4)]
    g = grids_for("scale-dp", [64, 128, 2048])
    assert g == {64: [(1, 4, 4, 4)], 128: [(2, 4, 4, 4)], 2048: [(32, 4, 4, 4)]}
    assert grids_for("dp", [4]) == {4: [(4, 1, 1, 1)]}
    with pytest.raises(ValueError, match="multiples"):
        grids_for("scale-dp", [8, 12])


def test_every_spec_loads_and_expands():
    assert {"fig5_ablation", "fig6_time_to_accuracy", "fig7_strong_scaling", "fig8_epoch_breakdown",
            "table1_accuracy", "table2_eval_time"} <= set(list_specs())
    for name in list_specs():
        spec = load_spec(name)
        for cluster in spec.clusters:
            runs = expand(spec, cluster)
            assert runs and len({r.key for r in runs}) == len(runs)
            assert all(r.train_argv("o")[:2] == ["train", "--dataset"] for r in runs)


def test_fig7_starts_at_the_cube_and_grows_gd():
    runs = expand(load_spec("fig7"), "perlmutter")
    papers = sorted((r for r in runs if r.dataset == "ogbn-papers100M"), key=lambda r: r.world_size)
    assert [r.world_size for r in papers] == [64, 128, 256, 512, 1024, 2048]
    assert [r.grid for r in papers][:2] == [(1, 4, 4, 4), (2, 4, 4, 4)] and papers[-1].grid == (32, 4, 4, 4)
    products = [r for r in runs if r.dataset == "ogbn-products"]
    assert min(r.world_size for r in products) == 8 and products[0].grid == (1, 2, 2, 2)
    # fig8 asks for exactly fig7's Perlmutter Products-14M runs: same keys, shared records
    fig8 = {r.key for r in expand(load_spec("fig8"), "perlmutter")}
    assert fig8 == {r.key for r in runs if r.dataset == "products-14m"}


def test_fig5_variants_are_cumulative_and_fig6_has_targets():
    runs = expand(load_spec("fig5"), "perlmutter")
    assert len(runs) == 10 and {r.grid for r in runs} == {(1, 2, 2, 2), (4, 2, 2, 2)}
    last = next(r for r in runs if r.variant == "+comm overlap")
    argv = last.option_argv()
    assert "--prefetch" in argv and "--compile" in argv and "--comm-overlap" in argv
    assert argv[argv.index("--comm-dtype") + 1] == "bf16"
    fig6 = expand(load_spec("fig6"), "perlmutter")
    reddit = [r for r in fig6 if r.dataset == "reddit"]
    assert {r.target_acc for r in reddit} == {0.95} and all("--stop-at-target" in r.option_argv() for r in reddit)
    salient = next(r for r in reddit if r.system == "salient")
    assert salient.grid[1:] == (1, 1, 1) and "--hidden" not in salient.option_argv()  # baselines keep defaults
    assert {r.seed for r in expand(load_spec("table1"), "perlmutter")} == {0, 1, 2}


def test_local_stand_ins_and_spec_errors(tmp_path):
    runs = expand(load_spec("fig7"), "local")
    assert [r.grid for r in runs] == [(1, 2, 1, 1), (2, 2, 1, 1), (4, 2, 1, 1)]  # 4 datasets map to one stand-in
    assert all(r.paper_dataset == "ogbn-products" and r.dataset.startswith("csbm") for r in runs)
    with pytest.raises(SpecError, match="no experiments for cluster"):
        expand(load_spec("table2"), "frontier")
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "x"\nsystems = ["nope"]\n[[experiments]]\ncluster = "local"\ndataset = "cora"\ngpus = [1]\n')
    with pytest.raises(SpecError, match="unknown systems"):
        load_spec(bad)
    bad.write_text('name = "x"\nsystems = ["scalegnn"]\n[train]\ngrid = "1x1x1x2"\n[[experiments]]\n'
                   'cluster = "local"\ndataset = "cora"\ngpus = [1]\n')
    with pytest.raises(SpecError, match="set by the sweep"):
        load_spec(bad)


# ---------------------------------------------------------------------------- batch scripts
@pytest.mark.parametrize("cluster", SLURM_CLUSTERS)
def test_sbatch_script_matches_the_reviewed_file(cluster):
    """The batch script of fig7's largest job array; regenerate with UPDATE_EXPECTED=1 and review the diff."""
    out = sweep("fig7", cluster, f"/scratch/scalegnn/fig7-{cluster}", dry_run=True, python="python3",
                printer=lambda *a: None)
    sizes = [len(g) for g in group_runs(out.todo, load_profile(cluster)).values()]
    script = out.scripts[max(range(len(sizes)), key=lambda k: (sizes[k], -k))]
    expected = EXPECTED / f"sbatch_{cluster}.sh"
    if os.environ.get("UPDATE_EXPECTED"):
        expected.write_text(script)
    assert script == expected.read_text()
    profile = load_profile(cluster)
    assert f"#SBATCH --ntasks-per-node={profile.gpus_per_node}" in script and "--array=0-" in script
    assert "#SBATCH --signal=USR2@120" in script  # time to checkpoint before the limit


def test_cli_dry_run_prints_scripts_and_submits_nothing(tmp_path, capsys):
    assert main(["sweep", "fig8", "--cluster", "perlmutter", "--dry-run", "--out", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert text.count("#!/bin/bash") == 6 and text.count("# ---- job") == 6
    assert "--grid 32x4x4x2" in text and not (tmp_path / "runs").exists()


# ---------------------------------------------------------------------------- the task
def test_task_checkpoint_requeues_the_same_run_with_resume(tmp_path):
    args = checkpoint_args(tmp_path, "20m")
    assert args[:2] == ["--checkpoint-dir", str(tmp_path / "checkpoint")] and "--resume" in args
    assert args[-2:] == ["--checkpoint-every", "20m"]
    task = SweepTask({"argv": ["train"], "key": "k", "world_size": 2, "system": "scalegnn"}, str(tmp_path), "gloo")
    delayed = task.checkpoint()
    assert delayed.function.requeued == 1 and delayed.function.run == task.run


def test_unavailable_systems_are_reported_not_dropped(tmp_path):
    known = supported_systems()
    out = sweep("fig6", "perlmutter", tmp_path, dry_run=True, python="python3", printer=lambda *a: None)
    if known is not None and "massivegnn" not in known:
        assert out.unsupported and {r.system for r in out.unsupported} == {"massivegnn"}


# ---------------------------------------------------------------------------- end to end, locally
TINY = "csbm:n=600,avg_degree=8,classes=4,feature_dim=16"


def _tiny_spec(tmp_path) -> Path:
    spec = tmp_path / "tiny.toml"
    spec.write_text(f'''
name = "tiny"
figure = "demo"
systems = ["scalegnn"]
seeds = [0]
[targets]
"{TINY}" = 0.3
[train]
hidden = 16
layers = 2
batch-ratio = 0.25
epochs = 2
eval-every = 1
[[experiments]]
cluster = "local"
dataset = "{TINY}"
gpus = [1, 2]
grids = "scale-dp"
''')
    return spec


@pytest.mark.slow
def test_local_sweep_end_to_end_then_resubmission_submits_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("SCALEGNN_DATA_ROOT", str(tmp_path / "data"))
    out = tmp_path / "out"
    spec = _tiny_spec(tmp_path)
    first = sweep(spec, "local", out, printer=lambda *a: None)
    assert not first.failed and len(first.submitted) == 2
    manifest = json.loads((out / "tiny-local.manifest").read_text())
    assert [r["grid"] for r in manifest["runs"]] == ["1x1x1x1", "2x1x1x1"]
    for run in first.runs:
        state, path, _ = run_state(out / "runs" / run.key)
        assert state == "ok"
        rec = records.read_record(path)
        assert rec["world_size"] == run.world_size
    two = records.read_record(run_state(out / "runs" / first.runs[1].key)[1])
    assert two["env"]["backend"] == "gloo" and len(two["peak_memory_bytes_per_rank"]) == 2  # a 2-task job
    assert list((out / ".submitit").rglob("*_1_log.out"))  # submitit ran task 1 of that job
    again = sweep(spec, "local", out, printer=lambda *a: None)
    assert again.submitted == [] and again.todo == [] and len(again.done) == 2
    # and the report from those records
    assert main(["report", str(out), "--out", str(tmp_path / "report")]) == 0
    report = (tmp_path / "report" / "report.md").read_text()
    assert "fig7_strong_scaling.png" in report and (tmp_path / "report" / "fig7_strong_scaling.pdf").exists()
    assert "## Provenance of every run" in report and "every run of every sweep manifest has an ok record" in report


def test_collective_timeout_reaches_the_sweep_tasks_process_group():
    assert collective_timeout_s(["train", "--collective-timeout", "90"]) == 90.0
    assert collective_timeout_s(["train", "--collective-timeout=45.5"]) == 45.5
    assert collective_timeout_s(["train", "--epochs", "3"]) == 600.0  # scalegnn train's default


def test_resubmission_skips_runs_whose_slurm_job_is_still_queued(tmp_path, monkeypatch):
    """A run submitted earlier whose job squeue still lists is neither done nor
    submitted again; once the job has left the queue without a record it is."""
    import sweeps.launcher as launcher

    first = sweep("fig8", "perlmutter", tmp_path, dry_run=True, python="python3", printer=lambda *a: None)
    runs = first.todo
    for i, run in enumerate(runs):
        launcher._mark_submitted(run_dir(tmp_path, run), f"777_{i}", "perlmutter")
    assert submitted_job(run_dir(tmp_path, runs[0])) == "777_0"
    monkeypatch.setattr(launcher, "active_slurm_jobs", lambda: {f"777_{i}" for i in range(len(runs))})
    lines = []
    out = sweep("fig8", "perlmutter", tmp_path, python="python3", printer=lines.append)
    assert len(out.queued) == len(runs) and not out.todo and not out.submitted
    assert f"{len(runs)} still queued or running" in lines[0]
    # the jobs left the queue with no record: they are submitted again (which gets as
    # far as the profile's unfilled account placeholder here)
    monkeypatch.setattr(launcher, "active_slurm_jobs", lambda: set())
    with pytest.raises(ValueError, match="placeholders"):
        sweep("fig8", "perlmutter", tmp_path, python="python3", printer=lambda *a: None)
