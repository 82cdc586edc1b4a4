"""libyaml's parse of a policy reads what ruamel's round-trip parse reads, or leaves the
verdict to ruamel; nesting past ``MAX_DEPTH`` is one located line in every style.

Documents are generated from a grammar of YAML 1.1/1.2 look-alike scalars (``yes``, ``on``,
``0o17``, ``017``, ``1:30``, ``1_000``, ``.inf``, dates), merge keys, anchors, duplicate
keys, tags and directives, in block and flow styles.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

from policy import PolicyError, fast_yaml
from policy.loader import parse_document, parse_yaml

CASES = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

SCALARS = st.sampled_from(
    [
        "yes", "no", "on", "off", "y", "n", "true", "False", "TRUE", "null", "~", "Null", "",
        "0", "-0", "12", "+12", "012", "0o17", "0o8", "0x1F", "0b101", "1_000", "1:30",
        "1:30.5", "1e3", "1.5e3", "1.", ".5", "-.inf", ".NaN", ".nan", "2024-01-02",
        "2024-01-02 03:04:05", "2024-1-2", "=", "'yes'", '"12"', "!!str 12", "!!int '12'",
        "!!float 1", "!foo bar", "a b", "<<", "'<<'", "node-1.ec2.internal", "*a",
    ]
)  # fmt: skip
KEYS = st.sampled_from(["a", "b", "<<", "1", "yes", "'a'"])


def _value(depth: int) -> st.SearchStrategy[str]:
    if depth == 0:
        return SCALARS
    inner = _value(depth - 1)
    flow_map = st.lists(st.tuples(KEYS, inner), max_size=3).map(
        lambda pairs: "{" + ", ".join(f"{k}: {v}" for k, v in pairs) + "}"
    )
    flow_seq = st.lists(inner, max_size=3).map(lambda items: "[" + ", ".join(items) + "]")
    anchored = st.tuples(st.sampled_from(["&a ", ""]), st.one_of(flow_map, flow_seq)).map("".join)
    return st.one_of(SCALARS, flow_map, flow_seq, anchored)


def _block(pairs: list[tuple[str, str]]) -> str:
    return "".join(f"{k}: {v}\n" for k, v in pairs)


DOCUMENTS = st.tuples(
    st.sampled_from(["", "%YAML 1.1\n---\n", "%YAML 1.2\n---\n"]),
    st.lists(st.tuples(KEYS, _value(2)), max_size=5).map(_block),
    st.sampled_from(["", "m: {<<: [*a], b: 1}\n", "l:\n  - <<: *a\n    b: 2\n"]),
).map("".join)


def _same(a: Any, b: Any, seen: frozenset[tuple[int, int]] = frozenset()) -> bool:
    """Equal, key order included; an alias inside its own anchor is a cycle in both."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    if (id(a), id(b)) in seen:
        return True
    seen |= {(id(a), id(b))}
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(_same(a[k], b[k], seen) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y, seen) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def _plain(data: Any, memo: dict[int, Any] | None = None) -> Any:
    """ruamel's round-trip types (``ScalarFloat``, ``CommentedMap``...) as plain ones; a cycle
    stays a cycle."""
    memo = {} if memo is None else memo
    if id(data) in memo:
        return memo[id(data)]
    if isinstance(data, dict):
        plain: dict[Any, Any] = memo.setdefault(id(data), {})
        plain.update({_plain(k, memo): _plain(v, memo) for k, v in data.items()})
        return plain
    if isinstance(data, list):
        items: list[Any] = memo.setdefault(id(data), [])
        items.extend(_plain(x, memo) for x in data)
        return items
    for kind in (bool, int, float, str):
        if isinstance(data, kind):
            return kind(data)
    return data


