r"""Sweeps (sweeps/): profiles and specs as data, expansion, batch scripts, staging, the
task of a sweep, the local end-to-end sweep.

Sweep parameters in batch scripts: a newline in ``scalegnn sweep --account`` (or a
profile's ``slurm.account`` / ``flux.bank``, a spec's ``name``) ended its ``#SBATCH`` /
``# flux:`` directive and put a shell line into the batch script; ``$(...)`` and
backticks in a profile's ``[env]`` value ran when the script exported it. Now:

==============================================  =====================================================
input                                           message (one line; exit 2 for the CLI)
==============================================  =====================================================
``sweep --account $'m1234\ntouch X'`` (SLURM,   --account 'm1234\ntouch X': '\n' cannot go into a
Flux), ``--dry-run`` or not                     batch script line (allowed: letters, digits and
                                                _.,:+=@/-); give the account alone, e.g. --account
                                                m1234
``slurm.account`` / ``flux.bank`` with a        slurm.account 'm1234\ntouch X': ... correct it in
newline in a profile file                       <profile>
``$(touch X)`` / backticks in an ``[env]``      (no error) exported double-quoted as the literal text;
value                                           only ``$NAME`` / ``${NAME}`` references expand
==============================================  =====================================================
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from scalegnn import checkpoint as ck
from scalegnn import records
from scalegnn.cli import main
from scalegnn.config import make_config, parse_train_args
from scalegnn.parallel.grid import cube_3d
from scalegnn.sweeps import expand, list_profiles, list_specs, load_profile, load_spec
from scalegnn.sweeps.folders import mark_submitted, run_dir, run_state, submitted_job
from scalegnn.sweeps.grids import grids_for
from scalegnn.sweeps.jobs import group_runs, supported_systems, with_checkpoints
from scalegnn.sweeps.launcher import sweep
from scalegnn.sweeps.profiles import ProfileError, show_site_variables
from scalegnn.sweeps.spec import SpecError
from scalegnn.sweeps.task import SweepTask
from tests.files import REPO, sparse_npz
from tests.runs import one_line_error

EXPECTED = REPO / "tests" / "expected"
# Every test runs in the shell of a cluster's login node ($PSCRATCH, $USER: tests/harness/conftest.py),
# which the cluster profiles' data_root / out_root name.
pytestmark = pytest.mark.usefixtures("login_node")


SLURM_CLUSTERS = ("perlmutter", "frontier")


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
    # Frontier / Tuolumne: RCCL with the CXI provider settings, MIOpen's caches on node-local /tmp
    for p in (fro, tuo):
        assert p.env["FI_PROVIDER"] == "cxi" and p.env["FI_CXI_ATS"] == "0"
        assert p.env["MIOPEN_USER_DB_PATH"] == p.env["MIOPEN_CUSTOM_CACHE_DIR"] == "/tmp/miopen-${USER}"
        assert p.net_plugin == ("librccl-net.so",)
    # the socket transports' interface: Slingshot's name on each site (LC's El Capitan systems call it hsi0)
    assert (per.network.socket_ifname, fro.network.socket_ifname, tuo.network.socket_ifname) == ("hsn0", "hsn0", "hsi0")
    for p in (per, fro, tuo):
        assert p.placeholders() and p.setup and p.offline  # compute nodes never download
        assert p.network.inter_node_GBps == 100  # 4 NICs x 25 GB/s per node (paper VI-A)
        assert p.python == '"${SCALEGNN_VENV}/bin/python"'  # the jobs run the venv's python, not the submitter's
        assert p.data_root and p.out_root and p.staging.time_min  # scratch, not $HOME; staging's own job
    assert loc.python is None and not loc.data_root and not loc.out_root and not loc.network.socket_ifname
    assert per.scheduler == fro.scheduler == "slurm" and tuo.scheduler == "flux"  # Tuolumne is scheduled by Flux
    assert tuo.placeholders() == ["flux.bank"] and tuo.flux.queue == "pbatch"
    assert loc.scheduler == "local" and loc.placeholders() == []
    # every profile checkpoints: a run without a checkpointer ignores the preemption signal
    for name in list_profiles():
        assert load_profile(name).checkpoint_every


def test_a_profile_without_checkpoints_is_refused(tmp_path):
    text = (Path(load_profile("local").source).read_text()
            .replace('checkpoint_every = "10m"', 'checkpoint_every = ""'))
    assert 'checkpoint_every = ""' in text
    (tmp_path / "nockpt.toml").write_text(text)
    with pytest.raises(ProfileError, match="checkpoint_every '' .*always checkpoint"):
        load_profile(tmp_path / "nockpt.toml")


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
        sweep("fig8", "perlmutter", tmp_path / "o", printer=lambda *a: None)  # refuses before touching SLURM
    assert not (tmp_path / "o").exists()  # nor writing anything: no manifest in a folder of a project not given


# ---------------------------------------------------------------------------- a first day on a site
def test_site_paths_expand_on_the_login_node():
    """data_root / out_root are scratch on each site, expanded from the submitting shell:
    ${VAR} from its environment, {account} the project in lower case (OLCF's folder
    names); a variable that is not set is one line naming it and the flag that overrides."""
    per, fro, tuo = (load_profile(n) for n in ("perlmutter", "frontier", "tuolumne"))
    assert per.site_path("data_root") == "/pscratch/sd/u/user/scalegnn/data"
    assert per.site_path("out_root") == "/pscratch/sd/u/user/scalegnn/sweeps"
    assert fro.with_overrides(account="CSC123").site_path("out_root") == \
        "/lustre/orion/csc123/scratch/user/scalegnn/sweeps"
    assert fro.site_path("data_root") == "/lustre/orion/<project>/scratch/user/scalegnn/data"  # the placeholder shows
    assert tuo.site_path("data_root", {"USER": "ann"}) == "/p/lustre5/ann/scalegnn/data"
    assert load_profile("local").site_path("data_root") is None and load_profile("local").site_path("out_root") is None
    with pytest.raises(ProfileError) as err:
        per.site_path("data_root", {"USER": "ann"})
    assert str(err.value) == ("profile perlmutter: data_root '${PSCRATCH}/scalegnn/data' needs $PSCRATCH, which is not "
                              "set here; run on a perlmutter login node (where the site sets it), export it, or pass "
                              "--data-root DIR")
    with pytest.raises(ProfileError, match=r"needs \$USER, .* or pass --out DIR$"):
        tuo.site_path("out_root", {"PSCRATCH": "/x"})
    unset = []  # a dry run's: the variable stays in the path, shown as itself
    assert show_site_variables(per.site_path("out_root", {}, unset)) == "${PSCRATCH}/scalegnn/sweeps"
    assert show_site_variables(tuo.site_path("out_root", {}, unset)) == "/p/lustre5/${USER}/scalegnn/sweeps"
    assert show_site_variables(fro.with_overrides(account="CSC1").site_path("data_root", {}, unset)) == \
        "/lustre/orion/csc1/scratch/${USER}/scalegnn/data"
    assert unset == ["PSCRATCH", "USER"] and per.site_path("out_root", {}, unset).startswith("/")  # resolves as is


def test_a_sweep_puts_data_and_outputs_on_the_sites_scratch(tmp_path, monkeypatch):
    """Without --out / --data-root a cluster sweep writes under the profile's out_root and
    reads the profile's data_root (not ~/.cache and cwd-relative results/); --data-root,
    then $SCALEGNN_DATA_ROOT, then the profile; --out wins over out_root."""
    scratch = "/pscratch/sd/u/user/scalegnn"
    lines = []
    out = sweep("fig8", "perlmutter", dry_run=True, printer=lines.append)
    assert out.out == Path(f"{scratch}/sweeps/fig8-perlmutter") and out.data_root == f"{scratch}/data"
    runs = [line for line in lines if ": scalegnn train " in line]
    assert len(runs) == len(out.todo) == 6
    assert all(f"--data-root {scratch}/data " in line and f"--out {scratch}/sweeps/fig8-perlmutter/runs/" in line
               for line in runs)
    assert all(f"#SBATCH --output={scratch}/sweeps/fig8-perlmutter/.submitit/" in script for script in out.scripts)
    assert all(st.folder.startswith(f"{scratch}/sweeps/fig8-perlmutter/shards/") for st in out.stages.values())
    monkeypatch.setenv("SCALEGNN_DATA_ROOT", str(tmp_path / "env-root"))
    assert sweep("fig8", "perlmutter", dry_run=True, printer=lambda *a: None).data_root == str(tmp_path / "env-root")
    given = sweep("fig8", "perlmutter", tmp_path / "o", dry_run=True, data_root=str(tmp_path / "d"),
                  printer=lambda *a: None)
    assert (given.out, given.data_root) == (tmp_path / "o", str(tmp_path / "d"))
    local = sweep("demo", "local", dry_run=True, printer=lambda *a: None)
    assert local.out == Path("results/sweeps/demo-local")  # the local profiles keep today's defaults


def test_a_site_variable_that_is_not_set_is_one_line_before_anything_is_written(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("PSCRATCH")
    monkeypatch.chdir(tmp_path)
    err = one_line_error(capsys, ["sweep", "fig8", "--cluster", "perlmutter", "--account", "m1"])
    assert "out_root '${PSCRATCH}/scalegnn/sweeps' needs $PSCRATCH" in err and err.rstrip().endswith("pass --out DIR")
    err = one_line_error(capsys, ["sweep", "fig8", "--cluster", "perlmutter", "--out", "o", "--account", "m1"])
    assert "data_root '${PSCRATCH}/scalegnn/data' needs $PSCRATCH" in err and err.rstrip().endswith("--data-root DIR")
    assert list(tmp_path.iterdir()) == []  # no manifest, no folder, nothing submitted
    assert main(["sweep", "fig8", "--cluster", "perlmutter", "--dry-run", "--out", "o", "--data-root", "d"]) == 0


@pytest.mark.parametrize("cluster, variable, out_root", [  # out_root as the scripts show it (quoted: <project>)
    pytest.param("perlmutter", "PSCRATCH", "${PSCRATCH}/scalegnn/sweeps", id="perlmutter"),
    pytest.param("frontier", "USER", "'/lustre/orion/<project>/scratch/${USER}/scalegnn/sweeps", id="frontier"),
    pytest.param("tuolumne", "USER", "/p/lustre5/${USER}/scalegnn/sweeps", id="tuolumne"),
])
def test_the_readmes_dry_run_runs_off_the_site(cluster, variable, out_root, tmp_path, capsys, monkeypatch):
    """`scalegnn sweep fig7 --cluster C --dry-run` on a laptop, before logging in (no
    $PSCRATCH, no $USER): the scripts show the site variables as themselves, one line
    says so, and nothing is written; the same jobs as on the site. It used to stop with
    "needs $PSCRATCH" (or $USER)."""
    for var in ("PSCRATCH", "USER"):
        monkeypatch.delenv(var)
    monkeypatch.chdir(tmp_path)
    assert main(["sweep", "fig7", "--cluster", cluster, "--dry-run"]) == 0
    out = capsys.readouterr().out
    notes = [line for line in out.splitlines() if "not set here" in line]
    assert notes == [f"  note: ${variable} is not set here, so the paths show ${{{variable}}} as written; a {cluster} "
                     f"login node sets it, and a submission needs it"]
    output = "--output=" if cluster != "tuolumne" else "# flux: --output="
    assert f"{output}{out_root}/fig7-{cluster}/" in out and "@" + "unset" not in out and "site-root" not in out
    assert f"--data-root {out_root.replace('sweeps', 'data')}" in out  # the staging and the runs' commands
    assert list(tmp_path.iterdir()) == []
    # the same jobs as on the site, where the variables are set
    monkeypatch.setenv("PSCRATCH", "/pscratch/sd/u/user")
    monkeypatch.setenv("USER", "user")
    assert main(["sweep", "fig7", "--cluster", cluster, "--dry-run"]) == 0
    on_site = capsys.readouterr().out
    assert "not set here" not in on_site and "${" + variable + "}/scalegnn" not in on_site
    assert [line for line in on_site.splitlines() if line.startswith("# ----")] == \
        [line for line in out.splitlines() if line.startswith("# ----")]


@pytest.mark.parametrize("old, new, message", [
    ('data_root = "${PSCRATCH}/scalegnn/data"', 'data_root = "/lustre/orion/{project}/data"',
     "data_root '/lustre/orion/{project}/data': {project} is not a field a site path can name (known: {account}"),
    ('out_root = "${PSCRATCH}/scalegnn/sweeps"', 'out_root = "/p/x\\nid"',
     "out_root '/p/x\\nid': '\\n' cannot go into a batch script line"),
    ('socket_ifname = "hsn0"', 'socket_ifname = "hsn0 id"',
     "network.socket_ifname 'hsn0 id': ' ' cannot go into a batch script line"),
    ('qos = "shared"', 'qos = "shared"\nqueue = "pdebug"',
     "staging.queue is a Flux setting; profile perlmutter is scheduled by slurm"),
    ('qos = "shared"', 'qos = "shared\\nid"', "staging.qos 'shared\\nid': '\\n' cannot go into a batch script line"),
    ("cpus_per_task = 128", 'cpus_per_task = "8"', "staging.cpus_per_task must be a whole number, got '8'"),
    ('net_plugin = ["libnccl-net.so", "libnccl-net-ofi.so"]', 'net_plugin = ["../libnccl-net.so"]',
     "net_plugin '../libnccl-net.so': '/' cannot go into a batch script line"),
])
def test_site_fields_are_checked_where_the_profile_is_loaded(tmp_path, old, new, message):
    """Each site field is data, refused with one line naming it before anything is written."""
    import re

    with pytest.raises(ProfileError, match=re.escape(message)):
        load_profile(_edited_profile(tmp_path, "perlmutter", old, new))


def test_the_socket_interface_is_exported_for_gloo_and_nccl_unless_env_names_it():
    """[network] socket_ifname becomes GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME in every
    batch script; an [env] value (Perlmutter's NCCL prefix "hsn") takes its place."""
    per, fro, loc = (load_profile(n) for n in ("perlmutter", "frontier", "local"))
    exports = [line for line in per.env_lines() if "SOCKET_IFNAME" in line]
    assert exports == ['export GLOO_SOCKET_IFNAME="hsn0"', 'export NCCL_SOCKET_IFNAME="hsn"']
    assert [line for line in fro.env_lines() if "SOCKET_IFNAME" in line] == [
        'export GLOO_SOCKET_IFNAME="hsn0"', 'export NCCL_SOCKET_IFNAME="hsn0"']
    assert [line for line in loc.env_lines() if "SOCKET_IFNAME" in line] == ['export GLOO_SOCKET_IFNAME="lo"']
    bare = dataclasses.replace(fro, network=dataclasses.replace(fro.network, socket_ifname=""))
    assert not [line for line in bare.env_lines() if "SOCKET_IFNAME" in line]


def test_staging_is_cpu_work_on_the_sites_staging_resources():
    """The staging job asks for no GPU and binds none, has no start-of-job check, and takes
    [staging]: Perlmutter's shared CPU QOS on half a CPU node, one Frontier node; the runs'
    jobs run the check last in their set-up, with the profile's python."""
    from scalegnn.sweeps.launcher import slurm_parameters, stage_parameters

    per, fro = load_profile("perlmutter"), load_profile("frontier")
    stage = stage_parameters(per, "s")
    assert (stage["constraint"], stage["qos"], stage["cpus_per_task"], stage["time"]) == ("cpu", "shared", 128, 120)
    assert "gpus_per_node" not in stage and stage["srun_args"] == []
    assert (stage["nodes"], stage["ntasks_per_node"]) == (1, 1)
    assert not any("preflight" in line for line in stage["setup"])
    assert stage["setup"][-1].startswith("export OMP_NUM_THREADS=128")
    stage = stage_parameters(fro, "s")
    assert (stage["partition"], stage["cpus_per_task"], stage["time"], stage["srun_args"]) == ("batch", 56, 120, [])
    run = slurm_parameters(fro, 8, 8, 60, "r")
    assert run["setup"][-1] == ('"${SCALEGNN_VENV}/bin/python" -m scalegnn.sweeps.preflight --device rocm '
                                "--net-plugin librccl-net.so || exit 1")
    assert slurm_parameters(fro, 8, 8, 60, "r", python="/opt/py")["setup"][-1].startswith("/opt/py -m scalegnn.sweeps.")
    loose = dataclasses.replace(per, slurm=dataclasses.replace(per.slurm, extra={"exclusive": True}))
    assert stage_parameters(loose, "s")["additional_parameters"] == {"exclusive": True}  # no [staging] extra: the runs'
    strict = dataclasses.replace(loose, staging=dataclasses.replace(loose.staging, extra={}))
    assert "additional_parameters" not in stage_parameters(strict, "s")


def _printed_jobs(printed: str) -> tuple[list[str], list[str]]:
    """(staging jobs, run jobs) of what a dry run printed, each job as printed: header, lines, script."""
    jobs = printed.split("\n# ---- ")[1:]
    return ([job for job in jobs if "staging" in job.splitlines()[0]],
            [job for job in jobs if "staging" not in job.splitlines()[0]])


@pytest.mark.parametrize("cluster, directive", [("perlmutter", "#SBATCH --account="),
                                                ("frontier", "#SBATCH --account="), ("tuolumne", "# flux: --bank=")])
def test_the_staging_jobs_are_charged_to_the_staging_account(tmp_path, capsys, cluster, directive):
    """Perlmutter charges GPU jobs to <project>_g and CPU jobs to <project>: --staging-account
    (or the profile's [staging] account) charges the staging jobs (CPU work), --account the
    run jobs. Without either, both are charged to --account, as before the flag existed."""
    from scalegnn.sweeps.jobs import refuse_placeholders

    def charged(*flags, profile=cluster) -> tuple[set[str], set[str]]:
        argv = ["sweep", "fig7", "--cluster", str(profile), "--out", str(tmp_path / "o"), "--dry-run", *flags]
        assert main(argv) == 0
        jobs = _printed_jobs(capsys.readouterr().out)
        assert all(jobs)  # staging jobs and run jobs
        return tuple({line.removeprefix(directive) for job in kind for line in job.splitlines()
                      if line.startswith(directive)} for kind in jobs)

    assert charged("--account", "m1_g", "--staging-account", "m1") == ({"m1"}, {"m1_g"})
    assert charged("--account", "m1_g") == ({"m1_g"}, {"m1_g"})
    own = _edited_profile(tmp_path, cluster, "time_min = 120", 'account = "m9"\ntime_min = 120')  # in [staging]
    assert charged("--account", "m1_g", profile=own) == ({"m9"}, {"m1_g"})
    assert charged("--account", "m1_g", "--staging-account", "m1", profile=own) == ({"m1"}, {"m1_g"})
    held = load_profile(_edited_profile(tmp_path, cluster, "time_min = 120",
                                        'account = "<CPU ACCOUNT>"\ntime_min = 120'))
    assert held.with_overrides(account="m1_g").placeholders() == ["staging.account"]
    with pytest.raises(ValueError, match="staging.account.*--staging-account"):
        refuse_placeholders(held.with_overrides(account="m1_g"))
    refuse_placeholders(held.with_overrides(account="m1_g", staging_account="m1"))
    err = one_line_error(capsys, ["sweep", "fig7", "--cluster", cluster, "--dry-run", "--staging-account", "m1\nid"])
    assert "--staging-account 'm1\\nid': '\\n' cannot go into a batch script line" in err
    assert err.rstrip().endswith("give the account alone, e.g. --staging-account m1234")


def test_one_staging_task_writes_every_grid_of_its_graph_from_one_load(isolated_data, monkeypatch):
    """The shard sets of one graph are one task: the graph is loaded once and each set
    written as a task of its own would write it; sets of two graphs are two tasks."""
    import torch

    import scalegnn.datasets as datasets
    from scalegnn.sweeps.staging import StageSet, StageTask, group_stages

    path = sparse_npz(isolated_data / "g.npz")
    root = str(isolated_data)

    def sets(where):
        return [StageSet(f"npz:{path}", grid, permute, 3, root, str(isolated_data / where / f"{i}"))
                for i, (grid, permute) in enumerate((((1, 1, 1, 2), "none"), ((1, 2, 1, 1), "double")))]

    loads = []
    load = datasets.load_graph
    monkeypatch.setattr(datasets, "load_graph", lambda *a, **k: loads.append(a) or load(*a, **k))
    packed = sets("packed")
    assert group_stages(packed) == [packed] and StageTask(packed, offline=True)() == [st.folder for st in packed]
    assert len(loads) == 1 and all(st.done() for st in packed)
    alone = sets("alone")
    for st in alone:
        StageTask(st, offline=True)()
    assert len(loads) == 3
    for a, b in zip(packed, alone):
        names = sorted(p.name for p in Path(a.folder).iterdir())
        assert names == sorted(p.name for p in Path(b.folder).iterdir()) and len(names) > 1
        assert json.loads((Path(a.folder) / "manifest.json").read_text()) == \
            json.loads((Path(b.folder) / "manifest.json").read_text())
        for name in names:
            if not name.endswith(".json"):
                assert _same(*(torch.load(Path(f.folder) / name, weights_only=True) for f in (a, b))), name
    StageTask(packed, offline=True)()
    assert len(loads) == 3  # done sets: nothing loaded
    other = dataclasses.replace(packed[0], seed=4, folder=str(isolated_data / "s4"))
    assert group_stages([*packed, other]) == [packed, [other]]
    with pytest.raises(ValueError, match="one staging task shards one graph"):
        StageTask([*packed, other], offline=True)


def _same(x, y) -> bool:
    """Two loaded shard files hold the same values (dense or sparse tensors, nested)."""
    import torch

    if isinstance(x, dict):
        return isinstance(y, dict) and x.keys() == y.keys() and all(_same(x[k], y[k]) for k in x)
    if isinstance(x, (list, tuple)):
        return type(x) is type(y) and len(x) == len(y) and all(map(_same, x, y))
    if torch.is_tensor(x):
        if x.layout != y.layout or x.shape != y.shape or x.dtype != y.dtype:
            return False
        return torch.equal(x.to_dense(), y.to_dense()) if x.layout != torch.strided else torch.equal(x, y)
    return x == y


def test_a_staging_task_writes_the_sets_it_can_and_names_the_one_it_could_not(isolated_data):
    from scalegnn.sweeps.staging import StageSet, StageTask

    path = sparse_npz(isolated_data / "g.npz")
    (isolated_data / "a-file").write_text("")
    good = StageSet(f"npz:{path}", (1, 1, 1, 2), "none", 0, str(isolated_data), str(isolated_data / "good"))
    bad = dataclasses.replace(good, grid=(1, 2, 1, 1), folder=str(isolated_data / "a-file" / "bad"))  # not a folder
    with pytest.raises(RuntimeError, match=r"staging failed for 1 of 2 shard set\(s\), first `scalegnn data shard .*"
                                           r"--grid 1x2x1x1 --out .*a-file/bad"):
        StageTask([bad, good], offline=True)()
    assert good.done() and not bad.done()  # the set after the failed one is written all the same


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
    bad.write_text('name = "x"\nsystems = ["scalegnn"]\n[train]\nquiet = true\n[[experiments]]\n'
                   'cluster = "local"\ndataset = "cora"\ngpus = [1]\n')
    with pytest.raises(SpecError, match="blind the batch jobs' logs"):
        load_spec(bad)


# ---------------------------------------------------------------------------- batch scripts
@pytest.mark.parametrize("cluster", SLURM_CLUSTERS)
def test_sbatch_script_matches_the_reviewed_file(cluster):
    """The batch script of fig7's largest job array and of its staging job; regenerate with
    UPDATE_EXPECTED=1 and review the diff."""
    out = sweep("fig7", cluster, f"/scratch/scalegnn/fig7-{cluster}", dry_run=True, printer=lambda *a: None)
    sizes = [len(g) for g in group_runs(out.todo, load_profile(cluster)).values()]
    script = out.scripts[max(range(len(sizes)), key=lambda k: (sizes[k], -k))]
    [stage] = out.stage_scripts
    for text, name in ((script, f"sbatch_{cluster}.sh"), (stage, f"sbatch_{cluster}_stage.sh")):
        if os.environ.get("UPDATE_EXPECTED"):
            (EXPECTED / name).write_text(text)
        assert text == (EXPECTED / name).read_text(), name
    profile = load_profile(cluster)
    assert f"#SBATCH --ntasks-per-node={profile.gpus_per_node}" in script and "--array=0-" in script
    assert "#SBATCH --signal=USR2@120" in script  # time to checkpoint before the limit
    # the ranks run the venv's python, after the start-of-job check; not the submitting python's absolute path
    venv_python = '"${SCALEGNN_VENV}/bin/python"'
    assert f"{venv_python} -u -m submitit.core._submit" in script and sys.executable not in script + stage
    check = f"{venv_python} -m scalegnn.sweeps.preflight --device {profile.device}"
    assert script.index("source ${SCALEGNN_VENV") < script.index(check) < script.index("\nsrun ")
    # staging: one task per graph (3 or 4 graphs, not one per shard set), CPU work, no check
    assert f"#SBATCH --array=0-{len({(s.dataset, s.seed) for s in out.stages.values()}) - 1}%" in stage
    assert "--gpu" not in stage and "preflight" not in stage and "#SBATCH --nodes=1" in stage
    assert f"#SBATCH --cpus-per-task={profile.staging.cpus_per_task}" in stage


def test_cli_dry_run_prints_scripts_and_submits_nothing(tmp_path, capsys):
    assert main(["sweep", "fig8", "--cluster", "perlmutter", "--dry-run", "--out", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    # one staging job array (1 shard set: the six grids share the 3D grid 4x4x2), then the 6 runs' jobs after it
    assert text.count("#!/bin/bash") == 7 and text.count("# ---- job") == 6 and text.count("# ---- staging") == 1
    assert text.count("#SBATCH --dependency='afterok:<staging job>'") == 6
    assert "--grid 32x4x4x2" in text and not (tmp_path / "runs").exists() and not (tmp_path / "shards").exists()
    shards = f"{tmp_path.resolve()}/shards/products-14m-"
    assert text.count(f"--shard-dir {shards}") == 6 and text.count(f"--out {shards}") == 1  # runs read what staging writes
    assert text.count(f"--shard-dir {shards}1x4x4x2-") == 6 and "# ---- staging: 1 shard set(s)" in text
    assert "--quiet" not in text  # the jobs' .out files keep their per-epoch lines


def test_distdgl_runs_in_one_task_on_one_node_and_is_refused_across_nodes(tmp_path):
    """DistDGL starts its servers and trainers on 127.0.0.1 from one process: a job with
    one task per rank would start one DistDGL cluster per rank, and a multi-node job
    would leave every node but the first idle. The sweep gives it one task with the
    CPUs of all its trainers, and refuses (with the reason) runs that need two nodes."""
    from scalegnn.sweeps.jobs import job_shape, multi_node_refusal

    per = load_profile("perlmutter")
    lines = []
    out = sweep("fig6", "perlmutter", tmp_path, dry_run=True, python="python3", printer=lines.append)
    dgl = [r for r in out.runs + [r for r, _ in out.refused] if r.system == "distdgl"]
    assert dgl and {r.world_size for r, _ in out.refused} and all(r.system == "distdgl" for r, _ in out.refused)
    assert all(r.world_size > per.gpus_per_node for r, _ in out.refused)
    assert all(r.world_size <= per.gpus_per_node for r in out.runs if r.system == "distdgl")
    why = out.refused[0][1]
    assert "127.0.0.1" in why and "one node" in why and f"{out.refused[0][0].world_size} trainers" in why
    assert any(line.startswith("  refused (") and "127.0.0.1" in line for line in lines)
    for r in (r for r in out.runs if r.system == "distdgl"):
        assert job_shape(r, per) == (1, 1, per.cpus_per_task * r.world_size)
    sage = next(r for r in out.runs if r.system == "salient" and r.world_size == 8)
    assert job_shape(sage, per) == (2, 4, per.cpus_per_task) and multi_node_refusal(sage, per) is None


def test_staging_covers_multi_rank_scalegnn_runs_once(tmp_path):
    """Each (dataset, 3D grid, permutation, seed) is sharded once, whatever the
    data-parallel size; fullgraph-3d's implied --permute double is seen; baselines and
    one-rank runs load the graph themselves."""
    from scalegnn.sweeps.staging import stage_for, with_data

    root = str(tmp_path / "data")
    out = sweep("demo", "local", tmp_path / "o", dry_run=True, data_root=root, printer=lambda *a: None)
    staged = {r.system: st for r in out.todo if (st := out.stages.get(r.key))}
    assert set(staged) == {"scalegnn"} and len(out.stages) == 2  # grids 2x1x1x1 and 1x2x1x1; the rest have 1 rank
    [job] = out.stage_scripts  # both grids shard one graph: one staging job writes both
    assert job.count("scalegnn data shard") == 2 and "--grid 1x1x1x1" in job and "--grid 1x2x1x1" in job
    def cfg(*argv):
        return parse_train_args(list(argv))[0]

    fg = stage_for(cfg("--dataset", "cora", "--grid", "1x2x1x1", "--system", "fullgraph-3d", "--seed", "3"),
                   tmp_path, root)
    assert (fg.permute, fg.seed, fg.grid) == ("double", 3, (1, 2, 1, 1)) and "-double-s3-" in fg.folder
    assert stage_for(cfg("--dataset", "cora", "--grid", "2x1x1x1", "--system", "graphsage"), tmp_path, root) is None
    assert stage_for(cfg("--dataset", "cora"), tmp_path, root) is None
    same = stage_for(cfg("--dataset", "cora", "--grid", "1x2x1x1", "--seed", "3", "--system", "fullgraph-3d",
                         "--epochs", "9"), tmp_path, root)
    assert same == fg  # other options, same shards
    replicas = [stage_for(cfg("--dataset", "cora", "--grid", f"{gd}x2x1x1", "--seed", "3", "--system",
                              "fullgraph-3d"), tmp_path, root) for gd in (2, 4)]
    assert replicas == [fg, fg]  # Gd replicas read the shards of their (x, y, z): one set
    other = stage_for(cfg("--dataset", "cora", "--grid", "2x1x2x1", "--seed", "3", "--system", "fullgraph-3d"),
                      tmp_path, root)
    assert other.grid == (1, 1, 2, 1) and other.folder != fg.folder
    given = with_data(cfg("--dataset", "cora"), root, fg).data
    assert (given.data_root, given.shard_dir) == (root, fg.folder)
    assert with_data(cfg("--dataset", "cora", "--data-root", "/d"), root, None).data.data_root == "/d"  # the spec's
    for r in out.todo:
        argv = next(line for line in out.scripts if r.key in line)
        assert f"--data-root {root}" in argv and "--quiet" not in argv
    bad = dataclasses.replace(out.todo[0], options=(*out.todo[0].options, ("no-such-flag", True)))
    with pytest.raises(SpecError, match="rejects the options of run"):
        bad.config(str(tmp_path))


# ---------------------------------------------------------------------------- the task
def test_task_checkpoint_requeues_the_same_run_with_resume(tmp_path):
    cfg = with_checkpoints(parse_train_args(["--dataset", "cora"])[0], tmp_path, "20m")
    assert (cfg.checkpoint.dir, cfg.checkpoint.resume, cfg.checkpoint.every) == \
        (str(tmp_path / "checkpoint"), True, "20m")
    baseline = parse_train_args(["--system", "graphsage", "--dataset", "cora"])[0]
    assert with_checkpoints(baseline, tmp_path, "20m") == baseline  # the compared systems have no checkpoints
    task = SweepTask({"config": cfg.to_dict(), "argv": ["train"], "key": "k", "world_size": 2, "system": "scalegnn"},
                     str(tmp_path), "gloo")
    delayed = task.checkpoint()
    assert delayed.function.requeued == 1 and delayed.function.run == task.run


def _fake_scontrol(tmp_path, monkeypatch, text: str) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "scontrol").write_text(f"#!/bin/sh\ncat <<'EOF'\n{text}\nEOF\n")
    (bin_dir / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


@pytest.mark.parametrize("fields, restart_count, want", [
    ("JobState=COMPLETING Reason=None Restarts=0 RunTime=00:00:04 TimeLimit=00:02:00", None, "cancelled"),
    ("JobState=COMPLETING Reason=TimeLimit Restarts=0 RunTime=00:01:01 TimeLimit=00:01:00", None, "timeout"),
    ("JobState=COMPLETING Reason=None Restarts=1 RunTime=00:00:00 TimeLimit=00:02:00", None, None),  # a requeue
    ("JobState=COMPLETING Reason=None Restarts=1 RunTime=00:00:09 TimeLimit=00:02:00", "1", "cancelled"),
    ("JobState=RUNNING Reason=None Restarts=0 RunTime=00:00:09 TimeLimit=00:02:00", None, None),  # not the job's end
])
def test_slurm_job_verdict_reads_why_sigterm_came(tmp_path, monkeypatch, fields, restart_count, want):
    """What `scontrol show job` says while SIGTERM is delivered (checked on a real SLURM,
    tests/harness/test_slurm.py): scancel, the time limit and a requeue all read COMPLETING."""
    from scalegnn.sweeps.task import slurm_job_verdict

    _fake_scontrol(tmp_path, monkeypatch, f"JobId=42 JobName=x\n   {fields}")
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    if restart_count is None:
        monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    else:
        monkeypatch.setenv("SLURM_RESTART_COUNT", restart_count)
    verdict = slurm_job_verdict()
    assert (verdict[0] if verdict else None) == want
    if want:
        assert "SLURM job 42" in verdict[1] and "resubmit the sweep" in verdict[1]
    monkeypatch.delenv("SLURM_JOB_ID")
    assert slurm_job_verdict() is None  # not a SLURM job


def test_an_ended_run_is_recorded_under_its_own_run_id(tmp_path):
    """_end_record rewrites the attempt's failed record (same run id) as cancelled; without
    one it writes a minimal record; run_state reads it (submitted.json is not a record)."""
    from scalegnn.signals import JobEnded
    from scalegnn.sweeps.task import _end_record

    folder = tmp_path / "run"
    run = {"system": "scalegnn", "dataset": "cora", "grid": "1x2x1x1", "world_size": 2, "seed": 0,
           "config": parse_train_args(["--dataset", "cora", "--grid", "1x2x1x1"])[0].to_dict(), "argv": ["train"],
           "target_acc": None}
    folder.mkdir()
    mark_submitted(folder, "7_0", "localslurm")
    path = _end_record(folder, run, 0.0, "cancelled", "SLURM job 7_0 was cancelled", None)
    assert run_state(folder)[:1] == ("cancelled",) and run_state(folder)[2] == "SLURM job 7_0 was cancelled"
    rec = records.read_record(path)
    failed = {**rec, "status": "failed", "error": "RuntimeError: Connection closed by peer\n  trace"}
    failed.pop("path", None)
    records.write_record(failed, folder)
    exc = JobEnded("timeout", "SLURM job 7_0 reached its time limit")
    again = _end_record(folder, run, 0.0, "timeout", exc.reason, None)
    assert again == path and len(list(folder.glob("2*.json"))) == 1  # replaced, not added
    rec = records.read_record(again)
    assert rec["status"] == "timeout" and rec["error"] == ("SLURM job 7_0 reached its time limit (the interrupted "
                                                           "attempt saw: RuntimeError: Connection closed by peer)")


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
    # data staged once for the 2-rank run, which read only its shard; both got the data root
    assert len(first.staged) == 1 and two["config"]["data"]["shard_dir"] == first.stages[first.runs[1].key].folder
    assert (Path(two["config"]["data"]["shard_dir"]) / "manifest.json").is_file()
    one = records.read_record(run_state(out / "runs" / first.runs[0].key)[1])
    assert one["config"]["data"]["shard_dir"] is None and one["config"]["data"]["data_root"] == two["config"]["data"]["data_root"] \
        == str((tmp_path / "data").resolve())
    assert two["checkpoint"]["every"] == "10m"  # every profile checkpoints (USR2 is heard)
    again = sweep(spec, "local", out, printer=lambda *a: None)
    assert again.submitted == [] and again.todo == [] and len(again.done) == 2
    # and the report from those records
    assert main(["report", str(out), "--out", str(tmp_path / "report")]) == 0
    report = (tmp_path / "report" / "report.md").read_text()
    assert "fig7_strong_scaling.png" in report and (tmp_path / "report" / "fig7_strong_scaling.pdf").exists()
    assert "## Provenance of every run" in report and "every run of every sweep manifest has an ok record" in report


def test_collective_timeout_reaches_the_sweep_tasks_process_group(monkeypatch):
    import scalegnn.launch.environment as launch
    from scalegnn.sweeps.task import join_job

    seen = []
    monkeypatch.setattr(launch, "detect_env", lambda: launch.DistEnv(1, 2, 1, "auto", "h", 29500, "slurm"))
    monkeypatch.setattr(launch, "init_from_env", lambda timeout, backend: seen.append((timeout.total_seconds(),
                                                                                       backend)))
    # what join_job exports is undone after the test (conftest.py starts every test outside a job)
    join_job(parse_train_args(["--dataset", "cora", "--collective-timeout", "90"])[0], "gloo")
    join_job(parse_train_args(["--dataset", "cora", "--collective-timeout=45.5"])[0], "nccl")
    join_job(parse_train_args(["--dataset", "cora"])[0], "gloo")
    join_job(parse_train_args(["--system", "graphsage", "--dataset", "cora"])[0], "gloo")  # sets up its own groups
    assert seen == [(90.0, "gloo"), (45.5, "nccl"), (600.0, "gloo")]  # 600 s: scalegnn train's default
    assert os.environ["RANK"] == "1" and os.environ["WORLD_SIZE"] == "2" and os.environ["MASTER_PORT"] == "29500"


def test_resubmission_skips_runs_whose_slurm_job_is_still_queued(tmp_path, monkeypatch):
    """A run submitted earlier whose job squeue still lists is neither done nor
    submitted again; once the job has left the queue without a record it is."""
    import scalegnn.sweeps.launcher as launcher

    first = sweep("fig8", "perlmutter", tmp_path, dry_run=True, python="python3", printer=lambda *a: None)
    runs = first.todo
    for i, run in enumerate(runs):
        mark_submitted(run_dir(tmp_path, run), f"777_{i}", "perlmutter")
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


def test_sweep_task_turns_submitits_signal_into_a_save_then_requeues(monkeypatch):
    """Inside a submitit job the USR2 handler only requests the save; submitit's own
    handler (which requeues) runs afterwards, when the task calls it."""
    import submitit

    from scalegnn.sweeps.task import _save_on_preemption_signal

    calls = []
    monkeypatch.setattr(submitit.JobEnvironment, "_usr_sig", classmethod(lambda cls: signal.SIGUSR2))
    previous = signal.signal(signal.SIGUSR2, lambda sig, frame: calls.append(sig))  # stands in for submitit's
    try:
        requeue = _save_on_preemption_signal()
        assert ck.PREEMPTION.armed and not ck.PREEMPTION.requested
        os.kill(os.getpid(), signal.SIGUSR2)  # no training loop listening: submitit's handler at once
        assert calls == [signal.SIGUSR2] and not ck.PREEMPTION.requested
        ck.PREEMPTION.listening = True
        os.kill(os.getpid(), signal.SIGUSR2)
        assert ck.PREEMPTION.requested and ck.PREEMPTION.signal == "SIGUSR2" and calls == [signal.SIGUSR2]
        requeue()
        assert calls == [signal.SIGUSR2, signal.SIGUSR2]
    finally:
        ck.PREEMPTION.disarm()
        signal.signal(signal.SIGUSR2, previous)


# ----------------------------------------------------------------------------- sweeps: one concept
def test_a_sweeps_threads_per_task_is_each_runs_threads_flag():
    from scalegnn.config import command_line, make_config
    from scalegnn.sweeps.jobs import with_threads

    cfg = make_config(dataset="cora")
    assert with_threads(cfg, 0) == cfg  # 0: the run's own (auto)
    four = with_threads(cfg, 4)
    assert four.parallel.threads == 4 and command_line(four)[-2:] == ["--threads", "4"]
    own = make_config(dataset="cora", threads=2)
    assert with_threads(own, 4) == own  # a run that names its count keeps it


def test_a_sweep_stages_shards_with_the_runs_split(isolated_data):
    """A sweep's staged shards carry the run's --split (its folder key too), so the
    staged run is not refused; without --split the key is the one staged before."""
    from scalegnn.shards import check_shard_manifest
    from scalegnn.sweeps.staging import StageSet, StageTask, stage_for

    path = sparse_npz(isolated_data / "g.npz")
    cfg = make_config(dataset=f"npz:{path}", split="random:0.6,0.2,0.2", split_seed=2, grid=(1, 1, 1, 2))
    stage = stage_for(cfg, isolated_data / "sweep", str(isolated_data))
    assert stage.argv()[-4:] == ["--split", "random:0.6,0.2,0.2", "--split-seed", "2"]
    StageTask(stage, offline=True)()
    manifest = json.loads((isolated_data / stage.folder / "manifest.json").read_text())
    check_shard_manifest(manifest, "none", 0, stage.folder, (cfg.data.split, cfg.data.split_seed))
    assert manifest["graph"]["split"].startswith("random 60/20/20 seed 2 (--split")
    plain = stage_for(make_config(dataset=f"npz:{path}", grid=(1, 1, 1, 2)), isolated_data / "sweep",
                      str(isolated_data))
    assert plain.folder.endswith(StageSet.key_of(f"npz:{path}", (1, 1, 1, 2), "none", 0, str(isolated_data)))
    assert plain.folder != stage.folder and "--split" not in plain.argv()
    said, left = (stage_for(make_config(dataset=f"npz:{path}", split="random:0.6,0.2,0.2", grid=(1, 1, 1, 2), **kw),
                            isolated_data / "sweep", str(isolated_data)) for kw in ({"split_seed": 0}, {}))
    assert said.folder == left.folder  # --split-seed 0 said, or left to --seed 0: the same staged set


# ----------------------------------------------------------------------------- sweep parameters in batch scripts
def _edited_profile(tmp_path, cluster: str, old: str, new: str) -> Path:
    """A copy of a shipped profile with ``old`` (text that must be there) replaced."""
    text = (REPO / "sweeps" / "profiles" / f"{cluster}.toml").read_text()
    assert old in text, old
    path = tmp_path / f"{cluster}-edited.toml"
    path.write_text(text.replace(old, new, 1))
    return path


@pytest.mark.parametrize("dry_run", [True, False], ids=["dry-run", "submit"])
@pytest.mark.parametrize("cluster, source", [("perlmutter", "flag"), ("tuolumne", "flag"),
                                             ("perlmutter", "file"), ("tuolumne", "file")])
def test_a_newline_in_an_account_is_one_line_before_anything_is_written(tmp_path, capsys, monkeypatch, cluster,
                                                                         source, dry_run):
    """A newline in --account, or in a profile's slurm.account / flux.bank, ended the
    ``#SBATCH --account=`` (``# flux: --bank=``) directive and put a shell line into the script."""
    monkeypatch.setenv("PATH", str(tmp_path / "no-scheduler"))  # this machine has an sbatch: never reach it
    marker = tmp_path / "injected"
    value = f"m1234\ntouch {marker}"
    out = tmp_path / "sweep"
    argv = ["sweep", "fig7", "--out", str(out), "--python", "python3", *(["--dry-run"] if dry_run else [])]
    if source == "flag":
        argv += ["--cluster", cluster, "--account", value]
        field, fix = "--account", "give the account alone, e.g. --account m1234"
    else:
        key = {"perlmutter": "account", "tuolumne": "bank"}[cluster]
        placeholder = {"perlmutter": "<ACCOUNT>", "tuolumne": "<BANK>"}[cluster]
        path = _edited_profile(tmp_path, cluster, f'{key} = "{placeholder}"', f'{key} = "m1234\\ntouch {marker}"')
        argv += ["--cluster", str(path)]
        field, fix = f"{'slurm' if cluster == 'perlmutter' else 'flux'}.{key}", f"correct it in {path}"
    err = one_line_error(capsys, argv)
    assert f"{field} {value!r}: '\\n' cannot go into a batch script line" in err and err.rstrip().endswith(fix), err
    assert not out.exists() and not marker.exists()  # no manifest, no run folder, no script, nothing submitted


@pytest.mark.parametrize("change, message", [
    ({"slurm": {"constraint": "gpu $(id)"}}, "slurm.constraint 'gpu $(id)': ' ' cannot"),
    ({"slurm": {"extra": {"mail-user": "a;b"}}}, "slurm.extra.mail-user 'a;b': ';' cannot"),
    ({"slurm": {"extra": {"x\nid": True}}}, "slurm.extra option 'x\\nid': '\\n' cannot"),
    ({"slurm": {"srun_args": ("--cpu-bind=cores\nid",)}}, "slurm.srun_args '--cpu-bind=cores\\nid': '\\n' cannot"),
    ({"env": {"X;id": "1"}}, "env name 'X;id' is not a shell variable name"),
    ({"env": {"X": "1\nid"}}, "env.X '1\\nid': '\\n' cannot"),
    ({"slurm": {"gpus_per_node": "4\nid"}}, "slurm.gpus_per_node must be a whole number, got '4\\nid'"),
])
def test_every_scheduler_value_is_checked_where_the_profile_is_built(change, message):
    """The same check guards every value a batch script takes as data (dataclasses.replace
    builds the profile again, as loading and with_overrides do)."""
    import dataclasses
    import re

    from scalegnn.sweeps.profiles import ProfileError, load_profile

    prof = load_profile("perlmutter")
    slurm = change.get("slurm")
    changes = {**change, **({"slurm": dataclasses.replace(prof.slurm, **slurm)} if slurm else {})}
    with pytest.raises(ProfileError, match=re.escape(message)):
        dataclasses.replace(prof, **changes)
    assert prof.with_overrides(constraint="gpu&hbm80g", qos="regular").slurm.constraint == "gpu&hbm80g"


@pytest.mark.parametrize("cluster", ["perlmutter", "tuolumne"])
def test_env_values_are_data_when_the_batch_script_exports_them(tmp_path, cluster):
    """``$(...)`` and backticks in an [env] value ran when the batch script exported it;
    a reference to another variable (``${HOME}``) still expands."""
    from scalegnn.sweeps.launcher import sweep
    from scalegnn.sweeps.profiles import load_profile

    marker = tmp_path / "ran"
    hostile = f'$(touch {marker}-1)`touch {marker}-2`; touch {marker}-3 "quoted" \\ $1 ${{HOME:-x}}'
    path = _edited_profile(tmp_path, cluster, "\n[env]\n",
                           f"\n[env]\nHOSTILE = '{hostile}'\nREFERENCE = '${{HOME}}/cache'\n")
    result = sweep("fig7", str(path), tmp_path / "sweep", dry_run=True, python="python3", printer=lambda *a: None)
    names = set(load_profile(path).env)
    exports = [line for line in result.scripts[0].splitlines()
               if line.startswith("export ") and line[len("export "):].split("=")[0] in names]
    assert len(exports) == len(names)
    shell = subprocess.run(["bash", "-c", "\n".join([*exports, 'printf "%s|%s" "$HOSTILE" "$REFERENCE"'])],
                           cwd=tmp_path, env={"PATH": os.environ["PATH"], "HOME": "/home/someone"},
                           capture_output=True, text=True, timeout=60)
    assert not list(tmp_path.glob("ran*")), "an [env] value ran a command"
    assert shell.returncode == 0 and shell.stdout == f"{hostile}|/home/someone/cache", (shell.stdout, shell.stderr)
    assert not (tmp_path / "sweep").exists()


def test_a_spec_name_that_is_not_a_job_name_is_one_line(tmp_path, capsys):
    """A spec's name becomes ``--job-name`` in ``#SBATCH`` and ``# flux:`` lines."""
    spec = tmp_path / "bad.toml"
    spec.write_text('name = "x\\nid"\nsystems = ["scalegnn"]\n[[experiments]]\ncluster = "perlmutter"\n'
                    'dataset = "ogbn-products"\ngpus = [4]\n')
    out = tmp_path / "sweep"
    err = one_line_error(capsys, ["sweep", str(spec), "--cluster", "perlmutter", "--dry-run", "--out", str(out)])
    assert "name 'x\\nid': '\\n' cannot go into a batch script line" in err and f"rename the spec in {spec}" in err, err
    assert not out.exists()


@pytest.mark.parametrize("cluster", ["perlmutter", "tuolumne"])
def test_a_sweep_folder_with_a_newline_is_one_line(tmp_path, capsys, cluster):
    """The sweep's --out folder lands in the #SBATCH --output / # flux: --output lines:
    a newline in it would end the directive and inject the rest as a script line."""
    out = tmp_path / "sweep\necho injected"
    err = one_line_error(capsys, ["sweep", "fig7", "--cluster", cluster, "--dry-run", "--out", str(out)])
    assert "--out" in err and "'\\n' cannot go into a batch script line" in err and "no newline" in err, err
    assert not out.exists()


def test_a_profiles_memory_budget_stages_what_it_can_out_of_core(isolated_data, monkeypatch):
    """[staging] memory_budget: an npz: set is streamed from disk (blocks layout; per-rank
    files with the double permutation), never loaded whole, with the shards the
    in-memory staging writes; a named graph out-of-core staging cannot read stays in
    memory. Perlmutter's fig7 stages ogbn-papers100M (OGB's raw files) so, the rest not."""
    import numpy as np

    import scalegnn.datasets as datasets
    from scalegnn.shards import load_shard
    from scalegnn.sweeps.staging import StageSet, StageTask
    from tests.graphs import same_shard

    rng = np.random.default_rng(2)
    n = 400
    src = rng.integers(0, n, 1500)
    path = isolated_data / "e.npz"
    np.savez(path, edge_index=np.stack([src, (src + 1 + rng.integers(0, 9, 1500)) % n]),
             x=rng.standard_normal((n, 5)).astype(np.float32), y=rng.integers(0, 3, n))
    root = str(isolated_data)
    sets = [StageSet(f"npz:{path}", grid, permute, 3, root, str(isolated_data / f"ooc{i}"), memory_budget="256M")
            for i, (grid, permute) in enumerate((((1, 2, 1, 2), "single"), ((1, 2, 1, 1), "double")))]
    assert [st.argv()[-4:] for st in sets] == [["--memory-budget", "256M", "--layout", "blocks"],
                                               ["--memory-budget", "256M", "--layout", "files"]]
    monkeypatch.setattr(datasets, "load_graph", lambda *a, **k: pytest.fail("loaded whole"))
    StageTask(sets, offline=True)()
    monkeypatch.undo()
    for st in sets:
        memory = dataclasses.replace(st, memory_budget="", folder=st.folder + "-mem")
        StageTask(memory, offline=True)()
        manifest = json.loads((Path(st.folder) / "manifest.json").read_text())
        assert manifest["staged"]["out_of_core"] and manifest.get("layout", "files") == st.argv()[-1]
        for rank in range(manifest["grid_shape"][1] * manifest["grid_shape"][2] * manifest["grid_shape"][3]):
            same_shard(load_shard(st.folder, rank), load_shard(memory.folder, rank))
    named = StageSet("cora", (1, 2, 1, 1), "none", 0, root, str(isolated_data / "cora"), memory_budget="1G")
    assert not named.out_of_core and "--memory-budget" not in named.argv()


def test_fig7_on_perlmutter_stages_papers100m_out_of_core(tmp_path, monkeypatch, capsys):
    from scalegnn.cli import main

    monkeypatch.setenv("PSCRATCH", str(tmp_path))
    assert main(["sweep", "fig7", "--cluster", "perlmutter", "--dry-run", "--out", str(tmp_path / "o")]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "scalegnn data shard" in ln and ln.startswith("#")]
    assert len(lines) == 4
    assert [("--memory-budget 160G --layout blocks" in ln) for ln in lines] == ["ogbn-papers100M" in ln for ln in lines]
    assert sum("ogbn-papers100M" in ln for ln in lines) == 1
