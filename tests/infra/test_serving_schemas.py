"""Every Gateway API Inference Extension and Gateway API object gpupool renders is valid for
its vendored CRD (tests/fixtures/crds/): jsonschema on the CRD's openAPIV3Schema of the object's
version, closed like strict field validation (``_closed``, the Karpenter test's), plus
hand-written equivalents of the CEL rules that concern what gpupool sets. Each check is shown
to have teeth: a mutated object is refused.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from ruamel.yaml import YAML
from ruamel.yaml.constructor import SafeConstructor

from infra.builders.meta import Manifest
from infra.builders.serving_options import OBJECTIVE_APIS, ObjectiveApi, ServingOptions
from infra.builders.stack_options import StackOptions
from infra.bundle import build_bundle
from policy import PoolPolicy, parse_policy
from tests.infra.policies import edited, explicit_args
from tests.infra.test_karpenter_schema import _closed

CRDS = Path(__file__).resolve().parents[1] / "fixtures" / "crds"
"""The vendored CRDs (README there: sources, tags, blob ids, licence)."""

CRD_FILES = {
    "InferencePool": "gateway-api-inference-extension/v1.6.0/"
    "inference.networking.k8s.io_inferencepools.yaml",
    "InferenceObjective@inference.networking.x-k8s.io": "gateway-api-inference-extension/v1.5.0/"
    "inference.networking.x-k8s.io_inferenceobjectives.yaml",
    "InferenceObjective@llm-d.ai": "llm-d-router/v0.10.0/llm-d.ai_inferenceobjectives.yaml",
    "HTTPRoute": "gateway-api/v1.6.1/gateway.networking.k8s.io_httproutes.yaml",
    "AlertmanagerConfig": "prometheus-operator/v0.93.0/"
    "monitoring.coreos.com_alertmanagerconfigs.yaml",
}
"""Kind (and, where two CRDs define it, group) -> the CRD file that defines it."""

CRD_GROUPS = ("inference.networking.", "gateway.networking.", "llm-d.ai/")
"""apiVersion prefixes of the kinds these CRDs define (not built-in, so not for
kubernetes-validate)."""


class _CrdConstructor(SafeConstructor):
    """YAML 1.1's ``=`` is the ``value`` tag, which safe loaders refuse; prometheus-operator's
    ``matchType`` enums list it unquoted, so it is read as the string it is there."""


_CrdConstructor.add_constructor("tag:yaml.org,2002:value", SafeConstructor.construct_yaml_str)


def _crd_yaml() -> YAML:
    yaml = YAML(typ="safe", pure=True)
    yaml.Constructor = _CrdConstructor
    return yaml


@functools.cache
def crd_validator(api_version: str, kind: str) -> jsonschema.Draft7Validator:
    """The closed openAPIV3Schema of ``kind`` at ``api_version``, from its vendored CRD; the
    version must be one the CRD serves."""
    group, version = api_version.split("/")
    key = kind if kind in CRD_FILES else f"{kind}@{group}"
    crd: Any = _crd_yaml().load((CRDS / CRD_FILES[key]).read_text())
    assert (crd["spec"]["group"], crd["spec"]["names"]["kind"]) == (group, kind)
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == version and v["served"]]
    schema = _closed(served["schema"]["openAPIV3Schema"])
    # ObjectMeta is validated by the API server itself, not by the CRD schema.
    schema["properties"]["metadata"] = {"type": "object"}
    return jsonschema.Draft7Validator(schema)


def schema_errors(obj: Manifest) -> list[str]:
    """What the CRD's schema refuses in ``obj``, one line per error."""
    validator = crd_validator(obj["apiVersion"], obj["kind"])
    return [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(obj)
    ]


