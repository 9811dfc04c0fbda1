"""The multi-node tier: runs whose ranks sit on different hosts and talk over links.

``make test-cluster`` runs it (``tests/cluster/tier.sh``: a SLURM cluster of three
namespaced nodes started by ``tests/cluster/localcluster.sh``, its node count and
host names printed, these tests, the cluster stopped by pid); the plain ``make test``
deselects it (``-m "not cluster"`` in pyproject.toml). ``SCALEGNN_CLUSTER_CONF=<slurm.conf>``
names a cluster that runs already; without it the fixture starts its own (root).

Each node has its own host name, address and port space; the rendezvous goes to the
first host of ``SLURM_JOB_NODELIST`` (or of torchrun's c10d rendezvous), gloo over the
nodes' veth links (``GLOO_SOCKET_IFNAME=sc0``, as a site profile sets it). What runs
for real: ``srun -N 2`` and ``-N 3`` ScaleGNN runs equal (``==``) to the same grid on
one host and (to the 3D grid's tolerance) to one process; ``torchrun --nnodes 2``; a
sweep submitted through submitit whose jobs span nodes and read shards staged on
another node; a baseline across nodes and DistDGL's refusal; and the failures a
multi-node job meets: one node's processes killed, one node's link cut mid-epoch, a
node drained and the job requeued onto another, which resumes exactly. No timing is
asserted beyond "every rank exits, within the collective timeout and a bound".
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scalegnn import records
from tests.files import REPO
from tests.slurm_cluster import cancel_all_and_wait, slurm_clients, squeue, wait_for

pytestmark = pytest.mark.cluster

LOCALCLUSTER = REPO / "tests" / "cluster" / "localcluster.sh"
SMALL = "csbm:n=600,avg_degree=8,classes=4,feature_dim=16"
LONG = "csbm:n=20000,avg_degree=8,classes=4,feature_dim=16"  # epochs of ~10 s: long enough to break one
TRAIN = ["--hidden", "16", "--layers", "2", "--batch-size", "128", "--eval-every", "1", "--quiet"]
KEYS = ("loss", "batch_train_acc", "train_acc", "val_acc", "test_acc")  # what an epoch computed (no times)
RTOL_3D = 1e-4  # the 3D grid against one process (tests/parallel/test_engine.py: reduction order differs)


# ---------------------------------------------------------------------------- the cluster
@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A running multi-node SLURM cluster: SLURM_CONF set for this process and its jobs,
    this checkout first on every task's PYTHONPATH; yields the node names."""
    own = None
    conf = os.environ.get("SCALEGNN_CLUSTER_CONF")
    if not conf:
        if os.geteuid() != 0:
            pytest.skip("the cluster tier creates network namespaces and starts slurmd: it needs root (or "
                        "SCALEGNN_CLUSTER_CONF of a running cluster)")
        if shutil.which("slurmctld") is None and shutil.which("apt-get") is None:
            pytest.skip("no SLURM here and no apt-get to install it (set SCALEGNN_CLUSTER_CONF)")
        own = tmp_path_factory.mktemp("cluster")
        proc = subprocess.run(["bash", str(LOCALCLUSTER), "up", str(own), "3"], capture_output=True, text=True,
                              timeout=600)
        assert proc.returncode == 0, f"localcluster.sh up failed:\n{proc.stdout}\n{proc.stderr}"
        conf = str(own / "slurm.conf")
    with slurm_clients(conf):
        try:
            nodes = _sinfo("%N")
            assert len(nodes) >= 3, f"the cluster tier needs 3 nodes, {conf} has {nodes}"
            yield nodes
        finally:
            cancel_all_and_wait()
            if own is not None:
                subprocess.run(["bash", str(LOCALCLUSTER), "down", str(own)], timeout=180)


@pytest.fixture(autouse=True)
def every_node_up_and_nothing_left(cluster):
    """Each test starts with every node idle and leaves no job behind (a failed assertion
    mid-test), every link up."""
    conf_dir = Path(os.environ["SLURM_CONF"]).parent
    for i, _ in enumerate(cluster, start=1):
        subprocess.run(["bash", str(LOCALCLUSTER), "mend", str(conf_dir), str(i)], capture_output=True, timeout=30)
    for node in cluster:
        if _node_state(node) not in ("idle", "mixed", "allocated"):
            subprocess.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"], capture_output=True,
                           timeout=30)
    wait_for(lambda: all(_node_state(n) == "idle" for n in cluster), 120, "every node idle")
    yield
    cancel_all_and_wait()


