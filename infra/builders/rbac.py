"""ServiceAccounts of gpupool's pods: none of them talks to the Kubernetes API.

The tuner changes the cluster only through git (it proposes policy PRs; GitOps applies
them) and finds the compaction sidecars through DNS; vLLM and the compaction sidecar talk to
each other over a socket and to the tuner over HTTP. So every ServiceAccount gets no Role,
no RoleBinding and no API token (``automountServiceAccountToken: false`` here and on each
pod): a compromised pod holds no credential to the API server.
"""

from __future__ import annotations

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
