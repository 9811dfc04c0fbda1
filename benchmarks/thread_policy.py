"""Thread policies side by side under a competing load (``scalegnn bench threads``).

    scalegnn bench threads                       # Facebook from ../shared/data (else a generated graph)
    scalegnn bench threads --runs 2 --load 1 --epochs 2 --reps 2 --policies default,default-passive,one,auto

For each policy, ``--load`` competing processes (a busy Python loop each) start first;
then ``--runs`` identical ``scalegnn train`` processes (single process, ratio 0.1, 3
layers, hidden 256) start together, and the next policy starts when they have all
ended. Policies (``scalegnn/threads.py``):

* ``default``: torch's default thread count (one per core) and the OpenMP runtime's
  default wait (spin, then sleep): what every run did before scalegnn chose. The run
  imports torch before scalegnn's entry point, which therefore cannot set the wait.
* ``default-passive``: the same count (``--threads N``) with ``OMP_WAIT_POLICY=PASSIVE``
  set before torch loads: what passive waiting alone changes.
* ``one``: ``--threads 1``, one thread per process.
* ``auto``: ``--threads auto``, scalegnn's policy (the cores free now, shared by ranks).

Each run's children see neither ``OMP_NUM_THREADS`` nor ``OMP_WAIT_POLICY`` from this
process (torch's default and ``auto`` would follow them). Per run: wall time, CPU time
(user + system, ``wait4``), the record's training time (evaluation excluded), the
threads it used (the record's ``env.threads``) and its last test accuracy; per policy:
the means, their ratios to ``one``, the CPU time the load got, and the load average
before and after. Writes ``OUT/threads.json`` and ``OUT/threads.md`` (default ``results/bench``).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from scalegnn.records import read_record

REPO = Path(__file__).resolve().parents[1]
POLICIES = ("default", "default-passive", "one", "auto")
GENERATED = "csbm:n=20000,avg_degree=15,classes=8,feature_dim=512"
# A run as it was before scalegnn chose threads: torch (and with it OpenMP) loads before
# scalegnn's entry point could set the wait policy, and keeps its default thread count.
BEFORE = "import sys, torch\nfrom scalegnn.cli import main\n" \
         "sys.exit(main(sys.argv[1:] + ['--threads', str(torch.get_num_threads())]))"
HOG = "while True: pass"

__all__ = ["add_arguments", "thread_bench", "run", "POLICIES"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    facebook = REPO.parent / "shared" / "data"
    parser.add_argument("--dataset", default=None,
                        help=f"default: facebook from {facebook} when it is there, else {GENERATED}")
    parser.add_argument("--data-root", default=None)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-ratio", default="0.1")
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--runs", type=int, default=2, help="identical runs side by side")
    parser.add_argument("--load", type=int, default=1, help="competing busy processes")
    parser.add_argument("--policies", default=",".join(POLICIES), help=f"comma-separated, of {', '.join(POLICIES)}")
    parser.add_argument("--reps", type=int, default=1, help="repetitions of the policy sequence (odd ones reversed)")


def _child_env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    return env


def _default_threads(env: dict) -> int:
    out = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"], env=env,
                         capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


def _timed(cmd: list[str], env: dict, log: Path) -> dict:
    """Start ``cmd``; a thread waits for it and notes its wall and CPU time (``wait4``)."""
    f = open(log, "w")
    start = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, cwd=str(REPO))
    out: dict = {"proc": proc}

    def wait():
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.update(wall_s=time.monotonic() - start, cpu_s=usage.ru_utime + usage.ru_stime,
                   returncode=proc.returncode)
        f.close()

    out["thread"] = threading.Thread(target=wait, daemon=True)
    out["thread"].start()
    return out


def _policy_block(policy: str, argv: list[str], runs: int, load: int, env: dict, default_threads: int,
                  work: Path) -> dict:
    hogs = [_timed([sys.executable, "-c", HOG], env, work / f"{policy}-load{i}.log") for i in range(load)]
    time.sleep(1.0)  # the load is running (and visible to a sample) before the runs start
    loadavg_before = os.getloadavg()
    children = []
    for i in range(runs):
        out = work / policy / f"run{i}"
        args = [*argv, "--out", str(out), "--quiet"]
        if policy == "default":
            cmd = [sys.executable, "-c", BEFORE, *args]
        else:
            flag = {"default-passive": str(default_threads), "one": "1", "auto": "auto"}[policy]
            cmd = [sys.executable, "-m", "scalegnn", *args, "--threads", flag]
        children.append((out, _timed(cmd, env, work / f"{policy}-run{i}.log")))
    for _, child in children:
        child["thread"].join()
    loadavg_after = os.getloadavg()
    for hog in hogs:
        os.kill(hog["proc"].pid, signal.SIGTERM)  # not Popen.terminate: the waiting thread reaps it
        hog["thread"].join()
    rows, failed = [], []
    for i, (out, child) in enumerate(children):
        records = list(out.glob("*.json"))
        if child["returncode"] != 0 or not records:  # kept, and said: one killed run must not lose the others
            tail = (work / f"{policy}-run{i}.log").read_text()[-1000:]
            failed.append({"run": i, "returncode": child["returncode"], "log_tail": tail})
            print(f"{policy} run {i} failed (exit {child['returncode']}): {tail}", file=sys.stderr)
            continue
        record = read_record(records[0])
        threads = record["env"]["threads"]
        rows.append({"wall_s": round(child["wall_s"], 3), "cpu_s": round(child["cpu_s"], 3),
                     "train_s": round(record["epochs"][-1]["train_time_s"], 3),
                     "test_acc": record["epochs"][-1]["test_acc"], "intra_op": threads["intra_op"],
                     "reason": threads["reason"], "busy_cores": threads.get("inputs", {}).get("busy_cores"),
                     "omp_wait_policy": threads["omp_wait_policy"]})
    return {"runs": rows, "failed": failed, "load_cpu_s": round(sum(h["cpu_s"] for h in hogs), 3),
            "loadavg": [loadavg_before, loadavg_after]}


def _combine(reps: list[dict]) -> dict:
    """A policy's blocks over the repetitions: every run, the means, the load's CPU time per block."""
    rows = [r for rep in reps for r in rep["runs"]]
    mean = lambda key: round(statistics.fmean(r[key] for r in rows), 3) if rows else None  # noqa: E731
    return {"runs": rows, "failed": [f for rep in reps for f in rep["failed"]], "wall_s": mean("wall_s"),
            "cpu_s": mean("cpu_s"), "train_s": mean("train_s"),
            "wall_s_max": max((r["wall_s"] for r in rows), default=None),
            "load_cpu_s": round(statistics.fmean(rep["load_cpu_s"] for rep in reps), 3),
            "loadavg_before": reps[0]["loadavg"][0], "loadavg_after": reps[-1]["loadavg"][1],
            "loadavg_per_rep": [rep["loadavg"] for rep in reps]}


def thread_bench(dataset: str | None = None, data_root: str | None = None, epochs: int = 2, batch_ratio="0.1",
                 layers: int = 3, hidden: int = 256, runs: int = 2, load: int = 1,
                 policies=POLICIES, reps: int = 1) -> tuple[dict, str]:
    """Run every policy's block ``reps`` times, in the order given and then reversed
    (ABBA: a load that drifts over the bench hits every policy alike; see the module
    doc); returns (payload, Markdown table)."""
    unknown = sorted(set(policies) - set(POLICIES))
    if unknown or not policies:
        raise ValueError(f"unknown policies {unknown}; choose from {', '.join(POLICIES)}")
    if runs < 1 or load < 0 or epochs < 1 or reps < 1:
        raise ValueError(f"--runs, --epochs and --reps must be >= 1 and --load >= 0, got {runs}, {epochs}, {reps}, "
                         f"{load}")
    if dataset is None:
        shared = REPO.parent / "shared" / "data"
        dataset, data_root = ("facebook", data_root or str(shared)) if (shared / "facebook_pagepage").is_dir() \
            else (GENERATED, data_root)
    argv = ["train", "--dataset", dataset, *(["--data-root", data_root] if data_root else []),
            "--batch-ratio", str(batch_ratio), "--layers", str(layers), "--hidden", str(hidden),
            "--epochs", str(epochs)]
    env = _child_env()
    default_threads = _default_threads(env)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    started = os.getloadavg()
    raw: dict[str, list] = {policy: [] for policy in policies}
    with tempfile.TemporaryDirectory(prefix="scalegnn-threads-") as tmp:
        for rep in range(reps):
            work = Path(tmp) / f"rep{rep}"
            work.mkdir()
            for policy in (policies if rep % 2 == 0 else tuple(reversed(policies))):
                raw[policy].append(_policy_block(policy, argv, runs, load, env, default_threads, work))
    blocks = {policy: _combine(raw[policy]) for policy in policies}
    base = blocks.get("one") if blocks.get("one", {}).get("runs") else None
    for block in blocks.values():
        block["wall_vs_one"] = round(block["wall_s"] / base["wall_s"], 3) if base and block["runs"] else None
        block["train_vs_one"] = round(block["train_s"] / base["train_s"], 3) if base and block["runs"] else None
    payload = {"bench": "threads", "dataset": dataset, "data_root": data_root, "epochs": epochs,
               "batch_ratio": float(batch_ratio), "layers": layers, "hidden": hidden, "runs": runs, "load": load,
               "reps": reps,
               "cores": cores, "torch_default_threads": default_threads, "loadavg_start": started,
               "loadavg_end": os.getloadavg(), "argv": argv, "policies": blocks,
               "auto_within_5pct_of_one": (blocks["auto"]["wall_s_max"] <= base["wall_s_max"] * 1.05
                                           if blocks.get("auto", {}).get("runs") and base else None)}
    return payload, _markdown(payload)


def _markdown(p: dict) -> str:
    lines = [f"{p['runs']} identical runs side by side + {p['load']} busy process(es) on {p['cores']} cores: "
             f"{p['dataset']}, ratio {p['batch_ratio']}, {p['layers']} layers, hidden {p['hidden']}, "
             f"{p['epochs']} epochs, {p['reps']} repetition(s) (means over the runs; ratios to `one`)", "",
             "| policy | threads | wait | wall s | train s | CPU s | wall / one | train / one | load's CPU s | "
             "load avg before -> after |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name, b in p["policies"].items():
        if not b["runs"]:
            lines.append(f"| {name} | every run failed ({', '.join(str(f['returncode']) for f in b['failed'])}) |"
                         + " |" * 8)
            continue
        threads = ",".join(str(r["intra_op"]) for r in b["runs"]) + (f" ({len(b['failed'])} failed)"
                                                                     if b["failed"] else "")
        wait = b["runs"][0]["omp_wait_policy"] or "runtime default"
        lines.append(f"| {name} | {threads} | {wait} | {b['wall_s']:.1f} | {b['train_s']:.1f} | {b['cpu_s']:.1f} | "
                     f"{b['wall_vs_one'] if b['wall_vs_one'] is not None else '-'} | "
                     f"{b['train_vs_one'] if b['train_vs_one'] is not None else '-'} | {b['load_cpu_s']:.1f} | "
                     f"{b['loadavg_before'][0]:.2f} -> {b['loadavg_after'][0]:.2f} |")
    return "\n".join(lines)


def run(args) -> tuple[dict, str]:
    """``scalegnn bench threads`` with its parsed ``args``."""
    return thread_bench(args.dataset, args.data_root, args.epochs, args.batch_ratio, args.layers, args.hidden,
                        args.runs, args.load, tuple(p for p in args.policies.split(",") if p), args.reps)
