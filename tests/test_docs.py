"""The docs are a user's map, not a lab notebook: a short README, user pages in docs/*.md that
open with what the reader can do and carry no design, test or measurement sections (those live in
docs/design/ and docs/benchmarks.md), paragraphs a reader can take in, links that resolve, and
product text that speaks of the product only (no briefs, issue numbers or outside paths).

``python tests/test_docs.py`` prints the measurements these rules are drawn from."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README_MAX_LINES = 150
PARAGRAPH_MAX_WORDS = 150
# pages that are measurements by design: figures belong there
MEASUREMENT_PAGES = frozenset({"benchmarks.md"})
NOTEBOOK_HEADING = re.compile(
    r"^#+\s+((design )?choices\b|sources\b|tests\b|measured\b|.*\(measured\))", re.I | re.M
)
OPENING = re.compile(r"\byou (can|will)\b|\blets you\b", re.I)
FORBIDDEN = re.compile(
    r"\bbrief('s)?\b|\bissue\s*#?\s*\d+|\bthe issue('s)?\b|FACTS\.md|\.\./shared"
    r"|search tool|other helpers",
    re.I,
)
CODE_PACKAGES = ("policy", "infra", "alerts", "runtime")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FIGURE = re.compile(r"\b\d+(?:\.\d+)?\s?(?:%|x\b|ms\b|s\b|GiB\b|MiB\b|GB/s\b)")


def user_pages() -> list[Path]:
    return sorted(DOCS.glob("*.md"))


def all_doc_pages() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def prose_blocks(text: str) -> list[str]:
    """Paragraphs and list items outside code fences and tables, each as one line of words."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    blocks: list[str] = []
    for chunk in re.split(r"\n\s*\n", text):
        lines = [ln for ln in chunk.splitlines() if not ln.lstrip().startswith(("|", "#"))]
        item: list[str] = []
        for line in lines:
            if re.match(r"\s*([-*]|\d+\.)\s", line) and item:
                blocks.append(" ".join(item))
                item = []
            item.append(line.strip())
        if item:
            blocks.append(" ".join(item))
    return blocks


def words(block: str) -> int:
    return len(block.split())


def opening_paragraph(text: str) -> str:
    """The first prose paragraph after the page's title."""
    body = text.split("\n", 1)[1] if text.startswith("# ") else text
    for chunk in re.split(r"\n\s*\n", body):
        if chunk.strip() and not chunk.lstrip().startswith("#"):
            return " ".join(chunk.split())
    return ""


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
    seen: dict[str, int] = {}
    out: set[str] = set()
    for heading in re.findall(r"^#+\s+(.*)$", text, flags=re.M):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def product_sources() -> list[Path]:
    return [p for pkg in CODE_PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))]


def test_readme_is_short() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) < README_MAX_LINES, f"README.md has {len(lines)} lines"


@pytest.mark.parametrize("page", [p.name for p in user_pages()])
def test_user_page_opens_with_what_the_reader_can_do(page: str) -> None:
    opening = opening_paragraph((DOCS / page).read_text())
    assert OPENING.search(opening), f"docs/{page} opens with: {opening[:120]}"


@pytest.mark.parametrize("page", [p.name for p in user_pages()])
def test_user_page_paragraphs_are_short(page: str) -> None:
    long = [b[:80] for b in prose_blocks((DOCS / page).read_text()) if words(b) > 150]
    assert not long, f"docs/{page}: paragraphs over {PARAGRAPH_MAX_WORDS} words: {long}"


@pytest.mark.parametrize("page", [p.name for p in user_pages()])
def test_user_page_has_no_notebook_sections(page: str) -> None:
    found = NOTEBOOK_HEADING.findall((DOCS / page).read_text())
    assert not found, f"docs/{page}: move to docs/design/: {found}"


@pytest.mark.parametrize("path", [p.relative_to(ROOT).as_posix() for p in all_doc_pages()])
def test_docs_speak_of_the_product_only(path: str) -> None:
    hits = [m.group(0) for m in FORBIDDEN.finditer((ROOT / path).read_text())]
    assert not hits, f"{path}: {hits}"


def test_code_speaks_of_the_product_only() -> None:
    hits = [
        f"{p.relative_to(ROOT)}:{n}: {line.strip()}"
        for p in product_sources()
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if FORBIDDEN.search(line)
    ]
    assert not hits, "\n".join(hits)


@pytest.mark.parametrize("path", [p.relative_to(ROOT).as_posix() for p in all_doc_pages()])
def test_relative_links_resolve(path: str) -> None:
    page = ROOT / path
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue
        file_part, _, anchor = target.partition("#")
        dest = (page.parent / file_part).resolve() if file_part else page
        found = dest.exists() and (not anchor or dest.suffix != ".md" or anchor in anchors(dest))
        if not found:
            broken.append(target)
    assert not broken, f"{path}: {broken}"


def test_design_notes_link_back_to_a_user_page() -> None:
    orphans = [
        p.name
        for p in sorted((DOCS / "design").glob("*.md"))
        if not re.search(r"\]\(\.\./[\w-]+\.md", p.read_text())
    ]
    assert not orphans, f"docs/design pages that link to no user page: {orphans}"


def test_the_map_lists_every_page() -> None:
    index = (DOCS / "README.md").read_text()
    for section in ("Concepts", "How-to", "Reference", "Runbooks"):
        assert re.search(rf"^## {section}", index, re.M), f"docs/README.md has no {section}"
    missing = [p.name for p in user_pages() if p.name != "README.md" and f"({p.name}" not in index]
    assert not missing, f"docs/README.md does not list {missing}"


def measure() -> None:
    readme = (ROOT / "README.md").read_text()
    print(f"README.md: {len(readme.splitlines())} lines, {len(FIGURE.findall(readme))} figures")
    for page in user_pages():
        text = page.read_text()
        long = [words(b) for b in prose_blocks(text) if words(b) > PARAGRAPH_MAX_WORDS]
        print(
            f"docs/{page.name}: {len(FIGURE.findall(text))} figures, long paragraphs {long}, "
            f"notebook {NOTEBOOK_HEADING.findall(text)}, forbidden {len(FORBIDDEN.findall(text))}"
        )


if __name__ == "__main__":
    measure()
    sys.exit(0)