def _sinfo(fmt: str) -> list[str]:
    out = subprocess.run(["sinfo", "-h", "-N", "-o", fmt], capture_output=True, text=True, timeout=30).stdout
    return [line.strip() for line in out.splitlines() if line.strip()]


def _node_state(node: str) -> str:
    out = subprocess.run(["sinfo", "-h", "-n", node, "-o", "%T"], capture_output=True, text=True, timeout=30)
    return out.stdout.strip().rstrip("*~#$@")


# ---------------------------------------------------------------------------- runs
def _train_argv(dataset: str, grid: str, out: Path, data: Path, epochs: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "scalegnn.cli", "train", "--dataset", dataset, "--data-root", str(data),
            "--grid", grid, "--epochs", str(epochs), "--out", str(out), *TRAIN, *extra]


def _baseline_argv(argv: list[str]) -> list[str]:
    """``argv`` without ScaleGNN's --batch-size (each baseline sizes its batches its own way)."""
    i = argv.index("--batch-size")
    return argv[:i] + argv[i + 2:]


def _srun_command(nodes: int, per_node: int, argv: list[str]) -> list[str]:
    """``argv`` as a job step of ``per_node`` tasks on each of ``nodes`` nodes that ends
    when one task fails."""
    return ["srun", "-N", str(nodes), "--ntasks-per-node", str(per_node), "--kill-on-bad-exit=1", *argv]


def _transport_env(ifname: str | None = "sc0") -> dict:
    """This environment with gloo on ``ifname`` (a site profile's socket_ifname; None: unset)."""
    return {**os.environ, **({"GLOO_SOCKET_IFNAME": ifname} if ifname else {})}


def _srun(nodes: int, per_node: int, argv: list[str], *, ifname: str | None = "sc0", timeout_s: float = 300,
          check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(_srun_command(nodes, per_node, argv), capture_output=True, text=True, timeout=timeout_s,
                          env=_transport_env(ifname))
    if check:
        assert proc.returncode == 0, f"srun failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def _here(argv: list[str], timeout_s: float = 300) -> None:
    """The same command on this host, no scheduler (one process, or --nproc local workers)."""
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    assert proc.returncode == 0, f"{' '.join(argv)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


def _record(out: Path) -> dict:
    paths = sorted(out.glob("*.json"))
    assert len(paths) == 1, f"expected one record in {out}, found {[p.name for p in paths]}"
    return records.read_record(paths[0])


def _rows(record: dict, key: str) -> list:
    return [e.get(key) for e in record["epochs"]]


def _hosts(record: dict) -> dict[str, list[int]]:
    by_host: dict[str, list[int]] = {}
    for p in record["env"]["placement"]:
        by_host.setdefault(p["host"], []).append(p["rank"])
    return by_host


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return tmp_path_factory.mktemp("data")


@pytest.fixture(scope="module")
def one_process(tmp_path_factory, data, cluster):
    """The reference: the run in one process on this host."""
    out = tmp_path_factory.mktemp("one-process")
    _here(_train_argv(SMALL, "1x1x1x1", out, data, 3))
    return _record(out)


# ---------------------------------------------------------------------------- runs across nodes
@pytest.mark.parametrize("nodes, per_node, grid", [(2, 2, "1x2x1x2"), (3, 2, "1x3x1x2")], ids=["N2", "N3"])
def test_srun_across_nodes_equals_one_host_and_one_process(cluster, tmp_path, data, one_process, nodes, per_node, grid):
    """srun -N 2 / -N 3: ranks on every node of the job (the record's placement), the
    rendezvous on the first host of the node list; the epochs equal the same grid's
    on one host exactly (only the transport differs) and one process's to the 3D
    grid's tolerance."""
    across, local = tmp_path / "across", tmp_path / "local"
    _srun(nodes, per_node, _train_argv(SMALL, grid, across, data, 3))
    rec = _record(across)
    _here(_train_argv(SMALL, grid, local, data, 3, "--nproc", str(nodes * per_node)))
    want = _record(local)
    assert rec["status"] == "ok" and rec["world_size"] == nodes * per_node
    hosts = _hosts(rec)
    assert sorted(hosts) == cluster[:nodes], hosts  # every node of the job, the first one first
    assert all(len(r) == per_node for r in hosts.values())
    assert [p["local_rank"] for p in rec["env"]["placement"]] == list(range(per_node)) * nodes
    assert {p["device"] for p in rec["env"]["placement"]} == {"cpu"}
    assert hosts[cluster[0]] == list(range(per_node))  # rank 0 (the rendezvous) on the first host
    for key in KEYS:
        assert _rows(rec, key) == _rows(want, key), key
        assert _rows(rec, key) == pytest.approx(_rows(one_process, key), rel=RTOL_3D), key


def test_torchrun_two_nodes_with_c10d_rendezvous(cluster, tmp_path, data):
    """torchrun --nnodes 2 --rdzv-backend c10d, one agent per node (srun one task per
    node): the agents meet at the first node, the ranks at torchrun's store; the
    epochs equal the same grid's on one host."""
    out, local = tmp_path / "torchrun", tmp_path / "local"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2",
                "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{cluster[0]}:29411", "--rdzv-id", tmp_path.name,
                "--max-restarts", "0"]
    train = _train_argv(SMALL, "1x2x1x2", out, data, 2)
    _srun(2, 1, [*torchrun, "-m", "scalegnn.cli", *train[3:]])
    rec = _record(out)
    _here(_train_argv(SMALL, "1x2x1x2", local, data, 2, "--nproc", "4"))
    assert rec["status"] == "ok" and rec["env"]["placement"][0]["rank"] == 0
    hosts = _hosts(rec)
    assert sorted(hosts) == cluster[:2] and all(len(r) == 2 for r in hosts.values()), hosts
    assert sorted(p["local_rank"] for p in rec["env"]["placement"]) == [0, 0, 1, 1]
    for key in KEYS:
        assert _rows(rec, key) == _rows(_record(local), key), key


