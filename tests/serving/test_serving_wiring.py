"""The serving layer's observability and retry wiring: each picker scraped with its pool's
name, the alerts reading exactly those labels and the policy's knobs, and ``Retry-After`` on
the sheddable classes' routes (schema-valid) when the policy asks for it."""

from __future__ import annotations

from typing import Any

import pytest

from alerts.bundle import rule_files
from alerts.rules import Rule
from alerts.serving import ERRORS, POLL_ERRORS, REQUESTS, SHED_CODE, VLLM_CONTAINER
from infra.builders.endpoint_picker import METRICS
from infra.builders.meta import Manifest
from infra.builders.scraping import POOL_TARGET_LABEL
from infra.builders.serving import RETRY_AFTER
from infra.builders.serving_options import ServingOptions
from infra.builders.serving_pools import pools
from infra.builders.stack_options import StackOptions
from infra.bundle import build_bundle
from policy import PoolPolicy, parse_policy
from tests.infra.policies import explicit_args
from tests.infra.test_serving_schemas import cel_problems, schema_errors, served_doc
from tests.serving.pod import vllm_container


def _bundle(policy: PoolPolicy, mode: str = "inference-extension") -> list[Manifest]:
    options = ServingOptions(mode)  # type: ignore[arg-type]
    return build_bundle(
        policy, stack=StackOptions("labels", serving=options), vllm_args=explicit_args(policy)
    )


def _serving_rules(policy: PoolPolicy) -> list[Rule]:
    (group,) = rule_files(policy)["serving"]
    return list(group["rules"])


def _alerts(policy: PoolPolicy, name: str) -> list[Rule]:
    return [r for r in _serving_rules(policy) if r.get("alert") == name]


def _with_thresholds(doc: Any, **thresholds: Any) -> PoolPolicy:
    doc.setdefault("alerting", {}).setdefault("thresholds", {}).update(thresholds)
    return parse_policy(doc)


