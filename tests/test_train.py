"""Training loop and CLI: repeatability, records, early stop, divergence, errors, the help."""

import argparse
import dataclasses
import json
import os
import re
import subprocess
import sys

import pytest

from scalegnn import records
from scalegnn import systems as registry
from scalegnn.cli import build_parser, main
from scalegnn.config import (SCALEGNN_SYSTEMS, SECTIONS, RunConfig, add_train_arguments, command_line,
                             config_from_given, flag_table, make_config, parse_train_args, train_flags)
from scalegnn.parallel.engine import COMPONENTS
from scalegnn.launch import launch
from scalegnn.settings import flag_of, is_setting

SMALL = "csbm:n=600,avg_degree=8,classes=4,feature_dim=16"


def small_config(tmp_path, **over):
    fields = dict(dataset=SMALL, batch_ratio=0.2, epochs=3, out_dir=str(tmp_path), progress=False,
                  hidden=16, layers=2, dropout=0.2, data_root=str(tmp_path / "data"))
    fields.update(over)
    return make_config(**fields)


def test_same_seed_gives_the_same_loss_curve(tmp_path):
    a = launch(small_config(tmp_path))
    b = launch(small_config(tmp_path))
    c = launch(small_config(tmp_path, seed=1))
    losses = lambda r: [row["loss"] for row in r["epochs"]]  # noqa: E731
    assert losses(a) == losses(b)
    assert losses(a) != losses(c)
    assert a["status"] == "ok" and a["run_id"] != b["run_id"]


def test_record_fields_and_timing_semantics(tmp_path):
    rec = launch(small_config(tmp_path, epochs=4, eval_every=2, target_acc=0.05))
    on_disk = records.read_record(rec["path"])
    assert on_disk["system"] == "scalegnn" and on_disk["world_size"] == 1
    assert on_disk["grid"] == {"dp": 1, "x": 1, "y": 1, "z": 1}
    assert on_disk["config"]["model"]["hidden"] == 16
    assert on_disk["env"]["torch"] and on_disk["env"]["python"]
    rows = on_disk["epochs"]
    assert [r["epoch"] for r in rows] == [1, 2, 3, 4]
    assert rows[0]["test_acc"] is None and rows[1]["test_acc"] is not None  # eval every 2 epochs
    times = [r["train_time_s"] for r in rows]
    assert times == sorted(times) and times[0] > 0  # cumulative
    assert set(rows[0]["components"]) == set(COMPONENTS)  # the one engine's breakdown, a single process too
    # training time excludes evaluation: the components are the step's own parts
    assert sum(rows[0]["components"].values()) <= rows[0]["train_time_s"] + 1e-6
    assert on_disk["time_to_target_s"] == rows[1]["train_time_s"]  # 0.05 is reached at the first eval
    assert on_disk["peak_memory_bytes"] > 0
    assert on_disk["summary"]["best_epoch"] in (2, 4)


def test_stop_at_target_and_full_graph_label(tmp_path):
    rec = launch(small_config(tmp_path, epochs=20, target_acc=0.05, stop_at_target=True, batch_ratio=1.0))
    assert len(rec["epochs"]) == 1
    assert rec["system"] == "fullgraph-3d" and rec["steps_per_epoch"] == 1


def test_divergence_is_recorded(tmp_path):
    rec = launch(small_config(tmp_path, lr=1e30, epochs=5))
    assert rec["status"] == "diverged" and "loss became" in rec["error"]
    assert records.read_record(rec["path"])["status"] == "diverged"


def test_cli_train_writes_record_and_prints_summary(tmp_path, capsys):
    code = main(["train", "--dataset", SMALL, "--data-root", str(tmp_path / "d"), "--batch-ratio", "0.25",
                 "--layers", "2", "--hidden", "16", "--epochs", "2", "--out", str(tmp_path / "runs"), "--quiet"])
    out = capsys.readouterr().out
    assert code == 0
    assert "status ok" in out and "record:" in out
    path = out.strip().splitlines()[-1].split("record: ")[1]
    assert json.loads(open(path).read())["config"]["sampling"]["batch_ratio"] == 0.25


