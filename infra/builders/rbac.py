"""ServiceAccounts and least-privilege RBAC of gpupool's runtime components.

The tuner changes the cluster only through git (it proposes policy PRs; GitOps applies
them), so its ServiceAccount gets no Role and no API token. The KV compaction worker runs
inside the flex vLLM pods and may only read pods in the flex namespace (to find its peers'
snapshots); nothing else.
"""

from __future__ import annotations

from infra.builders.meta import Manifest, metadata
from policy import PoolPolicy

TUNER_SERVICE_ACCOUNT = "gpupool-tuner"
"""ServiceAccount (and Deployment, Service) name of the tuner."""

COMPACTION_SERVICE_ACCOUNT = "gpupool-kv-compaction"
"""ServiceAccount of the flex vLLM pods, where the KV compaction worker runs."""

COMPACTION_VERBS = ("get", "list")
"""Everything the compaction worker may do, on pods in the flex namespace only."""


def service_accounts_and_rbac(policy: PoolPolicy) -> list[Manifest]:
    """Tuner and compaction ServiceAccounts, plus the compaction worker's Role and binding."""
    flex = policy.cluster.flex_namespace

    def role_meta() -> Manifest:
        return metadata(COMPACTION_SERVICE_ACCOUNT, "kv-compaction", namespace=flex)

    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": metadata(
                TUNER_SERVICE_ACCOUNT, "tuner", namespace=policy.cluster.system_namespace
            ),
            "automountServiceAccountToken": False,
        },
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": role_meta(),
            "automountServiceAccountToken": True,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": role_meta(),
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": list(COMPACTION_VERBS)}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": role_meta(),
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": COMPACTION_SERVICE_ACCOUNT,
            },
            "subjects": [
                {"kind": "ServiceAccount", "name": COMPACTION_SERVICE_ACCOUNT, "namespace": flex}
            ],
        },
    ]
