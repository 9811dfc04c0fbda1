"""``distdgl``: real DGL distributed training, driven as a subprocess from the DGL environment.

DGL wheels exist only for torch <= 2.2, so the DGL side (``dgl_run.py``) runs under
``.venv-dgl/bin/python`` (``make dgl-env``: torch 2.1.2, dgl 2.1.0, torchdata
0.7.1, numpy<2) and this side only writes the input, launches, watches and
converts. What DGL's ``tools/launch.py`` (not in the wheel) would do, done here on
localhost (``../shared/notes/distdgl-on-one-host.md`` has the facts):

1. the dataset (same split as ``scalegnn train``) goes to ``graph.npz``;
   ``dgl.distributed.partition_graph`` (metis or random, ``balance_train``,
   ``balance_edges``) cuts it into K partitions = K simulated machines;
2. ``ip_config.txt`` gets one ``127.0.0.1 PORT`` line per machine; the servers
   start first (``DGL_ROLE=server DGL_SERVER_ID ...``), then the trainers
   (``DGL_ROLE=client ...`` plus ``MASTER_ADDR/PORT RANK WORLD_SIZE``), each told
   its machine id;
3. each machine's processes run in a private mount namespace whose ``/dev/shm`` is
   a folder of its own (DGL names shared-memory segments without the partition id,
   so two machines on one host would collide), removed after the job;
4. every process is started in its own session and is killed by its process group
   id when the job ends, fails or times out: no orphan survives a run.

Trainer rank 0 writes ``result-0.json``; :func:`job` turns it into the run record.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from scalegnn.config import RunConfig
from scalegnn.csr import is_csr
from scalegnn.loop import DivergedError
from scalegnn.session import JobFailed
from scalegnn.settings import int_tuple, setting
from scalegnn.signals import JobEnded

__all__ = ["DistDGLOptions", "job", "dgl_python", "DistDGLUnavailable"]

SCRIPT = Path(__file__).with_name("dgl_run.py")
REPO = Path(__file__).resolve().parents[2]


# Where DistDGL computes, said in its record: a GPU ScaleGNN run against it compares devices.
CPU_ONLY = ("DistDGL trains on the CPU: its environment comes from PyPI, whose DGL wheels (<= 2.1) are CPU builds; "
            "a comparison with a GPU run of another system compares devices, not systems")


class DistDGLUnavailable(ValueError):
    """The DGL environment is missing; the message says how to build it."""


@dataclass(kw_only=True)
class DistDGLOptions:
    fanouts: tuple = setting((10, 25), type=int_tuple, metavar="F1,F2,...",
                             help="neighbor-sampling fanouts, seeds' hop first; their number is the model's depth "
                             "(DGL's examples/distributed/graphsage)")
    eval_fanouts: tuple | None = setting(None, type=int_tuple, metavar="F1,F2,...",
                                         help="fanouts of sampled evaluation (default: the training fanouts)")
    batch_size: int = setting(1000, help="seed vertices per step (per trainer; DGL's example default)")
    eval_batch_size: int = setting(4096, help="seeds per batch of sampled evaluation")
    num_parts: int | None = setting(None, flag="--dgl-parts",
                                    help="graph partitions = simulated machines (default: --nproc)")
    partition: str = setting("metis", choices=("metis", "random"), help="vertex partitioning")
    balance_train: bool = setting(True, help="partition with DGL's balance_train")
    balance_edges: bool = setting(True, help="partition with DGL's balance_edges")
    num_servers: int = 1                # servers per machine
    timeout_s: float = setting(1800.0, flag="--dgl-timeout", help="seconds before the whole DistDGL job is killed")
    python: str | None = setting(None, flag="--dgl-python",
                                 help="python of the DGL environment (default: $SCALEGNN_DGL_PYTHON or "
                                 ".venv-dgl/bin/python; `make dgl-env` builds it)")
    fail_at_epoch: int | None = None    # test hook: trainers raise at this epoch
    keep_workdir: bool = False
    pids: list = field(default_factory=list)  # filled by run(): every process it started

    def __post_init__(self):
        self.fanouts = tuple(int(f) for f in self.fanouts)
        if self.eval_fanouts is not None:
            self.eval_fanouts = tuple(int(f) for f in self.eval_fanouts)
        if self.partition not in ("metis", "random"):
            raise ValueError(f"--partition must be metis or random, got {self.partition!r}")
        if self.num_parts is not None and self.num_parts < 1:
            raise ValueError(f"--dgl-parts must be >= 1, got {self.num_parts}")


def dgl_python(explicit: str | None = None, *, required: bool = True) -> str | None:
    """The DGL environment's python: ``explicit`` (--dgl-python), else $SCALEGNN_DGL_PYTHON, else the
    repository's ``.venv-dgl``. The one place it is looked up (the benchmarks' DGL peers ask here too, with
    ``required=False``: None where there is none, and they say "not measured")."""
    cand = explicit or os.environ.get("SCALEGNN_DGL_PYTHON") or str(REPO / ".venv-dgl" / "bin" / "python")
    if Path(cand).exists():
        return cand
    if not required:
        return None
    raise DistDGLUnavailable(
        f"the DGL environment's python {cand} does not exist; build it with `make dgl-env` "
        "(torch 2.1.2 + dgl 2.1.0 in .venv-dgl) or pass --dgl-python / set SCALEGNN_DGL_PYTHON")


def _free_ports(count: int, span: int = 1) -> list[int]:
    """``count`` base ports, each with ``span`` consecutive free ports after it."""
    import socket

    ports: list[int] = []
    tries = 0
    while len(ports) < count and tries < 1000:
        tries += 1
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + span > 65535 or any(abs(base - p) < span + 1 for p in ports):
            continue
        ok = True
        for k in range(span):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", base + k))
                except OSError:
                    ok = False
                    break
        if ok:
            ports.append(base)
    if len(ports) < count:
        raise RuntimeError("could not find free local ports for the DGL servers")
    return ports


def _isolate(cmd: list[str], shm_dir: str | None) -> list[str]:
    """Run ``cmd`` with ``shm_dir`` bind-mounted on /dev/shm in a private mount namespace."""
    if shm_dir is None:
        return cmd
    if shutil.which("unshare") is None:
        raise DistDGLUnavailable("more than one DGL partition on one host needs `unshare` (util-linux) "
                                 "to give each simulated machine its own /dev/shm; use --dgl-parts 1")
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    return ["unshare", *user, "--mount", "--propagation", "private", "--", "sh", "-c",
            'mount --bind "$0" /dev/shm && exec "$@"', shm_dir, *cmd]


class _Procs:
    """The processes of one job: started in their own sessions, stopped by process group."""

    def __init__(self):
        self.items: list[tuple[str, subprocess.Popen]] = []

    def start(self, name: str, cmd: list[str], env: dict, log: Path) -> subprocess.Popen:
        f = open(log, "wb")
        p = subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        f.close()
        self.items.append((name, p))
        return p

    @property
    def pids(self) -> list[int]:
        return [p.pid for _, p in self.items]

    def stop_all(self, grace_s: float = 5.0) -> None:
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            alive = [p for _, p in self.items if p.poll() is None]
            for p in alive:
                try:
                    os.killpg(p.pid, sig)  # the process group this job created for p
                except ProcessLookupError:
                    pass
            end = time.monotonic() + wait
            for p in alive:
                try:
                    p.wait(max(0.0, end - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
        for _, p in self.items:  # reap; leave no zombie
            if p.poll() is None:
                p.wait(5.0)


def _write_graph(graph, path: Path) -> None:
    rows = graph.row_ids().numpy()
    cols = graph.indices.numpy()
    keep = rows != cols
    # The one place a baseline densifies sparse (CSR) features: DistDGL's partitioner
    # takes node data as dense arrays (ndata), so the graph is handed over dense here.
    x = graph.x.to_dense() if is_csr(graph.x) else graph.x
    np.savez(path, num_nodes=np.int64(graph.num_nodes), src=cols[keep], dst=rows[keep],
             x=x.numpy().astype(np.float32), y=graph.y.numpy(),
             train_idx=graph.train_idx.numpy(), val_idx=graph.val_idx.numpy(), test_idx=graph.test_idx.numpy())


def _tail(path: Path, n: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


def job(cfg: RunConfig, graph=None) -> dict:
    """Partition, launch servers and trainers on localhost, wait, record (the registry's
    ``job`` of --system distdgl: DistDGL starts its own processes). The record is a
    :class:`~scalegnn.session.RunSession`'s, as every system's: the DGL job's outcome
    (trainer 0's result, a failed or silent process, the deadline) becomes its status."""
    from scalegnn.datasets import load_graph
    from scalegnn.records import placement_of
    from scalegnn.session import RunSession
    from scalegnn.systems import check_graph

    if cfg.parallel.device.startswith("cuda"):
        raise ValueError("--system distdgl runs on the CPU only (PyPI's DGL wheels, <= 2.1, are CPU builds); "
                         "use --device cpu or auto")
    opts: DistDGLOptions = cfg.options
    py = dgl_python(opts.python)
    graph = load_graph(cfg.data, cfg.seed, graph)
    check_graph(cfg.system, graph)
    if graph.multilabel:
        raise ValueError("the distdgl adapter trains single-label node classification only")
    parts = opts.num_parts or cfg.parallel.nproc
    world = cfg.parallel.nproc
    if world % parts:
        raise ValueError(f"--nproc {world} trainers cannot be spread evenly over --dgl-parts {parts} machines")
    if parts > 1 and shutil.which("unshare") is None:
        raise DistDGLUnavailable("more than one DGL partition on one host needs `unshare` (util-linux) "
                                 "to give each simulated machine its own /dev/shm; use --dgl-parts 1")
    opts.eval_fanouts = opts.eval_fanouts or opts.fanouts
    dgl_job = _DGLJob(cfg, graph, py, parts, world)
    # DistDGL runs on this host only: its trainers, world // parts per simulated machine.
    placement = [placement_of(r, r % (world // parts), "cpu") for r in range(world)]
    session = RunSession(cfg, world_size=world, backend="gloo", device="cpu", placement=placement)
    record = session.open(dgl_job)
    record["device_note"] = CPU_ONLY
    record["config"]["model"]["layers"] = len(opts.fanouts)  # DistDGL's model depth is its number of fanouts
    record["config"]["options"].pop("pids", None)
    session.peaks = []  # the trainers' own, from their result (this process trains nothing)
    with session.running():
        result = dgl_job.run(record)
        if result is not None:
            rss = result.get("peak_memory_bytes_per_rank") or [result["peak_memory_bytes"]]
            session.peaks = [(p, p, None) for p in rss]  # CPU trainers: the RSS is the peak, no device memory
        dgl_job.raise_outcome(result)
    return record


class _DGLJob:
    """One DistDGL job on this host: its work folder, its processes and its outcome. It
    stands in for a trainer before the run's session: what it trains on, its batch
    size, and (closing) its processes stopped and its folders removed."""

    device = "cpu"  # DistDGL's PyPI wheels are CPU builds
    stage = "the DistDGL job"

    def __init__(self, cfg: RunConfig, graph, python: str, parts: int, world: int):
        self.cfg, self.graph, self.python, self.parts, self.world = cfg, graph, python, parts, world
        opts = cfg.options
        self.graph_info = graph.record_info()
        self.batch_size, self.steps_per_epoch = opts.batch_size, 0  # trainer 0's result gives the steps
        self.work = Path(tempfile.mkdtemp(prefix="scalegnn-distdgl-"))
        # A private /dev/shm per simulated machine: required for K > 1, and with one machine it
        # still guarantees that a killed server leaves no shared-memory segment behind.
        isolate = parts > 1 or (shutil.which("unshare") is not None and Path("/dev/shm").is_dir())
        self.shm_root = Path(tempfile.mkdtemp(prefix="scalegnn-dgl-shm-", dir="/dev/shm")) if isolate else None
        self.procs = _Procs()
        self.started = time.monotonic()
        self.failure: str | None = None

    def record_fields(self) -> dict:
        return {}

    def run(self, record: dict) -> dict | None:
        """Partition, start the servers and trainers, wait; trainer 0's result (None when
        it wrote none). ``self.failure`` says what went wrong with the processes."""
        cfg, opts, work, parts, world, py = self.cfg, self.cfg.options, self.work, self.parts, self.world, self.python
        per_machine = world // parts
        deadline = self.started + opts.timeout_s
        _write_graph(self.graph, work / "graph.npz")
        cmd = [py, str(SCRIPT), "partition", "--graph", str(work / "graph.npz"), "--out", str(work / "parts"),
               "--parts", str(parts), "--method", opts.partition, "--trainers-per-machine", str(per_machine)]
        cmd += ["--balance-train"] if opts.balance_train else []
        cmd += ["--balance-edges"] if opts.balance_edges else []
        t0 = time.perf_counter()
        part_log = work / "partition.log"
        with open(part_log, "wb") as f:
            rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=max(1.0, deadline - time.monotonic()),
                                env=_clean_env()).returncode
        if rc != 0:
            raise JobFailed(f"DGL partition_graph failed (exit {rc}):\n{_tail(part_log)}")
        record["partition_s"] = time.perf_counter() - t0
        part_config = str(work / "parts" / "graph.json")
        ports = _free_ports(parts, span=opts.num_servers)
        ip_config = work / "ip_config.txt"
        ip_config.write_text("".join(f"127.0.0.1 {p}\n" for p in ports))
        shm = [None] * parts
        if self.shm_root is not None:
            for m in range(parts):
                (self.shm_root / f"m{m}").mkdir()
                shm[m] = str(self.shm_root / f"m{m}")
        num_client = world  # trainers x (1 + samplers) x machines; samplers = 0
        common = {"DGL_NUM_SERVER": str(opts.num_servers), "DGL_NUM_CLIENT": str(num_client),
                  "DGL_NUM_SAMPLER": "0", "DGL_CONF_PATH": part_config, "DGL_IP_CONFIG": str(ip_config),
                  "DGL_GRAPH_FORMAT": "csc", "OMP_NUM_THREADS": "1"}
        for m in range(parts):
            for j in range(opts.num_servers):
                env = {**_clean_env(), **common, "DGL_ROLE": "server",
                       "DGL_SERVER_ID": str(m * opts.num_servers + j)}
                self.procs.start(f"server-{m}-{j}", _isolate([py, str(SCRIPT), "server"], shm[m]), env,
                                 work / f"server-{m}-{j}.log")
        from scalegnn.launch.environment import free_port, threads_of_run

        master_port = free_port()
        threads = threads_of_run(cfg.parallel).intra_op  # --threads, for the trainers (the servers keep 1)
        trainers = []
        for m in range(parts):
            for t in range(per_machine):
                rank = m * per_machine + t
                spec = {"machine": m, "seed": cfg.seed + rank, "ip_config": str(ip_config),
                        "graph_name": "graph", "part_config": part_config, "fanouts": list(opts.fanouts),
                        "eval_fanouts": list(opts.eval_fanouts), "batch_size": opts.batch_size,
                        "eval_batch_size": opts.eval_batch_size, "hidden": cfg.model.hidden,
                        "dropout": cfg.model.dropout, "lr": cfg.optim.lr, "weight_decay": cfg.optim.weight_decay,
                        "epochs": cfg.loop.epochs, "eval_every": cfg.loop.eval_every,
                        "target_acc": cfg.loop.target_acc, "stop_at_target": cfg.loop.stop_at_target,
                        "num_classes": self.graph.num_classes, "out_dir": str(work),
                        "fail_at_epoch": opts.fail_at_epoch, "threads": threads,
                        "collective_timeout_s": max(60.0, min(opts.timeout_s, 600.0))}
                spec_path = work / f"trainer-{rank}.json"
                spec_path.write_text(json.dumps(spec))
                env = {**_clean_env(), **common, "DGL_DIST_MODE": "distributed", "DGL_ROLE": "client",
                       "DGL_GROUP_ID": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(master_port),
                       "RANK": str(rank), "WORLD_SIZE": str(world), "OMP_NUM_THREADS": str(threads)}
                p = self.procs.start(f"trainer-{rank}", _isolate([py, str(SCRIPT), "trainer", "--spec",
                                                                  str(spec_path)], shm[m]),
                                     env, work / f"trainer-{rank}.log")
                trainers.append((rank, p))
        opts.pids[:] = self.procs.pids
        self.failure = _wait_trainers(trainers, self.procs, deadline, work)
        # The last trainer's exit_client() shuts the servers down; give them a moment.
        end = time.monotonic() + 20.0
        while self.failure is None and any(p.poll() is None for n, p in self.procs.items if n.startswith("server")) \
                and time.monotonic() < end:
            time.sleep(0.2)
        result_path = work / "result-0.json"
        result = json.loads(result_path.read_text()) if result_path.exists() else None
        if result is not None:
            record["epochs"] = result["epochs"]
            record["steps_per_epoch"] = result["steps_per_epoch"]
            record["env"]["libraries"]["dgl"] = result["env"]["dgl"]
            record["env"]["dgl_env"] = result["env"]
        return result

    def raise_outcome(self, result: dict | None) -> None:
        """The job's outcome as the run session reads outcomes: nothing when trainer 0
        finished ok, else the error of what ended it (its deadline, a failed process, the
        trainers' own divergence or failure)."""
        said = (result or {}).get("error") or ""
        if self.failure is not None:
            if self.failure.startswith("timeout"):
                raise JobEnded("timeout", said + self.failure)
            raise JobFailed(said + self.failure)
        status = (result or {}).get("status")
        if status == "diverged":
            raise DivergedError(said)
        if result is None or status == "running":
            raise JobFailed("trainer 0 wrote no result")
        if status != "ok":
            raise JobFailed(said or f"trainer 0 ended with status {status}")

    def record_extra(self) -> dict:
        extra = {"distdgl_pids": self.procs.pids, "distdgl_wall_s": time.monotonic() - self.started}
        if self.cfg.options.keep_workdir:
            extra["distdgl_workdir"] = str(self.work)
        return extra

    def close(self) -> None:
        """Stop every process of the job (by process group) and remove its folders."""
        self.procs.stop_all()
        self.cfg.options.pids[:] = self.procs.pids
        if self.shm_root is not None:
            shutil.rmtree(self.shm_root, ignore_errors=True)
        if not self.cfg.options.keep_workdir:
            shutil.rmtree(self.work, ignore_errors=True)


def _clean_env() -> dict:
    """The parent's environment without this venv's python settings or torchrun variables."""
    drop = {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
            "MASTER_PORT", "TORCHELASTIC_RUN_ID"}
    return {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("DGL_")}


def _wait_trainers(trainers, procs: _Procs, deadline: float, work: Path) -> str | None:
    """Wait for every trainer; on the first failure give the rest a few seconds, then
    return a description (the caller stops every process)."""
    failed_at = None
    while True:
        codes = {r: p.poll() for r, p in trainers}
        bad = {r: c for r, c in codes.items() if c not in (None, 0)}
        servers_dead = [n for n, p in procs.items if n.startswith("server") and p.poll() not in (None, 0)]
        if bad or servers_dead:
            failed_at = failed_at or time.monotonic()
            if all(c is not None for c in codes.values()) or time.monotonic() - failed_at > 5.0:
                logs = "".join(f"\n--- trainer {r} (exit {c}) ---\n{_tail(work / f'trainer-{r}.log')}"
                               for r, c in sorted(bad.items()))
                logs += "".join(f"\n--- {n} ---\n{_tail(work / f'{n}.log')}" for n in servers_dead)
                return f"DistDGL job failed: trainers {sorted(bad)} servers {servers_dead}{logs}"
        elif all(c == 0 for c in codes.values()):
            return None
        if time.monotonic() > deadline:
            logs = "".join(f"\n--- trainer {r} ---\n{_tail(work / f'trainer-{r}.log', 1500)}" for r, _ in trainers)
            return f"timeout: the DistDGL job did not finish in time{logs}"
        time.sleep(0.2)


if __name__ == "__main__":  # pragma: no cover
    sys.exit("use: scalegnn train --system distdgl ...")
