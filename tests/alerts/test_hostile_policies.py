"""Property: any policy ``validate`` accepts renders rules promtool accepts and objects the
cluster accepts, for generated policies with hostile values.

Hypothesis mutates leaves of the shipped policy and of the infra fuzz test's generated
policies with values near the valid ones (any script, trailing characters, look-alikes,
option-like prefixes, numbers across int32 and beyond; job regexes from the RE2 operator
alphabet). A refused policy must be refused with one line per problem. An accepted one is
rendered: ``promtool check rules`` on every rule file, ``amtool check-config`` on the
Alertmanager configuration, kubernetes-validate strict on every built-in object, the
Karpenter NodePool schema and CEL rules, the API server's own name and label rules (which the
OpenAPI schemas leave out), int32 for every integer, and each rendered YAML file reading back
as the object it was rendered from.
"""

from __future__ import annotations

import copy
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from ruamel.yaml import YAML

from alerts.render import bundle_files
from infra.builders.stack_options import StackOptions
from infra.bundle import build_bundle
from infra.render import KUSTOMIZATION, render_documents
from policy import PolicyError, PoolPolicy, parse_policy
from tests.harness import hostile as h
from tests.harness.servers import require_binary
from tests.infra.policies import BASE, explicit_args
from tests.infra.test_fuzz_render import policies
from tests.infra.test_karpenter_schema import VALIDATOR, cel_problems
from tests.infra.test_kubernetes_schemas import CRD_GROUPS

pytestmark = pytest.mark.process


