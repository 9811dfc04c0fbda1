"""The start-of-job check (sweeps/preflight.py): a job's environment against the torch
build and the profile, fed fake environments, torch builds and library folders.

=============================================  ======================================================  =====
environment                                    the line                                                 exit
=============================================  ======================================================  =====
ROCm 6.2 torch, ROCM_PATH=/opt/rocm-6.2.4,     ``ok: ... torch 2.5.1+rocm6.2 (ROCm 6.2) with ROCm      0
librccl-net.so on LD_LIBRARY_PATH              6.2.4 ...; network plugin .../librccl-net.so``
ROCm 6.0.0 loaded                              ``warning: ROCm 6.0.0 is loaded ... torch ... built     0
                                               for ROCm 6.2 ...: load a rocm/6.2.* module ...``
no plugin                                      ``warning: no librccl-net.so in LD_LIBRARY_PATH ...:    0
                                               ... fall back to TCP sockets ...``
no plugin, NCCL_NET="AWS Libfabric"            ``error: NCCL_NET='AWS Libfabric' asks for the network  1
                                               plugin ... NCCL cannot start ...``
CUDA torch on a ROCm profile                   ``error: torch ... is a CUDA 12.4 build, not a ROCm``   1
plugin in .../rocm-6.1.0/...                   ``warning: the network plugin ... ROCm 6.1.0 but ...``  0
another python than $SCALEGNN_VENV's           ``warning: python ... not from $SCALEGNN_VENV ...``     0
=============================================  ======================================================  =====
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from scalegnn.sweeps import load_profile
from scalegnn.sweeps.preflight import (check, command, find_plugin, loaded_cuda, loaded_rocm, main, prepare_node,
                                       torch_build)
from tests.files import REPO

ROCM_TORCH = {"version": "2.5.1+rocm6.2", "cuda": None, "hip": "6.2.41133-dd7f95766", "path": "/venv/torch/version.py"}
CUDA_TORCH = {"version": "2.6.0+cu124", "cuda": "12.4", "hip": None, "path": "/venv/torch/version.py"}


def _rocm(tmp_path, version="6.2.4") -> Path:
    root = tmp_path / f"opt/rocm-{version}"
    (root / ".info").mkdir(parents=True)
    (root / ".info" / "version").write_text(f"{version}-120\n")
    return root


def _plugin(tmp_path, name="librccl-net.so", where="aws-ofi-rccl/lib") -> Path:
    folder = tmp_path / where
    folder.mkdir(parents=True)
    (folder / name).write_bytes(b"\x7fELF")
    return folder


def _site(tmp_path, **extra) -> dict:
    """A Frontier node after the profile's set-up: ROCm 6.2.4, the plugin, the venv."""
    env = {"ROCM_PATH": str(_rocm(tmp_path)), "LD_LIBRARY_PATH": f"{_plugin(tmp_path)}:/opt/cray/lib64",
           "SCALEGNN_VENV": str(tmp_path / "venv")}
    return {**env, **extra}


def _lines(findings) -> list[str]:
    return [f.line() for f in findings]


