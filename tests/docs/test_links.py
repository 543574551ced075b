"""Relative links in README.md and docs/*.md point to files that exist and to headings that exist in them."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Pages other people own: a link to one that has not landed yet is allowed; their own links are not checked here.
NOT_OURS = frozenset({"performance.md", "reclaim-study.md", "reliability.md"})
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
_CODE = re.compile(r"`[^`\n]*`")


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name not in NOT_OURS)]


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation other than ``-`` and ``_`` dropped, spaces to ``-``."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = _FENCE.sub("", path.read_text(encoding="utf-8"))
    out: set[str] = set()
    for heading in re.findall(r"^#{1,6} (.+)$", text, re.MULTILINE):
        base = anchor(heading)
        name, n = base, 1
        while name in out:  # GitHub numbers repeated headings: x, x-1, x-2
            name, n = f"{base}-{n}", n + 1
        out.add(name)
    return out


def links(path: Path) -> list[str]:
    text = _CODE.sub("", _FENCE.sub("", path.read_text(encoding="utf-8")))
    return _LINK.findall(text)


def test_relative_links_resolve() -> None:
    problems: list[str] = []
    for page in pages():
        for target in links(page):
            if re.match(r"^[a-z]+:", target):
                continue  # http(s), mailto
            file_part, _, fragment = target.partition("#")
            dest = (page.parent / file_part).resolve() if file_part else page
            where = f"{page.relative_to(ROOT)}: ({target})"
            if not dest.exists():
                if dest.name not in NOT_OURS:
                    problems.append(f"{where}: {file_part} does not exist")
                continue
            if fragment and dest.suffix == ".md" and fragment not in anchors(dest):
                problems.append(f"{where}: no heading #{fragment} in {dest.relative_to(ROOT)}")
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_anchor_rules() -> None:
    assert anchor("`nvmlcheck/snapshot`") == "nvmlchecksnapshot"
    assert anchor("Quick start") == "quick-start"
    assert anchor("`Session.wait_until_clean`") == "sessionwait_until_clean"
