"""docs/sites.md shows each site's scripts as the sweeps write them now (sweeps/sites.py).

The page used to hold hand-copied before/after diffs of the dry runs, which went stale as
the profiles and the staging changed (two papers100M shard sets, no out-of-core
staging). Its scripts are now generated parts, rebuilt by ``python -m scalegnn.sweeps.sites``;
these tests fail when the page differs from what that command makes now.
"""

from __future__ import annotations

import re

import pytest

from scalegnn.sweeps import sites
from scalegnn.sweeps.profiles import load_profile

PAGE = sites.PAGE


def _part(text: str, site: str) -> str:
    return re.search(rf"<!-- generated: {site} .*?-->\n(.*?)<!-- end generated: {site} -->", text, re.S).group(1)


def test_the_sites_page_shows_the_scripts_the_sweeps_write_now():
    text = PAGE.read_text(encoding="utf-8")
    assert sites.render_page(text) == text, "docs/sites.md is stale: run `python -m scalegnn.sweeps.sites`"


def test_each_site_shows_its_papers100m_staging_and_a_run_job_charged_as_documented():
    """What the parts hold: the site's staging of ogbn-papers100M out of core with the
    profile's budget, a run job, the accounts of the page's table (Perlmutter's staging
    on the plain project, its GPU jobs on <project>_g), and no change-log diffs."""
    text = PAGE.read_text(encoding="utf-8")
    assert "```diff" not in text and "+++ " not in text
    for site, run_account, stage_account in (("perlmutter", "#SBATCH --account=m1234_g", "#SBATCH --account=m1234"),
                                             ("frontier", "#SBATCH --account=abc123", "#SBATCH --account=abc123"),
                                             ("tuolumne", "# flux: --bank=mybank", "# flux: --bank=mybank")):
        part = _part(text, site)
        budget = load_profile(site).staging.memory_budget
        shard = [line for line in part.splitlines() if "scalegnn data shard ogbn-papers100M " in line]
        assert len(shard) == 1 and shard[0].endswith(f"--memory-budget {budget} --layout blocks"), shard
        staging, run = part.split("\n# ---- ")[1:3]
        assert "staging" in staging.splitlines()[0] and "staging" not in run.splitlines()[0]
        assert f"\n{stage_account}\n" in staging and f"\n{run_account}\n" in run
        assert "afterok" in run and "preflight" in run and "preflight" not in staging
        assert "@unset" not in part and "<ACCOUNT>" not in part  # the off-site paths shown as ${VAR}


def test_a_stale_or_unmarked_page_is_caught(tmp_path, capsys):
    """An edited line in a generated part is put back, and --check says so with exit 1;
    a page without the parts (the old one) is refused naming what is missing."""
    text = PAGE.read_text(encoding="utf-8")
    stale = text.replace("#SBATCH --qos=shared", "#SBATCH --qos=regular", 1)
    assert stale != text and sites.render_page(stale) == text
    page = tmp_path / "sites.md"
    page.write_text(stale)
    assert sites.main(["--check", str(page)]) == 1 and page.read_text() == stale
    assert "differs from what the sweeps write now" in capsys.readouterr().err
    assert sites.main([str(page)]) == 0 and page.read_text() == text
    assert sites.main(["--check", str(page)]) == 0
    unmarked = re.sub(r"<!-- (end )?generated: tuolumne.*?-->\n", "", text)
    with pytest.raises(ValueError, match=r"generated parts \['perlmutter', 'frontier'\] do not match the examples"):
        sites.render_page(unmarked)
