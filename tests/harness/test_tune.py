"""``scalegnn tune`` (sweeps/tune.py, issue V): every system gets a search of the same
size, the choice reads validation only, the search is recorded after each trial and
resumed, and bad input is refused in one line before any trial."""

from __future__ import annotations

import json

import pytest

from scalegnn import systems as registry
from scalegnn.cli import main as cli_main
from scalegnn.config import parse_train_args
from scalegnn.sweeps import tune as T

TINY = ["--hidden", "16"]


def _record(val, test, status="ok", step_s=1.0):
    rows = [{"epoch": i + 1, "train_time_s": step_s * (i + 1), "val_acc": v, "test_acc": t}
            for i, (v, t) in enumerate(zip(val, test))]
    best = max(range(len(val)), key=lambda i: val[i]) if val else None
    return {"status": status, "run_id": f"r{len(val)}-{step_s}", "path": None, "epochs": rows,
            "summary": {"best_val_acc": val[best], "test_acc_at_best_val": test[best]} if val else None}


def test_every_system_gets_the_same_budget_of_real_flags():
    for system in registry.names(available=True):
        space = T.SPACES[system]
        configs = T.trial_flags(space)
        assert len(configs) == 12 and len({json.dumps(c, sort_keys=True) for c in configs}) == 12, system
        assert {"--lr", "--dropout"} <= set(space), system
        for flags in (configs[0], configs[-1]):  # each axis' values parse as that system's train flags
            argv = ["--system", system, "--dataset", "cora", *[x for kv in flags.items() for x in kv]]
            parse_train_args(argv)


def test_the_score_reads_validation_never_test():
    rec = _record(val=[0.5, 0.8, 0.95, 0.9], test=[0.95, 0.96, 0.5, 0.5])
    s = T.score(rec, 0.9)
    assert s["epochs_to_target"] == 3 and s["time_to_target_s"] == 3.0  # test reached 0.9 at epoch 1: ignored
    assert s["best_val_acc"] == 0.95 and s["test_acc_at_best_val"] == 0.5
    assert T.score(_record(val=[0.5, 0.6], test=[0.99, 0.99]), 0.9)["epochs_to_target"] is None


def test_the_choice_is_the_least_time_to_target_then_the_best_validation():
    fast = {"flags": {"--lr": "a"}, **T.score(_record([0.2, 0.91], [0, 0], step_s=1.0), 0.9)}
    slow_but_higher = {"flags": {"--lr": "b"}, **T.score(_record([0.2, 0.5, 0.99], [0, 0, 0], step_s=1.0), 0.9)}
    fewer_epochs_slower = {"flags": {"--lr": "c"}, **T.score(_record([0.95], [0], step_s=5.0), 0.9)}
    never = {"flags": {"--lr": "d"}, **T.score(_record([0.85, 0.89], [0, 0]), 0.9)}
    failed = {"flags": {"--lr": "e"}, **T.score(_record([0.99], [0], status="failed"), 0.9)}
    assert T.choose([never, slow_but_higher, fewer_epochs_slower, fast, failed])["flags"] == {"--lr": "a"}
    assert T.choose([never, failed])["flags"] == {"--lr": "d"}  # none reached: the best validation accuracy
    lower = {"flags": {"--lr": "f"}, **T.score(_record([0.5, 0.6], [0, 0]), 0.9)}
    assert T.choose([lower, never])["flags"] == {"--lr": "d"}
    assert T.choose([failed]) is None


def test_space_overrides():
    space = T.space_for("graphsage", ["lr=0.02,0.002", "--fanouts=10,5;4,4", "hidden=32"])
    assert space["--lr"] == ("0.02", "0.002") and space["--fanouts"] == ("10,5", "4,4")
    assert space["--hidden"] == ("32",) and space["--dropout"] == T.SPACES["graphsage"]["--dropout"]
    with pytest.raises(ValueError, match="--space takes FLAG=V1,V2"):
        T.space_for("scalegnn", ["lr"])


def _spec(tmp_path, **kw):
    space = T.space_for("scalegnn", ["lr=0.01", "dropout=0.5"])
    return T.TuneSpec(**{"system": "scalegnn", "dataset": "csbm:n=600", "target": 0.3, "epochs": 2, "budget": 12,
                         "space": space, "train_flags": (*TINY, "--data-root", str(tmp_path / "data")), **kw})


