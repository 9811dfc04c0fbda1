"""Runs the tests configure: the generated graphs they train on, run configurations
of the compared systems, and what they read back (a record's epoch rows, the one line
of a refused command)."""

from __future__ import annotations

from scalegnn.cli import main
from scalegnn.config import make_config

SMALL = "csbm:n=600,avg_degree=8,classes=4,feature_dim=16"
TINY = "csbm:n=400,avg_degree=8,classes=3,feature_dim=8"
MEDIUM = "csbm:n=3000,avg_degree=10,classes=4,feature_dim=32"
BASELINE_TINY = "csbm:n=400,avg_degree=6,classes=3,feature_dim=12"  # the compared systems' tests
TOY_GRAPH = "csbm:n=200,avg_degree=4,classes=2,feature_dim=4"  # runs refused or scripted before any training


def cfg_for(system, data_root, tmp_path, **over):
    """A 2-epoch run of ``system`` on :data:`BASELINE_TINY` (hidden 16, 2 layers, no dropout)."""
    kw = dict(dataset=BASELINE_TINY, data_root=data_root, epochs=2, out_dir=str(tmp_path), hidden=16, layers=2,
              dropout=0.0)
    kw.update(over)
    return make_config(system, **kw)


def edge_set(data):
    src, dst = data.edge_index
    return set(zip(src.tolist(), dst.tolist()))


def epoch_rows(record: dict) -> list[dict]:
    """What a resumed run must reproduce exactly: each epoch's loss and accuracies."""
    keys = ("epoch", "loss", "batch_train_acc", "train_acc", "val_acc", "test_acc")
    return [{k: row[k] for k in keys} for row in record["epochs"]]


def one_line_error(capsys, argv) -> str:
    """Run the CLI, expect the user-error exit (2) and exactly one stderr line."""
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("scalegnn: error: "), (code, err)
    return err


def refuse_work(monkeypatch):
    """Loading data or spawning ranks fails the test: every output folder must be
    checked before either (the bad path used to surface after training)."""
    import scalegnn.datasets
    import scalegnn.launch.job

    def refuse(*args, **kwargs):
        raise AssertionError("work started before the output folders were checked")

    monkeypatch.setattr(scalegnn.datasets, "load_dataset", refuse)
    monkeypatch.setattr(scalegnn.launch.job.LocalJob, "start", refuse)