def test_each_picker_is_scraped_on_its_metrics_port_with_its_pool_name() -> None:
    policy = parse_policy(served_doc())
    objs = _bundle(policy)
    monitors = {o["metadata"]["name"]: o for o in objs if o["kind"] == "PodMonitor"}
    served = pools(policy)
    assert {p.tier for p in served} == {"flex", "production"}
    for pool in served:
        monitor = monitors[pool.picker]
        assert monitor["metadata"]["namespace"] == pool.namespace
        (picker,) = [
            o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == pool.picker
        ]
        template = picker["spec"]["template"]
        selector = monitor["spec"]["selector"]["matchLabels"]
        assert selector.items() <= template["metadata"]["labels"].items()
        (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
        ports = {p["name"] for c in template["spec"]["containers"] for p in c["ports"]}
        assert endpoint["port"] == METRICS and METRICS in ports
        assert endpoint["relabelings"] == [
            {"targetLabel": POOL_TARGET_LABEL, "replacement": pool.name, "action": "replace"}
        ]
        # no other pod of the namespace is selected: not vLLM, not the other pool's picker
        others = [
            o
            for o in objs
            if o["kind"] == "Deployment"
            and o["metadata"].get("namespace") == pool.namespace
            and o is not picker
        ]
        for other in others:
            labels = other["spec"]["template"]["metadata"]["labels"]
            assert not selector.items() <= labels.items(), other["metadata"]["name"]
    # the flex pods' own PodMonitor is still the only other one
    assert set(monitors) == {p.picker for p in served} | {"gpupool-flex"}


@pytest.mark.parametrize("mode", ["services", "off"])
def test_no_picker_monitor_without_pickers(mode: str) -> None:
    objs = _bundle(parse_policy(served_doc()), mode)
    assert [o["metadata"]["name"] for o in objs if o["kind"] == "PodMonitor"] == ["gpupool-flex"]


def test_serving_rules_read_only_gpupools_pickers_and_flex_pods() -> None:
    policy = parse_policy(served_doc())
    rules = _serving_rules(policy)
    picker = f'{POOL_TARGET_LABEL}!=""'
    for rule in rules:
        expr = rule["expr"]
        for name in (*REQUESTS, *ERRORS, *POLL_ERRORS):
            for at in range(expr.count(name)):
                selector = expr.split(name + "{", at + 1)[at + 1].split("}", 1)[0]
                assert picker in selector, (name, rule.get("record") or rule["alert"])
        if "vllm:" in expr or "up{" in expr:
            assert f'namespace="{policy.cluster.flex_namespace}"' in expr
            assert "group by (namespace) (up{namespace=" in expr  # a picker runs there
    shed = next(r for r in rules if r.get("record") == "gpupool:serving_shed_requests:rate")
    assert f'error_code="{SHED_CODE}"' in shed["expr"]
    # the vLLM container gpupool renders is the one the scrape rule names
    assert vllm_container(policy, policy.workloads[0])["name"] == VLLM_CONTAINER


def test_rules_do_not_depend_on_the_serving_section() -> None:
    """A stack with serving off renders the same rule file with or without the section."""
    with_serving = parse_policy(served_doc())
    without = with_serving.model_copy(update={"serving": None})
    assert _serving_rules(with_serving) == _serving_rules(without)


def test_alert_knobs_come_from_the_policy() -> None:
    default = parse_policy(served_doc())
    changed = _with_thresholds(
        served_doc(),
        serving_shed={
            "max_share": 0.4,
            "min_requests_per_minute": 30,
            "for": "20m",
            "severity": "critical",
        },
        serving_metrics_stale={"for": "7m", "severity": "info"},
        serving_terminating_requests={"window": "30m", "for": "2m", "severity": "critical"},
    )
    (shed,) = _alerts(default, "ServingRequestsShed")
    assert " > 0.25 and " in shed["expr"] and shed["expr"].endswith(">= 6.0")
    (shed,) = _alerts(changed, "ServingRequestsShed")
    assert " > 0.4 and " in shed["expr"] and shed["expr"].endswith(">= 30.0")
    assert (shed["for"], shed["labels"]["severity"]) == ("20m", "critical")
    assert "limit 40% for 20m, at 30 requests per minute" in shed["annotations"]["description"]
    stale = _alerts(changed, "ServingEndpointMetricsStale")
    assert sorted(r["labels"]["signal"] for r in stale) == ["picker-polls", "scrape"]
    assert {(r["for"], r["labels"]["severity"]) for r in stale} == {("7m", "info")}
    (term,) = _alerts(changed, "ServingRequestsToTerminatingPod")
    assert "[30m:" in term["expr"] and term["for"] == "2m"
    assert "in the last 30m" in term["annotations"]["description"]
    # the abort window is two scrapes (gpupool's PodMonitors scrape at evaluation_interval)
    assert f"[{2 * 30}s]" in _alerts(default, "ServingRequestsToTerminatingPod")[0]["expr"]


def test_window_must_exceed_for() -> None:
    with pytest.raises(Exception, match=r"window \(1m\) must exceed for \(5m\)"):
        _with_thresholds(
            served_doc(),
            serving_terminating_requests={"window": "1m", "for": "5m", "severity": "warning"},
        )


def _routes(policy: PoolPolicy) -> dict[str, Manifest]:
    return {o["metadata"]["name"]: o for o in _bundle(policy) if o["kind"] == "HTTPRoute"}


def test_retry_after_on_sheddable_routes_only_when_asked() -> None:
    doc = served_doc()
    for route in _routes(parse_policy(doc)).values():  # off by default
        for rule in route["spec"]["rules"]:
            assert [f["type"] for f in rule["filters"]] == ["RequestHeaderModifier"]
    doc["serving"]["retry_after_s"] = 7
    policy = parse_policy(doc)
    assert policy.serving is not None
    priority = {c.name: c.priority for c in policy.serving.traffic_classes}
    seen = set()
    for route in _routes(policy).values():
        assert schema_errors(route) == [] and cel_problems(route) == []
        for rule in route["spec"]["rules"]:
            modifiers = [f for f in rule["filters"] if f["type"] == "ResponseHeaderModifier"]
            seen.add(rule["name"])
            if priority[rule["name"]] < 0:
                (modifier,) = modifiers
                assert modifier["responseHeaderModifier"] == {
                    "set": [{"name": RETRY_AFTER, "value": "7"}]
                }
            else:
                assert modifiers == []  # production traffic is never shed
    assert seen == set(priority)


@pytest.mark.parametrize("value", [0, 3601])
def test_retry_after_bounds(value: int) -> None:
    doc = served_doc()
    doc["serving"]["retry_after_s"] = value
    with pytest.raises(Exception, match="retry_after_s"):
        parse_policy(doc)
