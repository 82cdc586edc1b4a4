"""Edit values of pool.yaml in place: every comment, blank line and flow mapping survives.

ruamel.yaml's round-trip loader tells where each value starts; the edit replaces only
that value's text in the original, or adds one ``key: value`` line to a block mapping that
lacks the key, then re-reads the result to prove every value landed and nothing else moved.
(Dumping the round-trip document instead re-indents lists and joins wrapped flow mappings.)
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq

from runtime.tuner.proposals import Change, PolicyPath

_SCALAR = re.compile(r"[^\s,\]}#]+")
_QUOTED = re.compile(r"\"(?:[^\"\\]|\\.)*\"|'(?:[^']|'')*'")
_PLAIN_SAFE = re.compile(r"[A-Za-z0-9_./-]+")
_WORDS = {"true", "false", "null", "yes", "no", "on", "off", "y", "n", "~"}


class YamlEditError(Exception):
    """The policy text does not hold the value an edit names."""


@dataclass(frozen=True)
class ValueEdit:
    """One value of the policy document: where, and what it must read back as."""

    path: PolicyPath
    value: object

    @property
    def dotted(self) -> str:
        return ".".join(str(p) for p in self.path)


def edit_scalars(text: str, changes: Sequence[Change], *, document: Any = None) -> tuple[str, Any]:
    """``text`` with each change's number replaced, the rest byte for byte unchanged, and
    the edited text's round-trip document. ``document``: ``text`` already loaded (parsing
    dominates a tuning cycle, so callers pass the one they have)."""
    edits = [ValueEdit(c.path, _number(c)) for c in changes]
    return edit_values(text, edits, document=document, add_missing=False)


def edit_values(
    text: str, edits: Sequence[ValueEdit], *, document: Any = None, add_missing: bool = True
) -> tuple[str, Any]:
    """``text`` with each edit applied, the rest byte for byte unchanged, and the edited
    text's round-trip document. A value already written is replaced where it stands (a
    scalar, or a flow collection on one line); with ``add_missing`` a key its block mapping
    lacks gets a line of its own after the mapping's last one-line entry. Raises
    ``YamlEditError`` when a value cannot be edited so, or the edited text does not read
    back as exactly these edits."""
    lines = text.splitlines(keepends=True)
    if document is None:
        document = YAML(typ="rt").load(text)
    inserts: list[tuple[int, str]] = []
    for edit in edits:
        parent = lookup(document, edit.path[:-1])
        key = edit.path[-1]
        if _written(parent, key):
            line, col = _position(parent, key)
            start, end = _span(lines[line], col, edit)
            lines[line] = _replaced(lines[line], start, end, render(edit.value))
        elif add_missing:
            inserts.append(_insertion(parent, key, edit, lines))
        else:
            raise YamlEditError(
                f"{edit.dotted} is not written in the policy file; add it explicitly so it "
                "can be edited"
            )
    for at, new in sorted(inserts, reverse=True):
        lines.insert(at, new)
    edited = "".join(lines)
    reread = YAML(typ="rt").load(edited)
    for edit in edits:
        if _plain(lookup(reread, edit.path)) != edit.value:
            raise YamlEditError(f"{edit.dotted}: edit did not read back as {edit.value!r}")
    if _plain(reread) != applied(_plain(document), edits):
        raise YamlEditError("an edit changed more than the values it names")
    return edited, reread


def render(value: object) -> str:
    """``value`` as YAML on one line: plain scalars where they read back as themselves,
    JSON-quoted strings otherwise, flow collections for mappings and lists."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        safe = _PLAIN_SAFE.fullmatch(value) and value.lower() not in _WORDS
        return value if safe and not _numeric(value) else json.dumps(value)
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{render(k)}: {render(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(render(v) for v in value) + "]"
    raise YamlEditError(f"cannot write {value!r} as YAML")


def _numeric(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _number(change: Change) -> float | int:
    if isinstance(change.before, int) and float(change.after).is_integer():
        return int(change.after)
    return float(change.after)


def lookup(document: Any, path: Sequence[str | int]) -> Any:
    """The value at ``path`` of a (round-trip or plain) document."""
    node = document
    for part in path:
        node = node[part]
    return node


def _written(parent: Any, key: str | int) -> bool:
    if isinstance(parent, CommentedMap):
        return key in parent
    return isinstance(parent, CommentedSeq) and isinstance(key, int) and key < len(parent)


def _position(parent: Any, key: str | int) -> tuple[int, int]:
    line, col = parent.lc.value(key) if isinstance(parent, CommentedMap) else parent.lc.item(key)
    return int(line), int(col)


def _span(line: str, col: int, edit: ValueEdit) -> tuple[int, int]:
    """Where the value starting at ``col`` ends on ``line``: a quoted or plain scalar, or a
    flow collection closed on the same line."""
    opener = line[col : col + 1]
    if opener in "[{":
        depth = 0
        for i in range(col, len(line)):
            depth += {"[": 1, "{": 1, "]": -1, "}": -1}.get(line[i], 0)
            if depth == 0:
                return col, i + 1
        raise YamlEditError(f"{edit.dotted}: its value spans lines; edit it by hand")
    quoted = _QUOTED.match(line, col)
    match = quoted or _SCALAR.match(line, col)
    if match is None:
        raise YamlEditError(f"{edit.dotted}: no value at line {line!r}")
    return match.start(), match.end()


def _replaced(line: str, start: int, end: int, new: str) -> str:
    """``line`` with ``[start, end)`` replaced by ``new``, a trailing comment kept in its
    column where the new value leaves room."""
    rest = line[end:]
    if rest.lstrip(" ").startswith("#"):
        gap = len(rest) - len(rest.lstrip(" "))
        width = end - start + gap
        new, rest = new.ljust(width - 1) + " ", rest.lstrip(" ")
    return line[:start] + new + rest


def _insertion(parent: Any, key: str | int, edit: ValueEdit, lines: list[str]) -> tuple[int, str]:
    """Where and what to insert for a key ``parent`` (a block mapping) lacks: a line after
    its last entry that sits on one line, at that entry's column, past its comment lines."""
    if not isinstance(parent, CommentedMap) or not isinstance(key, str) or not parent:
        raise YamlEditError(f"{edit.dotted} is not written in the policy file; add it by hand")
    for sibling in reversed(list(parent)):
        key_line, key_col = (int(v) for v in parent.lc.key(sibling))
        if _one_line(parent, sibling, key_line):
            at = key_line + 1
            while at < len(lines) and _comment_below(lines[at], key_col):
                at += 1
            return at, " " * key_col + f"{key}: {render(edit.value)}\n"
    raise YamlEditError(f"{edit.dotted}: no one-line entry to add it after; add it by hand")


def _one_line(parent: CommentedMap, key: str, key_line: int) -> bool:
    """Whether ``parent[key]`` is written on its key's line: a scalar or a flow collection."""
    value = parent[key]
    if isinstance(value, CommentedMap | CommentedSeq) and not value.fa.flow_style():
        return False
    return _position(parent, key)[0] == key_line


def _comment_below(line: str, col: int) -> bool:
    """A comment line indented past ``col``: the previous entry's continued comment."""
    stripped = line.lstrip(" ")
    return stripped.startswith("#") and len(line) - len(stripped) > col


def _plain(node: Any) -> Any:
    """A round-trip node as plain dicts, lists and scalars."""
    if isinstance(node, Mapping):
        return {str(k): _plain(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_plain(v) for v in node]
    if isinstance(node, bool) or node is None:
        return node
    if isinstance(node, int):
        return int(node)
    if isinstance(node, float):
        return float(node)
    return str(node) if isinstance(node, str) else node


def applied(document: Any, edits: Sequence[ValueEdit]) -> Any:
    """``document`` (a plain one, changed in place) with every edit's value set."""
    for edit in edits:
        parent = lookup(document, edit.path[:-1])
        parent[edit.path[-1]] = edit.value
    return document
