"""The ``scalegnn`` command (scalegnn/cli.py): ``train`` writes a record and prints its
summary, the help (at most 40 flag lines, ``--help-all``, the topics, the rare flags),
and user errors, each one line before any work.

Bad inputs tried (``scalegnn train ...``; each prints exactly one line
``scalegnn: error: <message>`` and exits 2, before any record is written; argparse
errors print usage plus one line):

==========================================  ==============================================================
input                                       message
==========================================  ==============================================================
--grid 1x2x2x1 --nproc 2                    --nproc 2 does not match the grid 1x2x2x1 (Gd*Gx*Gy*Gz = 4);
                                            pass --nproc 4 or change --grid
--grid 1x2x1x1 (no launcher, no --nproc)    the grid 1x2x1x1 needs 2 ranks but the job has 1 (single); pass
                                            --nproc 2 to spawn local workers, or launch 2 processes with
                                            torchrun/srun
grid product != torchrun/srun world size    the grid ... needs G ranks but the job has W (torchrun); launch G
                                            processes or change --grid   (scalegnn.launch)
--batch-size 1   (also under --nproc 2)     batch size must be between 2 and N=600, got 1; use
                                            --batch-ratio 1.0 for full-graph training
--batch-size 601 (N = 600)                  batch size must be between 2 and N=600, got 601; ...
--batch-ratio 0                             argument --batch-ratio: expected a fraction in (0, 1], got 0
--dataset facebok                           unknown dataset 'facebok'; did you mean 'facebook'? Known: ...
--dataset csbm:n=abc                        csbm: parameter n='abc' is not an integer
--dataset csbm:nodes=5                      csbm: unknown parameter 'nodes'; valid parameters: n (default
                                            10000), avg_degree ...
--dataset npz:/nonexistent.npz              npz: file not found: /nonexistent.npz; pass npz:<path to an
                                            existing .npz file>
--hidden 2 --grid 1x4x1x1                   hidden size 2 is smaller than grid axis x = 4: every 3D axis
                                            splits the hidden dimension, so some ranks would hold no
                                            weights; use --hidden >= 4 or a grid with at most 2 ranks per
                                            axis
--grid 2x2 / --grid 1x0x1x1                 argument --grid: --grid must be GdxGxxGyxGz with four positive
                                            integers, e.g. 1x2x2x2; got '2x2'
--epochs 0 / --layers 0 / --dropout 1.5     epochs must be >= 1, got 0 / layers must be >= 1, got 0 /
/ --lr -1                                   dropout must be in [0, 1), got 1.5 / lr must be > 0, got -1.0
--checkpoint-every 10 (no dir)              --checkpoint-every needs --checkpoint-dir (a folder every rank
                                            can reach, one per run)
--resume (no dir)                           --resume needs --checkpoint-dir (...)
--checkpoint-every ten                      --checkpoint-every must be a step count (e.g. 500) or a
                                            duration with a unit (e.g. 30m, 90s, 2h), got 'ten'
--keep-checkpoints 0                        --keep-checkpoints must be >= 1, got 0
--collective-timeout 0                      --collective-timeout must be > 0 seconds, got 0.0
--resume with other settings than the       <dir>/step-000000005 was written by a run with another config
checkpoint's                                (model.hidden: checkpoint 16, now 32); resume with the same
                                            settings, or use a new --checkpoint-dir for a new run
                                            (tests/integration/test_resume.py)
``data shard --out <existing file>``        --out <file> is an existing file, not a folder; pass a folder
                                            you can write to
==========================================  ==============================================================

Data errors (malformed edge lists, BYO arrays, labels, splits, NaN features,
non-square matrices ...) are listed with their messages in tests/unit/datasets/; the
output folders every command checks before any work in tests/integration/test_launch.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import subprocess
import sys

import pytest

from scalegnn import systems as registry
from scalegnn.cli import build_parser, main
from scalegnn.config import (RunConfig, SCALEGNN_SYSTEMS, SECTIONS, add_train_arguments, command_line,
                             config_from_given, flag_table, make_config, parse_train_args, train_flags)
from scalegnn.settings import flag_of, is_setting
from tests.runs import SMALL, TINY, one_line_error, refuse_work


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


# ----------------------------------------------------------------------------- hostile configuration
BAD_INPUTS = [
    (["--grid", "1x2x2x1", "--nproc", "2"], "--nproc 2 does not match the grid 1x2x2x1 (Gd*Gx*Gy*Gz = 4)"),
    (["--grid", "1x2x1x1"], "the grid 1x2x1x1 needs 2 ranks but the job has 1 (single); pass --nproc 2"),
    (["--batch-size", "1"], "batch size must be between 2 and N=600, got 1"),
    (["--batch-size", "601"], "batch size must be between 2 and N=600, got 601"),
    (["--dataset", "facebok"], "unknown dataset 'facebok'; did you mean 'facebook'?"),
    (["--dataset", "csbm:n=abc"], "csbm: parameter n='abc' is not an integer"),
    (["--dataset", "csbm:nodes=5"], "csbm: unknown parameter 'nodes'; valid parameters: n (default"),
    (["--dataset", "npz:/nonexistent.npz"], "npz: file not found: /nonexistent.npz"),
    (["--hidden", "2", "--grid", "1x4x1x1", "--nproc", "4"], "hidden size 2 is smaller than grid axis x = 4"),
    (["--epochs", "0"], "epochs must be >= 1, got 0"),
    (["--layers", "0"], "layers must be >= 1, got 0"),
    (["--dropout", "1.5"], "dropout must be in [0, 1), got 1.5"),
    (["--lr", "-1"], "lr must be > 0, got -1.0"),
    (["--checkpoint-every", "10"], "--checkpoint-every needs --checkpoint-dir"),
    (["--resume"], "--resume needs --checkpoint-dir"),
    (["--checkpoint-every", "ten", "--checkpoint-dir", "ck"], "--checkpoint-every must be a step count (e.g. 500)"),
    (["--checkpoint-dir", "ck", "--keep-checkpoints", "0"], "--keep-checkpoints must be >= 1, got 0"),
    (["--collective-timeout", "0"], "--collective-timeout must be > 0 seconds, got 0.0"),
]


@pytest.mark.parametrize("argv, message", BAD_INPUTS, ids=[" ".join(a) for a, _ in BAD_INPUTS])
def test_bad_configuration_gives_one_clear_line(tmp_path, capsys, argv, message):
    if "--dataset" not in argv:
        argv = ["--dataset", SMALL] + argv
    code = main(["train", *argv, "--data-root", str(tmp_path / "data"), "--out", str(tmp_path / "runs"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("scalegnn: error: "), err
    assert message in err, err
    assert not (tmp_path / "runs").exists()  # no record for a user error


@pytest.mark.parametrize("argv, message", [
    (["--batch-ratio", "0"], "expected a fraction in (0, 1], got 0"),
    (["--grid", "2x2"], "--grid must be GdxGxxGyxGz with four positive integers"),
    (["--grid", "1x0x1x1"], "--grid must be GdxGxxGyxGz with four positive integers"),
])
def test_bad_flag_syntax_is_an_argparse_error(capsys, argv, message):
    with pytest.raises(SystemExit) as info:
        main(["train", "--dataset", SMALL, *argv])
    assert info.value.code == 2 and message in capsys.readouterr().err


def test_data_shard_into_an_existing_file_is_one_line_and_writes_nothing(tmp_path, capsys, monkeypatch, isolated_data):
    """``scalegnn data shard --out <existing file>`` gave a FileExistsError traceback."""
    out = tmp_path / "FILE"
    out.write_text("keep me")
    refuse_work(monkeypatch)
    err = one_line_error(capsys, ["data", "shard", TINY, "--grid", "1x2x1x1", "--out", str(out)])
    assert f"--out {out} is an existing file, not a folder; pass a folder you can write to" in err, err
    assert out.read_text() == "keep me" and [p.name for p in tmp_path.iterdir()] == ["FILE"]  # nothing written


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
    "--stand-in-labels": (["--stand-in-labels"], dict(stand_in_labels=True)),
    "--norm": (["--no-norm"], dict(norm=False)),
    "--residual": (["--no-residual"], dict(residual=False)),
    "--norm-position": (["--norm-position", "pre"], dict(norm_position="pre")),
    "--schedule": (["--schedule", "cosine"], dict(schedule="cosine")),
    "--grad-clip": (["--grad-clip", "1.5"], dict(grad_clip=1.5)),
    "--sparse-input-update": (["--sparse-input-update", "on"], dict(sparse_input_update="on")),
    "--keep-checkpoints": (["--keep-checkpoints", "5"], dict(keep=5)),
    "--bucket-collectives": (["--no-bucket-collectives"], dict(bucket_collectives=False)),
    "--profile": (["--profile", "trace"], dict(profile="trace")),
    "--sampler": (["--sampler", "torch"], dict(sampler="torch")),
    "--cuda-graphs": (["--cuda-graphs"], dict(cuda_graphs=True)),
    "--tuned-from": (["--tuned-from", "search/tune.json"], dict(tuned_from="search/tune.json")),
    "--heartbeat": (["--heartbeat", "5"], dict(heartbeat_s=5.0)),
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
