"""The registry of systems is the only place a system is declared: a toy system
registered here, and nowhere else, shows up in ``scalegnn train`` (its own flags
under ``--system toy --help`` only), trains through the shared epoch loop, expands in
a sweep spec, and appears in the tables, the figures and the report."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout
from dataclasses import dataclass

import pytest
import torch

from scalegnn import systems as registry
from scalegnn.baselines.common import DataParallelTrainer, baseline_data
from scalegnn.cli import main as cli
from scalegnn.loop import EpochStats
from scalegnn.optim import OptimConfig
from scalegnn.settings import setting


# ----------------------------------------------------------------------------- the toy
@dataclass(kw_only=True)
class ToyOptions:
    """The toy's own settings: they become its flags under ``--system toy``."""

    smoothing: int = setting(1, help="times the features are averaged over neighbours before the linear model")


class ToyTrainer(DataParallelTrainer):
    """A linear model on neighbour-averaged features, one full-batch step per epoch."""

    def __init__(self, cfg, data, env):
        super().__init__(data, env)
        graph = data.graph
        adj, degree = graph.to_torch_csr(), graph.degrees().clamp(min=1).unsqueeze(1).float()
        x = graph.x.float()
        for _ in range(cfg.options.smoothing):
            x = (adj @ x) / degree
        self.graph, self.x = graph, x
        torch.manual_seed(cfg.seed)
        self.model = torch.nn.Linear(x.shape[1], graph.num_classes)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=cfg.optim.lr)
        self.batch_size = graph.train_idx.numel()
        self.steps_per_epoch = 1

    def train_epoch(self, epoch: int) -> EpochStats:
        idx = self.graph.train_idx
        logits = self.model(self.x[idx])
        loss = torch.nn.functional.cross_entropy(logits, self.graph.y[idx])
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        stats = EpochStats(components={"forward_backward": 0.0})
        stats.add_batch(float(loss.detach()), logits.detach(), self.graph.y[idx])
        return stats

    @torch.no_grad()
    def evaluate(self):
        pred = self.model(self.x).argmax(-1)
        return tuple(float((pred[i] == self.graph.y[i]).float().mean())
                     for i in (self.graph.train_idx, self.graph.val_idx, self.graph.test_idx))


def make_trainer(cfg, graph, env):
    return ToyTrainer(cfg, baseline_data(cfg, graph), env)


@pytest.fixture
def toy():
    """The toy in the registry for one test (after ScaleGNN: tables list it last)."""
    entry = registry.register(registry.System(
        name="toy", display="Toy model", color="#000000", marker="x",
        trainer="tests.baselines.test_systems:make_trainer", options="tests.baselines.test_systems:ToyOptions",
        sweep_defaults=(("system", "toy"),)))
    yield entry
    registry.unregister("toy")


def _help(argv) -> str:
    out = io.StringIO()
    with redirect_stdout(out), pytest.raises(SystemExit) as stop:
        cli(argv)
    assert stop.value.code == 0
    return out.getvalue()


DATASET = "csbm:n=400,avg_degree=8,classes=3,feature_dim=8,homophily=0.9,signal=2.0"


def _train_toy(out, seed=0) -> dict:
    assert cli(["train", "--system", "toy", "--dataset", DATASET, "--epochs", "4", "--lr", "0.05", "--target-acc", "0.5", "--smoothing",
                "2", "--seed", str(seed), "--out", str(out), "--log-level", "warning"]) == 0
    (path,) = [p for p in out.glob("*.json") if json.loads(p.read_text())["seed"] == seed]
    return json.loads(path.read_text())


# ----------------------------------------------------------------------------- the checks
def test_the_toy_has_its_flags_under_its_name_only(toy):
    assert "toy" in _help(["train", "--help"])  # a --system choice
    assert "--smoothing" not in _help(["train", "--help"])
    own = _help(["train", "--system", "toy", "--help"])
    assert "--smoothing" in own and "Toy model settings (--system toy)" in own
    assert "--smoothing" not in _help(["train", "--system", "graphsage", "--help"])


def test_the_toy_trains_through_the_shared_loop(toy, tmp_path):
    rec = _train_toy(tmp_path)
    assert rec["status"] == "ok" and rec["system"] == "toy"
    assert rec["config"]["options"] == {"smoothing": 2}
    assert [e["epoch"] for e in rec["epochs"]] == [1, 2, 3, 4]
    assert rec["epochs"][-1]["test_acc"] > 0.6  # three classes: a linear model on smoothed CSBM features learns


def test_a_sweep_spec_expands_and_launches_the_toy(toy, tmp_path):
    from scalegnn.sweeps.launcher import sweep

    spec = tmp_path / "toy.toml"
    spec.write_text(f"""
name = "toy"
title = "a toy sweep"
paper = "none"
figure = "table1"
systems = ["scalegnn", "toy"]
seeds = [0]
[train]
epochs = 2
lr = 0.02
[[experiments]]
cluster = "local"
dataset = "{DATASET}"
gpus = [1]
systems = ["scalegnn"]
[[experiments]]
cluster = "local"
dataset = "{DATASET}"
gpus = [1]
systems = ["toy"]
train = {{ smoothing = 3 }}
""")
    lines: list[str] = []
    result = sweep(str(spec), "local", tmp_path / "out", dry_run=True, printer=lines.append)
    assert sorted(r.system for r in result.todo) == ["scalegnn", "toy"]
    toy_cmd = next(line for line in lines if "--system toy" in line)
    assert "--smoothing 3" in toy_cmd and "--epochs 2" in toy_cmd
    assert "--lr" not in toy_cmd  # a compared system keeps its own hyper-parameters (sweep_options "loop")
    (run,) = [r for r in result.todo if r.system == "toy"]
    cfg = run.config(str(tmp_path / "folder"))
    assert (cfg.options.smoothing, cfg.loop.epochs, cfg.optim.lr) == (3, 2, OptimConfig().lr)
    (ours,) = [r for r in result.todo if r.system == "scalegnn"]
    assert ours.config(str(tmp_path / "ours")).optim.lr == 0.02


def test_the_toy_is_in_the_tables_figures_and_report(toy, tmp_path):
    from scalegnn.analysis import figures
    from scalegnn.analysis.load import load_runs
    from scalegnn.analysis.report import write_report
    from scalegnn.analysis.tables import table1_accuracy

    results = tmp_path / "results"
    for seed in (0, 1):
        _train_toy(results, seed)
    assert cli(["train", "--dataset", DATASET, "--epochs", "2", "--batch-ratio", "0.5", "--target-acc", "0.5",
                "--out", str(results), "--log-level", "warning"]) == 0
    table = table1_accuracy(load_runs(results), paper={})
    assert list(table["system"]) == ["scalegnn", "toy"]  # registration order
    assert table.set_index("system").loc["toy", "runs"] == 2
    legend = figures.fig6_time_to_target(load_runs(results)).legends[0]
    assert "Toy model" in [t.get_text() for t in legend.get_texts()]
    report = write_report(results, tmp_path / "report").read_text()
    table1 = report.split("## Table I")[1].split("\n## ")[0]
    assert "| toy |" in table1 and table1.index("| scalegnn |") < table1.index("| toy |")
