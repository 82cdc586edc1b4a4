"""The repository stands alone: no tracked file reads or links a path outside it.

A user's clone has nothing beside it, so a test, a doc or product text that names a sibling
folder (the team's ``../shared`` with its CRDs, traces and notes) works only on the machine it
was written on. Vendor what is needed instead (tests/fixtures/crds/, runtime/sim/data/) and
cite upstream sources by repository, commit and path. Checked in every file ``git ls-files``
lists (text files; this one excepted: its examples are what it looks for):

- the strings ``../shared`` and ``/shared/``, and the team notes' names (``FACTS.md``,
  ``DESIGN.md``, ``STYLE.md``) unless the repository holds a file of that name;
- markdown links ``[text](target)``, reference definitions ``[id]: target`` and HTML
  ``src``/``href`` attributes in markdown whose relative target resolves outside the root;
- in files other than Python, relative paths (``../...``) that climb above the root from the
  file's own folder (how a policy's ``hf_config`` or a kustomization resolves them);
- Python that climbs from ``__file__`` above the root (``parents[N]``, ``.parent`` chains).
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import pytest

ROOT = Path(__file__).resolve().parents[1]
SELF = PurePosixPath(Path(__file__).resolve().relative_to(ROOT).as_posix())

OUTSIDE_STRINGS = ("../shared", "/shared/")
"""Strings that name the sibling folder, however they are spelled around it."""

TEAM_NOTES = ("FACTS.md", "DESIGN.md", "STYLE.md")
"""Files of the sibling folder that product text used to cite instead of upstream sources."""

INLINE_LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_LINK = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.M)
HTML_LINK = re.compile(r"""\b(?:src|href)\s*=\s*["']([^"']+)["']""", re.I)
RELATIVE_PATH = re.compile(r"(?<![\w.\-/~$*])((?:\.\./)+[\w.\-/]*)")
FILE_CLIMB = re.compile(
    r"__file__\s*\)(?:\s*\.\s*(?:resolve|absolute)\s*\(\s*\))?"
    r"((?:\s*\.\s*(?:parents\s*\[\s*\d+\s*\]|parent\b))+)"
)
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*:")


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.what}"


def tracked_files() -> list[PurePosixPath]:
    """``git ls-files`` of the repository (files deleted from the work tree left out)."""
    try:
        out = subprocess.run(
            ["git", "-C", str(ROOT), "ls-files", "-z"],
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"needs git and a git checkout of the repository to list its files: {exc}")
    names = [PurePosixPath(n) for n in out.decode().split("\0") if n]
    return [n for n in names if (ROOT / n).is_file()]


def _text(path: Path) -> str | None:
    data = path.read_bytes()
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _line(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def _escapes(base: PurePosixPath, target: str) -> bool:
    """Whether ``target``, relative to the folder ``base`` (repo-relative), leaves the root."""
    depth = 0 if target.startswith("/") else len(base.parts)
    for part in PurePosixPath(target.lstrip("/")).parts:
        if part == "..":
            depth -= 1
            if depth < 0:
                return True
        elif part != ".":
            depth += 1
    return False


def _link_target(raw: str) -> str | None:
    """The path part of a link target, or None for URLs, anchors and template text."""
    if SCHEME.match(raw) or raw.startswith(("#", "//")) or "{" in raw or "$" in raw:
        return None
    path = re.split(r"[#?]", raw, maxsplit=1)[0]
    return path or None


def _climb(chain: str) -> int:
    """Folders ``chain`` climbs from the file: ``.parent`` one, ``.parents[N]`` N + 1."""
    levels = 0
    for match in re.finditer(r"parents\s*\[\s*(\d+)\s*\]|parent\b", chain):
        levels += int(match.group(1)) + 1 if match.group(1) is not None else 1
    return levels


def findings(name: PurePosixPath, text: str, names: set[str]) -> list[Finding]:
    """Every way ``text`` (the file ``name``) reads or links a path outside the repository."""
    where = str(name)
    folder = name.parent
    found: list[Finding] = []
    for needle in OUTSIDE_STRINGS:
        for match in re.finditer(re.escape(needle), text):
            found.append(Finding(where, _line(text, match.start()), f"names {needle!r}"))
    for note in TEAM_NOTES:
        if note in names:
            continue
        for match in re.finditer(rf"(?<![\w/.-]){re.escape(note)}", text):
            found.append(
                Finding(where, _line(text, match.start()), f"cites {note}, not in the repo")
            )
    if name.suffix == ".md":
        for pattern in (INLINE_LINK, REFERENCE_LINK, HTML_LINK):
            for match in pattern.finditer(text):
                target = _link_target(match.group(1))
                if target is not None and _escapes(folder, target):
                    found.append(
                        Finding(where, _line(text, match.start()), f"links {match.group(1)!r}")
                    )
    if name.suffix != ".py":  # Python's relative paths are the working folder's, not the file's
        for match in RELATIVE_PATH.finditer(text):
            if _escapes(folder, match.group(1)):
                found.append(
                    Finding(where, _line(text, match.start()), f"climbs out: {match.group(1)!r}")
                )
    else:
        for match in FILE_CLIMB.finditer(text):
            # a file at depth d (folders above it in the repo) reaches the root in d + 1 levels
            if _climb(match.group(1)) > len(folder.parts) + 1:
                found.append(
                    Finding(where, _line(text, match.start()), f"__file__{match.group(1).strip()}")
                )
    return found


@pytest.mark.process
def test_no_tracked_file_reads_or_links_outside_the_repository() -> None:
    files = tracked_files()
    assert PurePosixPath("README.md") in files  # the listing is the repository's
    names = {f.name for f in files}
    problems: list[Finding] = []
    for name in files:
        if name == SELF:  # its examples are the very strings and links it looks for
            continue
        text = _text(ROOT / name)
        if text is not None:
            problems.extend(findings(name, text, names))
    assert not problems, "paths outside the repository:\n" + "\n".join(map(str, problems))


@pytest.mark.parametrize(
    ("name", "text", "what"),
    [
        ("docs/a.md", "see `../shared/crds/README.md`", "names '../shared'"),
        ("tests/x.py", 'Path("/shared/data")', "names '/shared/'"),
        ("runtime/x.py", '"""Names in FACTS.md."""', "cites FACTS.md"),
        ("docs/a.md", "[the CRDs](../../shared/crds/README.md)", "links"),
        ("docs/a.md", "[up](../../README.md#top)", "links"),
        ("README.md", '[up](<../other/README.md> "title")', "links"),
        ("docs/a.md", "[crds]: ../../crds/README.md", "links"),
        ("docs/a.md", '<img src="../../plot.png">', "links"),
        ("tests/sim/data/p.yaml", "hf_config: ../../../../models/x.json", "climbs out"),
        ("tests/infra/t.py", "Path(__file__).resolve().parents[3]", "__file__.parents[3]"),
        ("tests/sim/t.py", "Path(__file__).resolve().parents[2].parent", "__file__"),
        ("bench/t.py", "Path(__file__).parent.parent.parent", "__file__"),
    ],
)
def test_each_way_out_is_found(name: str, text: str, what: str) -> None:
    found = findings(PurePosixPath(name), text, set())
    assert any(f.what.startswith(what) for f in found), found
    assert {(f.path, f.line) for f in found} == {(name, 1)}


@pytest.mark.parametrize(
    ("name", "text", "names"),
    [
        (
            "docs/a.md",
            "[policy](policy.md) [infra](../infra/README.md#x) [web](https://x.io/a)",
            (),
        ),
        ("docs/a.md", "[top](/README.md) [anchor](#tests) [tmpl]({name}.png)", ()),
        ("tests/sim/data/p.yaml", "hf_config: ../../../policy/models/x.json", ()),
        ("tests/infra/t.py", 'write_documents(out, {"../escape.yaml": "x"})', ()),
        ("tests/sim/t.py", 'text.replace("../../../policy/models/", "models/")', ()),
        ("tests/infra/t.py", "ROOT = Path(__file__).resolve().parents[2]", ()),
        ("bench/t.py", "sys.path.insert(0, str(Path(__file__).resolve().parents[1]))", ()),
        ("docs/a.md", "error: GitHub API: POST .../comments: 403", ()),
        ("docs/a.md", "the notes in docs/FACTS.md", ("FACTS.md",)),
    ],
)
def test_paths_inside_the_repository_pass(name: str, text: str, names: tuple[str, ...]) -> None:
    assert findings(PurePosixPath(name), text, set(names)) == []
