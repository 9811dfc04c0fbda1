"""The harness subcommands of ``scalegnn``: ``sweep``, ``report``, ``plan`` and ``tune``.

    scalegnn sweep SPEC --cluster NAME [--dry-run] [--out DIR]   expand, skip done runs, submit
    scalegnn report RESULTS_DIR --out DIR                        figures, tables, provenance, failures
    scalegnn plan --dataset NAME --gpus G --cluster NAME         rank the grid shapes by predicted epoch time
                  [--cagnet]                                   and CAGNET's configurations of G ranks
                  [--grid GdxGxxGyxGz]                         one grid: time and memory, term by term
                  [--recommend]                                the grids that fit, ranked, and why the first wins
    scalegnn plan --paper                                      the model against every Fig. 5/7/8 number of the paper
    scalegnn tune --system NAME --dataset D --target VAL_ACC   one tuning budget for every system (sweeps/tune.py)
                  [--epochs E] [--budget 12] [--space FLAG=V1,V2] [-- TRAIN FLAGS]

``scalegnn.cli`` registers them with :func:`add_commands` and dispatches to :func:`run`.
"""

from __future__ import annotations

import argparse
import math

__all__ = ["COMMANDS", "add_commands", "run", "run_sweep"]

COMMANDS = ("sweep", "report", "plan", "tune")


def _threads(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0 (0: each run's --threads, auto by default), "
                                         f"got {text!r}")
    return int(text)


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.replace(" ", "").split(",") if v]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, e.g. 1,2,4; got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected an accuracy in (0, 1], got {text!r}")
    return value


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return int(text)


