"""The compaction requests' path through the bundle: headless Service, tuner flags and token.

Built from the shipped policy with two workloads, one of them with compaction switched off;
every manifest is checked by kubernetes-validate in strict mode.
"""

from __future__ import annotations

from typing import Any

import kubernetes_validate

from infra.builders.compaction_sidecar import COMPACTION_TOKEN_DIR, compaction_sidecar
from infra.builders.runtime_components import tuner_command, tuner_container, tuner_deployment
from infra.builders.stack_options import StackOptions
from infra.bundle import build_bundle
from policy import PoolPolicy, parse_policy
from tests.infra.policies import edited, explicit_args


def mixed() -> PoolPolicy:
    """The shipped workload (compaction on) and a second one with compaction off."""
    doc = edited({})
    second = {**doc["workloads"][0], "name": "plain-flex", "port": 8001, "kv_compaction": False}
    doc["workloads"].append(second)
    return parse_policy(doc)


def services(policy: PoolPolicy) -> dict[str, dict[str, Any]]:
    objs = build_bundle(policy, stack=StackOptions("labels"), vllm_args=explicit_args(policy))
    return {o["metadata"]["name"]: o for o in objs if o["kind"] == "Service"}


def test_headless_service_selects_the_sidecars_of_compacting_workloads_only() -> None:
    policy = mixed()
    found = services(policy)
    on, off = policy.workloads
    headless = found[f"{on.name}-kv-compaction"]
    kubernetes_validate.validate(headless, kubernetes_validate.latest_version(), strict=True)
    assert f"{off.name}-kv-compaction" not in found
    assert headless["metadata"]["namespace"] == policy.cluster.flex_namespace
    spec = headless["spec"]
    assert spec["clusterIP"] == "None"
    assert spec["selector"] == found[on.name]["spec"]["selector"]  # the workload's own pods
    (port,) = spec["ports"]
    (sidecar_port,) = compaction_sidecar(policy, on)["ports"]
    assert port["port"] == sidecar_port["containerPort"] == policy.kv_cache.compaction_sidecar_port
    assert port["targetPort"] == sidecar_port["name"]


def test_tuner_posts_to_each_headless_service_with_the_shared_token() -> None:
    policy = mixed()
    on = policy.workloads[0]
    command = tuner_command(policy)
    flagged = [command[i + 1] for i, a in enumerate(command) if a == "--compaction-service"]
    ns, port = policy.cluster.flex_namespace, policy.kv_cache.compaction_sidecar_port
    assert flagged == [f"{on.name}-kv-compaction.{ns}.svc:{port}"]

    settings = policy.tuner
    path = command[command.index("--compaction-token-file") + 1]
    assert path == f"{COMPACTION_TOKEN_DIR}/{settings.compaction_token_key}"
    (mount,) = [
        m for m in tuner_container(policy)["volumeMounts"] if m["mountPath"] == COMPACTION_TOKEN_DIR
    ]
    (volume,) = [
        v
        for v in tuner_deployment(policy)["spec"]["template"]["spec"]["volumes"]
        if v["name"] == mount["name"]
    ]
    assert volume["secret"] == {
        "secretName": settings.compaction_token_secret,
        "defaultMode": 0o440,
        "optional": True,
    }
    # the sidecar reads the same Secret (in its own namespace) as its shared token file
    sidecar = compaction_sidecar(policy, on)
    args = dict(zip(sidecar["args"][::2], sidecar["args"][1::2], strict=True))
    assert args["--compaction-token-file"] == (
        f"{COMPACTION_TOKEN_DIR}/{settings.compaction_token_key}"
    )
    assert args["--workload"] == on.name


def test_no_compacting_workload_no_flag() -> None:
    doc = edited({"workloads.0.kv_compaction": False})
    policy = parse_policy(doc)
    assert "--compaction-service" not in tuner_command(policy)
    assert not [name for name in services(policy) if name.endswith("-kv-compaction")]
