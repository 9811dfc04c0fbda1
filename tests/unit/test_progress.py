"""Per-epoch progress a batch job can read (scalegnn/progress.py), and the --log-level flag."""

import io
import logging
import os

import pytest

from scalegnn.loop import EpochStats, Trainer
from scalegnn.progress import EpochLogger, configure_logging, mode_from_progress

ROWS = [
    {"epoch": 1, "train_time_s": 2.0, "loss": 1.5, "batch_train_acc": 0.25, "train_acc": None, "val_acc": None,
     "test_acc": None, "eval_time_s": None, "components": {"spmm": 0.5}, "comm_bytes": {}},
    {"epoch": 2, "train_time_s": 2.5, "loss": 1.25, "batch_train_acc": 0.5, "train_acc": 0.6, "val_acc": 0.55,
     "test_acc": 0.5, "eval_time_s": 0.125, "components": {"spmm": 0.25}, "comm_bytes": {}},
]


class _Tty(io.StringIO):
    def isatty(self):
        return True


@pytest.fixture
def logged(monkeypatch):
    """The scalegnn logger writing into a buffer (restored afterwards, and the level
    that configure_logging exports for child processes too)."""
    monkeypatch.delenv("SCALEGNN_LOG_LEVEL", raising=False)
    buf = io.StringIO()
    logger = configure_logging("INFO", stream=buf)
    yield buf
    for handler in [h for h in logger.handlers if h.get_name() == "scalegnn-stdout"]:
        logger.removeHandler(handler)  # the next configure_logging follows sys.stdout again
    logger.setLevel(logging.INFO)


def test_one_line_per_epoch_with_loss_accuracy_time_and_throughput(logged):
    log = EpochLogger("scalegnn", "csbm:n=600", 10, rank=0, mode="auto", steps_per_epoch=4, batch_size=150,
                      stream=io.StringIO())  # not a terminal: lines
    assert log.mode == "lines" and log.bar is None
    for row in ROWS:
        log.epoch(row)
    log.close()
    lines = logged.getvalue().strip().splitlines()
    assert len(lines) == 2 and all("INFO scalegnn.progress:" in line for line in lines)
    assert lines[0].endswith("scalegnn csbm:n=600 epoch 1/10: loss 1.5000, batch acc 0.2500, epoch 2.00 s, "
                             "300 vertices/s")  # 4 steps x 150 vertices / 2.0 s
    # epoch 2: the time is the difference of cumulative training times (0.5 s), evaluation apart
    assert lines[1].endswith("epoch 2/10: loss 1.2500, batch acc 0.5000, val acc 0.5500, test acc 0.5000, "
                             "epoch 0.50 s, 1,200 vertices/s, eval 0.12 s")


def test_other_ranks_and_off_write_nothing_and_the_level_filters(logged):
    for log in (EpochLogger("s", "d", 2, rank=1, mode="lines"), EpochLogger("s", "d", 2, rank=0, mode="off")):
        log.epoch(ROWS[0])
        assert log.mode == "off"
    assert logged.getvalue() == ""
    configure_logging("WARNING", stream=logged)
    EpochLogger("s", "d", 2, rank=0, mode="lines").epoch(ROWS[0])
    assert logged.getvalue() == ""
    configure_logging("DEBUG", stream=logged)
    EpochLogger("s", "d", 2, rank=0, mode="lines").epoch(ROWS[0])
    assert "epoch 1/2" in logged.getvalue() and "components {'spmm': 0.5}" in logged.getvalue()


def test_a_terminal_gets_the_bar_and_a_resumed_run_starts_where_it_was():
    tty = _Tty()
    log = EpochLogger("scalegnn", "d", 10, rank=0, mode="auto", done_epochs=3, done_time_s=2.0, stream=tty)
    assert log.mode == "bar" and log.bar.n == 3
    log.epoch({**ROWS[1], "epoch": 4})
    assert log.bar.n == 4 and log.last_time_s == 2.5
    log.close()
    assert "scalegnn d" in tty.getvalue()
    assert [mode_from_progress(p) for p in (None, False, True)] == ["auto", "off", "bar"]
    with pytest.raises(ValueError, match="progress mode"):
        EpochLogger("s", "d", 1, mode="loud")


def test_log_level_flag_and_its_errors(capsys, monkeypatch):
    from scalegnn.cli import build_parser, main

    args = build_parser().parse_args(["train", "--dataset", "cora", "--log-level", "debug"])
    assert args.log_level == "DEBUG"
    monkeypatch.setenv("SCALEGNN_LOG_LEVEL", "warning")
    assert build_parser().parse_args(["train", "--dataset", "cora"]).log_level == "WARNING"
    monkeypatch.setenv("SCALEGNN_LOG_LEVEL", "chatty")
    assert main(["train", "--dataset", "cora", "--epochs", "1"]) == 2
    err = capsys.readouterr().err
    assert "--log-level (default $SCALEGNN_LOG_LEVEL) must be one of DEBUG, INFO, WARNING, ERROR, got 'CHATTY'" in err


