"""``scalegnn tune``: the same tuning budget for every system, chosen by validation time to a target.

    scalegnn tune --system NAME --dataset D --target VAL_ACC [--epochs E] [--budget 12]
                  [--space FLAG=V1,V2,...] [--seed S] [--out DIR] [-- TRAIN FLAGS...]

A comparison of time to accuracy is fair only if every system had the same chance to
find its settings (issue V): here each system gets a search space of at most
``--budget`` configurations, its learning rate x dropout x its own main knob (ScaleGNN's
batch ratio, the neighbor samplers' fan-outs, GraphSAINT's node budget, BNS-GCN's
boundary rate; :data:`SPACES`), every configuration trained for the same ``--epochs``
with a full evaluation after each epoch. The choice reads validation accuracy only (the
test split stays unseen): the configuration that first reaches ``--target`` validation
accuracy in the least training time (the records' cumulative ``train_time_s``,
evaluation excluded); among those that never reach it, the highest validation
accuracy. Each trial is an ordinary run with its own record; the search (space, budget,
every trial with its record and scores, the choice and its ``scalegnn train`` line) is
written to ``DIR/tune.json`` after every trial, atomically, so an interrupted search
keeps what it ran and the same command resumes it (trials already recorded ok are not
run again).

Times are wall times: run a search on an otherwise idle machine, as any timing.
"""

from __future__ import annotations

import itertools
import json
import math
import shlex
from dataclasses import dataclass
from pathlib import Path

__all__ = ["SPACES", "LR_DROPOUT", "TuneSpec", "space_for", "trial_flags", "score", "choose", "tune"]

# Learning rate x dropout, as every system's first two axes (3 x 2 = 6 configurations).
LR_DROPOUT = {"--lr": ("0.01", "0.003", "0.001"), "--dropout": ("0.5", "0.3")}
# Each system's own main knob (2 values): with LR_DROPOUT, 12 configurations. A system
# without one gets a wider learning-rate and dropout grid of the same size instead.
_KNOBS = {
    "scalegnn": {"--batch-ratio": ("0.1", "0.25")},
    "graphsage": {"--fanouts": ("15,10,5", "5,5,5")},
    "salient": {"--fanouts": ("15,10,5", "5,5,5")},
    "fastsample": {"--fanouts": ("15,10,5", "5,5,5")},
    "distdgl": {"--fanouts": ("10,25", "5,10")},  # its own default and a cheaper pair (DistDGL trains 2 layers)
    "graphsaint": {"--node-budget": ("2000", "8000")},
    "bns-gcn": {"--boundary-rate": ("0.1", "0.5")},
}
_NO_KNOB = {"--lr": ("0.03", "0.01", "0.003", "0.001"), "--dropout": ("0.5", "0.3", "0.1")}
# ScaleGNN's model trains with AdamW at lower rates than the baselines' Adam: its grid is
# shifted one step down (0.01 diverged on the products-shaped graph, results/bench/convergence).
_LR = {"scalegnn": ("0.003", "0.001", "0.0003")}


def _spaces() -> dict[str, dict[str, tuple[str, ...]]]:
    from scalegnn import systems as registry

    spaces = {}
    for name in registry.names():
        if name in _KNOBS:
            spaces[name] = {"--lr": _LR.get(name, LR_DROPOUT["--lr"]), "--dropout": LR_DROPOUT["--dropout"],
                            **_KNOBS[name]}
        else:
            spaces[name] = dict(_NO_KNOB)
    return spaces


SPACES = _spaces()


@dataclass(frozen=True)
class TuneSpec:
    """One search: the system, the dataset, the budget and the common train flags."""
    system: str
    dataset: str
    target: float
    epochs: int
    budget: int
    space: dict[str, tuple[str, ...]]
    seed: int = 0
    train_flags: tuple[str, ...] = ()  # given to every trial (e.g. --hidden 128 --data-root DIR)

    def to_dict(self) -> dict:
        return {"system": self.system, "dataset": self.dataset, "target": self.target, "epochs": self.epochs,
                "budget": self.budget, "space": {k: list(v) for k, v in self.space.items()}, "seed": self.seed,
                "train_flags": list(self.train_flags)}


def space_for(system: str, overrides: list[str] = ()) -> dict[str, tuple[str, ...]]:
    """``system``'s default space with ``FLAG=V1,V2`` overrides (the flag's whole list of
    values replaced, or a new flag added; its leading ``--`` may be left out). Fan-outs
    contain commas: their values are separated with ``;`` (``fanouts=15,10,5;5,5,5``)."""
    from scalegnn.config import train_flags

    space = dict(SPACES[system])
    known: set[str] = set()
    for text in overrides:
        flag, sep, values = text.partition("=")
        if not sep or not flag.strip("-") or not values:
            raise ValueError(f"--space takes FLAG=V1,V2,... (e.g. --space lr=0.01,0.001), got {text!r}")
        flag = "--" + flag.strip("-")
        if flag not in (known := known or train_flags(system)):
            import difflib

            close = difflib.get_close_matches(flag, sorted(known), n=1, cutoff=0.75)
            hint = f"did you mean {close[0]}? " if close else ""
            raise ValueError(f"--space {text}: {flag} is not a flag of `scalegnn train --system {system}`; {hint}"
                             f"(`scalegnn train --system {system} --help-all` lists them)")
        split = ";" if ";" in values or flag == "--fanouts" else ","
        space[flag] = tuple(v.strip() for v in values.split(split) if v.strip())
    return space


def trial_flags(space: dict[str, tuple[str, ...]]) -> list[dict[str, str]]:
    """Every configuration of ``space``, in a fixed order (the product of its axes)."""
    flags = list(space)
    return [dict(zip(flags, values)) for values in itertools.product(*(space[f] for f in flags))]


