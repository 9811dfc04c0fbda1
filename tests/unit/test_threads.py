"""The thread policy (scalegnn/threads.py): the decision on injected machines, the
machine probes on fake /proc and cgroup files, the launchers' local rank counts, the
environment of spawned ranks, and the record of real runs (one process, the command
line, two spawned ranks). A sweep's threads per task: tests/harness/test_sweeps.py; the
thread bench: tests/harness/test_bench.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from scalegnn import threads as T
from scalegnn.launch import environment
from scalegnn.launch.job import spawn
from tests.files import REPO
from tests.runs import SMALL


# ----------------------------------------------------------------------------- the decision
@pytest.mark.parametrize("inputs, want", [
    (dict(cpus=2, busy=0.05), 2),  # idle: every core
    (dict(cpus=2, busy=1.0), 1),  # one core taken by another process
    (dict(cpus=2, busy=1.3), 1),
    (dict(cpus=2, busy=0.2), 2),  # a core at least FREE_SHARE idle counts as free
    (dict(cpus=2, busy=0.3), 1),  # ... one that is not, does not
    (dict(cpus=2, busy=7.0), 1),  # more busy than cores: still one thread
    (dict(cpus=2), 2),  # not measured: taken as idle
    (dict(cpus=16, local_ranks=4, busy=0.0), 4),  # four ranks share 16 cores
    (dict(cpus=16, local_ranks=4, busy=8.0), 2),  # ... half of them busy
    (dict(cpus=2, local_ranks=8, busy=0.0), 1),  # 8 gloo ranks on 2 cores: one each, never 0
    (dict(cpus=4, local_ranks=4, pinned=True, busy=0.0), 4),  # srun --cpu-bind: the 4 CPUs are this rank's own
    (dict(cpus=8, quota=1.5, busy=0.0), 1),  # a cgroup quota of 1.5 cores: 1 usable
    (dict(cpus=16, quota=4.0, busy=0.0), 4),
    (dict(cpus=16, busy=0.0, omp_threads=3), 3),  # OMP_NUM_THREADS caps auto
    (dict(cpus=2, busy=0.0, omp_threads=1), 1),
    (dict(cpus=2, busy=0.0, omp_threads=8), 2),  # ... but never raises it
])
def test_auto_takes_the_free_cores_shared_by_the_local_ranks(inputs, want):
    choice = T.decide("auto", **inputs)
    assert (choice.setting, choice.intra_op, choice.inter_op) == ("auto", want, want), choice.reason
    assert choice.reason.endswith(f"-> {want}")
    assert choice.inputs["cpus"] == inputs["cpus"] and choice.inputs["local_ranks"] == inputs.get("local_ranks", 1)


def test_a_given_count_overrides_the_machine():
    busy = T.decide(3, cpus=2, busy=2.0, local_ranks=2)
    assert (busy.setting, busy.intra_op, busy.inter_op) == (3, 3, 3)
    assert busy.reason == "--threads 3 (given); 3 x 2 rank(s) > 2 usable cores"
    assert T.decide("2", cpus=8).reason == "--threads 2 (given)"


@pytest.mark.parametrize("bad", ["0", "-1", "two", "", "1.5", 0, True, None, "auto,2"])
def test_a_bad_setting_names_the_fix(bad):
    with pytest.raises(ValueError, match=r"--threads must be 'auto' or a whole number >= 1.*use --threads auto"):
        T.thread_setting(bad)


def test_settings_parse():
    assert T.thread_setting("AUTO") == "auto" and T.thread_setting(" 4 ") == 4 and T.thread_setting(2) == 2
    assert T.omp_num_threads("4,2") == 4 and T.omp_num_threads(None) is None and T.omp_num_threads("x") is None
    assert T.omp_num_threads("0") is None


# ----------------------------------------------------------------------------- the machine
def test_cpu_lists_and_quotas_parse():
    assert T.parse_cpu_list("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert T.parse_cpu_list("5") == {5}
    assert T.parse_cpu_max("max 100000\n") is None
    assert T.parse_cpu_max("150000 100000") == 1.5
    assert T.parse_cpu_max("200000 50000\n") == 4.0


def _cgroup_files(tmp_path, lines, files):
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "cgroup").write_text("\n".join(lines) + "\n")
    for rel, text in files.items():
        path = tmp_path / "fs" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return str(tmp_path / "fs"), str(tmp_path / "cgroup")


def test_cgroup_v2_quota_is_the_tightest_on_the_path(tmp_path):
    root, proc = _cgroup_files(tmp_path, ["0::/job/step"], {"job/cpu.max": "300000 100000\n",
                                                            "job/step/cpu.max": "max 100000\n",
                                                            "cpu.max": "max 100000\n"})
    assert T.cgroup_cpu_quota(root, proc) == 3.0


def test_cgroup_v1_quota_and_a_container_without_the_host_path(tmp_path):
    root, proc = _cgroup_files(tmp_path, ["4:memory:/x", "2:cpu,cpuacct:/docker/abc"],
                               {"cpu,cpuacct/cpu.cfs_quota_us": "150000\n",
                                "cpu,cpuacct/cpu.cfs_period_us": "100000\n"})
    assert T.cgroup_cpu_quota(root, proc) == 1.5  # /docker/abc is not under the mount: its root is the container's
    root, proc = _cgroup_files(tmp_path / "none", ["1:cpu:/"], {"cpu/cpu.cfs_quota_us": "-1\n",
                                                               "cpu/cpu.cfs_period_us": "100000\n"})
    assert T.cgroup_cpu_quota(root, proc) is None
    assert T.cgroup_cpu_quota(root, str(tmp_path / "missing")) is None


def test_busy_cores_come_from_proc_stat_on_this_process_cpus(tmp_path, monkeypatch):
    """cpu0 busy half of the window, cpu1 all of it (steal counts as busy), cpu2 (not
    ours) all of it: 1.5 busy cores, less this process's own CPU time."""
    stat = tmp_path / "stat"
    before = ["cpu  1 1 1 1 1 1 1 1 0 0", "cpu0 100 0 0 100 0 0 0 0 0 0", "cpu1 100 0 0 100 0 0 0 0 0 0",
              "cpu2 100 0 0 100 0 0 0 0 0 0", "intr 5"]
    after = ["cpu  1 1 1 1 1 1 1 1 0 0", "cpu0 130 0 20 140 10 0 0 0 0 0", "cpu1 150 0 0 100 0 0 0 50 0 0",
             "cpu2 200 0 0 100 0 0 0 0 0 0", "intr 9"]
    stat.write_text("\n".join(before))
    own = iter([10.0, 10.25])  # 0.25 CPU-s of our own over the window
    clock = iter([0.0, 1.0])
    monkeypatch.setattr(T, "_own_cpu_s", lambda: next(own))
    monkeypatch.setattr(T.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(T.time, "sleep", lambda s: stat.write_text("\n".join(after)))
    assert T.busy_cores({0, 1}, 0.5, str(stat)) == pytest.approx(1.5 - 0.25)
    assert T.busy_cores({0}, 0.5, str(tmp_path / "absent")) is None


def test_choose_samples_only_when_the_load_can_change_the_answer_and_once(monkeypatch):
    sampled = []
    monkeypatch.setattr(T, "_sample", None)
    monkeypatch.setattr(T, "busy_cores", lambda cpus, s=T.SAMPLE_S, *a: sampled.append(s) or float(len(cpus)))
    monkeypatch.setattr(T, "_affinity", lambda: {0, 1, 2, 3})
    monkeypatch.setattr(T, "cgroup_cpu_quota", lambda *a: None)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert T.choose(2).intra_op == 2 and T.choose("auto", 4).intra_op == 1 and not sampled  # nothing to decide
    choice = T.choose("auto", 1)  # four cores, all busy: one thread, from a sample
    assert (choice.intra_op, choice.inputs["busy_cores"], choice.inputs["busy_source"]) == (1, 4.0, "/proc/stat")
    assert T.choose("auto", 1) == choice and len(sampled) == 1  # the process's sample, reused: the same count
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert T.choose("auto", 1).inputs["busy_cores"] is None and len(sampled) == 1


def test_workers_a_process_spawns_share_its_cpus_however_it_is_pinned(monkeypatch):
    """``taskset -c 0-3 scalegnn train --nproc 4``: the spawner is pinned (its affinity a
    strict subset of its parent's), but its 4 workers inherit those 4 CPUs: one each."""
    monkeypatch.setattr(T, "_affinity", lambda: {0, 1, 2, 3})
    monkeypatch.setattr(T, "_pinned", lambda mine: True)
    monkeypatch.setattr(T, "_sample", {"busy": 0.0, "busy_source": "/proc/stat", "sample_s": 0.2})
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert T.choose("auto", 4, spawner=True).intra_op == 1
    assert T.choose("auto", 4).intra_op == 4  # a launched rank pinned to 4 CPUs of its own


# ----------------------------------------------------------------------------- launchers: local ranks
@pytest.mark.parametrize("env, want", [
    ({"SLURM_STEP_TASKS_PER_NODE": "4(x2),3", "SLURM_NODEID": "2"}, 3),
    ({"SLURM_TASKS_PER_NODE": "4(x2),3", "SLURM_NODEID": "1"}, 4),
    ({"SLURM_TASKS_PER_NODE": "2", "SLURM_NODEID": "0"}, 2),
    ({"SLURM_NTASKS_PER_NODE": "8"}, 8),
    ({}, None),
])
def test_slurm_tasks_on_this_node(env, want):
    assert environment.slurm_tasks_on_node(env) == want


def _clear_launchers(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "SUBMITIT_EXECUTOR", "FLUX_TASK_RANK", "SLURM_PROCID",
                "SLURM_NTASKS", "SLURM_TASKS_PER_NODE", "SLURM_STEP_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE",
                "FLUX_JOB_NNODES"):
        monkeypatch.delenv(var, raising=False)


def test_each_launcher_says_how_many_ranks_share_the_node(monkeypatch):
    from scalegnn.parallel.grid import ParallelConfig

    _clear_launchers(monkeypatch)
    assert environment.local_ranks_of_run(ParallelConfig()) == (1, False)
    assert environment.local_ranks_of_run(ParallelConfig(grid=(1, 2, 2, 1), nproc=4)) == (4, True)  # spawns 4 here
    monkeypatch.setenv("MASTER_ADDR", "h")
    monkeypatch.setenv("MASTER_PORT", "29500")
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # torchrun: 2 nodes x 4
    assert environment.detect_env().local_world_size == 4
    assert environment.local_ranks_of_run(ParallelConfig(grid=(1, 2, 2, 2))) == (4, False)
    assert environment.local_ranks_of_run(ParallelConfig(grid=(8, 1, 1, 1), nproc=8)) == (4, False)  # nproc = Gd
    _clear_launchers(monkeypatch)
    monkeypatch.setenv("FLUX_TASK_RANK", "0")
    monkeypatch.setenv("FLUX_JOB_SIZE", "8")
    monkeypatch.setenv("FLUX_JOB_NNODES", "2")
    assert environment.detect_env().local_world_size == 4
    _clear_launchers(monkeypatch)
    monkeypatch.setenv("SLURM_PROCID", "0")
    monkeypatch.setenv("SLURM_NTASKS", "6")
    monkeypatch.setenv("SLURM_NODELIST", "n1")
    assert environment.detect_env().local_world_size == 6  # SLURM says nothing per node: all of them, here
    monkeypatch.setenv("SLURM_TASKS_PER_NODE", "3(x2)")
    assert environment.detect_env().local_world_size == 3


# ----------------------------------------------------------------------------- spawned ranks
def _report_threads(rank, world):
    from scalegnn import threads

    return {"wait": os.environ.get("OMP_WAIT_POLICY"), "intra": torch.get_num_threads(),
            "inter": torch.get_num_interop_threads(), "record": threads.record()}


def test_spawned_ranks_start_passive_with_the_choice_of_the_run():
    choice = T.decide("auto", cpus=4, busy=0.0, local_ranks=2)  # 2 threads each
    out = spawn(_report_threads, 2, timeout_s=120, threads_per_worker=choice)
    for rank in out:
        assert rank["wait"] == os.environ["OMP_WAIT_POLICY"]  # set before the workers' OpenMP loaded
        assert (rank["intra"], rank["inter"]) == (2, 2)
        assert rank["record"]["setting"] == "auto" and rank["record"]["inputs"]["local_ranks"] == 2
        assert rank["record"]["omp_wait_policy"] == rank["wait"] and rank["record"]["omp_wait_policy_known"]
    plain = spawn(_report_threads, 1, timeout_s=120)  # the default: one thread, as given
    assert plain[0]["intra"] == 1 and plain[0]["record"]["setting"] == 1


# ----------------------------------------------------------------------------- records of real runs
def _train(tmp_path, **settings):
    import scalegnn

    return scalegnn.train(dataset=SMALL, data_root=str(tmp_path / "data"), out_dir=str(tmp_path / "runs"), layers=2,
                          hidden=16, epochs=1, progress=False, **settings)


def test_a_run_records_its_threads_and_gives_back_the_callers(tmp_path, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        rec = _train(tmp_path, threads=1)
        assert torch.get_num_threads() == 3  # the caller's count is back
    finally:
        torch.set_num_threads(before)
    env = rec["env"]["threads"]
    assert (env["setting"], env["intra_op"], env["reason"]) == (1, 1, "--threads 1 (given)")
    assert rec["config"]["parallel"]["threads"] == 1
    auto = _train(tmp_path, seed=1)["env"]["threads"]
    assert auto["setting"] == "auto" and auto["reason"].startswith("auto: ")
    assert set(auto["inputs"]) >= {"cpus", "cpu_quota", "usable_cores", "busy_cores", "local_ranks", "sharing_ranks",
                                   "omp_num_threads"}
    assert "omp_wait_policy" in auto and "omp_wait_policy_known" in auto


def test_spawned_ranks_record_the_shared_choice(tmp_path):
    rec = _train(tmp_path, grid=(1, 2, 1, 1), nproc=2, threads="auto")
    env = rec["env"]["threads"]
    assert env["setting"] == "auto" and env["inputs"]["local_ranks"] == 2 and env["intra_op"] >= 1
    assert env["omp_wait_policy_known"] is True and env["omp_wait_policy"] == os.environ["OMP_WAIT_POLICY"]


def test_the_command_line_sets_passive_waiting_before_torch_loads(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-m", "scalegnn", "train", "--dataset", SMALL, "--data-root",
                          str(tmp_path / "data"), "--out", str(tmp_path / "runs"), "--quiet", "--layers", "2",
                          "--hidden", "16", "--epochs", "1", "--threads", "2"],
                         capture_output=True, text=True, env={**env, "PYTHONPATH": str(REPO)}, cwd=str(REPO),
                         timeout=300)
    assert out.returncode == 0, out.stderr
    (path,) = (tmp_path / "runs").glob("*.json")
    threads = json.loads(path.read_text())["env"]["threads"]
    assert (threads["omp_wait_policy"], threads["omp_wait_policy_known"]) == ("PASSIVE", True)
    assert (threads["setting"], threads["intra_op"]) == (2, 2)


def test_a_bad_threads_flag_is_one_line_naming_the_fix(capsys):
    from scalegnn.cli import main

    with pytest.raises(SystemExit) as stop:
        main(["train", "--dataset", "cora", "--threads", "two"])
    assert stop.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("scalegnn train: error: argument --threads:") and "use --threads auto" in last
    with pytest.raises(ValueError, match="use --threads auto"):
        import scalegnn

        scalegnn.make_config(dataset="cora", threads=0)
