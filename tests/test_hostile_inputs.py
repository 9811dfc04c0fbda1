r"""Hostile and careless files (issue K): no code runs from data, bad data is refused
before any work with one line naming the file, the problem and the fix, and no
record, shard or checkpoint is left half-written.

These failed before their fix (shown on the unfixed code; see the commits that added them):

- a crafted Planetoid ``ind.*`` pickle, a crafted LINKX ``.npy`` and a crafted ogb
  ``processed/data_processed`` ran code when loaded (``pickle.load``,
  ``np.load(allow_pickle=True)``, ``torch.load(weights_only=False)``);
- an empty graph npz crashed ("zero-size array to reduction operation maximum");
  fractional or NaN vertex ids (edges, CSR, splits) were truncated and training
  reported ``ok``;
- a checkpoint file of random bytes (or a crafted pickle) gave torch's six-line
  message suggesting ``weights_only=False`` (an empty one already gave one line); a
  corrupt newest ``meta.json`` made ``--resume`` fall back to an older checkpoint
  without a word;
- a newline in ``scalegnn sweep --account`` (or a profile's ``slurm.account`` /
  ``flux.bank``, a spec's ``name``) ended its ``#SBATCH`` / ``# flux:`` directive and put
  a shell line into the batch script; ``$(...)`` and backticks in a profile's ``[env]``
  value ran when the script exported it.
- ``--out`` at an existing file or at /proc or /sys, ``--checkpoint-dir`` or
  ``--profile`` at a file were found only after training (the run lost, a traceback,
  or a ``failed`` record for a run that had trained), for one process, ``--nproc``
  and the compared systems; ``scalegnn data shard --out <file>`` gave a traceback.

==============================================  =====================================================
input                                           message (one line; exit 2 for the CLI)
==============================================  =====================================================
crafted ``ind.cora.graph`` (os.system)          <file>: refusing to load it: it holds a pickled
                                                reference to posix.system, which a Planetoid ind.* file
                                                never contains, and unpickling it could run code;
                                                replace it with the original from <source>
crafted LINKX split ``.npy``                    same, "a LINKX split file", replace it with <source>
crafted ogb ``processed/data_processed``        same, "delete the processed folder next to it (ogb
                                                rebuilds it from raw/)"
npz with 0 vertices                             <npz>: 'x' has 0 rows: the graph has no vertices; save
                                                x as an (N, F) array with N >= 1 rows, one per vertex
npz with ids 0.5 / NaN (edge_index, indices,    <npz>: 'edge_index' holds non-integer vertex ids
train_idx ...)                                  (first: 0.5); save it as an int64 array of the
                                                intended ids
checkpoint rank file of random bytes / empty /  <file>: cannot be read (UnpicklingError: Unsupported
a pickle that runs code                         operand 64); it is truncated, corrupt or not written by
                                                scalegnn. Remove this checkpoint folder to resume from
                                                an older one
corrupt newest ``meta.json``                    UserWarning: <meta.json>: not valid JSON (...); this
                                                checkpoint is ignored; resuming from the older <folder>
                                                (remove <folder> to silence this warning)
``sweep --account $'m1234\ntouch X'`` (SLURM,   --account 'm1234\ntouch X': '\n' cannot go into a
Flux), ``--dry-run`` or not                     batch script line (allowed: letters, digits and
                                                _.,:+=@/-); give the account alone, e.g. --account
                                                m1234
``slurm.account`` / ``flux.bank`` with a        slurm.account 'm1234\ntouch X': ... correct it in
newline in a profile file                       <profile>
``$(touch X)`` / backticks in an ``[env]``      (no error) exported double-quoted as the literal text;
value                                           only ``$NAME`` / ``${NAME}`` references expand
``--out``/``--checkpoint-dir``/``--profile``   --out <file> is an existing file, not a folder; pass a
at a file (train, ``--nproc``, a compared       folder you can write to (it is created if missing)
system; ``data shard --out``)
``--out <file>/runs``                           --out <file>/runs cannot be created: <file> is a file, not
                                                a folder; pass a folder ...
``--out /proc/x/runs``, ``--out /sys/x``        --out /sys/x cannot be created in /sys (Permission
                                                denied); pass a folder you can write to ...
==============================================  =====================================================
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from scalegnn.cli import main


REPO = Path(__file__).resolve().parents[1]


class RunsCode:
    """Unpickling this calls ``os.system("touch <marker>")``: the marker file exists
    afterwards exactly when a loader ran code from the file."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def one_line_error(capsys, argv) -> str:
    """Run the CLI, expect the user-error exit (2) and exactly one stderr line."""
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("scalegnn: error: "), (code, err)
    return err


