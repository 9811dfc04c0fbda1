"""Griffe extension (mkdocs.yml, the API reference): the docstrings' Sphinx roles
(``:class:`~scalegnn.graph.Graph```, ``:func:``, ``:meth:``, ...) rendered as
cross-references, not as raw text.

A role whose target is documented on the API page (an object ``docs/api.md`` renders
with ``::: path``, or one of its listed ``members``) becomes a link to it (an autorefs
reference ``[`Graph`][scalegnn.graph.Graph]``); any other target, which the site does not
render, becomes its name in code. A leading ``~`` shows the last component only, as
Sphinx does. A relative target (``Graph.gcn_normalize``, ``.sharding.RankShard``) is
resolved against the docstring's module and class.
"""

from __future__ import annotations

import re
from pathlib import Path

import griffe

ROLE = re.compile(r":(?:py:)?(?:class|func|meth|data|mod|attr|exc|obj|const):`(~?)([^`]+)`")
API_PAGE = Path(__file__).resolve().parents[1] / "api.md"


def documented(page: Path = API_PAGE) -> set[str]:
    """The dotted paths the API page renders: each ``::: path`` and its ``members``."""
    text = page.read_text(encoding="utf-8")
    paths = set()
    for match in re.finditer(r"^::: (\S+)((?:\n {4}.*)*)", text, re.M):
        path, options = match.groups()
        paths.add(path)
        members = re.search(r"members:\s*\[([^\]]*)\]", options, re.S)
        for name in (members.group(1).replace("\n", " ").split(",") if members else ()):
            if name.strip():
                paths.add(f"{path}.{name.strip()}")
    return paths


def _candidates(target: str, obj) -> list[str]:
    """Where a role's target may live, the most specific first."""
    target = target.strip().rstrip("()")
    module = obj.module.path if hasattr(obj, "module") else ""
    if target.startswith("."):  # relative: one dot the docstring's package, each more one level up
        dots = len(target) - len(target.lstrip("."))
        return [f"{module.rsplit('.', dots)[0]}.{target.lstrip('.')}"]
    scopes = [obj.path] if getattr(obj, "is_class", False) else []
    if getattr(obj, "parent", None) is not None and getattr(obj.parent, "is_class", False):
        scopes.append(obj.parent.path)
    scopes.append(module)
    return [target] + [f"{scope}.{target}" for scope in scopes if scope]


class SphinxRoles(griffe.Extension):
    def __init__(self) -> None:
        super().__init__()
        self.documented = documented()

    def on_object(self, *, obj, **kwargs) -> None:
        if obj.docstring is None or ":" not in obj.docstring.value:
            return

        def one(match: re.Match) -> str:
            short, target = match.groups()
            shown = target.strip().rstrip("()").lstrip(".")
            shown = shown.rsplit(".", 1)[-1] if short else shown
            for path in _candidates(target, obj):
                if path in self.documented:
                    return f"[`{shown}`][{path}]"
            return f"`{shown}`"

        obj.docstring.value = ROLE.sub(one, obj.docstring.value)