@pytest.mark.parametrize(
    "argv, message",
    [
        (["train", "--dataset", SMALL, "--batch-size", "1"], "batch size must be between 2"),
        (["train", "--dataset", "facebok"], "did you mean"),
        (["train", "--dataset", SMALL, "--epochs", "0"], "epochs must be >= 1"),
    ],
)
def test_cli_user_errors_are_one_clear_line(tmp_path, capsys, argv, message):
    code = main(argv + ["--data-root", str(tmp_path), "--out", str(tmp_path / "runs"), "--quiet"])
    err = capsys.readouterr().err
    assert code != 0 and message in err


def test_cli_bad_grid_syntax(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--dataset", SMALL, "--grid", "2x2"])
    assert "GdxGxxGyxGz" in capsys.readouterr().err


def test_python_dash_m_help_lists_the_options():
    out = subprocess.run([sys.executable, "-m", "scalegnn", "train", "--help"], capture_output=True, text=True,
                         timeout=120).stdout
    for flag in ("--dataset", "--data-root", "--batch-size", "--batch-ratio", "--layers", "--hidden", "--dropout",
                 "--lr", "--epochs", "--eval-every", "--target-acc", "--seed", "--out", "--grid", "--nproc"):
        assert flag in out, flag


# ----------------------------------------------------------------------------- train --help, --help-all, --help-topic
FLAG_LINE = re.compile(r"^  (-\S+)")  # an option's line: its flag at argparse's indent (wrapped help sits further in)
HELP_FLAGS = {"-h", "--help", "--help-all", "--help-topic", "--log-level"}  # scalegnn train's own, not settings'


def _flag_lines(text: str) -> list[str]:
    """The first flag of every option line of a help (``-h, --help ...`` -> ``-h``)."""
    return [m.group(1).rstrip(",") for line in text.splitlines() if (m := FLAG_LINE.match(line))]


def _all_flags(text: str) -> set[str]:
    """Every flag named on the option lines of a help (``--norm, --no-norm`` -> both)."""
    lines = [line.strip().split("  ")[0] for line in text.splitlines() if FLAG_LINE.match(line)]
    return {part.split(" ")[0] for invocation in lines for part in invocation.split(", ")}


def _help(capsys, monkeypatch, argv) -> str:
    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 0
    return capsys.readouterr().out


def _settings_flags(system: str) -> dict[str, str]:
    """flag -> setting path of every setting ``system`` has, from the flag table (results/README.md)."""
    return {flag: path for flag, path, scope in flag_table()
            if scope in ("common", system) or (scope == "scalegnn" and system in SCALEGNN_SYSTEMS)}


def _rare_flags(system: str) -> set[str]:
    """The flags of ``system``'s settings declared ``rare``, read from the dataclasses."""
    entry = registry.get(system)
    classes = [RunConfig, *SECTIONS.values(), *([registry.resolve(entry.options)] if entry.options else [])]
    return {flag_of(f) for cls in classes for f in dataclasses.fields(cls) if is_setting(f) and f.metadata["rare"]
            and (f.metadata["scope"] != "scalegnn" or system in SCALEGNN_SYSTEMS)}


def _train_help(option: str) -> str:
    return subprocess.run([sys.executable, "-m", "scalegnn", "train", option], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "COLUMNS": "80"}).stdout


def test_train_help_shows_at_most_40_flag_lines_and_names_the_rest():
    short, full = _train_help("--help"), _train_help("--help-all")
    assert len(_flag_lines(short)) <= 40, _flag_lines(short)
    assert len(_flag_lines(full)) > 40  # the count can fail: on every flag shown, as `--help` showed them
    epilog = " ".join(short.split()[-20:])
    assert "`scalegnn train --help-all` lists every flag" in epilog
    assert "`scalegnn train --help-topic TOPIC` the flags of one section" in epilog


