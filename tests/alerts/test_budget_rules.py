"""The flex budget as rendered rules: a policy change shows as the one term that owns it.

The shipped policy is rendered (``alerts render``'s files), then again with one knob
changed; the rule files are diffed line by line and every rule's expression compared. A
reserve change must touch ``gpupool:reserved_gpus`` alone, a threshold change
``gpupool:flex_budget_step`` alone, and the changed rule's comment must name the knob.
"""

from __future__ import annotations

import difflib
import re
from typing import Any

import pytest
from ruamel.yaml import YAML

from alerts.render import bundle_files
from policy import PoolPolicy, load_policy, parse_policy
from runtime.metrics import catalogue as c

Rules = dict[tuple[str, str], str]
"""(rule file, recorded series or alert name) -> expression."""


def _rendered(policy: PoolPolicy) -> dict[str, str]:
    return {k: v for k, v in bundle_files(policy).items() if k.startswith("rules/")}


def _expressions(files: dict[str, str]) -> Rules:
    out: Rules = {}
    for path, text in files.items():
        for group in YAML(typ="safe").load(text)["groups"]:
            for rule in group["rules"]:
                out[path, rule.get("record") or rule["alert"]] = rule["expr"]
    return out


def _document() -> dict[str, Any]:
    return load_policy().model_dump(by_alias=True, mode="json")


def _reserve() -> dict[str, Any]:
    document = _document()
    assert document["node_pools"][0]["reserve_ratio"] == 0.2, "the shipped prod reserve moved"
    document["node_pools"][0]["reserve_ratio"] = 0.25
    return document


def _grow() -> dict[str, Any]:
    document = _document()
    document["elastic"]["grow_while_production_below"] = 0.3
    return document


def _shed() -> dict[str, Any]:
    document = _document()
    document["elastic"]["shed_while_production_above"] = 0.7
    return document


CHANGES = [
    ("node_pools[].reserve_ratio", _reserve, c.RESERVED_GPUS, "* 0.2)", "* 0.25)"),
    ("elastic.grow_while_production_below", _grow, c.FLEX_BUDGET_STEP, "< 0.35)", "< 0.3)"),
    ("elastic.shed_while_production_above", _shed, c.FLEX_BUDGET_STEP, "> 0.65)", "> 0.7)"),
]


@pytest.mark.parametrize(("knob", "change", "term", "before", "after"), CHANGES)
def test_one_knob_changes_one_rule(
    knob: str, change: Any, term: str, before: str, after: str
) -> None:
    old_files, new_files = _rendered(load_policy()), _rendered(parse_policy(change()))
    old, new = _expressions(old_files), _expressions(new_files)
    assert old.keys() == new.keys()
    changed = [key for key in old if old[key] != new[key]]
    assert changed == [("rules/budget.yaml", term)], changed
    assert before in old[changed[0]] and after in new[changed[0]]
    # the rendered diff: one expression line, in the budget's file, under its own comment
    diff = [
        (path, line)
        for path in old_files
        for line in difflib.unified_diff(
            old_files[path].splitlines(), new_files[path].splitlines(), lineterm="", n=0
        )
        if line[:1] in "+-" and line[:3] not in ("+++", "---")
    ]
    expr_lines = [(path, line) for path, line in diff if re.match(r"[+-] +expr: ", line)]
    assert [path for path, _ in expr_lines] == ["rules/budget.yaml"] * 2, diff
    lines = new_files["rules/budget.yaml"].splitlines()
    at = lines.index(f"  - record: {term}")
    assert knob in lines[at - 1], "the changed rule's comment names the knob"


def test_every_budget_term_is_named_helped_and_in_order() -> None:
    """Each term is a ``gpupool:`` series (level:metric[:operation]) with its help above it,
    and reads only the terms before it (one group, so no evaluation lags)."""
    policy = load_policy()
    text = _rendered(policy)["rules/budget.yaml"]
    groups = YAML(typ="safe").load(text)["groups"]
    assert [g["name"] for g in groups] == ["gpupool.budget"]
    records = [r["record"] for r in groups[0]["rules"]]
    assert records == list(c.TERMS), "the group holds the budget's terms, in the table's order"
    assert records[-1] == c.FLEX_GPU_BUDGET
    lines = text.splitlines()
    seen: set[str] = set()
    for rule in groups[0]["rules"]:
        record = rule["record"]
        assert re.fullmatch(r"gpupool:[a-z][a-z0-9_]*(:[a-z0-9_]+)?", record), record
        comment = lines[lines.index(f"  - record: {record}") - 1].strip()
        if c.TERMS[record].knobs:
            comment = lines[lines.index(f"  - record: {record}") - 2].strip()
        assert comment == f"# {c.TERMS[record].help} ({c.TERMS[record].unit})"
        reads = set(re.findall(r"gpupool:[a-zA-Z0-9_:]+", rule["expr"])) - {record}
        assert reads <= seen, f"{record} reads {reads - seen} before it is recorded"
        seen.add(record)
    catalogue = _rendered(policy)["rules/catalogue.yaml"]
    assert not any(f"- record: {record}\n" in catalogue for record in records), (
        "each term is recorded once, in the budget's group"
    )


def test_the_budget_rule_reads_its_terms_only() -> None:
    """The budget rule holds no exporter series and no policy value: it combines the terms
    above it, so it stays short and no knob change rewrites it."""
    expr = c.build_catalogue(load_policy())[c.FLEX_GPU_BUDGET].expr
    assert len(expr) < 600, len(expr)
    assert "kube_" not in expr and "DCGM" not in expr and not re.search(r"\d\.\d", expr)
