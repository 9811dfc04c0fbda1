"""A disk that fills during a run (scalegnn/records.py's reserve, scalegnn/session.py's
DiskFull): the record is still written, a failed checkpoint save keeps the previous
checkpoint whole, the run ends with one line that says what was kept where, and the
run resumes from it to the uninterrupted epoch rows.

The full disk is real: a 4 MiB tmpfs mounted for the test (root only, as CI runs; the
test is skipped elsewhere, saying so), filled by a thread once the run has started."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from scalegnn import records
from scalegnn.cli import main
from tests.runs import TINY, epoch_rows

pytestmark = pytest.mark.distributed  # a real run per test


@pytest.fixture
def small_disk(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root (CI runs as root)")
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def _fill_when(disk: Path, ready, timeout_s: float = 120.0) -> threading.Thread:
    """A thread that waits for ``ready()`` and then fills ``disk`` to the last byte."""
    def fill():
        end = time.monotonic() + timeout_s
        while not ready() and time.monotonic() < end:
            time.sleep(0.005)
        try:
            with open(disk / "filler", "wb") as f:
                while True:
                    f.write(bytes(16 << 10))
                    f.flush()
        except OSError:  # full: done
            pass
    thread = threading.Thread(target=fill, daemon=True)
    thread.start()
    return thread


def _argv(tmp_path, out, *extra) -> list[str]:
    return ["train", "--dataset", TINY, "--data-root", str(tmp_path / "data"), "--out", str(out), "--batch-size", "100",
            "--hidden", "16", "--layers", "2", "--epochs", "6", "--quiet", *extra]


def test_a_disk_that_fills_during_the_run_keeps_its_record(tmp_path, small_disk, isolated_data, capsys,
                                                           monkeypatch):
    """Filled right after the run set its reserve aside: the record is written in its own
    folder all the same (the reserve given back), and the reserve is gone afterwards."""
    out = small_disk / "runs"
    real_reserve = records.reserve_record_space

    def reserve_then_fill(*args):
        path = real_reserve(*args)
        _fill_when(small_disk, lambda: True).join(30)
        return path

    monkeypatch.setattr(records, "reserve_record_space", reserve_then_fill)
    assert main(_argv(tmp_path, out)) == 0
    (path,) = out.glob("*.json")
    rec = records.read_record(path)
    assert rec["status"] == "ok" and len(rec["epochs"]) == 6
    assert not list(out.glob(".*.reserve")) and (small_disk / "filler").stat().st_size > 3 << 20


def test_a_full_disk_at_a_checkpoint_keeps_the_previous_one_and_the_run_resumes(tmp_path, small_disk, isolated_data,
                                                                               capsys, monkeypatch):
    """Filled as soon as the first checkpoint is complete (in the run's own thread, so at
    that very step): the next save fails, the run ends ``failed`` with one line naming
    the step and the newest whole checkpoint; after space is freed, --resume finishes
    the run with the uninterrupted epoch rows."""
    from scalegnn.checkpoint import Checkpointer

    assert main(_argv(tmp_path, tmp_path / "plain")) == 0
    (plain,) = (tmp_path / "plain").glob("*.json")
    capsys.readouterr()
    out, ck = small_disk / "runs", small_disk / "ck"
    argv = _argv(tmp_path, out, "--checkpoint-dir", str(ck), "--checkpoint-every", "4", "--keep-checkpoints", "1")
    real_save = Checkpointer.save

    def save_then_fill(self, step, engine_state, meta):
        path = real_save(self, step, engine_state, meta)
        if not (small_disk / "filler").exists():
            _fill_when(small_disk, lambda: True).join(30)
        return path

    monkeypatch.setattr(Checkpointer, "save", save_then_fill)
    assert main(argv) == 1
    monkeypatch.setattr(Checkpointer, "save", real_save)
    (path,) = out.glob("*.json")
    rec = records.read_record(path)
    assert rec["status"] == "failed", rec["error"]
    first = sorted(ck.glob("step-*/meta.json"))[0].parent
    assert first.name == "step-000000004"
    assert rec["error"].startswith("rank 0: no space left on device while checkpoint save at step 8 ")
    assert rec["error"].endswith(f"the newest whole checkpoint is {first}: free space, then resume with "
                                 f"--checkpoint-dir {ck} --resume") and "\n" not in rec["error"]
    (small_disk / "filler").unlink()
    assert main(argv + ["--resume"]) == 0
    assert records.read_record(path) == rec  # the failed attempt's record stays; the resume has its own
    (resumed,) = [records.read_record(p) for p in out.glob("*.json") if p != path]
    assert resumed["status"] == "ok" and resumed["resumed"][-1]["checkpoint"] == str(first)
    assert resumed["resumed_from"] == rec["run_id"]
    assert epoch_rows(resumed) == epoch_rows(records.read_record(plain))


def test_a_record_with_no_room_anywhere_in_its_folder_goes_to_a_rescue_folder(tmp_path, small_disk, monkeypatch,
                                                                              capsys):
    """No reserve (the disk was full from the start) and no room: the record goes to
    $SCALEGNN_RESCUE_DIR and one line says where."""
    monkeypatch.setenv("SCALEGNN_RESCUE_DIR", str(tmp_path / "rescue"))
    with open(small_disk / "filler", "wb") as f:
        try:
            while True:
                f.write(bytes(16 << 10))
                f.flush()
        except OSError:
            pass
    rec = {**_minimal(), "run_id": "r-full"}
    assert records.reserve_record_space(small_disk, "r-full", 10) is None
    path = records.write_record(rec, small_disk)
    assert path == tmp_path / "rescue" / "r-full.json" and records.read_record(path)["run_id"] == "r-full"
    err = capsys.readouterr().err
    assert err == f"scalegnn: no space left in {small_disk} for the run record (No space left on device); it is in " \
                  f"{path} instead\n"


def _minimal() -> dict:
    from tests.files import minimal_record

    return minimal_record()


def test_one_run_per_checkpoint_folder(tmp_path, isolated_data, capsys):
    """A second run on a checkpoint folder another run holds is refused in one line that
    names the holder; once the holder is gone the folder is free again (and a failed
    start does not keep it)."""
    from scalegnn.checkpoint import FolderLock

    ck = tmp_path / "ck"
    argv = _argv(tmp_path, tmp_path / "runs", "--checkpoint-dir", str(ck), "--checkpoint-every", "4")
    holder = FolderLock(ck).acquire("r-holder")
    try:
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err == (f"scalegnn: error: {ck} is in use by run r-holder, pid {os.getpid()} on host "
                       f"{__import__('socket').gethostname()}: one run per checkpoint folder; wait for it to end, "
                       "or give this run another --checkpoint-dir\n"), err
    finally:
        holder.release()
    assert main(argv + ["--epochs", "1"]) == 0
    FolderLock(ck).acquire().release()  # the finished run let go


def _fill(disk: Path) -> None:
    """``disk`` full to the last byte (what a run that started on it would meet)."""
    _fill_when(disk, lambda: True).join(60)


def _record_folder(tmp_path: Path) -> Path:
    """A folder holding one run record, for the commands that read records."""
    from tests.files import minimal_record

    folder = tmp_path / "records"
    records.write_record(minimal_record(), folder)
    return folder


# Every command's outputs on a full disk (issue X): refused before any work in one line
# naming the folder and its free space; nothing half-written left on the disk.
FULL_AT_START = {
    "train": lambda tmp, disk: _argv(tmp, disk / "runs"),
    "train --checkpoint-dir": lambda tmp, disk: _argv(tmp, tmp / "runs", "--checkpoint-dir", str(disk / "ck"),
                                                      "--checkpoint-every", "4"),
    "export": lambda tmp, disk: ["export", str(_checkpoint(tmp)), "--out", str(disk / "model.pt")],
    "data generate": lambda tmp, disk: ["data", "generate", "csbm:n=1000", "--out", str(disk / "gen")],
    "data shard": lambda tmp, disk: ["data", "shard", TINY, "--grid", "1x1x1x1", "--data-root", str(tmp / "data"),
                                     "--out", str(disk / "shards")],
    "demo": lambda tmp, disk: ["demo", "--out", str(disk / "demo")],
    "report": lambda tmp, disk: ["report", str(_record_folder(tmp)), "--out", str(disk / "report")],
    "sweep": lambda tmp, disk: ["sweep", "fig5", "--cluster", "local", "--gpus", "1", "--epochs", "1", "--systems",
                                "scalegnn", "--out", str(disk / "sweep")],
    "tune": lambda tmp, disk: ["tune", "--dataset", TINY, "--target", "0.5", "--epochs", "1", "--budget", "12",
                               "--out", str(disk / "tune")],
}


def _checkpoint(tmp: Path) -> Path:
    assert main(_argv(tmp, tmp / "runs", "--checkpoint-dir", str(tmp / "ck"), "--checkpoint-every", "4")) == 0
    return tmp / "ck"


@pytest.mark.parametrize("command", sorted(FULL_AT_START))
def test_a_full_disk_is_one_line_before_any_work_on_every_command(command, tmp_path, small_disk, isolated_data,
                                                                   capsys, monkeypatch):
    import scalegnn.launch

    argv = FULL_AT_START[command](tmp_path, small_disk)
    _fill(small_disk)
    monkeypatch.setattr(scalegnn.launch, "first_line", lambda *a: pytest.fail("a run started on a full disk"))
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code not in (0, None) and len(lines) == 1 and "Traceback" not in err, (command, err)
    assert lines[0].startswith("scalegnn: error: ") and str(small_disk) in lines[0] and "free" in lines[0], lines
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler"], "something was written on the full disk"


def test_a_disk_that_fills_during_data_generate_is_one_line_and_leaves_nothing(tmp_path, small_disk, capsys):
    """Room at the start (the 4 MiB disk is empty), not for the whole graph: the write that
    finds the disk full is one line naming the file, and the half-written graph is removed."""
    out = small_disk / "gen"
    code = main(["data", "generate", "csbm:n=400000,avg_degree=16", "--out", str(out), "--chunk-edges", "100000"])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 1 and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("scalegnn: error: ") and "No space left on device" in lines[0], lines
    assert not out.exists()


def test_a_disk_that_fills_during_export_is_one_line(tmp_path, small_disk, isolated_data, capsys):
    ck = tmp_path / "ck"
    argv = _argv(tmp_path, tmp_path / "runs", "--checkpoint-dir", str(ck), "--checkpoint-every", "4")
    argv[argv.index("--hidden") + 1] = "1024"  # a model file of about 9 MB: more than the disk holds
    assert main(argv) == 0
    capsys.readouterr()
    code = main(["export", str(ck), "--out", str(small_disk / "model.pt")])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 1 and len(lines) == 1 and "Traceback" not in err, err
    assert "No space left on device" in lines[0] and not list(small_disk.iterdir())