def add_commands(sub) -> None:
    from scalegnn import systems as registry

    from .profiles import list_profiles
    from .spec import list_specs

    s = sub.add_parser("sweep", help="run a paper figure's sweep on a cluster (submitit: SLURM arrays or local)",
                       description="Expand a sweep spec (sweeps/specs/*.toml) for a cluster profile "
                       "(sweeps/profiles/*.toml), skip runs that already have an ok record, and submit the rest "
                       "through submitit as job arrays (one task per rank). --cluster local runs them here.")
    s.add_argument("spec", help=f"spec name or .toml path; known: {', '.join(list_specs())}")
    s.add_argument("--cluster", required=True, help=f"profile name or .toml path; known: {', '.join(list_profiles())}")
    s.add_argument("--dry-run", action="store_true", help="print the batch scripts (or local commands); submit nothing")
    s.add_argument("--out", default=None, help="output folder (default <the profile's out_root>/<spec>-<cluster>: "
                   "scratch on the clusters, results/sweeps here)")
    s.add_argument("--gpus", type=_ints, default=None,
                   help="replace the spec's GPU counts (stand-in runs, e.g. on a cluster the spec does not list)")
    s.add_argument("--dataset", action="append", default=None,
                   help="replace the spec's datasets (repeatable; names may contain commas)")
    s.add_argument("--epochs", type=int, default=None, help="override the epochs of every run")
    s.add_argument("--seeds", type=_ints, default=None, help="override the seeds, e.g. 0,1,2")
    s.add_argument("--systems", default=None, help="only these systems (comma-separated)")
    s.add_argument("--account", default=None, help="SLURM account / Flux bank (replaces the profile's placeholder)")
    s.add_argument("--staging-account", default=None,
                   help="SLURM account / Flux bank of the staging jobs (CPU work), where CPU hours have an account of "
                   "their own (Perlmutter: --account m1234_g --staging-account m1234); default: the profile's "
                   "[staging] account, else --account")
    s.add_argument("--qos", default=None, help="SLURM QOS")
    s.add_argument("--partition", default=None, help="SLURM partition / Flux queue")
    s.add_argument("--constraint", default=None, help="SLURM constraint")
    s.add_argument("--time", type=int, default=None, dest="time_min", help="minutes per job")
    s.add_argument("--threads-per-task", type=_threads, default=None,
                   help="intra-op threads of each task, given to every run as --threads N (default: the profile's; "
                   "0: the run's own --threads, auto: the cores free on the node shared by its tasks)")
    s.add_argument("--python", default=None, help="interpreter in the batch script (default: the profile's, on the "
                   "clusters \"${SCALEGNN_VENV}/bin/python\"; else this one)")
    s.add_argument("--data-root", default=None,
                   help="dataset folder every task reads (default $SCALEGNN_DATA_ROOT, else the profile's data_root: "
                   "scratch on the clusters, else ~/.cache/scalegnn/data); fixed at submission")
    s.add_argument("--no-stage", dest="stage", action="store_false",
                   help="do not shard the data once before the runs: every rank loads the whole graph")

    r = sub.add_parser("report", help="figures (PNG, PDF) and a Markdown report from a results folder")
    r.add_argument("results_dir", help="folder of run records (searched recursively), e.g. results/sweeps")
    r.add_argument("--out", default=None, help="output folder (default RESULTS_DIR/report)")
    r.add_argument("--data-root", default=None, help="dataset folder, for the load-balance table")
    r.add_argument("--title", default=None)

    p = sub.add_parser("plan", help="rank 4D grid shapes by the performance model's predicted epoch time",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--dataset", default=None, help="a paper dataset (statistics built in) or any loadable name")
    p.add_argument("--gpus", type=int, default=None, help="total GPUs (ranks) G = Gd*Gx*Gy*Gz (default: --grid's)")
    p.add_argument("--cluster", default=None, help="profile: bandwidths, GPUs per node, device memory")
    p.add_argument("--grid", default=None, metavar="GdxGxxGyxGz", help="evaluate this one grid, term by term")
    p.add_argument("--recommend", action="store_true",
                   help="rank only the grids that fit in device memory and say why the first wins")
    p.add_argument("--paper", action="store_true",
                   help="the model against every Fig. 5/7/8 number of the paper (other options ignored)")
    p.add_argument("--prefetch", action="store_true", help="model --prefetch (sampling overlaps training)")
    p.add_argument("--compile", action="store_true", help="model --compile (fused element-wise kernels)")
    p.add_argument("--comm-overlap", action="store_true", help="model --comm-overlap")
    p.add_argument("--gd", type=int, default=None, help="fix the data-parallel size Gd (default: all)")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=3)
    batch = p.add_mutually_exclusive_group()
    batch.add_argument("--batch-ratio", type=float, default=0.1, help="B / N (1.0: full graph)")
    batch.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--comm-dtype", choices=("fp32", "bf16"), default="fp32", help="3D-PMM all-reduce precision")
    p.add_argument("--fit", default=None, metavar="RESULTS_DIR",
                   help="fit the model's coefficients on the runs recorded on this cluster under RESULTS_DIR")
    p.add_argument("--top", type=int, default=12, help="rows to show")
    p.add_argument("--cagnet", action="store_true",
                   help="also predict CAGNET's full-graph epoch (1D, 1.5D for each c, 2D for each grid) on G ranks")
    p.add_argument("--data-root", default=None)

    t = sub.add_parser("tune", help="tune a system under the same budget as every other: lr x dropout x its main "
                       "knob, chosen by validation time to a target",
                       description="Train every configuration of a system's search space (at most --budget) for "
                       "--epochs, evaluated each epoch, and choose the one that reaches --target validation "
                       "accuracy in the least training time (else the best validation accuracy). Flags after `--` "
                       "go to every trial's `scalegnn train`. The search is recorded in OUT/tune.json; the same "
                       "command resumes it.")
    t.add_argument("--system", default="scalegnn", choices=registry.names())
    t.add_argument("--dataset", required=True)
    t.add_argument("--target", type=_fraction, required=True, help="validation accuracy to reach")
    t.add_argument("--epochs", type=_positive, default=10, help="epochs of every trial")
    t.add_argument("--budget", type=_positive, default=12, help="the most configurations a search may train")
    t.add_argument("--space", action="append", default=[], metavar="FLAG=V1,V2",
                   help="replace (or add) one axis of the system's space, e.g. lr=0.01,0.001 or "
                   "fanouts=15,10,5;5,5,5 (repeatable)")
    t.add_argument("--seed", type=int, default=0, help="every trial's seed")
    t.add_argument("--out", default=None, help="folder of the search (default results/tune/SYSTEM-DATASET)")
    t.add_argument("train_flags", nargs=argparse.REMAINDER, help="after `--`: flags for every trial")