@pytest.mark.parametrize("system", registry.names(available=True))
def test_help_all_lists_every_flag_and_help_leaves_out_only_the_rare(system, capsys, monkeypatch):
    argv = ["train", "--system", system]
    short, full = _help(capsys, monkeypatch, argv + ["--help"]), _help(capsys, monkeypatch, argv + ["--help-all"])
    assert _all_flags(full) == train_flags(system) | HELP_FLAGS
    # one line per option: a wrapped help line that starts with a flag (`--help (default: ...)`) is not counted
    assert len(_flag_lines(full)) == len(_settings_flags(system)) + 4  # -h, --help-all, --help-topic, --log-level
    rare = _rare_flags(system)
    assert set(_flag_lines(full)) - set(_flag_lines(short)) == rare and rare
    assert len(_flag_lines(short)) <= 40
    command = "scalegnn train" + ("" if system == "scalegnn" else f" --system {system}")
    text = " ".join(short.split())
    assert f"{len(rare)} rarely set flag" in text and f"`{command} --help-all` lists every flag" in text


RARE = {  # every rare flag of ScaleGNN -> a command line that sets it, and make_config's settings of that run
    "--split-seed": (["--split", "random:0.5,0.25,0.25", "--split-seed", "7"],
                     dict(split="random:0.5,0.25,0.25", split_seed=7)),
    "--shard-dir": (["--shard-dir", "shards"], dict(shard_dir="shards")),
    "--norm": (["--no-norm"], dict(norm=False)),
    "--residual": (["--no-residual"], dict(residual=False)),
    "--schedule": (["--schedule", "cosine"], dict(schedule="cosine")),
    "--grad-clip": (["--grad-clip", "1.5"], dict(grad_clip=1.5)),
    "--sparse-input-update": (["--sparse-input-update", "on"], dict(sparse_input_update="on")),
    "--keep-checkpoints": (["--keep-checkpoints", "5"], dict(keep=5)),
    "--bucket-collectives": (["--no-bucket-collectives"], dict(bucket_collectives=False)),
    "--profile": (["--profile", "trace"], dict(profile="trace")),
    "--sampler": (["--sampler", "torch"], dict(sampler="torch")),
}


@pytest.mark.parametrize("flag", sorted(RARE))
def test_a_rare_flag_parses_into_the_same_config(flag):
    argv, settings = RARE[flag]
    argv = ["--dataset", "cora", *argv]
    cfg = parse_train_args(argv)[0]
    assert cfg == make_config(dataset="cora", **settings) != parse_train_args(["--dataset", "cora"])[0]
    plain = argparse.ArgumentParser(add_help=False)  # no help, so nothing hidden: the parser of every flag
    add_train_arguments(plain, "scalegnn")
    assert config_from_given(vars(plain.parse_args(argv))) == cfg
    given = vars(build_parser().parse_args(["train", *argv]))
    assert config_from_given({k: v for k, v in given.items() if k not in ("command", "log_level")}) == cfg
    assert parse_train_args(command_line(cfg))[0] == cfg and " ".join(argv[2:]) in " ".join(command_line(cfg))


def test_the_rare_flags_are_the_ones_tested_above():
    assert set(RARE) == _rare_flags("scalegnn")  # a new rare flag: add a line to RARE


@pytest.mark.parametrize("system", ["scalegnn", "graphsage", "distdgl"])
def test_each_help_topic_lists_exactly_its_sections_flags(system, capsys, monkeypatch):
    topics: dict[str, set[str]] = {}  # from the flag table, not from the parser
    for flag, path in _settings_flags(system).items():
        topics.setdefault(path.split(".")[0] if "." in path else "run", set()).add(flag)
    if system == "scalegnn":
        assert set(topics) == {"run", *SECTIONS}
    else:
        assert "options" in topics and "perf" not in topics
    for topic, flags in topics.items():
        text = _help(capsys, monkeypatch, ["train", "--system", system, "--help-topic", topic])
        assert set(_flag_lines(text)) == flags, topic


def test_an_unknown_help_topic_names_the_topics(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["train", "--system", "graphsage", "--help-topic", "perf"])
    assert stop.value.code == 2
    assert "invalid choice: 'perf'" in capsys.readouterr().err