def test_a_transport_interface_the_node_lacks_is_one_line_before_the_rendezvous(cluster, tmp_path, data):
    proc = _srun(2, 1, _train_argv(SMALL, "1x2x1x1", tmp_path / "out", data, 1), ifname="hsn0", check=False,
                 timeout_s=120)
    assert proc.returncode != 0
    assert "GLOO_SOCKET_IFNAME=hsn0 names no network interface of scn" in proc.stderr
    assert "sc0" in proc.stderr  # the interfaces the node has, to choose from
    assert not list((tmp_path / "out").glob("*.json"))  # refused before any work: no record


def test_a_baseline_across_nodes_equals_one_host_and_distdgl_is_refused(cluster, tmp_path, data):
    """GraphSAINT's data-parallel ranks on two nodes equal its ranks on one host; DistDGL,
    which starts its own processes on one host, refuses to be a rank of a 2-node step."""
    across, local = tmp_path / "across", tmp_path / "local"
    saint = ["--system", "graphsaint", "--node-budget", "128"]
    _srun(2, 1, _baseline_argv(_train_argv(SMALL, "2x1x1x1", across, data, 2, *saint)))
    rec = _record(across)
    _here(_baseline_argv(_train_argv(SMALL, "2x1x1x1", local, data, 2, *saint, "--nproc", "2")))
    assert rec["status"] == "ok" and sorted(_hosts(rec)) == cluster[:2]
    for key in ("loss", "val_acc", "test_acc"):
        assert _rows(rec, key) == _rows(_record(local), key), key
    refused = _srun(2, 1, _baseline_argv(_train_argv(SMALL, "1x1x1x1", tmp_path / "dgl", data, 1, "--system",
                                                     "distdgl", "--nproc", "2")), check=False, timeout_s=120)
    assert refused.returncode != 0
    assert "--system distdgl starts its own processes on this one host" in refused.stderr
    assert "srun -N 1 -n 1" in refused.stderr


def test_a_sweep_through_submitit_spans_nodes_and_reads_shards_staged_on_another(cluster, tmp_path, data):
    """A sweep on the localcluster profile (2 ranks per node): the 4-rank run is one job of
    2 nodes, its shards staged by a job of one task on one node and read by ranks on
    the others (the shared file system), its record listing ranks on two hosts."""
    from scalegnn.sweeps.folders import run_dir, run_state
    from scalegnn.sweeps.launcher import sweep

    spec = tmp_path / "span.toml"
    spec.write_text(f'''
name = "span"
figure = "demo"
systems = ["scalegnn"]
seeds = [0]
[train]
hidden = 16
layers = 2
batch-ratio = 0.05
epochs = 2
eval-every = 2
[[experiments]]
cluster = "localcluster"
dataset = "{SMALL}"
gpus = [4]
grids = ["1x2x1x2"]
''')
    out = tmp_path / "sweep"
    done = sweep(spec, "localcluster", out, data_root=str(data), printer=lambda *a: None)
    assert len(done.submitted) == 1 and len(done.staged) == 1
    run = done.runs[0]
    path = wait_for(lambda: run_state(run_dir(out, run))[1] if run_state(run_dir(out, run))[0] == "ok" else None,
                 400, "the sweep run's ok record", every_s=2)
    rec = records.read_record(path)
    hosts = _hosts(rec)
    assert len(hosts) == 2 and all(len(r) == 2 for r in hosts.values()), hosts
    shard_dir = Path(rec["config"]["data"]["shard_dir"])
    staged_on = json.loads((shard_dir / "manifest.json").read_text())["host"]
    assert staged_on in cluster
    readers = {p["host"] for p in rec["env"]["placement"]}
    assert readers - {staged_on}, (staged_on, readers)  # ranks on another node read what this one staged