def test_a_spawned_rank_logs_its_lines_at_the_inherited_level(tmp_path):
    """A worker process (--nproc's ranks) never ran the CLI's configure_logging: the
    EpochLogger configures it, at the level the parent exported."""
    import subprocess
    import sys

    code = ("from scalegnn.progress import EpochLogger\n"
            f"EpochLogger('scalegnn', 'd', 2, rank=0, mode='lines').epoch({ROWS[0]!r})\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    for level, shown in (("INFO", True), ("WARNING", False)):
        env["SCALEGNN_LOG_LEVEL"] = level
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
        assert out.returncode == 0, out.stderr
        assert ("INFO scalegnn.progress: scalegnn d epoch 1/2: loss 1.5000" in out.stdout) == shown, out.stdout


def test_configure_logging_adds_one_handler_and_leaves_the_root_logger_alone(monkeypatch):
    monkeypatch.delenv("SCALEGNN_LOG_LEVEL", raising=False)
    root_before = list(logging.getLogger().handlers)
    a = configure_logging("INFO")
    b = configure_logging("ERROR")
    assert a is b and len([h for h in a.handlers if h.get_name() == "scalegnn-stdout"]) == 1
    assert a.level == logging.ERROR and not a.propagate
    assert logging.getLogger().handlers == root_before
    assert os.environ["SCALEGNN_LOG_LEVEL"] == "ERROR"  # what spawned ranks inherit
    configure_logging("INFO")


def test_baseline_epoch_loop_logs_one_line_per_epoch(logged, tmp_path, monkeypatch):
    """The baselines' in-process runs go through the one loop and report through the
    same logger (no --quiet blindness)."""
    import dataclasses

    from scalegnn import systems as registry
    from scalegnn.config import make_config
    from scalegnn.launch import launch

    fixed = dataclasses.replace(registry.get("graphsage"), trainer="tests.unit.test_progress:fixed_trainer")
    monkeypatch.setitem(registry._REGISTRY, "graphsage", fixed)
    tiny = "csbm:n=200,avg_degree=4,classes=2,feature_dim=4"
    cfg = make_config("graphsage", dataset=tiny, epochs=3,
                      eval_every=2, data_root=str(tmp_path), out_dir=str(tmp_path / "runs"))
    record = launch(cfg)
    assert record["status"] == "ok"
    first, *lines = logged.getvalue().strip().splitlines()
    assert f"graphsage on {tiny}: starting in this process, grid 1x1x1x1, 3 epochs" in first  # the launcher's
    assert len(record["epochs"]) == 3 and len(lines) == 3
    assert f"graphsage {tiny} epoch 1/3: loss 1.0000, batch acc 0.5000" in lines[0]
    assert "test acc 0.5000" in lines[1] and "test acc" not in lines[0]


class _FixedTrainer(Trainer):
    """Two steps an epoch of known losses, and fixed accuracies."""

    steps_per_epoch, batch_size = 2, 10

    def train_epoch(self, epoch):
        return EpochStats(loss_sum=2.0 / epoch, loss_n=2, correct=5, count=10, components={"forward_backward": 0.0})

    def evaluate(self):
        return 0.5, 0.5, 0.5


def fixed_trainer(cfg, graph, env):
    return _FixedTrainer()


def test_the_first_minute_is_one_line_per_phase_before_the_first_epoch(logged, tmp_path):
    """A ScaleGNN run logs what it starts (the launcher's first line, before torch loads:
    tests/integration/test_start.py), then loading the graph (its sizes) and building the
    engine (grid, batch, steps) with their seconds, before its first epoch line; other
    ranks do not."""
    import re

    import scalegnn
    from scalegnn.progress import Phases

    scalegnn.train(dataset="csbm:n=200,avg_degree=4,classes=2,feature_dim=4", epochs=1, hidden=8,
                   data_root=str(tmp_path), out_dir=str(tmp_path / "runs"))
    first, *lines = logged.getvalue().strip().splitlines()
    assert first.endswith("scalegnn on csbm:n=200,avg_degree=4,classes=2,feature_dim=4: starting in this process, "
                          "grid 1x1x1x1, 1 epoch"), first
    assert re.search(r"loading the graph: csbm:n=200,.*, 200 vertices, [\d,]+ adjacency entries, 4 features "
                     r"\(\d+\.\d s\)$", lines[0]), lines
    assert re.search(r"building the engine: grid 1x1x1x1, batch 20, 10 steps per epoch, on cpu \(\d+\.\d s\)$",
                     lines[1]), lines
    assert "epoch 1/1" in lines[2] and len(lines) == 3
    with Phases(rank=1)("quiet elsewhere") as said:
        said("not logged")
    assert "quiet elsewhere" not in logged.getvalue()


def test_quiet_is_silent_and_a_heartbeat_speaks_inside_a_long_epoch(logged, tmp_path):
    """``quiet=True`` (--quiet, progress=False): no phase, epoch or heartbeat line. A
    batch log (lines) gets a heartbeat when the clock says one is due, with the step,
    the rates and the ETAs; a bar or quiet gets none."""
    import scalegnn
    from scalegnn.progress import Heartbeat

    scalegnn.train(dataset="csbm:n=200,avg_degree=4,classes=2,feature_dim=4", epochs=1, hidden=8, quiet=True,
                   data_root=str(tmp_path), out_dir=str(tmp_path / "runs"), heartbeat_s=1e-9)
    assert logged.getvalue() == ""
    now = [100.0]
    beat = Heartbeat("scalegnn", "d", 3, mode="lines", every_s=10, steps_per_epoch=100, batch_size=50,
                     clock=lambda: now[0])
    beat.begin_epoch(2, step_in_epoch=20)  # resumed at step 20 of epoch 2
    now[0] = 105.0
    assert beat.step(30) is None  # 5 s: not due
    now[0] = 110.0
    line = beat.step(40)  # 20 steps in 10 s
    assert line == ("scalegnn d epoch 2/3: step 40/100, 2.00 steps/s, 100 vertices/s, epoch ETA 30s, "
                    "run ETA 1m20s")  # 60 steps of this epoch + 100 of epoch 3 at 2 steps/s
    assert line in logged.getvalue()
    for mode, every in (("bar", 10), ("off", 10), ("lines", 0)):
        quiet = Heartbeat("s", "d", 1, mode=mode, every_s=every, steps_per_epoch=4, clock=lambda: now[0])
        quiet.begin_epoch(1)
        now[0] += 100
        assert quiet.step(2) is None, mode
