"""The run configuration (scalegnn/config.py): flags fill its sections. The help and the
rare flags are in tests/integration/test_cli.py."""

from __future__ import annotations

import pytest
import torch

from scalegnn.numerics import NumericsConfig
from scalegnn.perf import PerfConfig


def test_cli_flags_fill_perf_and_numerics_config():
    from scalegnn.config import parse_train_args

    cfg, _ = parse_train_args(
        ["--dataset", "cora", "--prefetch", "--comm-dtype", "bf16", "--compile", "--comm-overlap",
         "--profile", "/tmp/p", "--permute", "double", "--no-residual", "--sampler", "torch", "--gemm-dtype", "bf16"])
    perf, numerics = cfg.perf, cfg.numerics
    assert (perf.prefetch, numerics.comm_dtype, perf.compile, perf.comm_overlap, perf.profile, numerics.permute,
            perf.sampler, numerics.gemm_dtype) == (True, "bf16", True, True, "/tmp/p", "double", "torch", "bf16")
    assert numerics.local_gemm_dtype is torch.bfloat16
    assert parse_train_args(["--dataset", "cora"])[0].perf == PerfConfig()
    assert parse_train_args(["--dataset", "cora"])[0].numerics == NumericsConfig()
    with pytest.raises(ValueError, match="comm_dtype"):
        NumericsConfig(comm_dtype="fp8")
    with pytest.raises(ValueError, match="gemm_dtype"):
        NumericsConfig(gemm_dtype="fp16")


def test_bucket_switch_goes_from_flag_to_config():
    from scalegnn.config import make_config, parse_train_args

    assert make_config().perf.bucket_collectives is True
    assert make_config(bucket_collectives=False).perf.bucket_collectives is False
    cfg, _ = parse_train_args(["--dataset", "facebook", "--no-bucket-collectives"])
    assert cfg.perf.bucket_collectives is False and cfg.to_dict()["perf"]["bucket_collectives"] is False


def test_a_setting_python_does_not_know_says_what_it_is_called():
    """``epoch`` is close to ``epochs``; in one line, before anything runs."""
    from scalegnn.config import make_config

    with pytest.raises(ValueError, match=r"has no setting 'epoch' \(did you mean 'epochs'\?\)"):
        make_config(dataset="cora", epoch=3)
    with pytest.raises(ValueError, match=r"has no setting 'zzz'; its settings: backend, "):
        make_config(dataset="cora", zzz=1)
    # in Python's words (system=, not --system), another framework's name answered with ours
    with pytest.raises(ValueError, match=r"^system='graphsage' has no setting 'learning_rate' \(did you mean 'lr'\?\)"):
        make_config("graphsage", dataset="cora", learning_rate=0.1)
    with pytest.raises(ValueError, match=r"has no setting 'num_layers' \(did you mean 'layers'\?\)"):
        make_config(dataset="cora", num_layers=3)


def test_a_flag_the_command_line_does_not_know_says_what_it_is_called(capsys):
    """``--hiden`` is close to ``--hidden``: argparse's one line, with the flag it meant."""
    from scalegnn.cli import main

    with pytest.raises(SystemExit) as stop:
        main(["train", "--dataset", "cora", "--hiden", "8"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert stop.value.code == 2 and err == "scalegnn: error: unrecognized arguments: --hiden 8 (did you mean --hidden?)"
    with pytest.raises(SystemExit):
        main(["sweep", "fig7", "--cluster", "local", "--dryrun"])
    assert capsys.readouterr().err.strip().endswith("unrecognized arguments: --dryrun (did you mean --dry-run?)")


def test_a_setting_has_its_flags_name_in_python_too():
    """``checkpoint_dir=`` is --checkpoint-dir (the field ``dir``), ``quiet=True`` is --quiet
    (``progress=False``), ``out=`` is --out (``out_dir``): the same configuration as the
    field's name; both names at once, or a switch given a non-bool, is one line."""
    from scalegnn.config import make_config

    by_flag = make_config(dataset="cora", checkpoint_dir="ck", checkpoint_every="30m", keep_checkpoints=3,
                          quiet=True, out="runs")
    by_field = make_config(dataset="cora", dir="ck", every="30m", keep=3, progress=False, out_dir="runs")
    assert by_flag == by_field and by_flag.loop.progress is False and by_flag.checkpoint.dir == "ck"
    assert make_config(dataset="cora", quiet=False).loop.progress is None  # not quiet: the default
    with pytest.raises(ValueError, match=r"^out= and out_dir= are one setting \(--out\); give it once$"):
        make_config(dataset="cora", out="a", out_dir="b")
    with pytest.raises(ValueError, match=r"quiet= is a switch \(--quiet\): True or False, got 'yes'"):
        make_config(dataset="cora", quiet="yes")


def test_a_systems_help_shows_the_defaults_it_really_runs_with():
    """--system fullgraph-3d runs with B = N, the double permutation and no residual:
    its --help says so, flag by flag, and the configuration it builds agrees."""
    import argparse

    from scalegnn.config import SYSTEM_DEFAULTS, add_train_arguments, make_config

    for system, defaults in SYSTEM_DEFAULTS.items():
        cfg = make_config(system, dataset="cora")
        parser = argparse.ArgumentParser(add_help=False)  # no --help: the rare flags keep their help text
        add_train_arguments(parser, system)
        helps = {a.dest: " ".join(a.help.split()) for a in parser._actions if a.help}
        for dest, value in defaults.items():
            section, name = dest.split(".")
            assert getattr(getattr(cfg, section), name) == value, (system, dest)
            assert helps[dest].endswith(f"(default: {value})"), (system, dest, helps[dest])
    scalegnn_help = argparse.ArgumentParser(add_help=False)
    add_train_arguments(scalegnn_help, "scalegnn")
    residual = next(a for a in scalegnn_help._actions if a.dest == "model.residual")
    assert residual.help.endswith("(default: True)")