# ---------------------------------------------------------------------------- failures across nodes
def _start_long(tmp_path: Path, data: Path, timeout_s: int, epochs: int = 40) -> tuple[subprocess.Popen, Path]:
    out = tmp_path / "out"
    out.mkdir()
    argv = _train_argv(LONG, "1x2x1x2", out, data, epochs, "--collective-timeout", str(timeout_s),
                       "--checkpoint-dir", str(tmp_path / "ckpt"), "--checkpoint-every", "5")
    with open(tmp_path / "srun.log", "w") as log:  # srun keeps its own copy of the descriptor
        proc = subprocess.Popen(_srun_command(2, 2, argv), stdout=log, stderr=subprocess.STDOUT,
                                env=_transport_env())
    return proc, out


def _ranks_on(node: str) -> list[int]:
    """The pids of the training processes running on ``node`` (in its network namespace)."""
    out = subprocess.run(["ip", "netns", "pids", node], capture_output=True, text=True, timeout=30).stdout.split()
    pids = []
    for pid in out:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"scalegnn.cli" in cmd and b"train" in cmd:
            pids.append(int(pid))
    return pids


def _alive(pids) -> list[int]:
    alive = []
    for pid in pids:
        try:
            os.kill(pid, 0)
            state = Path(f"/proc/{pid}/stat").read_text().split()[2]
            if state != "Z":
                alive.append(pid)
        except (OSError, IndexError):
            continue
    return alive


def _first_checkpoint(tmp_path: Path):
    return list((tmp_path / "ckpt").glob("step-*/meta.json"))


def _record_with_status(out: Path, status: str) -> dict | None:
    """The run's one record in ``out`` with ``status``, once there is one, else None (a
    requeued job's attempts each write their own record: the resumed one names its
    parent in ``resumed_from``)."""
    found = [rec for rec in map(records.read_record, out.glob("*.json")) if rec["status"] == status]
    return found[0] if len(found) == 1 else None


def test_every_process_of_one_node_killed(cluster, tmp_path, data):
    """kill -9 to every rank on the second node mid-run: the ranks on the first node stop
    (a closed connection, then srun's SIGTERM), the record says failed and names ranks
    2 and 3 on that node as lost."""
    timeout_s = 60
    proc, out = _start_long(tmp_path, data, timeout_s)
    try:
        wait_for(lambda: _first_checkpoint(tmp_path), 240, "the first checkpoint")
        victims = wait_for(lambda: _ranks_on(cluster[1]), 30, f"the ranks on {cluster[1]}")
        survivors = _ranks_on(cluster[0])
        start = time.monotonic()
        for pid in victims:
            os.kill(pid, 9)
        proc.wait(timeout=timeout_s + 60)
        ended_s = time.monotonic() - start
        wait_for(lambda: not _alive(survivors), 30, "the first node's ranks to exit")
    finally:
        proc.kill()
    rec = wait_for(lambda: _record_with_status(out, "failed"), 30, "the failed record")
    assert rec["lost_ranks"] == [{"rank": 2, "host": cluster[1]}, {"rank": 3, "host": cluster[1]}]
    assert rec["error"].startswith(f"ranks 2, 3 on {cluster[1]} lost (no heartbeat for")
    assert ended_s < timeout_s + 40, ended_s  # detected by the closed connections, well inside the timeout
    print(f"\nkilled node: srun ended {ended_s:.1f} s after the kill (collective timeout {timeout_s} s)")