def test_a_search_runs_records_chooses_and_resumes(tmp_path, monkeypatch):
    spec, out = _spec(tmp_path), tmp_path / "tune"
    doc = T.tune(spec, out, log=lambda *_: None)
    trials = doc["trials"]
    assert doc["complete"] and [t["flags"]["--batch-ratio"] for t in trials] == ["0.1", "0.25"]
    for t in trials:  # each trial is an ordinary run with its record
        rec = json.loads(open(t["record"]).read())
        assert rec["run_id"] == t["run_id"] and rec["config"]["loop"]["epochs"] == 2
        assert rec["config"]["sampling"]["batch_ratio"] == float(t["flags"]["--batch-ratio"])
        assert {**T.score(rec, 0.3), "record": t["record"]} == {k: t[k] for k in T.score(rec, 0.3)}
    assert doc["chosen"] == T.choose(trials) and json.loads((out / "tune.json").read_text()) == doc
    cfg = parse_train_args(doc["command"].split()[2:])[0]  # the printed line trains the chosen configuration
    chosen = json.loads(open(doc["chosen"]["record"]).read())["config"]
    assert cfg.optim.lr == chosen["optim"]["lr"] and cfg.sampling.batch_ratio == chosen["sampling"]["batch_ratio"]
    assert cfg.tuned_from == str(out / "tune.json")  # and its record will say where its settings came from
    cfg.check_tuned_from()

    import scalegnn.launch as launch_module

    monkeypatch.setattr(launch_module, "launch", lambda *a, **k: pytest.fail("a recorded trial ran again"))
    assert T.tune(spec, out, log=lambda *_: None) == doc  # resumed: nothing run, the same choice
    with pytest.raises(ValueError, match="holds another search"):
        T.tune(_spec(tmp_path, epochs=3), out)


def test_an_interrupted_search_keeps_the_trials_it_ran(tmp_path, monkeypatch):
    import scalegnn.launch as launch_module

    real, calls = launch_module.launch, []

    def launch_then_stop(cfg, *a, **k):
        calls.append(cfg)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(cfg, *a, **k)

    monkeypatch.setattr(launch_module, "launch", launch_then_stop)
    out = tmp_path / "tune"
    with pytest.raises(KeyboardInterrupt):
        T.tune(_spec(tmp_path), out, log=lambda *_: None)
    kept = json.loads((out / "tune.json").read_text())
    assert not kept["complete"] and len(kept["trials"]) == 1 and kept["trials"][0]["status"] == "ok"


def test_over_budget_and_bad_flags_are_refused_before_any_trial(tmp_path, monkeypatch, capsys):
    import scalegnn.launch as launch_module

    monkeypatch.setattr(launch_module, "launch", lambda *a, **k: pytest.fail("a trial ran"))
    with pytest.raises(ValueError, match="the search space has 12 configurations .* but the budget is 8"):
        T.tune(T.TuneSpec("scalegnn", "cora", 0.8, 2, 8, T.SPACES["scalegnn"]), tmp_path)
    base = ["tune", "--dataset", "csbm:n=600", "--target", "0.5", "--out", str(tmp_path / "t")]
    for argv, message in [
        (base + ["--", "--epochs", "3"], "--epochs is set by scalegnn tune itself"),
        (base + ["--space", "lr"], "--space takes FLAG=V1,V2"),
        (base + ["--space", "dropout=1.5"], "dropout must be in [0, 1)"),
    ]:
        assert cli_main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("scalegnn: error: ") and message in err[0], (argv, err)
    with pytest.raises(SystemExit):
        cli_main(base[:-4] + ["--target", "1.5"])
    assert "expected an accuracy in (0, 1]" in capsys.readouterr().err
    assert not (tmp_path / "t").exists()


def test_tuned_from_must_name_a_search_of_the_system_that_chose(tmp_path):
    """--tuned-from is checked before any work: a missing or unreadable file, another
    system's search, a search without a choice: one line each."""
    def cfg(path, system="scalegnn"):
        return parse_train_args(["--system", system, "--dataset", "cora", "--tuned-from", str(path)])[0]

    with pytest.raises(ValueError, match="not a readable tuning record"):
        cfg(tmp_path / "missing.json").check_tuned_from()
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="not a readable tuning record"):
        cfg(tmp_path / "bad.json").check_tuned_from()
    search = tmp_path / "tune.json"
    search.write_text(json.dumps({"spec": {"system": "graphsage"}, "chosen": {"flags": {"--lr": "0.01"}}}))
    with pytest.raises(ValueError, match="a search of 'graphsage', this run is --system scalegnn"):
        cfg(search).check_tuned_from()
    cfg(search, "graphsage").check_tuned_from()
    search.write_text(json.dumps({"spec": {"system": "graphsage"}, "chosen": None}))
    with pytest.raises(ValueError, match="chose no settings"):
        cfg(search, "graphsage").check_tuned_from()
