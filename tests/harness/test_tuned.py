"""The tuned comparison (benchmarks/tuned.py, issue V): every system runs the settings
its search chose (and, second, its defaults), after an untimed warm-up, in alternating
order; searches that did not finish or tuned another dataset are refused."""

from __future__ import annotations

import json

import pytest

from scalegnn.benchmarks import tuned as B
from scalegnn.sweeps import tune as T

GRAPH = "csbm:n=600"


def _search(tmp_path, system, space, done=True):
    spec = T.TuneSpec(system=system, dataset=GRAPH, target=0.3, epochs=2, budget=12,
                      space=T.space_for(system, space),
                      train_flags=("--hidden", "16", "--data-root", str(tmp_path / "data")))
    doc = T.tune(spec, tmp_path / "tuned" / system, log=lambda *_: None)
    if not done:
        path = tmp_path / "tuned" / system / "tune.json"
        path.write_text(json.dumps({**doc, "complete": False}))
    return doc


def test_run_order_alternates():
    assert B.run_order(["a", "b", "c"], 0) == ["a", "b", "c"] == B.run_order(["a", "b", "c"], 2)
    assert B.run_order(["a", "b", "c"], 1) == ["c", "b", "a"]


def test_tuned_against_tuned_and_defaults_against_defaults(tmp_path, monkeypatch):
    sg = _search(tmp_path, "scalegnn", ["lr=0.01", "dropout=0.5", "batch-ratio=0.25"])
    gcn = _search(tmp_path, "pyg-gcn", ["lr=0.01", "dropout=0.5"])
    import scalegnn.launch as launch_module

    real, order = launch_module.launch, []

    def spy(cfg, *a, **k):
        order.append((cfg.system, cfg.loop.epochs, cfg.seed, cfg.optim.lr, cfg.tuned_from))
        return real(cfg, *a, **k)

    monkeypatch.setattr(launch_module, "launch", spy)
    out = tmp_path / "bench"
    assert B.main(["--tuned", str(tmp_path / "tuned"), "--target", "0.3", "--seeds", "0", "1", "--max-epochs", "3",
                   "--systems", "scalegnn,pyg-gcn", "--out", str(out)]) == 0
    tuned_runs = order[:6]  # warm-ups (1 epoch each), then seed 0 in order, seed 1 reversed
    assert [(s, e) for s, e, *_ in tuned_runs] == [("scalegnn", 1), ("pyg-gcn", 1), ("scalegnn", 3),
                                                     ("pyg-gcn", 3), ("pyg-gcn", 3), ("scalegnn", 3)]
    assert {lr for s, _, _, lr, _ in tuned_runs} == {0.01}  # the chosen flags
    assert {(s, src) for s, *_, src in tuned_runs} == {(s, str(tmp_path / "tuned" / s / "tune.json"))
                                                       for s in ("scalegnn", "pyg-gcn")}  # records say so
    paper = order[6:]
    assert len(paper) == 6 and {lr for *_, lr, _ in paper} == {0.001}  # each system's default lr
    assert {src for *_, src in paper} == {None}
    doc = json.loads((out / "tuned.json").read_text())
    for table in ("tuned", "paper"):
        assert list(doc[table]) == ["scalegnn", "pyg-gcn"] and all(len(r["runs"]) == 2 for r in doc[table].values())
        gcn_time = doc[table]["pyg-gcn"]["time_to_target_s"]
        if gcn_time is not None:
            assert doc[table]["pyg-gcn"]["ratio_to_pyg_gcn"] == pytest.approx(1.0)
    assert doc["tuned"]["scalegnn"]["flags"][-8:-2] == ["--lr", "0.01", "--dropout", "0.5", "--batch-ratio", "0.25"]
    assert doc["budget"]["scalegnn"]["configurations"] == len(sg["trials"]) == 1 and len(gcn["trials"]) == 1
    assert (out / "tuned" / "warmup").is_dir() and "ratio to pyg-gcn" in (out / "tuned.md").read_text()


def test_unfinished_or_mixed_searches_are_refused(tmp_path, capsys):
    _search(tmp_path, "pyg-gcn", ["lr=0.01", "dropout=0.5"], done=False)
    with pytest.raises(SystemExit):
        B.main(["--tuned", str(tmp_path / "tuned"), "--target", "0.3", "--out", str(tmp_path / "b")])
    assert "the search did not finish" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        B.main(["--tuned", str(tmp_path / "nothing"), "--target", "0.3", "--out", str(tmp_path / "b")])
    assert "no */tune.json under" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()
