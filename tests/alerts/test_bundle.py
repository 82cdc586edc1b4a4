"""The bundle is a pure function of the policy: thresholds flow in, files are deterministic,
writes are atomic, every runbook link resolves, and the Kubernetes objects are valid."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from ruamel.yaml import YAML
from typer.testing import CliRunner

from alerts.bundle import alert_names, all_groups
from alerts.dashboard import dashboard
from alerts.kv_snapshots import thrashing_window
from alerts.manifests import monitoring_objects
from alerts.render import bundle_files, render
from infra.render import adapter_documents
from policy import PoolPolicy, parse_policy
from runtime.cli.app import app
from runtime.metrics.catalogue import (
    FLEX_GPU_BUDGET,
    FLEX_HEADROOM_GPUS,
    HPA_METRIC,
    KV_CACHE_HIT_RATE,
    PRODUCTION_GPU_UTILIZATION,
    SPARE_GPUS,
    UNALLOCATED_GPUS,
    build_catalogue,
)
from tests.alerts.conftest import TEST_POLICY
from tests.harness.servers import REPO

RUNBOOKS = REPO / "docs" / "runbooks.md"


def _alerts(policy: PoolPolicy) -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for g in all_groups(policy) for r in g["rules"] if "alert" in r}


def _with(policy: PoolPolicy, thresholds: dict[str, Any]) -> PoolPolicy:
    document = policy.model_dump(by_alias=True, mode="json")
    for name, knobs in thresholds.items():
        document["alerting"]["thresholds"][name].update(knobs)
    return parse_policy(document)


def test_thresholds_and_for_come_from_the_policy(test_policy: PoolPolicy) -> None:
    changed = _with(
        test_policy,
        {
            "flex_eviction_rate": {"per_minute_max": 7.5, "for": "3m", "severity": "critical"},
            "kv_hit_rate": {"min": 0.6, "for": "45m"},
            "gpu_memory_pressure": {"max": 0.9},
        },
    )
    before, after = _alerts(test_policy), _alerts(changed)
    assert before["FlexEvictionRateHigh"]["expr"].endswith("> 5.0")
    assert after["FlexEvictionRateHigh"]["expr"].endswith("> 7.5")
    assert after["FlexEvictionRateHigh"]["for"] == "3m"
    assert after["FlexEvictionRateHigh"]["labels"]["severity"] == "critical"
    assert (
        "limit 7.5 per minute for 3m" in after["FlexEvictionRateHigh"]["annotations"]["description"]
    )
    assert after["KVCacheHitRateLow"]["expr"].startswith(f"({KV_CACHE_HIT_RATE} < 0.6) unless")
    assert after["KVCacheHitRateLow"]["for"] == "45m"
    assert "minimum 60% for 45m" in after["KVCacheHitRateLow"]["annotations"]["description"]
    assert after["GPUMemoryPressure"]["expr"].endswith("> 0.9")


def test_snapshot_tier_knobs_come_from_the_policy(test_policy: PoolPolicy) -> None:
    changed = _with(
        test_policy,
        {
            "kv_hit_rate": {"warmup": "25m"},
            "kv_tier_thrashing": {"quantile": 0.9, "evicted_age_below": "1h", "for": "2h"},
            "kv_snapshot_gc_stalled": {"missed_passes": 3, "lookback": "2h"},
            "kv_snapshot_gc_errors": {"severity": "critical"},
            "kv_snapshot_flush_dropped": {"max_dropped_share": 0.25, "window": "3h"},
        },
    )
    before, after = _alerts(test_policy), _alerts(changed)
    assert before["KVCacheHitRateLow"]["expr"].endswith("< 600.0)")
    assert after["KVCacheHitRateLow"]["expr"].endswith("< 1500.0)")
    assert "after a 25m warm-up" in after["KVCacheHitRateLow"]["annotations"]["description"]
    thrash = after["KVSnapshotTierThrashing"]
    assert thrash["expr"].startswith("histogram_quantile(0.9, ")
    assert thrash["expr"].endswith("< 3600.0")
    assert thrash["for"] == "2h"
    assert "90th percentile" in thrash["annotations"]["description"]
    assert "median" in before["KVSnapshotTierThrashing"]["annotations"]["description"]
    stalled = after["KVSnapshotGCStalled"]["expr"]
    assert stalled.endswith("> 180.0") and "[2h]" in stalled  # 3 x snapshot_gc_interval 1m
    assert after["KVSnapshotGCErrors"]["labels"]["severity"] == "critical"
    flush = after["KVSnapshotFlushDropped"]
    assert flush["expr"].endswith("> 0.25") and flush["expr"].count("[3h]") == 2
    assert "limit 25% for 5m" in flush["annotations"]["description"]


def test_thrashing_window_holds_several_gc_passes(test_policy: PoolPolicy) -> None:
    """The quantile's window is rate_window, or three GC intervals where those are longer, so
    a slow GC's passes never leave a window empty (which would reset the alert's for:)."""
    document = test_policy.model_dump(by_alias=True, mode="json")
    assert thrashing_window(test_policy) == "5m"
    document["kv_cache"]["snapshot_gc_interval"] = "10m"
    slow = parse_policy(document)
    assert thrashing_window(slow) == "1800s"
    assert "[1800s]" in _alerts(slow)["KVSnapshotTierThrashing"]["expr"]
    assert "over 1800s" in _alerts(slow)["KVSnapshotTierThrashing"]["annotations"]["description"]


def test_every_alert_has_for_severity_and_annotations(test_policy: PoolPolicy) -> None:
    for name, rule in _alerts(test_policy).items():
        assert rule["for"], name
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, name
        assert rule["labels"]["cluster"] == test_policy.cluster.name, name
        assert {"summary", "description", "runbook_url"} <= set(rule["annotations"]), name


def _runbook_sections() -> dict[str, str]:
    sections: dict[str, str] = {}
    current = None
    for line in RUNBOOKS.read_text().splitlines():
        heading = re.match(r"^## (\S+)$", line)
        if heading:
            current = heading.group(1).lower()
            sections[current] = ""
        elif current is not None:
            sections[current] += line + "\n"
    return sections


def test_every_runbook_url_points_at_a_section_that_says_what_to_do(
    test_policy: PoolPolicy,
) -> None:
    sections = _runbook_sections()
    base = test_policy.alerting.runbook_base_url
    for name, rule in _alerts(test_policy).items():
        url = rule["annotations"]["runbook_url"]
        assert url.startswith(base + "#"), url
        anchor = url.split("#", 1)[1]
        assert anchor in sections, f"{name}: docs/runbooks.md has no section #{anchor}"
        assert "**What to do.**" in sections[anchor], name


def test_render_is_deterministic_and_replaces_the_directory(
    test_policy: PoolPolicy, tmp_path: Path
) -> None:
    out = tmp_path / "bundle"
    out.mkdir()
    (out / "stale.yaml").write_text("left from an older render")
    first = {p.relative_to(out): p.read_bytes() for p in render(test_policy, out)}
    assert not (out / "stale.yaml").exists()
    second = {p.relative_to(out): p.read_bytes() for p in render(test_policy, out)}
    assert first == second
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bundle"], "no staging dirs left"
    assert set(map(str, first)) == set(bundle_files(test_policy))


def test_cli_renders_and_reports_a_bad_policy_without_touching_out(tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "out"
    ok = runner.invoke(app, ["alerts", "render", "--out", str(out), str(TEST_POLICY)])
    assert ok.exit_code == 0, ok.output
    assert (out / "alertmanager.yml").exists()
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    bad = tmp_path / "bad.yaml"
    bad.write_text(TEST_POLICY.read_text().replace("per_minute_max: 5,", "per_minute_max: -1,"))
    failed = runner.invoke(app, ["alerts", "render", "--out", str(out), str(bad)])
    assert failed.exit_code == 1
    assert "flex_eviction_rate.per_minute_max" in failed.output
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_monitoring_objects_are_valid_kubernetes(test_policy: PoolPolicy) -> None:
    objects = {o["kind"] + "/" + o["metadata"]["name"]: o for o in monitoring_objects(test_policy)}
    assert set(objects) == {
        "PrometheusRule/gpupool",
        "AlertmanagerConfig/gpupool",
        "ConfigMap/gpupool-dashboard",
    }
    for key, obj in objects.items():
        namespace = (
            test_policy.network.alertmanager_home
            if obj["kind"] == "AlertmanagerConfig"
            else test_policy.cluster.system_namespace
        )
        assert obj["metadata"]["namespace"] == namespace
        if obj["apiVersion"] == "v1":
            kubernetes_validate.validate(obj, "1.30.0", strict=True)
        else:
            assert obj["apiVersion"].startswith("monitoring.coreos.com/v1"), key
    rule = objects["PrometheusRule/gpupool"]
    assert rule["spec"]["groups"] == all_groups(test_policy)
    dashboard = objects["ConfigMap/gpupool-dashboard"]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    exprs = {
        t["expr"]
        for p in json.loads(dashboard["data"]["gpupool.json"])["panels"]
        for t in p.get("targets", [])
    }
    assert FLEX_GPU_BUDGET in exprs
    assert {q.record for q in build_catalogue(test_policy)} & exprs >= {
        "gpupool:kv_cache_hit_rate:ratio",
        "gpupool:flex_evictions:per_minute",
        "gpupool:gpu_memory_used:ratio",
    }
    assert {
        PRODUCTION_GPU_UTILIZATION,
        UNALLOCATED_GPUS,
        SPARE_GPUS,
        FLEX_HEADROOM_GPUS,
    } <= exprs


def test_adapter_rules_are_a_fragment_to_merge_not_an_object(test_policy: PoolPolicy) -> None:
    """The cluster's one prometheus-adapter reads one config.yaml: gpupool ships entries to
    append to its lists (Helm values or config.yaml keys), never a ConfigMap replacing it."""
    kinds = {(o["kind"], o["metadata"]["name"]) for o in monitoring_objects(test_policy)}
    assert not any("adapter" in name for _, name in kinds)
    documents = adapter_documents(test_policy)
    assert set(documents) == {"_prometheus-adapter/values.yaml", "_prometheus-adapter/rules.yaml"}
    yaml = YAML(typ="safe")
    values = yaml.load(documents["_prometheus-adapter/values.yaml"])
    raw = yaml.load(documents["_prometheus-adapter/rules.yaml"])
    assert values == {"rules": {"external": raw["externalRules"]}}
    assert set(raw) == {"externalRules"}  # no production HPA in the test policy: no custom rules
    (rule,) = raw["externalRules"]
    assert rule["name"] == {"matches": f"^{FLEX_GPU_BUDGET}$", "as": HPA_METRIC}
    assert rule["resources"] == {"namespaced": False}
    for text in documents.values():
        assert "do not replace it" in text.splitlines()[1]


def test_dashboard_names_nodes_by_the_policys_gpu_node_label(test_policy: PoolPolicy) -> None:
    document = test_policy.model_dump(by_alias=True, mode="json")
    document["metrics"]["gpu_node_label"] = "hostname"
    text = json.dumps(dashboard(parse_policy(document)))
    assert "{{hostname}}" in text and "Hostname" not in text


def test_kv_hit_rate_needs_the_policys_minimum_query_rate(test_policy: PoolPolicy) -> None:
    def hit_rate(tokens_per_s: float) -> str:
        document = test_policy.model_dump(by_alias=True, mode="json")
        document["alerting"]["thresholds"]["kv_hit_rate"]["min_queried_tokens_per_s"] = tokens_per_s
        return build_catalogue(parse_policy(document)).query(KV_CACHE_HIT_RATE)

    assert hit_rate(25).endswith(">= 25.0)")
    assert hit_rate(0).endswith("> 0)"), "0 keeps every instance with any query"


def test_alert_names_are_camel_case(test_policy: PoolPolicy) -> None:
    for name in alert_names(test_policy):
        assert re.fullmatch(r"(?:[A-Z][a-zA-Z0-9]*)+", name), name


def test_catalogue_answers_queries_by_recorded_name(test_policy: PoolPolicy) -> None:
    catalogue = build_catalogue(test_policy)
    records = [q.record for q in catalogue]
    assert len(records) == len(set(records))
    for record in records:
        assert record.startswith("gpupool:")
        standalone = catalogue.query(record)
        assert re.search(r"gpupool:[a-z]", standalone) is None, f"{record} reads a recording"
        if catalogue[record].standalone is None:
            assert standalone == catalogue[record].expr
    assert catalogue.query(FLEX_GPU_BUDGET) != catalogue[FLEX_GPU_BUDGET].expr
    with pytest.raises(KeyError, match="gpupool:nope"):
        catalogue.query("gpupool:nope")