def _argv(spec: TuneSpec, flags: dict[str, str], out: Path | None) -> list[str]:
    argv = ["--system", spec.system, "--dataset", spec.dataset, "--epochs", str(spec.epochs), "--seed",
            str(spec.seed), "--eval-every", "1", *spec.train_flags]
    for flag, value in flags.items():
        argv += [flag, value]
    return argv + (["--out", str(out), "--quiet"] if out is not None else [])


def score(record: dict, target: float) -> dict:
    """A trial's scores from its record, validation only: the epoch and cumulative training
    time at which validation accuracy first reached ``target`` (None if it did not), the
    best validation accuracy, and, reported but never used to choose, the test accuracy
    at the best validation epoch."""
    rows = record.get("epochs") or []
    first = next((r for r in rows if r.get("val_acc") is not None and r["val_acc"] >= target), None)
    summary = record.get("summary") or {}
    return {"status": record["status"], "run_id": record["run_id"], "record": record.get("path"),
            "epochs_to_target": first["epoch"] if first else None,
            "time_to_target_s": first["train_time_s"] if first else None,
            "best_val_acc": summary.get("best_val_acc"), "test_acc_at_best_val": summary.get("test_acc_at_best_val"),
            "epoch_time_s": rows[-1]["train_time_s"] / len(rows) if rows else None}


def _rank_key(trial: dict) -> tuple[int, float]:
    """Reached the target first (by its time), then the rest by best validation accuracy."""
    if trial["time_to_target_s"] is not None:
        return (0, trial["time_to_target_s"])
    best = trial["best_val_acc"]
    return (1, -(best if best is not None and math.isfinite(best) else -1.0))


def choose(trials: list[dict]) -> dict | None:
    """The trial that reached the validation target in the least training time; else the
    best validation accuracy; None if no trial ran ok. Ties keep the earlier trial."""
    ranked = sorted((t for t in trials if t["status"] == "ok"), key=_rank_key)
    return ranked[0] if ranked else None


def _load(path: Path, spec: TuneSpec) -> list[dict]:
    """The trials of an earlier search with the same spec (resumed), else none."""
    if not path.exists():
        return []
    try:
        old = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise ValueError(f"{path} is not a tuning record ({type(exc).__name__}); remove it or choose another --out") \
            from None
    if not isinstance(old, dict) or not isinstance(old.get("trials", []), list):
        raise ValueError(f"{path} is not a tuning record (not an object with a trials list); remove it or choose "
                         "another --out")
    if old.get("spec") != spec.to_dict():
        raise ValueError(f"{path} holds another search ({old.get('spec')}); choose another --out to start this one")
    return [t for t in old.get("trials", []) if isinstance(t, dict) and t.get("status") == "ok"]


def _write(path: Path, spec: TuneSpec, trials: list[dict], done: bool) -> dict:
    from scalegnn.fileio import atomic_write

    chosen = choose(trials)
    doc = {"spec": spec.to_dict(), "complete": done, "trials": trials, "chosen": chosen,
           "command": ("scalegnn train " + shlex.join(_argv(spec, chosen["flags"], None) + ["--tuned-from", str(path)]))
           if chosen else None}
    text = json.dumps(doc, indent=1)
    atomic_write(path, lambda f: f.write(text), text=True)
    return doc


def tune(spec: TuneSpec, out: Path, log=print) -> dict:
    """Run the search into ``out`` (records under ``out/runs``, the search in
    ``out/tune.json``) and return the tuning record."""
    from scalegnn.config import parse_train_args
    from scalegnn.launch import launch

    configs = trial_flags(spec.space)
    if len(configs) > spec.budget:
        sizes = " x ".join(f"{len(v)} {k}" for k, v in spec.space.items())
        raise ValueError(f"the search space has {len(configs)} configurations ({sizes}) but the budget is "
                         f"{spec.budget}: drop values with --space or raise --budget")
    cfgs = [parse_train_args(_argv(spec, flags, out / "runs"))[0] for flags in configs]  # every flag checked first
    path = out / "tune.json"
    done = {json.dumps(t["flags"], sort_keys=True): t for t in _load(path, spec)}
    trials = []
    for i, (flags, cfg) in enumerate(zip(configs, cfgs)):
        key = json.dumps(flags, sort_keys=True)
        if key in done:
            trials.append(done[key])
            log(f"[{i + 1}/{len(configs)}] {_show(flags)}: recorded already ({done[key]['run_id']})")
            continue
        trial = {"flags": flags, **score(launch(cfg), spec.target)}
        trials.append(trial)
        _write(path, spec, trials, done=False)
        log(f"[{i + 1}/{len(configs)}] {_show(flags)}: {_describe(trial, spec.target)}")
    doc = _write(path, spec, trials, done=True)
    chosen = doc["chosen"]
    if chosen is None:
        log(f"no trial of {spec.system} ran ok; see the records under {out / 'runs'}")
    else:
        log(f"chosen for {spec.system} on {spec.dataset}: {_show(chosen['flags'])} "
            f"({_describe(chosen, spec.target)})\n{doc['command']}")
    return doc


def _show(flags: dict[str, str]) -> str:
    return " ".join(f"{k} {v}" for k, v in flags.items())


def _describe(trial: dict, target: float) -> str:
    if trial["status"] != "ok":
        return f"status {trial['status']}"
    best = trial["best_val_acc"]
    if trial["time_to_target_s"] is not None:
        return (f"val {target} at epoch {trial['epochs_to_target']} after {trial['time_to_target_s']:.2f} s "
                f"training (best val {best:.4f})")
    return f"val {target} not reached (best val {best:.4f})"
