"""The serving section: its defaults, and every rule a policy can break, refused at its line
with what was expected (through ``infra.inputs.load_inputs`` and ``gpupool render``, which
writes nothing), the way tests/policy/test_rejections.py checks the other sections."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from infra.builders.policy_config import policy_text, sidecar_policy
from infra.builders.serving_options import ServingOptions
from infra.inputs import load_inputs
from policy import DEFAULT_POLICY, PolicyError, load_policy, parse_policy
from policy.serving import EndpointPicker, Serving, ServingGateway, TrafficClass
from runtime.cli.app import app
from tests.infra.test_serving_schemas import PRODUCTION_MODEL
from tests.policy.test_rejections import (
    Edit,
    _policy_file,
    _set,
    assert_rejected_at_its_line,
    yaml,
)

runner = CliRunner()


def _append(path: str, item: Any) -> Edit:
    def apply(doc: Any) -> None:
        node = doc
        for part in path.split("."):
            node = node[int(part)] if part.isdigit() else node[part]
        node.append(copy.deepcopy(item))

    return apply


def _model(name: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "model": f"example/{name}", **fields}


CASES: list[tuple[str, Edit, str, list[str]]] = [
    (
        "flex-class-not-sheddable",
        _set(serving__traffic_classes__1__priority=5),
        "serving.traffic_classes.1.priority",
        ["served only by flex instances", "gpupool-idle-inference", "expected a negative"],
    ),
    (
        "production-traffic-on-flex",
        _set(serving__traffic_classes__0__served_by="flex"),
        "serving.traffic_classes.0.priority",
        ["'production' is served only by flex", "priority 100 is not sheddable"],
    ),
    (
        "production-instances-outside-production",
        _set(serving__models__1__production__namespace="elsewhere"),
        "serving.models.1.production.namespace",
        ["'elsewhere' holds no production workload", "['inference']", "expected one of"],
    ),
    (
        "pools-that-take-each-others-pods",
        _append(
            "serving.models",
            _model(
                "llama-70b-long",
                production={
                    "namespace": "inference",
                    "pod_labels": {"app": "llama-70b", "x": "y"},
                    "port": 8000,
                },
            ),
        ),
        "serving.models.2.production.pod_labels",
        ["'llama-70b' (serving.models.1)", "one of which contains the other"],
    ),
    (
        "prefix-scorer-without-prefix-caching",
        _set(kv_cache__prefix_caching=False),
        "serving.endpoint_picker.prefix_cache_scorer_weight",
        ["prefix_caching is off", "expected weight 0"],
    ),
    (
        "no-scorer",
        _set(
            serving__endpoint_picker__queue_scorer_weight=0,
            serving__endpoint_picker__kv_cache_scorer_weight=0,
            serving__endpoint_picker__prefix_cache_scorer_weight=0,
        ),
        "serving.endpoint_picker.queue_scorer_weight",
        ["every scorer weight is 0"],
    ),
    (
        "model-name-repeated",
        _append("serving.models", _model("llama-8b")),
        "serving.models.2.name",
        ["'llama-8b' is repeated"],
    ),
    (
        "model-id-repeated",
        _append("serving.models", {"name": "other", "model": "meta-llama/Llama-3.1-8B-Instruct"}),
        "serving.models.2.model",
        ["served twice"],
    ),
    (
        "class-repeated",
        _append("serving.traffic_classes", {"name": "batch", "priority": -1, "served_by": "flex"}),
        "serving.traffic_classes.2.name",
        ["'batch' is repeated"],
    ),
    (
        "objective-names-collide",
        lambda doc: doc["serving"].update(
            models=[_model("a-b"), _model("a")],
            traffic_classes=[
                {"name": "c", "priority": -1, "served_by": "flex"},
                {"name": "b-c", "priority": -2, "served_by": "flex"},
            ],
        ),
        "serving.traffic_classes",
        ["InferenceObjective name 'a-b-c'", "a-b/c already has"],
    ),
    (
        "model-name-too-long",
        _set(serving__models__0__name="m" * 41),
        "serving.models.0.name",
        ["at most 40 characters"],
    ),
    (
        "model-name-not-a-service-name",
        _set(serving__models__0__name="8b"),
        "serving.models.0.name",
        ["DNS-1035"],
    ),
    (
        "class-name-too-long",
        _set(serving__traffic_classes__1__name="b" * 23),
        "serving.traffic_classes.1.name",
        ["at most 22 characters"],
    ),
    (
        "priority-beyond-int32",
        _set(serving__traffic_classes__0__priority=2**31),
        "serving.traffic_classes.0.priority",
        ["less than 2147483648"],
    ),
    (
        "unknown-tier",
        _set(serving__traffic_classes__1__served_by="gpu"),
        "serving.traffic_classes.1.served_by",
        ["'production' or 'flex'"],
    ),
    (
        "unknown-failure-mode",
        _set(serving__endpoint_picker__failure_mode="Open"),
        "serving.endpoint_picker.failure_mode",
        ["'FailClose' or 'FailOpen'"],
    ),
    (
        "gateway-missing",
        lambda doc: doc["serving"].pop("gateway"),
        "serving.gateway",
        ["required field is missing"],
    ),
    (
        "bad-image",
        _set(serving__endpoint_picker__images__gie="Registry/EPP"),
        "serving.endpoint_picker.images.gie",
        ["expected an image reference"],
    ),
    (
        "too-many-classes",
        _set(
            serving__traffic_classes=[
                {"name": f"c{i}", "priority": -1 - i, "served_by": "flex"} for i in range(17)
            ]
        ),
        "serving.traffic_classes",
        ["at most 16 items"],
    ),
    (
        "no-pod-labels",
        _set(serving__models__1__production__pod_labels={}),
        "serving.models.1.production.pod_labels",
        ["at least 1 item"],
    ),
    (
        "bad-pod-label",
        _set(serving__models__1__production__pod_labels={"app": "no spaces"}),
        "serving.models.1.production.pod_labels.app",
        ["expected a label value"],
    ),
    (
        "unknown-field",
        _set(serving__router="envoy"),
        "serving.router",
        ["unknown field"],
    ),
]


@pytest.mark.parametrize(
    ("edit", "path", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_rejected_at_its_line_with_what_was_expected(
    tmp_path: Path, edit: Edit, path: str, words: list[str]
) -> None:
    source = _policy_file(
        lambda doc: (_append("serving.models", PRODUCTION_MODEL)(doc), edit(doc)), tmp_path
    )
    assert_rejected_at_its_line(source, path, words)


def _second_flex_workload(port: int) -> Edit:
    def apply(doc: Any) -> None:
        second = copy.deepcopy(doc["workloads"][0])
        second.update(name="llama-8b-flex-b", port=port)
        doc["workloads"].append(second)

    return apply


@pytest.mark.parametrize("mode", ["inference-extension", "services"])
def test_one_port_per_pool_is_required_where_a_serving_mode_renders(
    tmp_path: Path, mode: str
) -> None:
    """Two flex workloads of one model on two ports: fine with serving off (nothing routes
    to them), a located error for a mode that renders a pool or Services."""
    source = _policy_file(_second_flex_workload(8001), tmp_path)
    load_inputs(source)  # off
    with pytest.raises(PolicyError) as caught:
        load_inputs(source, serving=ServingOptions(mode))  # type: ignore[arg-type]
    (problem,) = caught.value.problems
    assert problem.path == "workloads.1.port"
    assert "'llama-8b-flex' on 8000" in problem.message and "expected port 8000" in problem.message
    assert "port: 8001" in source.read_text().splitlines()[problem.line - 1]
    result = runner.invoke(
        app, ["render", str(source), "--out", str(tmp_path / "b"), "--serving", mode]
    )
    assert result.exit_code == 1 and f"{source}:{problem.line}: workloads.1.port: " in result.output
    same = _policy_file(_second_flex_workload(8000), tmp_path / "same")
    load_inputs(same, serving=ServingOptions(mode))  # type: ignore[arg-type]


def test_a_serving_mode_without_a_serving_section_is_located(tmp_path: Path) -> None:
    source = _policy_file(lambda doc: doc.pop("serving"), tmp_path)
    load_inputs(source)
    with pytest.raises(PolicyError) as caught:
        load_inputs(source, serving=ServingOptions("inference-extension"))
    (problem,) = caught.value.problems
    assert (problem.path, problem.line) == ("serving", 1)
    assert "no serving section" in problem.message


def test_defaults_and_the_shipped_section() -> None:
    picker = EndpointPicker()
    weights = (
        picker.queue_scorer_weight,
        picker.kv_cache_scorer_weight,
        picker.prefix_cache_scorer_weight,
    )
    assert weights == (2, 2, 3)  # the upstream chart's
    assert (picker.queue_depth_max, picker.metrics_staleness_ms) == (5, 200)  # upstream defaults
    assert picker.failure_mode == "FailClose"
    gateway = ServingGateway(name="g", namespace="gw")
    serving = Serving(gateway=gateway, models=[{"name": "m", "model": "x/m"}])  # type: ignore[list-item]
    assert serving.traffic_classes == [
        TrafficClass(name="production", priority=100, served_by="production"),
        TrafficClass(name="batch", priority=-10, served_by="flex"),
    ]
    shipped = load_policy().serving
    assert shipped is not None
    assert shipped.endpoint_picker == picker
    assert shipped.traffic_classes == serving.traffic_classes
    assert [m.name for m in shipped.models] == ["llama-8b"]


def test_the_sidecars_policy_without_workloads_still_loads() -> None:
    """The gpupool-policy ConfigMap drops the workloads; no serving rule may need them."""
    policy = load_policy()
    assert parse_policy(yaml.load(policy_text(sidecar_policy(policy)))) == sidecar_policy(policy)


def test_the_shipped_file_names_every_serving_field() -> None:
    """pool.yaml restates the section, so a reader sees every knob (comments say what)."""
    text = DEFAULT_POLICY.read_text()
    for field in (*EndpointPicker.model_fields, *Serving.model_fields, "pod_labels", "served_by"):
        # (production instances appear in a comment)
        assert f"{field}:" in text, field


def test_a_workload_named_like_a_picker_is_located(tmp_path: Path) -> None:
    def clash(doc: Any) -> None:
        second = copy.deepcopy(doc["workloads"][0])
        second.update(name="llama-8b-flex-epp", model="example/other", port=8001)
        doc["workloads"].append(second)

    source = _policy_file(clash, tmp_path)
    load_inputs(source)
    with pytest.raises(PolicyError) as caught:
        load_inputs(source, serving=ServingOptions("inference-extension"))
    (problem,) = caught.value.problems
    assert problem.path == "serving.models"
    assert "Deployment gpupool-flex/llama-8b-flex-epp" in problem.message
    assert "expected distinct names" in problem.message
