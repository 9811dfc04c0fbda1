"""The documentation site builds (``mkdocs build --strict``, as ``make docs``) and its API
page is complete: every name ``scalegnn`` exports, every public error a call can raise,
the settings table, and the docstrings' Sphinx roles rendered as links or code, never
as raw ``:class:`` text."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

import scalegnn

ROOT = Path(__file__).resolve().parents[2]

# Exceptions defined in the package that no public call hands to a user: control flow
# between the package's own layers, each caught (and turned into a record or a one-line
# error) before it reaches the caller.
INTERNAL = {
    "scalegnn._numba.Unavailable": "the compiled sampler's absence; the torch path runs instead",
    "scalegnn.checkpoint.Preempted": "a requeued job's stop; the session writes the record",
    "scalegnn.loop.DivergedError": "a NaN loss; the record's status says diverged",
    "scalegnn.session.JobFailed": "a rank's failure, gathered; the record's status says failed",
    "scalegnn.session.OutOfMemory": "the record's status out_of_memory says it",
    "scalegnn.session.DiskFull": "the record is rescued and the run says where",
    "scalegnn.signals.Terminated": "SIGTERM inside a rank, turned into Interrupted",
    "scalegnn.signals.JobEnded": "the scheduler's end of a job, turned into a record",
    "scalegnn.launch.job.WorkerError": "a local worker's failure, turned into the record's status",
    "scalegnn.launch.job.SpawnTimeout": "a worker that did not start, turned into the record's status",
    "scalegnn.datasets.safe_pickle._HoldsTensors": "private",
}


@pytest.fixture(scope="module")
def api_page(tmp_path_factory) -> str:
    pytest.importorskip("mkdocs", reason="the docs extra (pip install -e .[dev] installs it)")
    site = tmp_path_factory.mktemp("site")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    return (site / "api" / "index.html").read_text(encoding="utf-8")


def _anchors(page: str) -> set[str]:
    return set(re.findall(r'id="([A-Za-z_][\w.]*)"', page))


def test_every_exported_name_is_on_the_api_page(api_page):
    shown = {id(_resolve(anchor)) for anchor in _anchors(api_page)} - {id(None)}
    missing = [f"scalegnn.{name}" for name in scalegnn.__all__
               if not name.startswith("__") and id(getattr(scalegnn, name)) not in shown]
    assert not missing, f"exported but not on docs/api.md: {missing}"


def _resolve(path: str):
    """The object a dotted anchor names (a module's attribute, or a class's), else None."""
    parts = path.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr, None)
        return obj
    return None


def _package_exceptions() -> dict[str, type]:
    found = {}
    for info in pkgutil.walk_packages(scalegnn.__path__, "scalegnn."):
        if info.name.rsplit(".", 1)[-1].startswith("_") and info.name != "scalegnn._numba":
            continue
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == info.name:
                found[f"{info.name}.{name}"] = obj
    return found


def test_every_public_error_is_on_the_api_page_or_said_internal(api_page):
    anchors = _anchors(api_page)
    found = _package_exceptions()
    undocumented = sorted(path for path in found if path not in anchors and path not in INTERNAL)
    assert not undocumented, f"errors a user may meet, not on docs/api.md (or INTERNAL with a reason): {undocumented}"
    assert "scalegnn.trained.ModelFileError" in anchors and "scalegnn.graph.GraphValidationError" in anchors
    stale = sorted(path for path in INTERNAL if path not in found and not path.endswith("_HoldsTensors"))
    assert not stale, f"INTERNAL names errors that no longer exist: {stale}"


def test_the_settings_table_and_the_model_are_on_the_api_page(api_page):
    assert "<td><code>--batch-ratio</code></td>\n<td><code>sampling.batch_ratio</code></td>" in api_page
    anchors = _anchors(api_page)
    assert {"scalegnn.model.ScaleGNN.forward", "analysis.load.load_runs"} <= anchors
    assert "scalegnn.analysis.load_runs" in api_page  # the name a user imports


def test_sphinx_roles_are_rendered_not_raw(api_page):
    raw = re.findall(r":(?:class|func|meth|data|mod|attr|exc):`[^`]*`", api_page)
    assert not raw, raw[:5]
    assert 'href="#scalegnn.graph.Graph"' in api_page  # a role that names a documented object links to it
