"""The tuner: a Deployment and Service in the system namespace.

It reads Prometheus, proposes policy changes as git branches + PR text, and receives
Alertmanager webhooks on ``cluster.tuner_port`` (the ``gpupool-tuner`` receiver in pool.yaml
points at this Service).
"""

from __future__ import annotations

from infra.builders.meta import Manifest, metadata, selector_labels
from infra.builders.rbac import TUNER_SERVICE_ACCOUNT
from policy import PoolPolicy

REPO_PATH = "/var/lib/gpupool/repo"
"""Working clone of the policy repository inside the tuner container."""

TUNER_UID = 1000
"""Non-root UID the tuner runs as."""

TUNER_RESOURCES = {"cpu": "250m", "memory": "512Mi"}
"""Requests and limits of the tuner (it queries Prometheus and runs git; small and bursty)."""


def tuner(policy: PoolPolicy) -> list[Manifest]:
    """Tuner Deployment and its Service."""
    return [tuner_deployment(policy), tuner_service(policy)]


def tuner_command(policy: PoolPolicy) -> list[str]:
    """The tuner's command line (the ``gpupool tune`` flags)."""
    return [
        "gpupool",
        "tune",
        "--listen",
        f"0.0.0.0:{policy.cluster.tuner_port}",
        "--prometheus",
        policy.cluster.prometheus_url,
        "--repo",
        REPO_PATH,
    ]


def tuner_deployment(policy: PoolPolicy) -> Manifest:
    """One replica: proposals are serialised through one git clone."""
    ns = policy.cluster.system_namespace
    selector = selector_labels(TUNER_SERVICE_ACCOUNT)
    pod_labels = metadata(TUNER_SERVICE_ACCOUNT, "tuner", instance=TUNER_SERVICE_ACCOUNT)["labels"]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(
            TUNER_SERVICE_ACCOUNT, "tuner", namespace=ns, instance=TUNER_SERVICE_ACCOUNT
        ),
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": selector},
            "strategy": {"type": "Recreate"},
            "template": {
                "metadata": {"labels": pod_labels | selector},
                "spec": {
                    "serviceAccountName": TUNER_SERVICE_ACCOUNT,
                    "automountServiceAccountToken": False,
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": TUNER_UID,
                        "runAsGroup": TUNER_UID,
                        "fsGroup": TUNER_UID,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [
                        {
                            "name": "tuner",
                            "image": policy.cluster.runtime_image,
                            "command": tuner_command(policy),
                            "ports": [
                                {
                                    "name": "http",
                                    "containerPort": policy.cluster.tuner_port,
                                    "protocol": "TCP",
                                }
                            ],
                            "readinessProbe": {"tcpSocket": {"port": "http"}, "periodSeconds": 10},
                            "resources": {
                                "requests": dict(TUNER_RESOURCES),
                                "limits": dict(TUNER_RESOURCES),
                            },
                            "securityContext": {
                                "allowPrivilegeEscalation": False,
                                "readOnlyRootFilesystem": True,
                                "runAsNonRoot": True,
                                "capabilities": {"drop": ["ALL"]},
                            },
                            "volumeMounts": [
                                {"name": "repo", "mountPath": REPO_PATH},
                                {"name": "tmp", "mountPath": "/tmp"},
                            ],
                        }
                    ],
                    "volumes": [
                        {"name": "repo", "emptyDir": {}},
                        {"name": "tmp", "emptyDir": {}},
                    ],
                },
            },
        },
    }


def tuner_service(policy: PoolPolicy) -> Manifest:
    """ClusterIP Service Alertmanager posts webhooks to."""
    port = policy.cluster.tuner_port
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(
            TUNER_SERVICE_ACCOUNT,
            "tuner",
            namespace=policy.cluster.system_namespace,
            instance=TUNER_SERVICE_ACCOUNT,
        ),
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(TUNER_SERVICE_ACCOUNT),
            "ports": [{"name": "http", "port": port, "targetPort": "http", "protocol": "TCP"}],
        },
    }
