"""ServiceAccounts of gpupool's pods: only the endpoint pickers talk to the Kubernetes API.

The tuner changes the cluster only through git (it proposes policy PRs; GitOps applies
them) and finds the compaction sidecars through DNS; vLLM and the compaction sidecar talk to
each other over a socket and to the tuner over HTTP. So those ServiceAccounts get no Role,
no RoleBinding and no API token (``automountServiceAccountToken: false`` here and on each
pod): a compromised pod holds no credential to the API server. The serving layer's endpoint
pickers (stack option ``gpupool:serving: inference-extension``) must watch their pool's pods
and objects: each gets its own ServiceAccount and a Role that only reads those, in its own
namespace.
"""

from __future__ import annotations

from collections.abc import Sequence

from infra.builders.meta import Manifest, metadata
from policy import PoolPolicy

TUNER_SERVICE_ACCOUNT = "gpupool-tuner"
"""ServiceAccount (and Deployment, Service) name of the tuner."""

FLEX_SERVICE_ACCOUNT = "gpupool-flex-inference"
"""ServiceAccount of the flex vLLM pods (vLLM and, with ``kv_compaction``, its sidecar); its
own, so no flex pod runs as the namespace's ``default`` account."""


def service_accounts(policy: PoolPolicy) -> list[Manifest]:
    """The tuner's and the flex pods' ServiceAccounts, neither with an API token."""
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": metadata(name, component, namespace=namespace),
            "automountServiceAccountToken": False,
        }
        for name, component, namespace in (
            (TUNER_SERVICE_ACCOUNT, "tuner", policy.cluster.system_namespace),
            (FLEX_SERVICE_ACCOUNT, "flex-inference", policy.cluster.flex_namespace),
        )
    ]


POOL_GROUP = "inference.networking.k8s.io"
"""API group of InferencePool (v1, Gateway API Inference Extension)."""

READ = ["get", "list", "watch"]
"""What an endpoint picker may do with what it watches."""


def endpoint_picker_rbac(
    name: str, namespace: str, objective_groups: Sequence[str]
) -> list[Manifest]:
    """ServiceAccount, Role and RoleBinding of one endpoint picker: read-only access to the
    pods, InferencePools, InferenceObjectives and InferenceModelRewrites of its namespace
    (``objective_groups``: the API groups its distribution watches them in)."""
    meta = metadata(name, "serving", namespace=namespace, instance=name)
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": meta,
            # the picker's one credential: it watches the API (the Role below bounds it)
            "automountServiceAccountToken": True,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": meta,
            "rules": [
                {"apiGroups": [""], "resources": ["pods"], "verbs": READ},
                {"apiGroups": [POOL_GROUP], "resources": ["inferencepools"], "verbs": READ},
                {
                    "apiGroups": list(objective_groups),
                    "resources": ["inferenceobjectives", "inferencemodelrewrites"],
                    "verbs": READ,
                },
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": meta,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
        },
    ]