def run(args) -> int:
    if args.command == "sweep":
        return _sweep(args)
    if args.command == "report":
        from pathlib import Path

        from scalegnn.analysis.report import write_report

        from scalegnn.analysis.paper_model import MACHINES
        from scalegnn.perfmodel import Machine

        from .profiles import load_profile

        from scalegnn.fileio import check_output_folder

        out = args.out or str(Path(args.results_dir) / "report")
        check_output_folder(out, "--out")  # before any work: a file in the way, a folder that cannot be written
        machines = {c: Machine.from_profile(load_profile(c)) for c in MACHINES}
        path = write_report(args.results_dir, out, data_root=args.data_root, title=args.title,
                            paper_machines=machines)
        print(f"report: {path}")
        return 0
    if args.command == "plan":
        return _plan(args)
    if args.command == "tune":
        return _tune(args)
    raise ValueError(f"unknown harness command {args.command}")


def _tune(args) -> int:
    import re
    from pathlib import Path

    from .tune import TuneSpec, space_for, tune

    flags = args.train_flags[1:] if args.train_flags[:1] == ["--"] else args.train_flags
    taken = sorted({f.split("=")[0] for f in flags} & {"--system", "--dataset", "--epochs", "--seed", "--out",
                                                       "--eval-every"})
    if taken:
        raise ValueError(f"{taken[0]} is set by scalegnn tune itself: give it to tune (or drop it) instead of after --")
    spec = TuneSpec(system=args.system, dataset=args.dataset, target=args.target, epochs=args.epochs,
                    budget=args.budget, space=space_for(args.system, args.space), seed=args.seed,
                    train_flags=tuple(flags))
    out = Path(args.out or Path("results/tune") / f"{args.system}-{re.sub(r'[^A-Za-z0-9_.-]+', '_', args.dataset)}")
    doc = tune(spec, out)
    print(f"tuning record: {out / 'tune.json'}")
    return 0 if doc["chosen"] is not None else 1


def run_sweep(args, printer=print):
    """``scalegnn sweep`` with the parsed ``args``: the sweep's outcome; what it says goes to ``printer``."""
    from .launcher import sweep

    overrides = {k: getattr(args, k) for k in ("account", "staging_account", "qos", "partition", "constraint",
                                               "time_min", "threads_per_task")}
    systems = [s for s in args.systems.split(",") if s] if args.systems else None
    return sweep(args.spec, args.cluster, args.out, dry_run=args.dry_run, gpus=args.gpus, datasets=args.dataset,
                 epochs=args.epochs, seeds=args.seeds, systems=systems, overrides=overrides, python=args.python,
                 data_root=args.data_root, stage=args.stage, printer=printer)


def _sweep(args) -> int:
    result = run_sweep(args)
    if not args.dry_run:
        print(f"records: {result.out / 'runs'}; report: scalegnn report {result.out} --out {result.out / 'report'}")
    return 1 if result.failed else 0


def _check_plan_flags(args) -> tuple[int, int, int, int] | None:
    """``plan``'s numbers, refused before any work in one line naming the flag, the value
    and the range: by the checks ``scalegnn train`` runs on the same settings (the run
    configuration's sections) where there are some; returns ``--grid`` parsed."""
    from scalegnn.perfmodel import check_ranks
    from scalegnn.sections.model import ModelConfig
    from scalegnn.sections.parallel import grid_flag
    from scalegnn.settings import fraction

    grid = grid_flag(args.grid) if args.grid else None
    ranks = grid[0] * grid[1] * grid[2] * grid[3] if grid else None
    if args.gpus is None:
        args.gpus = ranks
    missing = [f"--{n}" for n in ("dataset", "gpus", "cluster") if getattr(args, n) is None]
    if missing:
        raise ValueError(f"plan needs {', '.join(missing)} (or --grid for --gpus; or --paper alone)")
    check_ranks(args.gpus, "--gpus") if ranks is None or ranks != args.gpus else \
        check_ranks(ranks, f"--grid {args.grid}: its rank count")
    if ranks is not None and ranks != args.gpus:
        raise ValueError(f"--grid {args.grid} has {ranks} ranks, --gpus says {args.gpus}; drop --gpus or make them "
                         "agree")
    if args.gd is not None and (args.gd < 1 or args.gpus % args.gd):
        raise ValueError(f"--gd {args.gd}: the data-parallel size is a divisor of --gpus {args.gpus} "
                         "(G = Gd*Gx*Gy*Gz)")
    for flag, name in (("--hidden", "hidden"), ("--layers", "layers")):
        try:
            ModelConfig(**{name: getattr(args, name)})
        except ValueError as exc:
            raise ValueError(f"{flag} {getattr(args, name)}: {exc}") from None
    if args.batch_size is None:
        try:
            fraction(args.batch_ratio)
        except ValueError as exc:
            raise ValueError(f"--batch-ratio {args.batch_ratio}: {exc}") from None
    if args.top < 1:
        raise ValueError(f"--top {args.top}: the rows to show are a whole number >= 1")
    return grid


