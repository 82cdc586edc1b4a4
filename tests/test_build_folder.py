"""``.gitignore``, the README and the docs agree on ``build/``: gpupool's own checkout ignores
it (renders of the packaged example, the demo's replay), and every place that says to commit
it says where: in the policy repository."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COMMIT_BUILD = re.compile(r"commit `?build/", re.IGNORECASE)
OWN_CHECKOUT = "gpupool's own checkout ignores `build/`"


def _paragraphs(path: Path) -> list[str]:
    return re.split(r"\n\s*\n", path.read_text())


@pytest.mark.process
def test_gpupool_checkout_ignores_build_and_the_readme_says_so() -> None:
    ignored = [ln.strip() for ln in (ROOT / ".gitignore").read_text().splitlines()]
    assert "build/" in ignored
    assert OWN_CHECKOUT in " ".join((ROOT / "README.md").read_text().split())
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: git check-ignore cannot confirm the rule")
    check = subprocess.run(
        ["git", "-C", str(ROOT), "check-ignore", "-q", "build/kustomization.yaml"], check=False
    )
    assert check.returncode == 0  # 0: ignored


@pytest.mark.parametrize(
    "doc", ["README.md", *sorted(p.name for p in (ROOT / "docs").glob("*.md"))]
)
def test_every_commit_build_names_the_policy_repository(doc: str) -> None:
    path = ROOT / doc if doc == "README.md" else ROOT / "docs" / doc
    for paragraph in _paragraphs(path):
        if COMMIT_BUILD.search(paragraph):
            assert "policy repository" in " ".join(paragraph.split()), paragraph