@pytest.mark.filterwarnings("ignore::ruamel.yaml.error.ReusedAnchorWarning")  # generated anchors
@CASES
@given(DOCUMENTS)
@example("a: yes\n<<: {b: yes}\n")  # own keys first, then merged ones, as ruamel orders them
@example("x: &x {c: 1, b: 2}\ny: {<<: [*x, {d: 4, c: 9}], a: 0}\n")  # first merged wins
@example("a: &a {a: *a}\n")  # a cycle: refused
@example("b: yes\n<<: {b: {a: yes, a: yes}}\n")  # a duplicate key under a shadowed value
def test_libyaml_reads_what_ruamel_reads_or_defers(text: str) -> None:
    try:
        slow: Any = YAML(typ="rt").load(text)
    except (YAMLError, RecursionError, AttributeError):  # the last: ruamel on ``&a {<<: *a}``
        slow = None
        refused = True
    else:
        refused = False
    try:
        fast = fast_yaml.parse(text)
    except (fast_yaml.Refused, fast_yaml.Unreadable, yaml.YAMLError, YAMLError):
        return  # the loader asks ruamel, whose verdict stands
    assert not refused, f"libyaml accepted what ruamel refuses: {text!r}"
    assert _same(_plain(fast.data), _plain(slow)), (text, fast.data, slow)


NESTS = {
    "flow list": lambda d: "extra: " + "[" * d + "x" + "]" * d + "\n",
    "flow mapping": lambda d: "extra: " + "{a: " * d + "x" + "}" * d + "\n",
    "block list": lambda d: "extra:\n" + "".join("  " * (i + 1) + "-\n" for i in range(d - 1))
    + "  " * d + "- x\n",
    "block mapping": lambda d: "extra:\n" + "".join("  " * (i + 1) + "a:\n" for i in range(d - 1))
    + "  " * d + "a: x\n",
}  # fmt: skip


@pytest.mark.parametrize("style", sorted(NESTS))
@pytest.mark.parametrize("depth", [fast_yaml.MAX_DEPTH - 2, fast_yaml.MAX_DEPTH, 5_000])
def test_nesting_past_the_limit_is_one_located_line(style: str, depth: int) -> None:
    text = "cluster: {}\n" + NESTS[style](depth)
    if depth + 1 <= fast_yaml.MAX_DEPTH:  # the top mapping is one level
        parsed = fast_yaml.parse(text)
        assert parsed.data["extra"] is not None
        return
    with pytest.raises(PolicyError) as caught:
        parse_document(text, "pool.yaml")
    (problem,) = caught.value.problems
    assert problem.message.startswith(f"invalid YAML: nested more than {fast_yaml.MAX_DEPTH}")
    lines = text.count("\n")
    flow = style.startswith("flow")
    assert problem.line == (2 if flow else fast_yaml.MAX_DEPTH + 1), (problem, lines)


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("cluster: {}\nx: &x {<<: *x}\n", 2),  # merges itself
        ("cluster: {}\nx: &x\n  a: 1\n  <<: [{b: 2}, *x]\n", 2),  # itself, second of a list
        ("cluster: {}\nx: &x {a: [1, {b: *x}]}\n", 2),  # holds itself
        ("cluster: {}\nx: &x {a: &y {<<: *x}}\n", 2),  # merges what holds it
        ("cluster: {}  # !tag\nx: &x {<<: *x}\n", 2),  # ruamel's text, checked first
    ],
)
def test_an_alias_inside_its_own_anchor_is_one_line(text: str, line: int) -> None:
    with pytest.raises(PolicyError) as caught:
        parse_document(text, "pool.yaml")
    (problem,) = caught.value.problems
    assert problem.message.startswith("invalid YAML: an alias inside the anchor it names")
    assert problem.line == line


def test_ruamel_alone_reports_a_merge_of_itself_as_one_line() -> None:
    with pytest.raises(PolicyError) as caught:
        parse_yaml("cluster: {}\nx: &x {<<: *x}\n", "pool.yaml")
    (problem,) = caught.value.problems
    assert problem.message.startswith("invalid YAML: an alias inside the anchor it names")


def test_an_alias_shared_by_many_is_no_cycle() -> None:
    text = "base: &b {a: 1}\n" + "".join(f"n{i}: {{<<: *b, i: {i}}}\n" for i in range(50))
    data = fast_yaml.parse(text).data
    assert data["n49"] == {"i": 49, "a": 1}
