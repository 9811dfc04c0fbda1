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


def test_the_memory_budget_and_declared_sizes(monkeypatch):
    """A declared size is refused before allocation: above what the file holds for it,
    or above the budget ($SCALEGNN_MEMORY_BUDGET, else this machine's memory); a
    malformed budget is itself one line."""
    import pytest

    from scalegnn.fileio import MEMORY_BUDGET_ENV, check_declared_size, memory_budget

    monkeypatch.delenv(MEMORY_BUDGET_ENV, raising=False)
    assert memory_budget() > 2**20  # this machine's memory
    for text, expected in (("64G", 64 * 2**30), ("512m", 512 * 2**20), ("1.5KiB", 1536), ("4096", 4096)):
        monkeypatch.setenv(MEMORY_BUDGET_ENV, text)
        assert memory_budget() == expected, text
    for bad in ("lots", "-1G", "0"):
        monkeypatch.setenv(MEMORY_BUDGET_ENV, bad)
        with pytest.raises(ValueError, match=MEMORY_BUDGET_ENV):
            memory_budget()
    monkeypatch.setenv(MEMORY_BUDGET_ENV, "1M")
    check_declared_size("f.npy", "'x'", 2**18, 4, fix="re-create it")  # exactly the budget: accepted
    with pytest.raises(ValueError, match=r"f.npy: 'x' declares 262,145 entries \(1.0 MiB\), more than the memory "
                                         r"budget of 1.0 MiB .*; re-create it"):
        check_declared_size("f.npy", "'x'", 2**18 + 1, 4, fix="re-create it")
    with pytest.raises(ValueError, match="but the file holds only 64 B for them; fix"):
        check_declared_size("f.mtx", "the header's entries", 17, 4, available=64, fix="fix")
    with pytest.raises(KeyError):  # the caller's error type
        check_declared_size("f", "n", -1, fix="fix", error=KeyError)


def test_expanded_size_counts_shared_containers_per_reference():
    """A pickle stores a shared list once; a walk visits it once per reference. The
    count takes time in the distinct objects (2,000 rows x 100,000 ids: at once)."""
    import numpy as np

    from scalegnn.datasets.safe_pickle import expanded_size

    shared = list(range(100_000))
    assert expanded_size({i: shared for i in range(2_000)}) == 2 * 2_000 + 2_000 * 100_000
    assert expanded_size([1, [2, 3], (4,)]) == 3 + 2 + 1
    assert expanded_size(np.zeros(10**6)) == 0  # numeric arrays: their bytes are in the file
    loop = [1]
    loop.append(loop)
    assert expanded_size(loop) >= 1 << 62
