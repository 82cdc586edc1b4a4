"""The PodMonitor scrapes exactly the flex pods, on ports they expose, with the labels the
catalogue's per-instance queries group by."""

from __future__ import annotations

import pytest

from infra.builders.meta import Manifest
from infra.builders.scraping import INSTANCE_META_LABEL
from infra.builders.stack_options import StackOptions
from infra.bundle import build_bundle
from policy import PoolPolicy
from tests.infra.policies import explicit_args, policy_with, two_workloads


def _bundle(policy: PoolPolicy) -> list[Manifest]:
    return build_bundle(policy, stack=StackOptions("labels"), vllm_args=explicit_args(policy))


def _pod_monitor(objs: list[Manifest]) -> Manifest:
    (monitor,) = [o for o in objs if o["kind"] == "PodMonitor"]
    return monitor


def _port_names(deployment: Manifest) -> set[str]:
    pod = deployment["spec"]["template"]["spec"]
    return {p["name"] for c in pod["containers"] for p in c.get("ports", [])}


@pytest.mark.parametrize(
    "policy",
    [two_workloads(), policy_with({"workloads.0.kv_compaction": False})],
    ids=["compaction-on", "compaction-off"],
)
def test_monitor_selects_every_flex_pod_on_a_port_it_exposes(policy: PoolPolicy) -> None:
    objs = _bundle(policy)
    monitor = _pod_monitor(objs)
    assert monitor["metadata"]["namespace"] == policy.cluster.flex_namespace
    selector = monitor["spec"]["selector"]["matchLabels"]
    endpoints = {e["port"] for e in monitor["spec"]["podMetricsEndpoints"]}
    deployments = [o for o in objs if o["kind"] == "Deployment"]
    flex = [d for d in deployments if d["metadata"]["namespace"] == policy.cluster.flex_namespace]
    assert len(flex) == len(policy.workloads)
    for deployment in flex:
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= labels.items()
        assert labels["app.kubernetes.io/instance"] == deployment["metadata"]["name"]
        exposed = endpoints & _port_names(deployment)
        assert "http" in exposed
        name = deployment["metadata"]["name"]
        compaction = next(w for w in policy.workloads if w.name == name).kv_compaction
        assert (exposed == endpoints) == compaction
    for other in deployments:
        if other not in flex:
            labels = other["spec"]["template"]["metadata"]["labels"]
            assert not selector.items() <= labels.items(), other["metadata"]["name"]


def test_scrape_labels_cover_the_catalogue_instance_labels() -> None:
    policy = policy_with({"metrics.workload_label": "flex_workload"})
    monitor = _pod_monitor(_bundle(policy))
    for endpoint in monitor["spec"]["podMetricsEndpoints"]:
        (relabel,) = endpoint["relabelings"]
        assert relabel["sourceLabels"] == [INSTANCE_META_LABEL]
        assert relabel["targetLabel"] == "flex_workload"
        assert endpoint["interval"] == policy.metrics.evaluation_interval
    provided = {"namespace", "pod", "flex_workload"}
    assert set(policy.metrics.instance_labels) - {"workload"} <= provided
