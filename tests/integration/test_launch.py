"""The launcher (scalegnn/launch/__init__.py): every system is started by it, and every
output folder is checked before any work: ``--out`` at a file or at /proc or /sys,
``--checkpoint-dir`` and ``--profile`` at a file were found only after training (the
finished run lost, or a failed record for a run that had trained); now one line naming
the flag, the path, the problem and the fix, before any data is loaded or any rank
spawned, for one process, ``--nproc`` and a compared system alike. A configuration error
inside spawned ranks is one line and leaves no record."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from scalegnn import systems as registry
from scalegnn.cli import main
from scalegnn.config import make_config
from scalegnn.launch import launch
from tests.runs import SMALL, TINY, TOY_GRAPH, one_line_error, refuse_work


# ----------------------------------------------------------------------------- the one launcher
def test_every_runnable_system_is_started_by_the_one_launcher():
    """A system gives a trainer (the launcher runs it in every mode) or, starting its own
    processes, a job; nothing else in the registry says how it runs."""
    for entry in registry.systems(available=True):
        assert (entry.trainer is None) != (entry.job is None), entry.name
        assert (entry.job is not None) == entry.self_launching
        registry.resolve(entry.trainer or entry.job)  # importable
    with pytest.raises(ValueError, match="a trainer the launcher runs, or a job of its own, not both"):
        registry.System(name="x", display="x", trainer="a:b", job="c:d")


def test_the_launcher_checks_outputs_before_any_work(tmp_path):
    file = tmp_path / "FILE"
    file.write_text("x")
    cfg = make_config(dataset=TOY_GRAPH, epochs=1, progress=False, out_dir=str(file))
    with pytest.raises(ValueError, match="is an existing file, not a folder"):
        launch(cfg)
    assert os.listdir(tmp_path) == ["FILE"]


@pytest.mark.distributed
def test_a_config_error_inside_spawned_ranks_is_one_line_and_no_record(tmp_path, capsys):
    code = main(["train", "--dataset", SMALL, "--batch-size", "601", "--nproc", "2", "--grid", "1x1x2x1",
                 "--data-root", str(tmp_path / "data"), "--out", str(tmp_path / "runs"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err == ("scalegnn: error: batch size must be between 2 and N=600, got 601; "
                                 "use --batch-ratio 1.0 for full-graph training\n")
    assert not (tmp_path / "runs").exists()


# ----------------------------------------------------------------------------- output locations
def _bad_outputs(tmp_path: Path) -> dict[str, tuple[list[str], str]]:
    """{case: (arguments, message)}; ``FILE`` is an existing file."""
    file = tmp_path / "FILE"
    return {
        "--out file": (["--out", str(file)], f"--out {file} is an existing file, not a folder"),
        "--out under a file": (["--out", str(file / "runs")],
                               f"--out {file / 'runs'} cannot be created: {file} is a file, not a folder"),
        "--out /proc": (["--out", "/proc/scalegnn-test/runs"],
                        "--out /proc/scalegnn-test/runs cannot be created in /proc ("),
        "--out /sys": (["--out", "/sys/scalegnn-test"], "--out /sys/scalegnn-test cannot be created in /sys ("),
        "--checkpoint-dir file": (["--checkpoint-dir", str(file), "--checkpoint-every", "2"],
                                  f"--checkpoint-dir {file} is an existing file, not a folder"),
        "--profile file": (["--profile", str(file)], f"--profile {file} is an existing file, not a folder"),
        "--nproc 2 --out file": (["--nproc", "2", "--grid", "1x2x1x1", "--out", str(file)],
                                 f"--out {file} is an existing file, not a folder"),
        "graphsage --out file": (["--system", "graphsage", "--out", str(file)],
                                 f"--out {file} is an existing file, not a folder"),
    }


BAD_OUTPUTS = list(_bad_outputs(Path("/x")))


@pytest.mark.parametrize("case", BAD_OUTPUTS)
def test_an_unusable_output_folder_is_one_line_before_any_work(tmp_path, capsys, monkeypatch, isolated_data, case):
    """``--out`` at a file or at /proc or /sys, ``--checkpoint-dir`` and ``--profile`` at
    a file were found only after training (the finished run lost, or a failed record
    for a run that had trained); now one line naming the flag, the path, the problem
    and the fix, before any data is loaded or any rank spawned, for one process,
    ``--nproc`` and a compared system alike."""
    if case.endswith("/sys") and not Path("/sys").is_dir():
        pytest.skip("no /sys here")
    argv, message = _bad_outputs(tmp_path)[case]
    (tmp_path / "FILE").write_text("keep me")
    refuse_work(monkeypatch)
    base = ["train", "--dataset", TINY, "--epochs", "1", "--quiet", "--out", str(tmp_path / "runs")]
    err = one_line_error(capsys, base + argv)
    assert message in err and "pass a folder you can write to" in err, err
    assert (tmp_path / "FILE").read_text() == "keep me"
    assert [p.name for p in tmp_path.iterdir()] == ["FILE"]  # no record, no folder, no data cache