def _check_batch_size(args, num_nodes: int) -> None:
    """``--batch-size`` against the graph's N, by ``scalegnn train``'s rule (2 <= B <= N)."""
    from scalegnn.sampling import resolve_batch_size

    if args.batch_size is not None:
        try:
            resolve_batch_size(num_nodes, batch_size=args.batch_size)
        except ValueError as exc:
            raise ValueError(f"--batch-size {args.batch_size} on {args.dataset}: {exc}") from None


def _fit(folder: str, cluster: str, machine):
    """The coefficients ``--fit FOLDER`` fits; files there that are not run records are named
    in the error when no run is left to fit on (their warnings would be lines of their own)."""
    import warnings

    from scalegnn.analysis import load_runs
    from scalegnn.analysis.perfmodel import fit_from_runs

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        runs = load_runs(folder)
    skipped = runs.attrs.get("skipped", [])
    try:
        return fit_from_runs(runs, cluster, machine)
    except ValueError as exc:
        unread = f"; {len(skipped)} file(s) there are not run records (first: {skipped[0][1]})" if skipped else ""
        raise ValueError(f"--fit {folder}: {exc}{unread}") from None


def _plan_paper() -> int:
    from scalegnn.analysis.paper_model import (MACHINES, format_recommendations, format_table, paper_recommendations,
                                               paper_table)
    from scalegnn.perfmodel import Machine

    from .profiles import load_profile

    ms = {c: Machine.from_profile(load_profile(c)) for c in MACHINES}
    rows, net = paper_table(ms)
    print(format_recommendations(paper_recommendations(ms["perlmutter"], net["perlmutter"]), "perlmutter"))
    print()
    print(format_table(rows, net, ms["frontier"]))
    return 0


def _explain(first, second, machine) -> str:
    """Why ``first`` beats ``second``: the term that differs most, and where their axes sit."""
    from scalegnn.perfmodel import axis_bandwidth

    diffs = {k: second.parts[k] - first.parts[k] for k in first.parts}
    term = max(diffs, key=diffs.get)
    inside = [a for a, n in zip(("x", "y", "z"), first.grid[1:]) if n > 1 and axis_bandwidth(first.grid, a, machine)[1]]
    where = f"{', '.join(inside)} inside a node" if inside else "no 3D-PMM axis inside a node"
    return (f"{first.grid_str} wins over {second.grid_str} by {1e3 * (second.epoch_s - first.epoch_s):.1f} ms per "
            f"epoch, most of it {term} ({1e3 * diffs[term]:+.1f} ms); {where}; {first.steps} steps per epoch")


