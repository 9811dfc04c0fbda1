"""MkDocs hook: a page line ``<!-- include: PATH -->`` is replaced by the repository
file PATH (relative to the repository root), so the READMEs that live beside the code
(results/README.md, sweeps/README.md, baselines/README.md, scalegnn/datasets/README.md)
are published as they are, never copied. ``<!-- include: PATH#NAME -->`` takes only the
fenced code block that follows the line ``<!-- example: NAME -->`` in PATH (the README's
Python example, which tests/integration/test_api.py runs); ``<!-- include: PATH#section=TITLE -->``
takes the section of PATH under the heading TITLE, to the next heading of its level or
above (the settings table on the API page).

Links in an included file are written for GitHub, relative to that file: a link to
another repository file becomes its path in code (the site does not hold it), and an
in-page anchor is given the slug Python-Markdown's table of contents makes (GitHub keeps
one hyphen per removed character, ``#a--b``; Python-Markdown collapses them, ``#a-b``).
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

from mkdocs.exceptions import PluginError

INCLUDE = re.compile(r"^<!-- include: (\S+) -->[ \t]*$", re.M)
LINK = re.compile(r"(?<!!)\[([^\]]+)\]\(([^)\s]+)\)")


def _relink(text: str, source: str) -> str:
    folder = posixpath.dirname(source)

    def one(match: re.Match) -> str:
        label, target = match.groups()
        if target.startswith("#"):
            return f"[{label}](#{re.sub(r'-+', '-', target[1:])})"
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            return match.group(0)
        path = posixpath.normpath(posixpath.join(folder, target.split("#")[0]))
        return f"`{path}`" if label.strip("`") == path else f"{label} (`{path}`)"

    # code blocks are left as they are: only the prose between the fences is relinked
    parts = re.split(r"(^[ \t]*```.*?^[ \t]*```[ \t]*$)", text, flags=re.M | re.S)
    return "".join(part if part.lstrip().startswith("```") else LINK.sub(one, part) for part in parts)


def on_page_markdown(markdown: str, page, config, files) -> str:
    root = Path(config.config_file_path).resolve().parent

    def include(match: re.Match) -> str:
        source, _, example = match.group(1).partition("#")
        path = (root / source).resolve()
        if root not in path.parents or not path.is_file():
            raise PluginError(f"{page.file.src_path}: cannot include {source!r}: no such file in the repository")
        text = path.read_text(encoding="utf-8")
        if example.startswith("section="):
            title = example[len("section="):].replace("_", " ")
            head = re.search(rf"^(#+) {re.escape(title)}[ \t]*$", text, re.M)
            if not head:
                raise PluginError(f"{page.file.src_path}: {source} has no heading {title!r}")
            end = re.compile(rf"^#{{1,{len(head.group(1))}}} ", re.M).search(text, head.end())
            return _relink(text[head.end():end.start() if end else len(text)].strip() + "\n", source)
        if example:
            block = re.search(rf"<!-- example: {re.escape(example)} -->\s*(```.*?\n```)", text, re.S)
            if not block:
                raise PluginError(f"{page.file.src_path}: {source} has no block marked <!-- example: {example} -->")
            return block.group(1)
        return _relink(text, source)

    return INCLUDE.sub(include, markdown)
