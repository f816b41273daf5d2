"""The README and the docs site's pages: every relative link names a file that exists (mkdocs
checks the site's own links and anchors in `make docs`; this also covers README.md and links
out of docs/), the README stays short, and the docs pins agree."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def relative_links(text: str) -> list[str]:
    """The targets of the Markdown links outside code (fenced blocks and inline spans)."""
    text = re.sub(r"^\s*```.*?^\s*```", "", text, flags=re.S | re.M)
    text = re.sub(r"`[^`\n]*`", "", text)
    targets = [m.group(1) for m in LINK.finditer(text)]
    return [t for t in targets if not re.match(r"^([a-z][a-z0-9+.-]*:|#)", t)]


def test_the_link_parser_sees_links_but_not_code() -> None:
    text = "[a](docs/x.md#s) ![i](img/p.png) [w](https://e.org) [h](#top) `[c](no.md)`\n"
    text += "```\n[d](no.md)\n```\n"
    assert relative_links(text) == ["docs/x.md#s", "img/p.png"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    missing = [
        target
        for target in relative_links(page.read_text(encoding="utf-8"))
        if not (page.parent / target.split("#", 1)[0]).exists()
    ]
    assert not missing, f"{page.relative_to(ROOT)}: links to missing files {missing}"


def test_readme_fits_in_12_kib() -> None:
    assert len((ROOT / "README.md").read_bytes()) <= 12_288


def test_every_page_is_in_the_nav() -> None:
    """The page list in mkdocs.yml names every page in docs/ (mkdocs --strict fails otherwise;
    this says which one without mkdocs installed)."""
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    named = set(re.findall(r":\s*([\w./-]+\.md)\s*$", nav, flags=re.M))
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert pages <= named, f"pages missing from mkdocs.yml's nav: {sorted(pages - named)}"


def test_docs_pins_agree() -> None:
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]["docs"]
    lines = (ROOT / "requirements" / "docs.txt").read_text().splitlines()
    pins = [line for line in lines if line and not line.startswith("#")]
    assert sorted(extra) == sorted(pins)
