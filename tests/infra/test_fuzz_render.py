"""Property: every valid policy renders, and everything it renders is valid Kubernetes.

Hypothesis draws policies that satisfy the model's invariants by construction (namespaces,
pool label, pools, nodes, Karpenter settings, tiers, disruption and HPA knobs, 1-3
workloads); each must build for both targets, pass kubernetes-validate strict (1.30), match
the Karpenter NodePool schema, and round-trip through the rendered YAML.
"""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ruamel.yaml import YAML

from infra.builders.stack_options import StackOptions
from infra.bundle import build_bundle
from infra.render import KUSTOMIZATION, render_documents
from policy import parse_policy
from tests.infra.policies import BASE, explicit_args
from tests.infra.test_karpenter_schema import VALIDATOR, cel_problems
from tests.infra.test_kubernetes_schemas import CRD_GROUPS

dns = st.from_regex(r"[a-z]([-a-z0-9]{0,20}[a-z0-9])?", fullmatch=True)
label_key = st.builds(
    lambda prefix, name: f"{prefix}/{name}" if prefix else name,
    st.sampled_from(["", "gpupool.io", "example.com", "pools.acme.dev"]),
    st.from_regex(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,20}[A-Za-z0-9])?", fullmatch=True),
)
quantity = st.builds(
    lambda n, unit: f"{n}{unit}", st.integers(1, 512), st.sampled_from(["", "Gi", "Mi", "m"])
)
karpenter_duration = st.sampled_from(["30s", "10m", "1h", "1h30m", "Never"])


