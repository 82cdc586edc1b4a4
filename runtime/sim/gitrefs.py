"""Edge: the policy directory as it is at a git ref, extracted into a temporary folder."""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path, PurePosixPath


class RefError(ValueError):
    """A ref or path git cannot give; one line with git's own message."""


def policy_at(repo: Path, ref: str, policy_path: str, into: Path) -> Path:
    """Extract the folder holding ``policy_path`` at ``ref`` (the policy and the model configs
    it names relative to itself) under ``into``; returns the policy file's path there."""
    folder = str(PurePosixPath(policy_path).parent) or "."
    result = subprocess.run(
        ["git", "-C", str(repo), "archive", "--format=tar", ref, "--", folder],
        capture_output=True,
        check=False,
    )
    if result.returncode != 0:
        message = result.stderr.decode(errors="replace").strip().splitlines()
        raise RefError(
            f"{repo}: cannot read {folder!r} at {ref!r}: {message[-1] if message else 'git failed'}"
        )
    with tarfile.open(fileobj=io.BytesIO(result.stdout)) as archive:
        archive.extractall(into, filter="data")
    path = into / policy_path
    if not path.is_file():
        raise RefError(f"{repo}: {policy_path} does not exist at {ref!r}")
    return path
