"""Pod-spec pieces every gpupool pod shares: the one user, the Pod Security ``restricted``
contexts and the image pull secrets (one module, so the workload, serving, tuner and snapshot
builders cannot drift apart)."""

from __future__ import annotations

from infra.builders.meta import Manifest
from policy import PoolPolicy

NON_ROOT_UID = 10001
"""UID/GID every container gpupool renders runs as (the upstream vLLM image defaults to root;
the runtime image's user has this UID): above the 0-9999 range of host and image users, so
a container escape does not land on a real account. One pod-level user, because the
compaction sidecar and vLLM share a mode-0600 socket."""


def pod_security() -> Manifest:
    """Pod ``securityContext`` of every pod gpupool renders (Pod Security ``restricted``)."""
    return {
        "runAsNonRoot": True,
        "runAsUser": NON_ROOT_UID,
        "runAsGroup": NON_ROOT_UID,
        "fsGroup": NON_ROOT_UID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security() -> Manifest:
    """Container ``securityContext`` of every container gpupool renders (``restricted``):
    writes go to mounted volumes only."""
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }


def pull_secrets(policy: PoolPolicy) -> Manifest:
    """``imagePullSecrets`` of a pod spec (``cluster.image_pull_secrets``); none: no field."""
    names = policy.cluster.image_pull_secrets
    return {"imagePullSecrets": [{"name": n} for n in names]} if names else {}
