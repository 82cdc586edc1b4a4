"""Edge: a policy's YAML parsed by libyaml (PyYAML's C loader), read as ruamel reads it.

ruamel's round-trip loader is pure Python and keeps comments: about 130 µs a node, 20-50 s
for a policy listing 150,000 nodes. libyaml composes the node tree in C, every node with its
line mark, so one parse gives both the data to validate and the lines to report at. Scalars
are resolved by ruamel's own YAML 1.2 rules (``yes``/``no``/``on``/``off`` stay strings,
``0o17`` is octal, no sexagesimal), rarer scalars (octal, dates, ``.inf``) by ruamel itself.

This loader only has to be right when it succeeds: whatever it refuses (a duplicate key, a
tag, a ``%YAML`` directive, bad YAML) the caller parses again with ruamel, whose verdict and
message stand. The exceptions are ``Unreadable``: nesting, refused here at ``MAX_DEPTH`` as
the tree is composed (libyaml's composer recurses in C, past Python's recursion guard), and
an alias inside its own anchor (ruamel reads it as null, or crashes on it in a merge).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any, ClassVar, Final

import yaml
from ruamel.yaml import YAML
from ruamel.yaml.resolver import implicit_resolvers

MAX_DEPTH: Final = 64
"""Deepest nesting of mappings and lists read: a policy nests five or six levels."""


@dataclass(frozen=True)
class Parsed:
    """A YAML document's plain data and the node tree it was built from (its line marks)."""

    data: Any
    node: yaml.Node | None


class Unreadable(ValueError):
    """YAML no loader reads (ruamel's own composer crashes on it): ``line`` is 1-based,
    ``expected`` says what a policy holds instead."""

    expected = ""

    def __init__(self, line: int, problem: str) -> None:
        self.line = line
        super().__init__(problem)


class TooDeep(Unreadable):
    """Nesting past ``MAX_DEPTH``; ``line`` is the node that holds the deeper ones."""

    expected = "a policy's few levels of mappings and lists"

    def __init__(self, line: int) -> None:
        super().__init__(line, f"nested more than {MAX_DEPTH} levels deep")


class AliasCycle(Unreadable):
    """An alias inside the anchor it names (``&a {b: *a}``, ``&a {<<: *a}``): ruamel reads the
    first as ``{b: None}`` and crashes on the second; ``line`` is the anchor's."""

    expected = "an alias (*name) to name a node defined outside it"

    def __init__(self, line: int) -> None:
        super().__init__(line, "an alias inside the anchor it names")


class Refused(ValueError):
    """Something this loader does not read alike ruamel: the caller asks ruamel."""


_INT = re.compile(r"[-+]?(?:0|[1-9][0-9]*)")
_FLOAT = re.compile(r"[-+]?[0-9]+\.[0-9]*(?:[eE][-+]?[0-9]+)?")
_BOOL = {"true": True, "True": True, "TRUE": True, "false": False, "False": False, "FALSE": False}


@functools.lru_cache(maxsize=4096)
def _ruamel_scalar(text: str) -> Any:
    """A plain scalar as ruamel's round-trip loader reads it (octal, dates, ``.inf``)."""
    return YAML(typ="rt").load(text)


class _Loader(yaml.CSafeLoader):
    """libyaml's parser and composer; ruamel's YAML 1.2 resolvers (PyYAML's 1.1 ones are not
    inherited); PyYAML's safe constructors, where they read alike ruamel."""

    yaml_implicit_resolvers = {}  # noqa: RUF012 (PyYAML's class table, filled below)
    yaml_constructors: ClassVar[dict[Any, Any]] = dict(yaml.CSafeLoader.yaml_constructors)

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.depth = 0

    def descend_resolver(self, current_node: Any, current_index: Any) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise TooDeep(current_node.start_mark.line + 1)

    def ascend_resolver(self) -> None:
        self.depth -= 1

    def resolve(self, kind: Any, value: Any, implicit: Any) -> str:
        """PyYAML's ``resolve`` without its path resolvers (none are added): a third of the
        parse of 150,000 node names went to their checks."""
        if kind is yaml.ScalarNode:
            if implicit[0]:
                for tag, regexp in self.yaml_implicit_resolvers.get(value[:1], ()):
                    if regexp.match(value):
                        return str(tag)
            return self.DEFAULT_SCALAR_TAG
        if kind is yaml.SequenceNode:
            return self.DEFAULT_SEQUENCE_TAG
        return self.DEFAULT_MAPPING_TAG

    def flatten_mapping(self, node: Any) -> None:
        """Merge keys resolved in ruamel's order, once each mapping's own keys are shown to be
        plain and distinct: the mapping's own keys first, then each merged mapping's keys it
        lacks, the first mapping named winning (PyYAML puts merged keys first)."""
        keys = [k.value for k, _ in node.value if isinstance(k, yaml.ScalarNode)]
        if len(keys) != len(set(keys)) or len(keys) != len(node.value):
            raise Refused("a duplicate or complex key")  # or one merged in before: ruamel decides
        own: list[tuple[yaml.Node, yaml.Node]] = []
        sources: list[yaml.MappingNode] = []
        for key, value in node.value:
            if key.tag == "tag:yaml.org,2002:merge":
                merged = value.value if isinstance(value, yaml.SequenceNode) else [value]
                if not all(isinstance(source, yaml.MappingNode) for source in merged):
                    raise Refused("a merge of something other than mappings")
                sources.extend(merged)
            else:
                if key.tag == "tag:yaml.org,2002:value":
                    key.tag = "tag:yaml.org,2002:str"  # ``=`` as a key, as PyYAML reads it
                own.append((key, value))
        seen = {key.value for key, _ in own}
        shadowed: list[yaml.Node] = []
        for source in sources:
            self.flatten_mapping(source)
            for key, value in source.value:
                if key.value in seen:
                    shadowed.append(value)
                else:
                    seen.add(key.value)
                    own.append((key, value))
        node.value = own
        self._check_unread(shadowed)

    def _check_unread(self, roots: list[Any]) -> None:
        """Every mapping under values a merge shadows passes ``flatten_mapping``'s checks:
        ruamel constructs them (and refuses a duplicate key there) though none is kept."""
        stack, visited = list(roots), set()
        while stack:
            node = stack.pop()
            if id(node) in visited or isinstance(node, yaml.ScalarNode):
                continue
            visited.add(id(node))
            if isinstance(node, yaml.MappingNode):
                self.flatten_mapping(node)
                stack.extend(child for pair in node.value for child in pair)
            else:
                stack.extend(node.value)

    def construct_undefined(self, node: Any) -> Any:
        raise Refused(f"tag {node.tag}")


