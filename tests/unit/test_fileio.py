"""Files and folders the runs write (scalegnn/fileio.py): the output check before any
work. Each command's refusals are in tests/integration/test_launch.py and test_cli.py."""

from __future__ import annotations


def test_the_output_check_leaves_nothing_behind(tmp_path):
    """A folder that does not exist yet is tried where it would be created; the probe
    is removed and no folder is made (a run refused later leaves no empty folder)."""
    from scalegnn.fileio import check_output_folder

    check_output_folder(tmp_path / "new" / "deeper", "--out")
    check_output_folder(tmp_path, "--out")
    assert list(tmp_path.iterdir()) == []
