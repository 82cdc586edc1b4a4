"""Every lever the tuner can propose changes what the cluster does, not only the policy copy.

The levers are read from ``runtime.tuner.levers`` (``LEVERS``), and a static check proves
no rule module builds a ``Change`` outside a lever's step, so a new lever cannot skip this test.
Each lever's step from the shipped policy is spliced into ``pool.yaml`` as the tuner does
(``edit_scalars``), both policies are rendered like ``gpupool diff`` (``render_policy_file``,
the ``labels`` target, the model configs beside the policy), and the rendered difference
must touch a PrometheusRule rule, an HPA's spec or a Deployment's pod spec (arguments).
"""

from __future__ import annotations

import ast
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.builders.stack_options import StackOptions
from infra.diff import diff_documents
from infra.pipeline import render_policy_file
from policy import DEFAULT_POLICY, load_policy
from runtime.tuner import decisions, eviction_rule, idle_rule, kv_rule, levers, rule_context
from runtime.tuner.levers import LEVERS, Lever
from runtime.tuner.settings import TunerSettings
from runtime.tuner.yamledit import edit_scalars

SHIPPED = DEFAULT_POLICY.read_text()
POLICY = load_policy(DEFAULT_POLICY)
CAPPED = SHIPPED.replace("max_replicas: auto", "max_replicas: 8", 1)
"""The shipped policy with an explicit flex bound: ``auto`` is at what the pools hold, so the
widening lever steps from this one."""


RULE_MODULES = (decisions, rule_context, levers, eviction_rule, idle_rule, kv_rule)
"""Every module of the tuner's rules: the decision, the context, the levers, each rule."""


def test_every_change_is_made_by_a_registered_lever() -> None:
    trees = [ast.parse(Path(module.__file__ or "").read_text()) for module in RULE_MODULES]
    makers = {
        node.name
        for tree in trees
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef)
        and any(
            isinstance(call, ast.Call)
            and isinstance(call.func, ast.Name)
            and call.func.id == "Change"
            for call in ast.walk(node)
        )
    }
    assert makers == {lever.steps.__name__ for lever in LEVERS}
    defined = {
        id(v): v for module in RULE_MODULES for v in vars(module).values() if isinstance(v, Lever)
    }.values()
    assert sorted(lever.name for lever in defined) == sorted(lever.name for lever in LEVERS)
    assert len({lever.name for lever in LEVERS}) == len(LEVERS)


def _rules(document: dict[str, Any]) -> dict[str, Any]:
    return {
        rule.get("record") or rule["alert"]: rule
        for group in document["spec"]["groups"]
        for rule in group["rules"]
    }


def _args(document: dict[str, Any]) -> dict[str, list[str]]:
    return {
        c["name"]: [*c.get("command", []), *c.get("args", [])]
        for c in document["spec"]["template"]["spec"]["containers"]
    }


def _flags(args: list[str]) -> dict[str, str]:
    """``--flag`` -> its value ("" for a switch); positional words under their own name."""
    out = {}
    for i, word in enumerate(args):
        if word.startswith("--"):
            value = args[i + 1] if i + 1 < len(args) else ""
            out[word] = "" if value.startswith("--") else value
        elif i == 0 or not args[i - 1].startswith("--"):
            out[word] = word
    return out


def behaviour_changes(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """What changed that the cluster acts on: ``rule <name>``, ``HPA <name>: <spec key>``,
    ``Deployment <name>: <argument>`` (or ``pod spec``); metadata and ConfigMaps never count."""
    touched = []
    for name in sorted(before.keys() & after.keys()):
        if before[name] == after[name]:
            continue
        old, new = yaml.safe_load(before[name]), yaml.safe_load(after[name])
        kind, object_name = new["kind"], new["metadata"]["name"]
        if kind == "PrometheusRule":
            a, b = _rules(old), _rules(new)
            touched += [f"rule {r}" for r in sorted(a.keys() | b.keys()) if a.get(r) != b.get(r)]
        elif kind == "HorizontalPodAutoscaler":
            touched += [
                f"HPA {object_name}: {key}"
                for key in sorted(old["spec"].keys() | new["spec"].keys())
                if old["spec"].get(key) != new["spec"].get(key)
            ]
        elif kind == "Deployment":
            a, b = _args(old), _args(new)
            for container in sorted(a.keys() | b.keys()):
                x, y = _flags(a.get(container, [])), _flags(b.get(container, []))
                touched += [
                    f"Deployment {object_name}: {flag}"
                    for flag in sorted(x.keys() | y.keys())
                    if x.get(flag) != y.get(flag)
                ]
            if a == b and old["spec"]["template"]["spec"] != new["spec"]["template"]["spec"]:
                touched.append(f"Deployment {object_name}: pod spec")
    return touched


@pytest.mark.parametrize("lever", LEVERS, ids=lambda lever: lever.name)
def test_every_lever_changes_cluster_behaviour(lever: Lever, tmp_path: Path) -> None:
    assert CAPPED != SHIPPED
    shutil.copytree(DEFAULT_POLICY.parent / "models", tmp_path / "models")
    text = SHIPPED if lever.steps(POLICY, TunerSettings()) else CAPPED
    (tmp_path / "before.yaml").write_text(text)
    changes = lever.steps(load_policy(tmp_path / "before.yaml"), TunerSettings())
    assert changes, f"{lever.name} has no step from the shipped policy; test it from one that has"
    assert {c.lever for c in changes} == {lever.name}
    new_text, _ = edit_scalars(text, changes)
    (tmp_path / "after.yaml").write_text(new_text)
    before = render_policy_file(tmp_path / "before.yaml", stack=StackOptions("labels"))
    after = render_policy_file(tmp_path / "after.yaml", stack=StackOptions("labels"))
    touched = behaviour_changes(before, after)
    assert touched, (
        f"{lever.name} ({lever.field}) changes no rule, HPA or Deployment:\n"
        + diff_documents(before, after)
    )
    # and what it touches is what the lever says it acts on
    tokens = [t.split(": ", 1)[-1] if t.startswith("Deployment") else t.split()[1] for t in touched]
    hits = [
        t
        for t, token in zip(touched, tokens, strict=True)
        if token in lever.acts_on or (t.startswith("HPA") and "HPA" in lever.acts_on)
    ]
    assert hits, f"{lever.name} says it acts on {lever.acts_on!r} but touched {touched}"


def test_the_policy_copy_alone_is_not_a_behaviour_change(tmp_path: Path) -> None:
    """The checker itself: a field only the ConfigMap copy carries reports nothing."""
    shutil.copytree(DEFAULT_POLICY.parent / "models", tmp_path / "models")
    (tmp_path / "before.yaml").write_text(SHIPPED)
    edited = SHIPPED.replace("compaction_max_moves: 4096", "compaction_max_moves: 4000")
    assert edited != SHIPPED
    (tmp_path / "after.yaml").write_text(edited)
    before = render_policy_file(tmp_path / "before.yaml", stack=StackOptions("labels"))
    after = render_policy_file(tmp_path / "after.yaml", stack=StackOptions("labels"))
    assert diff_documents(before, after)  # the ConfigMap copy changed...
    assert behaviour_changes(before, after) == []  # ...and nothing the cluster acts on
