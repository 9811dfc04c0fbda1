"""The convergence harness (benchmarks/convergence.py, issue V): each variant is a real
run stopped at its target, the table row's command is the run's own settings, and a
variant name that does not exist is refused before any run."""

from __future__ import annotations

import json

import pytest

from scalegnn.benchmarks import convergence as C
from scalegnn.cli import main as cli_main


def test_a_variant_runs_to_its_target_and_its_command_reproduces_it(tmp_path, capsys):
    settings = {**C.BASE, "hidden": 16, "lr": 0.01, "norm": False}
    got = C.run_variant(C.recipe(600), settings, 0.3, 4, 1, tmp_path)
    curve = got["test_acc"]
    assert got["status"] == "ok" and 1 <= len(curve) <= 4
    if got["epochs_to_target"] is not None:  # stopped at the first epoch at the target
        assert len(curve) == got["epochs_to_target"] and curve[-1] >= 0.3 > max([0.0] + curve[:-1])
        assert got["steps_to_target"] == got["epochs_to_target"] * got["steps_per_epoch"]
    else:
        assert len(curve) == 4 and max(curve) < 0.3
    line = C.command(C.recipe(600), settings, 0.3, 4, 1)
    assert "--no-norm" in line and "--hidden 16" in line and "--lr 0.01" in line
    argv = line.split()[1:] + ["--data-root", str(tmp_path / "data"), "--out", str(tmp_path / "cli"), "--quiet"]
    assert cli_main(argv) == 0  # the command is a valid train line; same seed, same curve
    record = capsys.readouterr().out.strip().splitlines()[-1].split("record: ")[1]
    assert [r["test_acc"] for r in json.loads(open(record).read())["epochs"]] == curve


def test_a_full_budget_run_trains_past_its_target_and_reports_model_selection(tmp_path):
    settings = {**C.BASE, "hidden": 16, "lr": 0.01}
    got = C.run_variant(C.recipe(600), settings, 0.2, 4, 0, tmp_path, stop=False, eval_every=2)
    assert got["status"] == "ok" and len(got["test_acc"]) == 4 and got["test_acc"][0] is None  # epochs 1, 3 unevaluated
    assert got["epochs_to_target"] in (2, 4, None) and got["test_acc_at_best_val"] in got["test_acc"]
    assert got["final_test_acc"] == got["test_acc"][-1]
    line = C.command(C.recipe(600), settings, 0.2, 4, 0, stop=False, eval_every=2)
    assert "--stop-at-target" not in line and line.endswith("--eval-every 2")


def test_eval_every_without_full_budget_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        C.main(["--eval-every", "2", "--out", str(tmp_path)])
    assert "--eval-every needs --full-budget" in capsys.readouterr().err


def test_an_unknown_variant_is_refused_before_any_run(tmp_path, capsys):
    with pytest.raises(SystemExit):
        C.main(["--only", "no such variant", "--out", str(tmp_path)])
    assert "no variant 'no such variant'" in capsys.readouterr().err
    assert not (tmp_path / "convergence.json").exists()