@st.composite
def policies(draw: st.DrawFn) -> Any:
    doc: Any = {k: v for k, v in BASE.items() if k in ("alerting", "kv_cache", "elastic", "tuner")}
    own = dns.filter(lambda n: n != "default" and not n.startswith("kube-"))
    namespaces = draw(st.lists(own, min_size=2, max_size=2, unique=True))
    doc["cluster"] = {
        "name": draw(dns),
        "flex_namespace": namespaces[0],
        "system_namespace": namespaces[1],
        "pool_label": draw(label_key),
        "tuner_port": draw(st.integers(1024, 65535)),
        "runtime_image": BASE["cluster"]["runtime_image"],
    }
    names = draw(st.lists(dns, min_size=2, max_size=3, unique=True))
    all_nodes = iter(draw(st.lists(dns, min_size=0, max_size=6, unique=True)))
    pools: list[dict[str, Any]] = []
    for i, name in enumerate(names):
        max_nodes = draw(st.integers(1, 16))
        nodes = [n for _, n in zip(range(draw(st.integers(0, max_nodes))), all_nodes, strict=False)]
        pools.append(
            {
                "name": name,
                "role": "prod" if i == 0 else "flex",
                "gpu_model": draw(st.sampled_from(["NVIDIA-H200", "NVIDIA-A100-SXM4-80GB"])),
                "gpus_per_node": draw(st.integers(1, 16)),
                "gpu_memory_gib": draw(st.floats(16, 192)),
                "max_nodes": max_nodes,
                "reserve_ratio": draw(st.floats(0, 0.9)),
                "nodes": nodes,
                "taint": draw(st.booleans()),
                "karpenter": {
                    "capacity_types": draw(
                        st.lists(
                            st.sampled_from(["on-demand", "spot", "reserved"]),
                            min_size=1,
                            unique=True,
                        )
                    ),
                    "instance_types": draw(
                        st.lists(st.sampled_from(["p5e.48xlarge", "p4d.24xlarge"]), unique=True)
                    ),
                    "consolidation_policy": draw(
                        st.sampled_from(["WhenEmpty", "WhenEmptyOrUnderutilized"])
                    ),
                    "consolidate_after": draw(karpenter_duration),
                    "disruption_budget_nodes": draw(st.sampled_from(["0", "1", "10%", "100%"])),
                },
            }
        )
    doc["node_pools"] = pools
    training = draw(st.integers(1, 10**8))
    doc["priorities"] = {
        "production": {
            "name": "prod-tier",
            "value": draw(st.integers(training + 1, 10**9)),
            "preemption_policy": "PreemptLowerPriority",
            "description": "p",
        },
        "training": {
            "name": "train-tier",
            "value": training,
            "preemption_policy": draw(st.sampled_from(["PreemptLowerPriority", "Never"])),
            "description": "t",
        },
        "idle_inference": {
            "name": "idle-tier",
            "value": draw(st.integers(-(10**9), -1)),
            "preemption_policy": "Never",
            "description": "i",
        },
    }
    period, failures = draw(st.integers(1, 5)), draw(st.integers(1, 4))
    prestop, drain, snapshot = (
        draw(st.integers(period * failures + 1, 60)),
        draw(st.integers(1, 600)),
        draw(st.integers(0, 600)),
    )
    pdb = draw(st.integers(0, 3))
    doc["disruption"] = {
        "readiness_period_s": period,
        "readiness_failure_threshold": failures,
        "prestop_delay_s": prestop,
        "drain_s": drain,
        "snapshot_s": snapshot,
        "termination_grace_s": max(30, prestop + drain + snapshot) + draw(st.integers(0, 100)),
        "pdb_min_available": pdb,
        "anti_affinity": draw(st.sampled_from(["preferred", "required"])),
    }
    up = draw(st.integers(0, 1800))
    doc["autoscaling"] = {
        "scale_up_stabilization_s": up,
        "scale_down_stabilization_s": draw(st.integers(up, 3600)),
        "scale_up_pods_per_minute": draw(st.integers(1, 10)),
        "scale_down_pods_per_minute": draw(st.integers(1, 10)),
    }
    workloads = []
    sidecar_port = doc["kv_cache"]["compaction_sidecar_port"]
    for name in draw(st.lists(dns, min_size=0, max_size=3, unique=True)):
        pool = draw(st.sampled_from(pools[1:]))
        max_replicas = draw(st.integers(pdb + 1, 20))
        workloads.append(
            {
                "name": name,
                "model": "org/model",
                "hf_config": "models/x.json",
                "pool": pool["name"],
                "gpus_per_replica": draw(st.integers(1, pool["gpus_per_node"])),
                "min_replicas": draw(st.integers(pdb + 1, max_replicas)),
                "max_replicas": max_replicas,
                "port": draw(st.integers(1024, 65535).filter(lambda p: p != sidecar_port)),
                "startup_timeout_s": draw(st.integers(60, 7200)),
                "resources": {"cpu": draw(quantity), "memory": draw(quantity)},
                "snapshot_volume": {
                    "size": f"{draw(st.integers(1, 4096))}Gi",
                    "storage_class": draw(dns),
                    "mount_path": draw(st.sampled_from(["/kv", "/var/lib/gpupool/kv-snapshots"])),
                },
            }
        )
    doc["workloads"] = workloads
    return doc


# 40 policies x 2 targets x ~20 objects: about a minute on the CI machines.
@pytest.mark.heavy
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=policies())
def test_valid_policies_render_valid_objects(doc: Any) -> None:
    policy = parse_policy(doc)
    for target in ("labels", "karpenter"):
        objects = build_bundle(policy, stack=StackOptions(target), vllm_args=explicit_args(policy))
        for obj in objects:
            if obj["apiVersion"] == "karpenter.sh/v1":
                assert [e.message for e in VALIDATOR.iter_errors(obj)] == []
                assert cel_problems(obj) == []
            elif obj["apiVersion"].startswith(CRD_GROUPS):
                continue  # PrometheusRule: promtool-checked in tests/alerts
            else:
                kubernetes_validate.validate(obj, "1.30.0", strict=True)
    # Rendering (the slow part: pure-Python YAML) is checked once, on the last target.
    documents = render_documents(objects)
    loader = YAML(typ="safe")
    assert [loader.load(t) for n, t in documents.items() if n != KUSTOMIZATION] == objects
