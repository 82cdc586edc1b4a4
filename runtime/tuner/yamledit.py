"""Edit scalars of pool.yaml in place: every comment, blank line and flow mapping survives.

ruamel.yaml's round-trip loader tells where each value starts; the edit replaces only
that token in the original text, then re-reads the result to prove the value landed and
nothing else moved. (Dumping the round-trip document instead re-indents lists and joins
wrapped flow mappings.)
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq

from runtime.tuner.decisions import Change

_SCALAR = re.compile(r"[^\s,\]}#]+")


class YamlEditError(Exception):
    """The policy text does not hold the scalar a change names."""


def edit_scalars(text: str, changes: Sequence[Change], *, document: Any = None) -> tuple[str, Any]:
    """``text`` with each change's scalar replaced, the rest byte for byte unchanged, and
    the edited text's round-trip document. ``document``: ``text`` already loaded (parsing
    dominates a tuning cycle, so callers pass the one they have)."""
    lines = text.splitlines(keepends=True)
    if document is None:
        document = YAML(typ="rt").load(text)
    for change in changes:
        line, col = _position(document, change)
        match = _SCALAR.match(lines[line], col)
        if match is None:
            raise YamlEditError(f"{change.dotted}: no scalar at line {line + 1}")
        new, rest = _render(change), lines[line][match.end() :]
        if rest.lstrip(" ").startswith("#"):  # keep trailing comments in their column
            gap = len(rest) - len(rest.lstrip(" "))
            width = match.end() - match.start() + gap
            new, rest = new.ljust(width - 1) + " ", rest.lstrip(" ")
        lines[line] = lines[line][: match.start()] + new + rest
    edited = "".join(lines)
    reread = YAML(typ="rt").load(edited)
    for change in changes:
        if _lookup(reread, change.path) != change.after:
            raise YamlEditError(f"{change.dotted}: edit did not read back as {change.after}")
    return edited, reread


def _render(change: Change) -> str:
    if isinstance(change.before, int) and float(change.after).is_integer():
        return str(int(change.after))
    return repr(float(change.after))


def _lookup(document: Any, path: Sequence[str | int]) -> Any:
    node = document
    for part in path:
        node = node[part]
    return node


def _position(document: Any, change: Change) -> tuple[int, int]:
    parent = _lookup(document, change.path[:-1])
    key = change.path[-1]
    if isinstance(parent, CommentedMap) and key in parent:
        line, col = parent.lc.value(key)
        return int(line), int(col)
    if isinstance(parent, CommentedSeq) and isinstance(key, int) and key < len(parent):
        line, col = parent.lc.item(key)
        return int(line), int(col)
    raise YamlEditError(
        f"{change.dotted} is not written in the policy file; add it explicitly so the "
        "tuner can edit it"
    )
