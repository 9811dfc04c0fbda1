"""Every bad input of the hostile-case table (tests/hostile.py) is refused in one line.

For each case: the ``scalegnn`` command it builds runs in this process
(:func:`scalegnn.cli.main`), and must exit non-zero with exactly one stderr line
``scalegnn: error: ...`` (no traceback) holding every expected fragment, write no run
record, and, for a crafted pickle, run no code from the file (its canary file is
absent). ``pytest -s tests/unit/test_hostile.py`` prints the counts by category.
"""

from __future__ import annotations

import re

import pytest

import scalegnn.launch.job
from scalegnn.cli import main
from scalegnn.fileio import MEMORY_BUDGET_ENV
from tests.hostile import CANARY, CASES, FAULTS, SIGNALS, STOPS, counts, counts_by_command

BAD_INPUTS = [c for c in CASES if c.kind == "input"]


def test_the_table_counts(capsys):
    by = counts()
    total = sum(v for k, v in by.items() if k.startswith("input:"))
    faults = sum(v for k, v in by.items() if k.startswith("fault:"))
    with capsys.disabled():
        print(f"\nhostile cases: {total} bad inputs, {faults} faults ({sum(f.resumed_equal for f in FAULTS)} "
              "resumed to == epoch rows); by category: " + ", ".join(f"{k} {v}" for k, v in sorted(by.items())))
        print("by command (bad inputs / faults): " + ", ".join(
            f"{command} {row['input']}/{row['fault']}" for command, row in sorted(counts_by_command().items())))
    assert total >= 200 and faults >= 12
    assert len({c.name for c in CASES}) == len(CASES), "case names must be unique"
    assert len({f.name for f in FAULTS}) == len(FAULTS), "fault names must be unique"


@pytest.mark.parametrize("fault", FAULTS, ids=[f.name for f in FAULTS])
def test_every_fault_row_names_a_test_that_exists(fault):
    """A fault runs in its own suite (processes, signals, a small disk): its row names the
    test, which must exist, with the parameter id the row gives."""
    import ast

    from tests.files import REPO

    path, _, rest = fault.test.partition("::")
    name, _, param = rest.partition("[")
    tree = ast.parse((REPO / path).read_text())
    functions = {node.name: node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
    assert name in functions, f"{fault.name}: {fault.test} names no test"
    if param and fault.test.startswith(SIGNALS):
        ids = [f"{launch}-{sig.name}" for launch, sig in STOPS]
        assert param.rstrip("]") in ids, f"{fault.name}: {param} is not one of {ids}"
    elif param:  # a parameter of another test: a string the test file spells (its parametrization's keys)
        strings = {node.value for node in ast.walk(tree)
                   if isinstance(node, ast.Constant) and isinstance(node.value, str)}
        assert param.rstrip("]") in strings, f"{fault.name}: {param} is no parameter of {path}"


@pytest.mark.parametrize("case", BAD_INPUTS, ids=[c.name for c in BAD_INPUTS])
def test_bad_input_is_one_line(case, tmp_path, capsys, monkeypatch, isolated_data):
    def no_workers(*args, **kwargs):
        raise AssertionError("a bad input started worker processes")

    monkeypatch.setattr(scalegnn.launch.job.LocalJob, "start", no_workers)
    monkeypatch.setenv(MEMORY_BUDGET_ENV, "2G")  # the same budget on every machine
    for name, value in case.env:
        monkeypatch.setenv(name, value)
    work = tmp_path / "case"
    work.mkdir()
    argv = case.build(work)
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse: usage, then one line
        code = exc.code
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith(("usage:", " "))]
    assert code not in (0, None), (case.name, out, err)
    assert "Traceback" not in err and len(lines) == 1, (case.name, err)
    assert re.match(r"scalegnn( [a-z-]+)*: error: ", lines[0]), err
    missing = [f for f in case.expect if f not in lines[0]]
    assert not missing, f"{case.name}: {missing} not in: {lines[0]}"
    assert not (work / "runs").exists() or not any((work / "runs").rglob("*.json")), "a record was written"
    if case.canary:
        assert not (work / CANARY).exists(), f"{case.name}: code from the file ran"