def _plan(args) -> int:
    from scalegnn.perfmodel import Coefficients, Machine, Workload, memory_breakdown, predict, rank_grids

    from .profiles import load_profile

    if args.paper:
        return _plan_paper()
    grid = _check_plan_flags(args)
    profile = load_profile(args.cluster)
    machine = Machine.from_profile(profile)
    w = Workload.for_dataset(args.dataset, hidden=args.hidden, layers=args.layers,
                             batch_ratio=None if args.batch_size else args.batch_ratio, batch_size=args.batch_size,
                             data_root=args.data_root, pmm_bytes=2 if args.comm_dtype == "bf16" else 4,
                             prefetch=args.prefetch, fused=args.compile, comm_overlap=args.comm_overlap)
    _check_batch_size(args, w.num_nodes)
    coef, source = Coefficients(), f"the {profile.name} profile's constants (not fitted)"
    if args.fit:
        coef = _fit(args.fit, profile.name, machine)
        source = f"fitted on {coef.fitted_on} runs recorded on {profile.name} in {args.fit}"
    preds = [predict(w, grid, machine, coef)] if grid else rank_grids(w, args.gpus, machine, coef, gd=args.gd)
    if args.recommend:
        preds = [p for p in preds if p.fits]
    print(f"{args.dataset}: N={w.num_nodes:,}, nnz={w.nnz:,}, F={w.num_features}, C={w.num_classes}, "
          f"H={w.hidden}, L={w.layers}, B={w.batch:,}; {args.gpus} ranks on {profile.name} "
          f"({profile.gpus_per_node} per node)")
    print(f"coefficients: {source}")
    head = f"{'rank':>4}  {'grid GdxGxxGyxGz':<17} {'epoch ms':>10} {'comm ms':>9} {'compute ms':>10} " \
           f"{'sampling ms':>11} {'other ms':>9} {'steps':>6} {'GiB/rank':>9}"
    print(head)
    for i, p in enumerate(preds[:args.top], 1):
        flag = "" if p.fits else "  (exceeds device memory)"
        print(f"{i:>4}  {p.grid_str:<17} {1e3 * p.epoch_s:>10.1f} {1e3 * p.comm_s:>9.1f} "
              f"{1e3 * p.parts['compute']:>10.1f} {1e3 * p.parts['sampling']:>11.1f} "
              f"{1e3 * p.parts['overhead']:>9.1f} {p.steps:>6} {p.memory_bytes / 2**30:>9.2f}{flag}")
    if len(preds) > args.top:
        print(f"... {len(preds) - args.top} more shapes (--top to show them)")
    if grid is not None:
        p = preds[0]
        print("per epoch: " + ", ".join(f"{k} {1e3 * v:.1f} ms" for k, v in p.parts.items()))
        mem = memory_breakdown(w, grid)
        print("memory per rank: " + ", ".join(f"{k} {v / 2**30:.2f} GiB" for k, v in mem.items())
              + f" (device {machine.memory_bytes / 2**30:.0f} GiB: {'fits' if p.fits else 'does not fit'})")
    if args.recommend:
        if not preds:
            print("no grid fits in device memory")
        elif len(preds) == 1:
            print(f"recommended: {preds[0].grid_str} (the only grid that fits)")
        else:
            print(f"recommended: {preds[0].grid_str}: {_explain(preds[0], preds[1], machine)}")
    if args.cagnet:
        _plan_cagnet(args, machine)
    return 0


def _plan_cagnet(args, machine) -> None:
    """CAGNET's predicted epoch (one full-graph step) for every configuration of G ranks,
    with the profile's constants (:mod:`scalegnn.baselines.cagnet_perf`)."""
    from scalegnn.baselines import cagnet_perf
    from scalegnn.baselines.cagnet_ops import process_grid_shape
    from scalegnn.perfmodel import Workload

    w = Workload.for_dataset(args.dataset, hidden=args.hidden, layers=args.layers, batch_ratio=1.0,
                             data_root=args.data_root)
    print(f"CAGNET, full graph (one step per epoch), {args.gpus} ranks:")
    print(f"{'system':<12} {'grid RxC':>9} {'epoch ms':>10} {'comm ms':>9} {'compute ms':>10} {'MiB/step':>9}")
    for name, kw in cagnet_perf.configurations(args.gpus):
        algorithm = name.split("-", 1)[1]
        R, C = process_grid_shape(algorithm, args.gpus, kw.get("c", 1), kw.get("grid2d"))
        t = cagnet_perf.step_times(algorithm, w, args.gpus, machine, **kw)
        mib = sum(cagnet_perf.predicted_bytes_per_step(algorithm, w, args.gpus, **kw).values()) / 2**20
        print(f"{name:<12} {f'{R}x{C}':>9} {1e3 * sum(t.values()):>10.1f} {1e3 * (t['bandwidth'] + t['latency']):>9.1f} "
              f"{1e3 * t['compute']:>10.1f} {mib:>9.1f}")