def _leaves(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(node, dict):
        return [p for k, v in node.items() for p in _leaves(v, (*prefix, k))]
    if isinstance(node, list):
        return [p for i, v in enumerate(node) for p in _leaves(v, (*prefix, i))]
    return [prefix] if isinstance(node, str | int | float) and not isinstance(node, bool) else []


def _get(doc: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        doc = doc[part]
    return doc


JOB_REGEX = st.text(alphabet='-Aa0_.*+?|()[]^$:/{}\\"', min_size=1, max_size=10)
"""Job regexes from the operators RE2 and Python read differently (or not at all)."""


UNITS = ["y", "w", "d", "h", "m", "s", "ms"]
durations = st.builds(
    lambda parts: "".join(f"{n}{unit}" for unit, n in parts) or "0s",
    st.lists(
        st.tuples(
            st.sampled_from(UNITS),
            st.one_of(st.integers(0, 100), st.integers(0, 10**12)),
        ),
        max_size=3,
        unique_by=lambda part: part[0],
    ).map(lambda parts: sorted(parts, key=lambda part: UNITS.index(part[0]))),
)
"""Durations in Prometheus' grammar, from 0 to far beyond int64 milliseconds."""


@st.composite
def hostile_documents(draw: st.DrawFn) -> tuple[Any, list[tuple[Any, ...]]]:
    """A policy document (the shipped one or a generated one) with 1-2 leaves replaced."""
    doc = copy.deepcopy(draw(st.one_of(st.just(BASE), policies())))
    leaves = _leaves(doc)
    edited = draw(st.lists(st.sampled_from(leaves), min_size=1, max_size=2, unique=True))
    for path in edited:
        old = _get(doc, path)
        if path == ("metrics", "dcgm_job"):
            new = draw(st.one_of(JOB_REGEX, h.hostile([old])))
        elif isinstance(old, str) and h.is_prometheus_duration(old):
            new = draw(st.one_of(durations, h.hostile([old])))
        elif isinstance(old, str):
            new = draw(h.hostile([old]))
        else:
            new = draw(st.one_of(h.numbers, st.just(old)))
        _get(doc, path[:-1])[path[-1]] = new
    return doc, edited


def _api_server_problems(obj: Any) -> list[str]:
    """What the API server checks beyond the OpenAPI schema, for what gpupool renders: object
    names, namespaces, labels and annotation keys, container and volume names, pod-spec
    references, images without surrounding whitespace, and int32 integers."""
    out = []
    meta = obj.get("metadata", {})
    name, kind = meta.get("name"), obj["kind"]
    rule = {"Service": h.is_service_name, "Namespace": h.is_dns_label}.get(kind, h.is_subdomain)
    if not rule(name):
        out.append(f"{kind} name {name!r}")
    if "namespace" in meta and not h.is_dns_label(meta["namespace"]):
        out.append(f"namespace {meta['namespace']!r}")

    def walk(node: Any, where: str) -> None:
        if isinstance(node, bool):
            return
        if isinstance(node, int) and not h.INT32[0] <= node <= h.INT32[1]:
            out.append(f"{where}: {node} is no int32")
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("labels", "matchLabels", "nodeSelector") and isinstance(value, dict):
                    for k, v in value.items():
                        if not (h.is_label_key(k) and h.is_label_value(v)):
                            out.append(f"{where}.{key}: label {k!r}={v!r}")
                if key == "annotations" and isinstance(value, dict):
                    out.extend(f"annotation {k!r}" for k in value if not h.is_label_key(k))
                if key in ("containers", "initContainers", "volumes"):
                    out.extend(
                        f"{key} name {c.get('name')!r}"
                        for c in value
                        if not h.is_dns_label(c.get("name"))
                    )
                if key == "image" and isinstance(value, str) and value != value.strip():
                    out.append(f"image {value!r}")
                references = ("priorityClassName", "storageClassName", "secretName", "claimName")
                if key in references and not h.is_subdomain(value):
                    out.append(f"{key} {value!r}")
                walk(value, f"{where}.{key}")
        elif isinstance(node, list):
            for i, item in enumerate(node):
                walk(item, f"{where}.{i}")

    walk(obj, kind)
    return out


def _check_rules(policy: PoolPolicy, folder: Path) -> None:
    files = bundle_files(policy)
    for relative, text in files.items():
        (folder / relative).parent.mkdir(parents=True, exist_ok=True)
        (folder / relative).write_text(text)
    rules = sorted(str(folder / r) for r in files if r.startswith("rules/"))
    promtool = subprocess.run(
        [require_binary("promtool"), "check", "rules", *rules],
        capture_output=True,
        text=True,
        check=False,
    )
    assert promtool.returncode == 0, promtool.stdout + promtool.stderr
    amtool = subprocess.run(
        [require_binary("amtool"), "check-config", str(folder / "alertmanager.yml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert amtool.returncode == 0, amtool.stdout + amtool.stderr


def _check_objects(policy: PoolPolicy) -> None:
    for target in ("labels", "karpenter"):
        objects = build_bundle(policy, stack=StackOptions(target), vllm_args=explicit_args(policy))
        for obj in objects:
            assert _api_server_problems(obj) == [], obj["metadata"]
            if obj["apiVersion"] == "karpenter.sh/v1":
                assert [e.message for e in VALIDATOR.iter_errors(obj)] == []
                assert cel_problems(obj) == []
            elif not obj["apiVersion"].startswith(CRD_GROUPS):
                kubernetes_validate.validate(obj, "1.30.0", strict=True)
        documents = render_documents(objects)
        loader = YAML(typ="safe")
        assert [loader.load(t) for n, t in documents.items() if n != KUSTOMIZATION] == objects


# 40 policies; about half are refused, each accepted one renders both targets and runs
# promtool and amtool once: under a minute.
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(drawn=hostile_documents())
@example(drawn=({**BASE, "metrics": {**BASE["metrics"], "rate_window": "\u0665m"}}, []))
@example(drawn=({**BASE, "metrics": {**BASE["metrics"], "dcgm_job": "(?=dcgm)"}}, []))
@example(drawn=({**BASE, "metrics": {**BASE["metrics"], "evaluation_interval": "1ms"}}, []))
def test_accepted_policies_render_what_their_consumers_accept(
    drawn: tuple[Any, list[tuple[Any, ...]]],
) -> None:
    doc, _ = drawn
    try:
        policy = parse_policy(doc)
    except PolicyError as exc:
        assert exc.problems and all("\n" not in str(p) for p in exc.problems), exc
        event("refused")
        return
    event("accepted")
    with tempfile.TemporaryDirectory() as folder:
        _check_rules(policy, Path(folder))
    _check_objects(policy)