def cel_problems(obj: Manifest) -> list[str]:
    """The CRDs' ``x-kubernetes-validations`` that concern the fields gpupool sets, with the
    CRD's defaults applied first (CEL sees defaulted objects)."""
    spec = obj["spec"]
    problems: list[str] = []
    if obj["kind"] == "InferencePool":
        ref = spec.get("endpointPickerRef", {})
        if ref.get("kind", "Service") == "Service" and "port" not in ref:
            problems.append("endpointPickerRef: port is required when kind is 'Service'")
        numbers = [p["number"] for p in spec["targetPorts"]]
        if len(set(numbers)) != len(numbers):
            problems.append("targetPorts: port number must be unique")
    if obj["kind"] == "HTTPRoute":
        rules = spec.get("rules", [])
        if sum(len(r.get("matches", [{}])) for r in rules) >= 128:
            problems.append("rules: the total number of matches must be less than 128")
        parents = [
            (p.get("name"), p.get("namespace"), p.get("sectionName")) for p in spec["parentRefs"]
        ]
        if len(set(parents)) != len(parents):
            problems.append("parentRefs: sectionName must be unique per parent")
        for i, rule in enumerate(rules):
            filters = rule.get("filters", [])
            types = [f["type"] for f in filters]
            for repeated in ("RequestHeaderModifier", "ResponseHeaderModifier", "URLRewrite"):
                if types.count(repeated) > 1:
                    problems.append(f"rules.{i}: {repeated} filter cannot be repeated")
            for f in filters:
                field = f["type"][0].lower() + f["type"][1:]
                present = {k for k in f if k != "type"}
                if present != {field}:
                    problems.append(f"rules.{i}: filter.{field} must be set for type {f['type']}")
            if filters and rule.get("backendRefs") and "RequestRedirect" in types:
                problems.append(f"rules.{i}: RequestRedirect must not be used with backendRefs")
            for ref in rule.get("backendRefs", []):
                service = ref.get("group", "") == "" and ref.get("kind", "Service") == "Service"
                if service and "port" not in ref:
                    problems.append(f"rules.{i}: Must have port for Service reference")
            for match in rule.get("matches", []):
                path = match.get("path", {"type": "PathPrefix", "value": "/"})
                if path["type"] in ("Exact", "PathPrefix") and not path["value"].startswith("/"):
                    problems.append(f"rules.{i}: path must be absolute")
    return problems


PRODUCTION_MODEL = {
    "name": "llama-70b",
    "model": "meta-llama/Llama-3.1-70B-Instruct",
    "production": {"namespace": "inference", "pod_labels": {"app": "llama-70b"}, "port": 8000},
}
"""The served model pool.yaml shows as a comment: the owner's llama-70b-prod pods."""


def served_doc() -> Any:
    """The shipped policy document with ``PRODUCTION_MODEL``: a flex and a production pool."""
    doc = edited()
    doc["serving"]["models"].append(copy.deepcopy(PRODUCTION_MODEL))
    return doc


def served_policy() -> PoolPolicy:
    return parse_policy(served_doc())


def serving_objects(
    policy: PoolPolicy, api: ObjectiveApi = "llm-d.ai/v1alpha2", mode: str = "inference-extension"
) -> list[Manifest]:
    """The serving objects of ``policy``, by component label."""
    options = ServingOptions(mode, api)  # type: ignore[arg-type]
    objs = build_bundle(
        policy, stack=StackOptions("labels", serving=options), vllm_args=explicit_args(policy)
    )
    return [
        o for o in objs if o["metadata"]["labels"].get("app.kubernetes.io/component") == "serving"
    ]


def crd_objects(policy: PoolPolicy, api: ObjectiveApi) -> list[Manifest]:
    return [o for o in serving_objects(policy, api) if o["apiVersion"].startswith(CRD_GROUPS)]


@functools.cache
def shipped_crd_objects(api: ObjectiveApi) -> tuple[Manifest, ...]:
    """``crd_objects`` of ``served_policy``, built once (tests copy before mutating)."""
    return tuple(crd_objects(served_policy(), api))


@pytest.mark.parametrize("api", OBJECTIVE_APIS)
def test_every_crd_object_is_valid_for_its_vendored_crd(api: ObjectiveApi) -> None:
    objs = shipped_crd_objects(api)
    kinds = sorted({(o["apiVersion"], o["kind"]) for o in objs})
    assert kinds == sorted(
        {
            ("gateway.networking.k8s.io/v1", "HTTPRoute"),
            ("inference.networking.k8s.io/v1", "InferencePool"),
            (api, "InferenceObjective"),
        }
    )
    for obj in objs:
        where = f"{obj['kind']} {obj['metadata']['name']}"
        assert schema_errors(obj) == [], where
        assert cel_problems(obj) == [], where


def _mutated(kind: str, change: Callable[[Manifest], None]) -> Manifest:
    objs = shipped_crd_objects("llm-d.ai/v1alpha2")
    out = copy.deepcopy(next(o for o in objs if o["kind"] == kind))
    change(out)
    return out


def _del(*path: str) -> Callable[[Manifest], None]:
    def change(obj: Manifest) -> None:
        node = obj
        for part in path[:-1]:
            node = node[part]
        del node[path[-1]]

    return change