# ----------------------------------------------------------------------------- bad checkpoints
SMALL = "csbm:n=600,avg_degree=8,classes=4,feature_dim=16"


def _train_argv(tmp_path, *extra):
    return ["train", "--dataset", SMALL, "--data-root", str(tmp_path / "data"), "--out", str(tmp_path / "runs"),
            "--quiet", "--layers", "2", "--hidden", "16", "--epochs", "1", "--checkpoint-every", "4",
            "--checkpoint-dir", str(tmp_path / "ck"), "--resume", *extra]


def _records(tmp_path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in (tmp_path / "runs").glob("*.json")}


@pytest.mark.parametrize("content", [b"random", b"", b"pickle"])
def test_an_unreadable_checkpoint_file_is_one_line_naming_it_and_the_fix(tmp_path, capsys, content):
    """Random bytes gave torch's six-line message that suggests weights_only=False."""
    from scalegnn import checkpoint as ck

    assert main(_train_argv(tmp_path)) == 0
    capsys.readouterr()
    before = _records(tmp_path)
    rank_file = ck.latest(tmp_path / "ck") / "rank-00000.pt"
    data = {b"random": np.random.default_rng(0).bytes(4096), b"": b"",
            b"pickle": pickle.dumps(RunsCode(tmp_path / "pwned"), protocol=2)}[content]
    rank_file.write_bytes(data)
    err = one_line_error(capsys, _train_argv(tmp_path))
    assert str(rank_file) in err and "cannot be read" in err, err
    assert "Remove this checkpoint folder" in err and "weights_only" not in err, err
    assert _records(tmp_path) == before  # the finished run's record is untouched
    assert not (tmp_path / "pwned").exists()


def test_a_corrupt_newest_meta_json_warns_by_name_and_falls_back(tmp_path, capsys):
    """A corrupt newest meta.json made --resume fall back to an older checkpoint silently."""
    from scalegnn import checkpoint as ck

    assert main(_train_argv(tmp_path)) == 0  # 10 steps: the checkpoints of steps 4 and 8 are kept
    capsys.readouterr()
    (older, _, _), (_, path, _) = ck.list_checkpoints(tmp_path / "ck")
    meta = path / "meta.json"
    meta.write_text('{"format": 1, "st')
    with pytest.warns(UserWarning, match=rf"{meta}: .*not valid JSON.*ignored; resuming from the older"):
        assert ck.latest(tmp_path / "ck").name == f"step-{older:09d}"
    cli = subprocess.run([sys.executable, "-m", "scalegnn", *_train_argv(tmp_path)], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=str(REPO), timeout=120)
    assert cli.returncode == 0 and f"UserWarning: {meta}: not valid JSON" in cli.stderr, cli.stderr
    (rec,) = [json.loads(text) for text in _records(tmp_path).values()]
    assert rec["status"] == "ok" and rec["resumed"][-1]["step"] == older


# ----------------------------------------------------------------------------- output locations
TINY = "csbm:n=400,avg_degree=8,classes=3,feature_dim=8"


def _refuse_work(monkeypatch):
    """Loading data or spawning ranks fails the test: every output folder must be
    checked before either (the bad path used to surface after training)."""
    import scalegnn.datasets
    import scalegnn.launch.job

    def refuse(*args, **kwargs):
        raise AssertionError("work started before the output folders were checked")

    monkeypatch.setattr(scalegnn.datasets, "load_dataset", refuse)
    monkeypatch.setattr(scalegnn.launch.job.LocalJob, "start", refuse)


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
    _refuse_work(monkeypatch)
    base = ["train", "--dataset", TINY, "--epochs", "1", "--quiet", "--out", str(tmp_path / "runs")]
    err = one_line_error(capsys, base + argv)
    assert message in err and "pass a folder you can write to" in err, err
    assert (tmp_path / "FILE").read_text() == "keep me"
    assert [p.name for p in tmp_path.iterdir()] == ["FILE"]  # no record, no folder, no data cache


def test_data_shard_into_an_existing_file_is_one_line_and_writes_nothing(tmp_path, capsys, monkeypatch, isolated_data):
    """``scalegnn data shard --out <existing file>`` gave a FileExistsError traceback."""
    out = tmp_path / "FILE"
    out.write_text("keep me")
    _refuse_work(monkeypatch)
    err = one_line_error(capsys, ["data", "shard", TINY, "--grid", "1x2x1x1", "--out", str(out)])
    assert f"--out {out} is an existing file, not a folder; pass a folder you can write to" in err, err
    assert out.read_text() == "keep me" and [p.name for p in tmp_path.iterdir()] == ["FILE"]  # nothing written
