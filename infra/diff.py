"""Object-level difference between two renders: what a PR would change in the cluster."""

from __future__ import annotations

import difflib
from collections.abc import Mapping


def diff_documents(old: Mapping[str, str], new: Mapping[str, str]) -> str:
    """Added, removed and changed files (one object each), then a unified diff per change.

    Empty when the renders are identical, so callers can test ``if diff_documents(...)``.
    """
    added = sorted(new.keys() - old.keys())
    removed = sorted(old.keys() - new.keys())
    changed = sorted(name for name in old.keys() & new.keys() if old[name] != new[name])
    if not (added or removed or changed):
        return ""
    lines = [f"{len(added)} added, {len(removed)} removed, {len(changed)} changed"]
    lines += [f"+ {name}" for name in added]
    lines += [f"- {name}" for name in removed]
    lines += [f"~ {name}" for name in changed]
    out = "\n".join(lines) + "\n"
    for name in changed:
        out += "\n" + "".join(
            difflib.unified_diff(
                old[name].splitlines(keepends=True),
                new[name].splitlines(keepends=True),
                fromfile=f"a/{name}",
                tofile=f"b/{name}",
            )
        )
    return out
