"""The scripts docs/sites.md shows: each site's fig7 sweep as ``scalegnn sweep --dry-run`` prints it now.

    python -m scalegnn.sweeps.sites            rewrite the generated parts of docs/sites.md in place
    python -m scalegnn.sweeps.sites --check    exit 1 when the page differs from what the sweeps write now

A generated part sits between ``<!-- generated: SITE ... -->`` and ``<!-- end generated: SITE -->``
and is rebuilt whole from the dry run of :data:`EXAMPLES` ``[SITE]``: the command, what the
dry run says first, the staging job that writes :data:`SHOWN_GRAPH`'s shards (out of
core, as the profile's ``[staging]`` says) and the first run job; the jobs left out are
named after it. The dry run is the one a laptop prints before logging in: the site
variables the profiles' paths name (``$PSCRATCH``, ``$USER``) and ``$SCALEGNN_DATA_ROOT``
are left out of its environment, so the paths read ``${PSCRATCH}/...`` and the page is
the same wherever it is generated. tests/harness/test_sites.py keeps the page equal to it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shlex
import sys
from pathlib import Path

__all__ = ["EXAMPLES", "SHOWN_GRAPH", "PAGE", "render_example", "render_page", "main"]

# Each site's worked example: fig7, with accounts in the site's form (Perlmutter charges GPU
# jobs to <project>_g and CPU jobs, the staging, to <project>: docs/sites.md).
EXAMPLES = {
    "perlmutter": ["sweep", "fig7", "--cluster", "perlmutter", "--account", "m1234_g", "--staging-account", "m1234",
                   "--dry-run"],
    "frontier": ["sweep", "fig7", "--cluster", "frontier", "--account", "abc123", "--dry-run"],
    "tuolumne": ["sweep", "fig7", "--cluster", "tuolumne", "--account", "mybank", "--dry-run"],
}
SHOWN_GRAPH = "ogbn-papers100M"  # the staging job shown: the graph staged out of core
PAGE = Path(__file__).resolve().parent.parent / "docs" / "sites.md"
_PART = re.compile(r"^(<!-- generated: (\S+) .*?-->\n)(.*?)^(<!-- end generated: \2 -->)$", re.M | re.S)
_HEADER = "\n# ---- "  # how the dry run starts each job it prints
_JOB_NAME = re.compile(r"scalegnn-[^\s:\[]+")


@contextlib.contextmanager
def _off_site(names):
    """This process's environment without ``names`` while the block runs."""
    saved = {name: os.environ.pop(name) for name in names if name in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def _dry_run(argv: list[str]):
    """(what ``scalegnn *argv`` prints, one entry per line it prints; the sweep's outcome), off the site."""
    from .cli import add_commands, run_sweep
    from .profiles import load_profile

    parser = argparse.ArgumentParser(prog="scalegnn")
    add_commands(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    named: list[str] = ["SCALEGNN_DATA_ROOT"]
    profile = load_profile(args.cluster)
    for name in ("data_root", "out_root"):
        profile.site_path(name, environ={}, unset=named)  # collects the variables the path names
    printed: list[str] = []
    with _off_site(named):
        result = run_sweep(args, lambda text="": printed.append(text))
    return printed, result


def render_example(site: str) -> str:
    """The generated part of docs/sites.md for ``site``: the dry run of ``EXAMPLES[site]``
    as a transcript cut to the staging job of :data:`SHOWN_GRAPH` and the first run job,
    then one line naming what was left out."""
    argv = EXAMPLES[site]
    printed, result = _dry_run(argv)
    start = next(i for i, text in enumerate(printed) if text.startswith(_HEADER))
    jobs: list[list[str]] = []  # each job as printed: its header, its runs or shard sets, its script
    for text in printed[start:]:
        if text.startswith(_HEADER):
            jobs.append([])
        jobs[-1].append(text)
    staging = [job for job in jobs if job[-1] in result.stage_scripts]
    runs = [job for job in jobs if job[-1] in result.scripts]
    shown_staging = [job for job in staging if any(f"data shard {SHOWN_GRAPH} " in line for line in job[:-1])]
    if not shown_staging or not runs:
        raise ValueError(f"the dry run `scalegnn {shlex.join(argv)}` has no staging job of {SHOWN_GRAPH} or no run "
                         "job; give docs/sites.md's example (EXAMPLES in sweeps/sites.py) a sweep that has both")
    shown = [job for job in jobs if any(job is j for j in shown_staging) or job is runs[0]]
    transcript = [f"$ scalegnn {shlex.join(argv)}", *printed[:start], *(text for job in shown for text in job)]
    lines = ["```bash", "\n".join(transcript).rstrip(), "```"]
    left = []
    if len(staging) > len(shown_staging):
        n = len(staging) - len(shown_staging)
        left.append(f"{n} more staging job{'s' if n > 1 else ''} (one per other graph)")
    if len(runs) > 1:
        names = ", ".join(f"`{_JOB_NAME.search(job[0]).group()}`" for job in runs[1:])
        left.append(f"{len(runs) - 1} more run job{'s' if len(runs) > 2 else ''}, alike but for their nodes and "
                    f"runs ({names})")
    if left:
        lines += ["", f"Left out above: the dry run's {' and '.join(left)}."]
    return "\n".join(lines) + "\n"


def render_page(text: str) -> str:
    """``text`` (docs/sites.md) with every generated part rebuilt; a part naming no
    example, or an example with no part, is a ValueError naming it."""
    found = [m.group(2) for m in _PART.finditer(text)]
    unknown = [name for name in found if name not in EXAMPLES]
    missing = [name for name in EXAMPLES if name not in found]
    if unknown or missing:
        raise ValueError(f"docs/sites.md: generated parts {found} do not match the examples {list(EXAMPLES)} of "
                         "sweeps/sites.py; each site needs one `<!-- generated: SITE (...) -->` ... "
                         "`<!-- end generated: SITE -->` pair")
    # blank lines around the part: Markdown ends the marker's HTML block there, not inside the code block
    return _PART.sub(lambda m: m.group(1) + "\n" + render_example(m.group(2)) + "\n" + m.group(4), text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scalegnn.sweeps.sites", description=__doc__.splitlines()[0])
    parser.add_argument("page", nargs="?", default=str(PAGE), help="the page (default: this checkout's docs/sites.md)")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 when the page is not current")
    args = parser.parse_args(argv)
    page = Path(args.page)
    text = page.read_text(encoding="utf-8")
    try:
        current = render_page(text)
    except ValueError as exc:
        print(f"scalegnn.sweeps.sites: error: {exc}", file=sys.stderr)
        return 2
    if current == text:
        print(f"{page}: current")
        return 0
    if args.check:
        print(f"{page}: differs from what the sweeps write now; run `python -m scalegnn.sweeps.sites`", file=sys.stderr)
        return 1
    from scalegnn.fileio import atomic_write

    atomic_write(page, lambda f: f.write(current), text=True)
    print(f"{page}: rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main())