# ---------------------------------------------------------------------------- what is installed and loaded
def test_the_torch_build_is_read_from_its_version_file_without_importing_torch(tmp_path):
    from importlib.machinery import PathFinder

    pkg = tmp_path / "site" / "torch"
    pkg.mkdir(parents=True)
    marker = tmp_path / "imported"
    (pkg / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\nraise ImportError('not importable')\n")
    (pkg / "version.py").write_text("from typing import Optional\n\n__all__ = ['__version__']\n"
                                    "__version__ = '2.5.1+rocm6.2'\ndebug = False\ncuda: Optional[str] = None\n"
                                    "hip: Optional[str] = '6.2.41133-dd7f95766'\n")
    found = torch_build(lambda name: PathFinder.find_spec(name, [str(tmp_path / "site")]))
    assert found == {"version": "2.5.1+rocm6.2", "cuda": None, "hip": "6.2.41133-dd7f95766",
                     "path": str(pkg / "version.py")}
    assert not marker.exists()  # torch's own code never ran
    assert torch_build(lambda name: None) is None


def test_the_loaded_rocm_and_cuda_are_read_from_the_environment(tmp_path):
    assert loaded_rocm({"ROCM_PATH": str(_rocm(tmp_path))}) == ("6.2.4", f"ROCM_PATH={tmp_path}/opt/rocm-6.2.4")
    assert loaded_rocm({"ROCM_PATH": "/opt/rocm-6.0.0"}) == ("6.0.0", "ROCM_PATH=/opt/rocm-6.0.0")  # no version file
    assert loaded_rocm({"LOADEDMODULES": "PrgEnv-gnu/8.5.0:rocm/6.2.4:craype-accel-amd-gfx90a"}) == \
        ("6.2.4", "module rocm/6.2.4")
    assert loaded_rocm({"LOADEDMODULES": "PrgEnv-gnu/8.5.0"}) is None and loaded_rocm({}) is None
    cuda = tmp_path / "cuda"
    cuda.mkdir()
    (cuda / "version.json").write_text(json.dumps({"cuda": {"name": "CUDA SDK", "version": "12.4.131"}}))
    assert loaded_cuda({"CUDA_HOME": str(cuda)}) == ("12.4.131", f"CUDA_HOME={cuda}")
    assert loaded_cuda({"CUDATOOLKIT_HOME": "/opt/nvidia/hpc_sdk/Linux_x86_64/24.5/cuda/12.4"})[0] == "12.4"
    assert loaded_cuda({"LOADEDMODULES": "cudatoolkit/12.2:craype"}) == ("12.2", "module cudatoolkit/12.2")
    assert loaded_cuda({}) is None


def test_the_plugin_is_looked_for_where_the_loader_looks(tmp_path):
    folder = _plugin(tmp_path)
    found, searched = find_plugin(["librccl-net.so"], {"LD_LIBRARY_PATH": f"/nowhere:{folder}"})
    assert found == str(folder / "librccl-net.so") and searched[:2] == ["/nowhere", str(folder)]
    assert find_plugin(["librccl-net.so"], {"LD_LIBRARY_PATH": "/nowhere"})[0] is None
    named = _plugin(tmp_path, "libnccl-net-ofi.so", "named/lib")
    assert find_plugin(["libnccl-net.so"], {"LD_LIBRARY_PATH": str(named), "NCCL_NET_PLUGIN": "ofi"})[0] == \
        str(named / "libnccl-net-ofi.so")
    path = str(named / "libnccl-net-ofi.so")
    assert find_plugin([], {"NCCL_NET_PLUGIN": path})[0] == path


# ---------------------------------------------------------------------------- the findings
def test_a_matching_rocm_node_is_one_ok_line(tmp_path, capsys, monkeypatch):
    env = _site(tmp_path)
    findings, seen = check("rocm", ("librccl-net.so",), env, ROCM_TORCH, prefix=env["SCALEGNN_VENV"])
    assert findings == []
    assert seen == (f"python {tmp_path}/venv; torch 2.5.1+rocm6.2 (ROCm 6.2) with ROCm 6.2.4 "
                    f"(ROCM_PATH={tmp_path}/opt/rocm-6.2.4); network plugin {tmp_path}/aws-ofi-rccl/lib/librccl-net.so")


def test_a_rocm_version_the_torch_build_was_not_made_for_is_one_warning(tmp_path):
    env = _site(tmp_path, ROCM_PATH=str(_rocm(tmp_path, "6.0.0")))
    findings, _ = check("rocm", ("librccl-net.so",), env, ROCM_TORCH, prefix=env["SCALEGNN_VENV"])
    assert _lines(findings) == [
        f"scalegnn preflight: warning: ROCm 6.0.0 is loaded (ROCM_PATH={tmp_path}/opt/rocm-6.0.0) but torch "
        "2.5.1+rocm6.2 is built for ROCm 6.2 (torch.version.hip 6.2.41133-dd7f95766): load a rocm/6.2.* module in the "
        "profile's setup, or install the torch wheel for ROCm 6.0 "
        "(--index-url https://download.pytorch.org/whl/rocm6.0)"]
    same_minor = _site(tmp_path / "b", ROCM_PATH=str(_rocm(tmp_path, "6.2.1")))
    assert check("rocm", ("librccl-net.so",), same_minor, ROCM_TORCH, prefix=same_minor["SCALEGNN_VENV"])[0] == []
    none = {k: v for k, v in _site(tmp_path / "c").items() if k != "ROCM_PATH"}
    [finding] = check("rocm", ("librccl-net.so",), none, ROCM_TORCH, prefix=none["SCALEGNN_VENV"])[0]
    assert finding.level == "warning" and finding.text.startswith("no ROCm is loaded") and "rocm/6.2.*" in finding.text


def test_a_missing_plugin_warns_unless_nccl_is_told_to_use_it(tmp_path):
    env = _site(tmp_path, LD_LIBRARY_PATH="/opt/cray/lib64")
    [finding] = check("rocm", ("librccl-net.so",), env, ROCM_TORCH, prefix=env["SCALEGNN_VENV"])[0]
    assert finding.level == "warning"
    assert finding.text.startswith("no librccl-net.so in LD_LIBRARY_PATH (/opt/cray/lib64)")
    assert "fall back to TCP sockets" in finding.text and "export AWS_OFI_RCCL_LIB=" in finding.text
    env["NCCL_NET"] = "AWS Libfabric"  # Perlmutter's setting: NCCL fails without the plugin
    [finding] = check("rocm", ("librccl-net.so",), env, ROCM_TORCH, prefix=env["SCALEGNN_VENV"])[0]
    assert finding.level == "error" and "NCCL_NET='AWS Libfabric' asks for the network plugin" in finding.text
    assert "NCCL cannot start" in finding.text
    env["NCCL_NET"] = "Socket"  # NCCL's own: no plugin needed
    assert check("rocm", ("librccl-net.so",), env, ROCM_TORCH, prefix=env["SCALEGNN_VENV"])[0][0].level == "warning"
    assert check("rocm", (), env, ROCM_TORCH, prefix=env["SCALEGNN_VENV"])[0] == []  # a profile that names none


def test_a_plugin_built_for_another_rocm_is_one_warning(tmp_path):
    other = _plugin(tmp_path, where="collab/rccl/rocm-6.1.0/install/lib")
    env = _site(tmp_path, LD_LIBRARY_PATH=str(other))
    [finding] = check("rocm", ("librccl-net.so",), env, ROCM_TORCH, prefix=env["SCALEGNN_VENV"])[0]
    assert finding.level == "warning" and f"the network plugin {other}/librccl-net.so is built for ROCm 6.1.0 but " \
        "torch 2.5.1+rocm6.2 for ROCm 6.2" in finding.text


def test_a_torch_build_for_another_device_cannot_run(tmp_path):
    env = _site(tmp_path)
    [finding] = check("rocm", ("librccl-net.so",), env, CUDA_TORCH, prefix=env["SCALEGNN_VENV"])[0]
    assert finding.level == "error" and "is a CUDA 12.4 build, not a ROCm build" in finding.text
    assert "--index-url https://download.pytorch.org/whl/rocm6.2" in finding.text  # the wheel for the loaded ROCm
    [finding] = check("cuda", (), {}, ROCM_TORCH, prefix="/venv", executable="/venv/bin/python")[0]
    assert finding.level == "error" and "is a ROCm 6.2 build, not a CUDA build" in finding.text
    [finding] = check("cuda", (), {}, "absent", prefix="/venv", executable="/venv/bin/python")[0]
    assert finding.level == "error" and finding.text.startswith("no torch for python /venv/bin/python")


def test_cuda_versions_are_compared_by_major(tmp_path):
    cuda = tmp_path / "cuda"
    cuda.mkdir()
    plugin = _plugin(tmp_path, "libnccl-net.so", "nccl/plugin/lib")
    for version, warned in (("12.2.91", False), ("12.4.131", False), ("11.8.89", True)):
        (cuda / "version.json").write_text(json.dumps({"cuda": {"version": version}}))
        env = {"CUDA_HOME": str(cuda), "LD_LIBRARY_PATH": str(plugin)}
        findings, _ = check("cuda", ("libnccl-net.so",), env, CUDA_TORCH, prefix="/venv")
        assert bool(findings) == warned, (version, _lines(findings))
    assert "CUDA 11.8.89 is loaded" in findings[0].text and "built for CUDA 12.4" in findings[0].text


def test_another_python_than_the_venvs_is_one_warning(tmp_path):
    env = _site(tmp_path)
    [finding] = check("rocm", ("librccl-net.so",), env, ROCM_TORCH, prefix="/usr", executable="/usr/bin/python3")[0]
    assert finding.level == "warning" and finding.text.startswith(
        f"python /usr/bin/python3 runs from /usr, not from $SCALEGNN_VENV ({tmp_path}/venv)")


def test_the_command_line_exits_1_on_an_error_only(tmp_path, monkeypatch, capsys):
    import scalegnn.sweeps.preflight as preflight

    env = _site(tmp_path, LD_LIBRARY_PATH="/nowhere")
    monkeypatch.setattr(preflight, "torch_build", lambda: ROCM_TORCH)
    monkeypatch.setattr(os, "environ", env)
    monkeypatch.setattr(sys, "prefix", env["SCALEGNN_VENV"])
    assert main(["--device", "rocm", "--net-plugin", "librccl-net.so"]) == 0
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("scalegnn preflight: warning: no librccl-net.so")
    env["NCCL_NET"] = "AWS Libfabric"
    assert main(["--device", "rocm", "--net-plugin", "librccl-net.so"]) == 1
    assert capsys.readouterr().err.startswith("scalegnn preflight: error: NCCL_NET='AWS Libfabric'")


def test_the_check_runs_as_a_module_without_torch(tmp_path):
    """What the batch script runs: `python -m scalegnn.sweeps.preflight`, with a torch that
    cannot even be imported on the path (its version file is all it reads)."""
    pkg = tmp_path / "site" / "torch"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ImportError('importing torch is not cheap')\n")
    (pkg / "version.py").write_text("__version__ = '2.5.1+rocm6.2'\ncuda = None\nhip = '6.2.41133-dd7f95766'\n")
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": f"{tmp_path / 'site'}{os.pathsep}{REPO}",
           **_site(tmp_path, SCALEGNN_VENV=sys.prefix)}
    proc = subprocess.run([sys.executable, "-m", "scalegnn.sweeps.preflight", "--device", "rocm", "--net-plugin",
                           "librccl-net.so"], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert proc.stdout.startswith("scalegnn preflight: ok: ") and "torch 2.5.1+rocm6.2 (ROCm 6.2) with ROCm 6.2.4" \
        in proc.stdout


# ---------------------------------------------------------------------------- the batch script and the node
def test_the_gpu_profiles_run_the_check_and_the_cpu_ones_do_not():
    assert command(load_profile("frontier"), "py") == [
        "# start-of-job check: torch build vs the loaded ROCm/CUDA, the network plugin, the python "
        "(sweeps/preflight.py)", "py -m scalegnn.sweeps.preflight --device rocm --net-plugin librccl-net.so || exit 1"]
    assert command(load_profile("perlmutter"), "py")[1] == (
        "py -m scalegnn.sweeps.preflight --device cuda --net-plugin libnccl-net.so --net-plugin libnccl-net-ofi.so "
        "|| exit 1")
    assert command(load_profile("local"), "py") == [] and command(load_profile("localslurm"), "py") == []


def test_every_task_makes_its_nodes_miopen_folders(tmp_path, capsys):
    """OLCF's and LLNL's guides make them in the batch script, which reaches the first node
    only; each task makes them on its own node (twice is harmless: ranks share a node)."""
    db, cache = tmp_path / "tmp" / "miopen-user", tmp_path / "tmp" / "miopen-kernels"
    env = {"MIOPEN_USER_DB_PATH": str(db), "MIOPEN_CUSTOM_CACHE_DIR": str(cache)}
    assert prepare_node(env) == [str(db), str(cache)] and db.is_dir() and cache.is_dir()
    assert prepare_node(env) == [str(db), str(cache)]
    assert prepare_node({}) == []
    (tmp_path / "file").write_text("")
    assert prepare_node({"MIOPEN_USER_DB_PATH": str(tmp_path / "file" / "db")}) == []
    assert capsys.readouterr().err.startswith("scalegnn preflight: warning: cannot create MIOPEN_USER_DB_PATH=")


def test_a_sweep_task_makes_the_miopen_folders_before_it_trains(tmp_path, monkeypatch):
    """SweepTask (SLURM, local) calls prepare_node before training."""
    import submitit

    import scalegnn.sweeps.task as task_module
    from scalegnn.config import make_config
    from scalegnn.sweeps.task import SweepTask

    db = tmp_path / "miopen"
    monkeypatch.setenv("MIOPEN_USER_DB_PATH", str(db))
    seen = []
    monkeypatch.setattr(task_module, "train", lambda cfg: seen.append(db.is_dir()) or 0)

    class OneTask:
        num_tasks, global_rank, hostnames, job_id = 1, 0, ["h"], "1"

    monkeypatch.setattr(submitit, "JobEnvironment", lambda: OneTask())
    run = {"key": "k", "world_size": 1, "config": make_config(dataset="cora").to_dict(), "argv": ["train"]}
    assert SweepTask(run, str(tmp_path), "gloo")()["status"] == "ok" and seen == [True]


@pytest.mark.parametrize("name", ["perlmutter", "frontier", "tuolumne"])
def test_each_sites_profile_names_its_plugin_and_the_venvs_python(name):
    prof = load_profile(name)
    assert prof.net_plugin and prof.python == '"${SCALEGNN_VENV}/bin/python"'
