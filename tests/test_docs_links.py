"""Every relative link in README.md and docs/*.md resolves: the file exists, and a #fragment
names a heading of the target (GitHub's anchor rule). Fast, no network."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# Markdown links and images, and HTML src/href attributes.
LINK = re.compile(r"\]\(([^)\s]+)\)|(?:src|href)=\"([^\"]+)\"")


def _strip_code(text: str) -> str:
    """The page without fenced code blocks and inline code (links there are not links)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def _anchor(heading: str) -> str:
    heading = heading.strip().lower()
    heading = re.sub(r"[^\w\- ]", "", heading)
    return heading.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M).splitlines():
        m = re.match(r"^#{1,6} (.+)$", line)
        if not m:
            continue
        base = _anchor(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def _links(page: Path):
    for m in LINK.finditer(_strip_code(page.read_text())):
        target = m.group(1) or m.group(2)
        if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
            continue
        yield target


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    broken = []
    for target in _links(page):
        path, _, fragment = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif fragment and dest.suffix == ".md" and fragment not in _anchors(dest):
            broken.append(f"{target}: no heading #{fragment} in {dest.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_readme_starts_with_the_two_commands():
    """The project rule: README.md starts with `make run` and `make test`; CI runs the latter."""
    head = (ROOT / "README.md").read_text().split("```")[1]
    lines = [ln.split("#")[0].strip() for ln in head.splitlines()[1:] if ln.strip()]
    assert lines == ["make run", "make test"]
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()
    assert ci[-1] == "make test"
