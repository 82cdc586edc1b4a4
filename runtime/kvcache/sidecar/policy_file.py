"""Edge: the sidecar's policy file, re-read between polls so a ``pulumi up`` reaches it.

The file is the ``gpupool-policy`` ConfigMap mounted as a volume. The kubelet updates such a
volume by writing the new data into a fresh timestamped directory and swapping the ``..data``
symlink that ``pool.yaml`` points through, so every open sees one whole version. Each poll
reads the file (a few KiB; the ``/metrics`` page scraped in the same poll is larger) and
compares its SHA-256 with the last version seen: only a new version is parsed and validated,
and a rejected version is reported once, not on every poll. A content hash rather than the
resolved path or mtime catches plain in-place edits too, whatever the file system's timestamp
granularity, and ignores swaps that change nothing.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from policy import PolicyError, PoolPolicy, Problem, parse_policy
from policy.loader import parse_document, read_text

Outcome = Literal["unchanged", "loaded", "rejected"]


@dataclass(frozen=True)
class Reload:
    """What one look at the file found."""

    outcome: Outcome
    policy: PoolPolicy | None = None
    """The new policy (``loaded`` only)."""
    problems: tuple[Problem, ...] = ()
    """Why the new version was refused (``rejected`` only), as ``FILE:LINE`` problems."""


class PolicyFile:
    """One policy file and the versions of it already seen."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.digest: str | None = None
        """SHA-256 of the version in use (the last one that validated)."""
        self.generation = 0
        """How many versions have been put in use (1 after the first load)."""
        self._seen: str | None = None

    def load(self) -> PoolPolicy:
        """The first read, at start: with no last good policy to keep, a bad file is fatal."""
        reload = self.refresh()
        if reload.policy is None:
            raise PolicyError(list(reload.problems))
        return reload.policy

    def refresh(self) -> Reload:
        """Read the file; a version not seen before is validated (``loaded`` or ``rejected``)."""
        try:
            text = read_text(self.path)
        except PolicyError as exc:
            return self._reject(_digest(f"unreadable\0{exc}"), exc)
        digest = _digest(text)
        if digest in (self._seen, self.digest):
            self._seen = digest
            return Reload("unchanged")
        try:
            policy = parse_policy(parse_document(text, str(self.path)), str(self.path))
        except PolicyError as exc:
            return self._reject(digest, exc)
        self._seen = self.digest = digest
        self.generation += 1
        return Reload("loaded", policy=policy)

    def _reject(self, digest: str, error: PolicyError) -> Reload:
        if digest == self._seen:
            return Reload("unchanged")
        self._seen = digest
        return Reload("rejected", problems=tuple(error.problems))


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