def test_one_node_link_cut_mid_epoch(cluster, tmp_path, data):
    """The second node's link cut mid-run: gloo notices after the collective timeout on
    both sides; the first node's rank 0 writes the failed record naming ranks 2 and 3
    on the cut node; the cut-off ranks, which can reach neither their peers nor the
    store, exit on their own (SLURM cannot reach them to kill them)."""
    timeout_s = 15  # shorter than SlurmdTimeout (20 s), so the ranks notice before SLURM does
    conf_dir = Path(os.environ["SLURM_CONF"]).parent
    proc, out = _start_long(tmp_path, data, timeout_s)
    try:
        wait_for(lambda: _first_checkpoint(tmp_path), 240, "the first checkpoint")
        near, far = _ranks_on(cluster[0]), wait_for(lambda: _ranks_on(cluster[1]), 30, f"the ranks on {cluster[1]}")
        start = time.monotonic()
        subprocess.run(["bash", str(LOCALCLUSTER), "cut", str(conf_dir), "2"], check=True, timeout=30)
        wait_for(lambda: not _alive(near), timeout_s + 60, "the first node's ranks to exit")
        near_s = time.monotonic() - start
        wait_for(lambda: not _alive(far), timeout_s + 60, "the cut-off node's ranks to exit")
        far_s = time.monotonic() - start
    finally:
        subprocess.run(["bash", str(LOCALCLUSTER), "mend", str(conf_dir), "2"], timeout=30)
        proc.kill()
    rec = wait_for(lambda: _record_with_status(out, "failed"), 30, "the failed record")
    assert rec["lost_ranks"] == [{"rank": 2, "host": cluster[1]}, {"rank": 3, "host": cluster[1]}]
    assert "Timed out waiting" in rec["error"]
    assert near_s < timeout_s + 30 and far_s < timeout_s + 45, (near_s, far_s)
    print(f"\nlink cut: first node's ranks out after {near_s:.1f} s, the cut node's after {far_s:.1f} s "
          f"(collective timeout {timeout_s} s)")


def test_a_drained_node_and_a_requeue_resume_on_other_nodes_exactly(cluster, tmp_path, data):
    """A 2-node batch job (--requeue, periodic checkpoints, --resume) on the first two
    nodes; mid-run the second node is drained and the job requeued: it starts again on
    the first and third nodes, resumes from the newest checkpoint, and its epochs
    equal an uninterrupted run's exactly; the record lists the new hosts."""
    third = cluster[2]
    subprocess.run(["scontrol", "update", f"NodeName={third}", "State=DRAIN", "Reason=not-yet"], check=True,
                   timeout=30)
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    argv = _train_argv(LONG, "1x2x1x2", out, data, 6, "--collective-timeout", "60", "--checkpoint-dir", str(ckpt),
                       "--checkpoint-every", "20", "--resume")
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\n#SBATCH -N 2\n#SBATCH --ntasks-per-node 2\n#SBATCH --requeue\n"
                      f"#SBATCH -o {tmp_path}/slurm-%j.out\n#SBATCH --open-mode=append\nexport GLOO_SOCKET_IFNAME=sc0\n"
                      f"srun --kill-on-bad-exit=1 {' '.join(argv)}\n")
    job = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, check=True,
                         timeout=30).stdout.strip().split(";")[0]
    wait_for(lambda: _first_checkpoint(tmp_path), 300, "the first checkpoint")
    subprocess.run(["scontrol", "update", f"NodeName={third}", "State=RESUME"], check=True, timeout=30)
    subprocess.run(["scontrol", "update", f"NodeName={cluster[1]}", "State=DRAIN", "Reason=maintenance"],
                   check=True, timeout=30)
    subprocess.run(["scontrol", "requeue", job], check=True, timeout=30)
    wait_for(lambda: squeue("%T", job) == ["PENDING"], 120, "the requeued job to wait", every_s=1)
    subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], check=True, timeout=30)
    rec = wait_for(lambda: _record_with_status(out, "ok"), 600, "the resumed run's record",
                every_s=2)
    assert rec.get("resumed"), "the requeued job started from scratch"
    first = [other for other in map(records.read_record, out.glob("*.json")) if other["run_id"] != rec["run_id"]]
    assert rec["resumed_from"] and all(other["run_id"] == rec["resumed_from"] for other in first)  # kept as written
    assert sorted(_hosts(rec)) == [cluster[0], third]  # the drained node left out
    reference = tmp_path / "reference"
    _here(_train_argv(LONG, "1x2x1x2", reference, data, 6, "--nproc", "4"), timeout_s=600)
    want = _record(reference)
    for key in KEYS:
        assert _rows(rec, key) == _rows(want, key), key
    assert len(rec["epochs"]) == 6
