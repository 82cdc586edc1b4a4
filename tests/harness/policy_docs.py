"""Edit parsed policy documents at dotted paths (``"workloads.0.pool"``) in tests."""

from __future__ import annotations

from typing import Any


def set_path(doc: Any, path: str, value: Any) -> None:
    """Set ``doc`` at a dotted path; list indices are digits."""
    *parents, last = path.split(".")
    node = doc
    for part in parents:
        node = node[int(part)] if part.isdigit() else node[part]
    node[int(last) if last.isdigit() else last] = value