def _scalar(loader: _Loader, node: Any) -> Any:
    text = node.value
    if node.tag.endswith(":bool") and text in _BOOL:
        return _BOOL[text]
    if node.tag.endswith(":int") and _INT.fullmatch(text):
        return int(text)
    if node.tag.endswith(":float") and _FLOAT.fullmatch(text):
        return float(text)
    if node.style is not None:
        raise Refused("a quoted scalar with an implicit tag")
    return _ruamel_scalar(text)


for _versions, _tag, _regexp, _first in implicit_resolvers:
    if (1, 2) in _versions:
        compiled = re.compile(_regexp.pattern, _regexp.flags)  # not ruamel's lazy wrapper
        _Loader.add_implicit_resolver(_tag, compiled, _first)
for _tag in ("bool", "int", "float", "timestamp"):
    _Loader.add_constructor(f"tag:yaml.org,2002:{_tag}", _scalar)
_Loader.add_constructor(None, _Loader.construct_undefined)


def _refuse_cycles(root: yaml.Node) -> None:
    """Raise ``AliasCycle`` where a node holds itself: a walk with its own stack, since a
    document may hold 150,000 nodes (each visited once, aliases shared)."""
    on_path: set[int] = set()
    done: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, leaving = stack.pop()
        if leaving:
            on_path.discard(id(node))
            done.add(id(node))
            continue
        if id(node) in on_path:
            raise AliasCycle(node.start_mark.line + 1)
        if id(node) in done or isinstance(node, yaml.ScalarNode):
            continue
        on_path.add(id(node))
        stack.append((node, True))
        children = (
            node.value
            if isinstance(node, yaml.SequenceNode)
            else [child for pair in node.value for child in pair]
        )
        stack.extend((child, False) for child in reversed(children))


def parse(text: str) -> Parsed:
    """``text``'s data and node tree; raises ``Unreadable``, ``Refused`` or a
    ``yaml.YAMLError`` (bad YAML: the caller reports ruamel's message)."""
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is not None and "&" in text:
            _refuse_cycles(node)
        if re.search(r"^%YAML", text, re.M):
            raise Refused("a version directive")  # 1.1 resolves scalars otherwise
        if "!" in text:
            # maybe an explicit tag: ruamel keeps ``!!str 12`` as a tagged scalar where libyaml
            # gives a str, so ruamel decides (a "!" inside a string only costs the slow parse)
            raise Refused("a possible explicit tag")
        data = None if node is None else loader.construct_document(node)
    except yaml.MarkedYAMLError as exc:
        if "maximum nesting depth" in str(exc.problem) and exc.problem_mark is not None:
            raise TooDeep(exc.problem_mark.line + 1) from None  # libyaml's own flow limit
        raise
    finally:
        loader.dispose()
    return Parsed(data, node)


def line_of(node: yaml.Node | None, loc: list[str]) -> int:
    """1-based line of the deepest node of ``loc`` present under ``node``.

    A key merged in (``<<: *anchor``) is not the merging mapping's own: its mark lies outside
    the mapping, and the line stays the mapping's (its parent key's, or its list entry's)."""
    line = 1
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            start, end = node.start_mark.index, node.end_mark.index
            found = [
                (key, value)
                for key, value in node.value
                if isinstance(key, yaml.ScalarNode) and key.value == part
            ]
            if not found:
                break
            key, node = found[-1]
            if start <= key.start_mark.index <= end:
                line = key.start_mark.line + 1
        elif isinstance(node, yaml.SequenceNode) and part.isdigit() and int(part) < len(node.value):
            node = node.value[int(part)]
            line = node.start_mark.line + 1
        else:
            break
    return line