def _set(value: Any, *path: Any) -> Callable[[Manifest], None]:
    def change(obj: Manifest) -> None:
        node = obj
        for part in path[:-1]:
            node = node[part]
        node[path[-1]] = value

    return change


@pytest.mark.parametrize(
    ("kind", "change", "words"),
    [
        ("InferencePool", _del("spec", "targetPorts"), "'targetPorts' is a required property"),
        ("InferencePool", _del("spec", "selector"), "'selector' is a required property"),
        ("InferencePool", _set([], "spec", "targetPorts"), "should be non-empty"),
        ("InferencePool", _set(70000, "spec", "targetPorts", 0, "number"), "70000"),
        ("InferencePool", _set("Open", "spec", "endpointPickerRef", "failureMode"), "'Open'"),
        ("InferencePool", _set("grpc", "spec", "appProtocol"), "'grpc' is not one of"),
        ("InferencePool", _set(1, "spec", "colour"), "'colour' was unexpected"),
        ("InferencePool", _set({}, "spec", "selector", "matchLabels"), "should be non-empty"),
        ("InferenceObjective", _set("high", "spec", "priority"), "'high' is not of type"),
        ("InferenceObjective", _del("spec", "poolRef"), "'poolRef' is a required property"),
        ("InferenceObjective", _set("x", "spec", "poolRef", "namespace"), "was unexpected"),
        (
            "HTTPRoute",
            _set("Prefix", "spec", "rules", 0, "matches", 0, "headers", 0, "type"),
            "'Prefix'",
        ),
        ("HTTPRoute", _del("spec", "rules", 0, "backendRefs", 0, "name"), "'name' is a required"),
        (
            "HTTPRoute",
            _set("Bad_Section", "spec", "parentRefs", 0, "sectionName"),
            "does not match",
        ),
        ("HTTPRoute", _set([{}] * 17, "spec", "rules"), "is too long"),
    ],
)
def test_the_schemas_refuse_mutated_objects(
    kind: str, change: Callable[[Manifest], None], words: str
) -> None:
    errors = schema_errors(_mutated(kind, change))
    assert any(words in e for e in errors), errors


@pytest.mark.parametrize(
    ("kind", "change", "words"),
    [
        (
            "InferencePool",
            _set([{"number": 8000}, {"number": 8000}], "spec", "targetPorts"),
            "must be unique",
        ),
        ("InferencePool", _del("spec", "endpointPickerRef", "port"), "port is required"),
        (
            "HTTPRoute",
            lambda o: o["spec"]["rules"][0]["filters"].append(o["spec"]["rules"][0]["filters"][0]),
            "cannot be repeated",
        ),
        (
            "HTTPRoute",
            _set({"type": "RequestHeaderModifier"}, "spec", "rules", 0, "filters", 0),
            "must be set",
        ),
        (
            "HTTPRoute",
            _set([{"kind": "Service", "name": "x"}], "spec", "rules", 0, "backendRefs"),
            "Must have port",
        ),
        (
            "HTTPRoute",
            lambda o: o["spec"]["parentRefs"].append(dict(o["spec"]["parentRefs"][0])),
            "sectionName must be unique",
        ),
    ],
)
def test_the_cel_checks_refuse_what_the_crds_rules_refuse(
    kind: str, change: Callable[[Manifest], None], words: str
) -> None:
    obj = _mutated(kind, change)
    assert any(words in p for p in cel_problems(obj)), cel_problems(obj)


def test_the_option_picks_the_objective_group_and_the_loader_only_served_versions() -> None:
    for api in OBJECTIVE_APIS:
        kinds = {(o["apiVersion"], o["kind"]) for o in shipped_crd_objects(api)}
        assert (api, "InferenceObjective") in kinds
    with pytest.raises(ValueError, match="not enough values"):
        crd_validator("llm-d.ai/v1alpha1", "InferenceObjective")  # the CRD serves v1alpha2 only


def _git_blob_id(data: bytes) -> str:
    """What ``git hash-object`` prints for a file holding ``data``."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def test_the_vendored_crds_are_the_upstream_blobs_the_readme_names() -> None:
    rows = re.findall(
        r"^\| `([^`]+\.yaml)` \|.*\| `([0-9a-f]{40})` \|", (CRDS / "README.md").read_text(), re.M
    )
    assert sorted(path for path, _ in rows) == sorted(CRD_FILES.values())
    for path, blob in rows:
        assert _git_blob_id((CRDS / path).read_bytes()) == blob, path
    assert "Apache License" in (CRDS / "LICENSE").read_text()
