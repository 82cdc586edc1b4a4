"""The snapshot-tier rules and panels read series that really exist, and only those.

The names are checked against what the snapshot GC sidecar itself exports: a real
``SnapshotGc`` over a temporary volume, one pass done and the pod's tier record written, so
the tier's own gauges (absent until it has started and hit once) are there too.
"""

from __future__ import annotations

import re

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from alerts.bundle import rule_files
from alerts.dashboard import dashboard
from policy import PoolPolicy
from runtime.kvcache.preservation.gc import GcSettings, SnapshotGc
from runtime.kvcache.preservation.status import TierStatus, status_path, write_status
from runtime.metrics.catalogue import build_catalogue

TIER = re.compile(r"\bgpupool_kv_tier_[a-z0-9_]+")
RECORDED = re.compile(r"\bgpupool:[a-z0-9_:]+")
SELECTOR = re.compile(r"\b([a-zA-Z_][a-zA-Z0-9_:]*)\{")

RAW_ON_THE_DASHBOARD = {"kube_deployment_status_replicas"}
"""Raw exporter series the dashboard shows besides the tier's (kube-state-metrics)."""


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    """Sample names a snapshot GC sidecar serves once its pod's tier has started and hit."""
    root = tmp_path_factory.mktemp("volume")
    status = TierStatus(pod="llm-0", tier="gpupool-kv-0", started_at=1.0, hits=1, first_hit_s=2)
    write_status(status_path(root, status), status)
    registry = CollectorRegistry()
    gc = SnapshotGc(root, "llm-0", registry)
    gc.run_once(GcSettings(capacity_bytes=1 << 20, reclaim_after_s=900, interval_s=60))
    text = generate_latest(registry).decode()
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


def _exprs(policy: PoolPolicy, stem: str) -> list[str]:
    return [r["expr"] for g in rule_files(policy)[stem] for r in g["rules"]]


def _panel_exprs(policy: PoolPolicy) -> list[str]:
    return [t["expr"] for p in dashboard(policy)["panels"] for t in p.get("targets", [])]


def test_the_exported_names_include_the_tiers_own_gauges(exported: set[str]) -> None:
    """Guards the fixture: without a started tier the names below would not be checked."""
    assert {
        "gpupool_kv_tier_first_hit_seconds",
        "gpupool_kv_tier_restored_hits_first_minute",
        "gpupool_kv_tier_evicted_age_seconds_bucket",
        "gpupool_kv_tier_flush_blocks_total",
    } <= exported


def test_rules_read_only_series_the_snapshot_gc_exports(
    test_policy: PoolPolicy, exported: set[str]
) -> None:
    catalogue = " ".join(q.expr for q in build_catalogue(test_policy))
    used = set(TIER.findall(" ".join(_exprs(test_policy, "kv_snapshots")) + catalogue))
    assert len(used) >= 6, used
    assert used <= exported, f"not exported by the snapshot GC: {sorted(used - exported)}"


def test_snapshot_alerts_read_nothing_that_exists_without_preservation(
    test_policy: PoolPolicy,
) -> None:
    """Each alert needs a sidecar series: where preservation is off none exists, so none can
    fire (``up`` only narrows the GC's own series to targets that still exist)."""
    for expr in _exprs(test_policy, "kv_snapshots"):
        selected = set(SELECTOR.findall(expr))
        assert any(TIER.fullmatch(name) for name in selected), expr
        assert {n for n in selected if not TIER.fullmatch(n)} <= {"up"}, expr
        if "up{" in expr:
            assert re.search(r"\) and on \([^)]*\binstance\b[^)]*\) up\{", expr), expr


def test_dashboard_panels_reference_only_series_that_exist(
    test_policy: PoolPolicy, exported: set[str]
) -> None:
    records = {q.record for q in build_catalogue(test_policy)}
    exprs = _panel_exprs(test_policy)
    text = " ".join(exprs)
    assert set(RECORDED.findall(text)) <= records
    assert set(TIER.findall(text)) <= exported
    assert {
        "gpupool:kv_tier_fill:ratio",
        "gpupool:kv_tier_deletions:per_minute",
        "gpupool:prompt_tokens_from_tier:ratio",
    } <= set(RECORDED.findall(text))
    assert {
        "gpupool_kv_tier_restored_hits_first_minute",
        "gpupool_kv_tier_first_hit_seconds",
    } <= set(TIER.findall(text))
    raw = {
        name
        for name in SELECTOR.findall(text)
        if not name.startswith("gpupool:") and not TIER.fullmatch(name)
    }
    assert raw <= RAW_ON_THE_DASHBOARD, raw


def test_the_snapshot_tier_panels_form_their_own_row(test_policy: PoolPolicy) -> None:
    panels = dashboard(test_policy)["panels"]
    assert [p["id"] for p in panels] == list(range(1, len(panels) + 1))
    (row,) = [p for p in panels if p["type"] == "row"]
    top = row["gridPos"]["y"]
    above = [p for p in panels if p["gridPos"]["y"] < top]
    below = [p for p in panels if p["gridPos"]["y"] > top]
    assert top == max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in above)
    tier = re.compile(r"gpupool(_kv_tier_|:kv_tier_|:prompt_tokens_from_tier)")
    assert len(below) == 5
    assert all(tier.search(t["expr"]) for p in below for t in p["targets"])
    assert not any(tier.search(t["expr"]) for p in above for t in p["targets"])
    cells = [
        (x, y)
        for p in panels
        for x in range(p["gridPos"]["x"], p["gridPos"]["x"] + p["gridPos"]["w"])
        for y in range(p["gridPos"]["y"], p["gridPos"]["y"] + p["gridPos"]["h"])
    ]
    assert len(cells) == len(set(cells)), "panels overlap"
