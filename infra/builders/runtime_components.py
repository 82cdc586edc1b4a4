"""The tuner: a Deployment and Service in the system namespace.

It reads Prometheus, proposes policy changes as git branches + PR text, and receives
Alertmanager webhooks on ``cluster.tuner_port`` (the ``gpupool-tuner`` receiver in pool.yaml
points at this Service). An init container clones ``tuner.policy_repo_url`` into the pod's
volume with the runtime image's git (the tuner needs git anyway, so no second image). Every
credential comes from a Secret referenced by name (``policy.tuner``) and mounted as a file
(never an environment variable, which ``kubectl describe``, crash dumps and child processes
would show); the bundle never holds one.
"""

from __future__ import annotations

from typing import Any

from infra.builders.compaction_sidecar import COMPACTION_TOKEN_DIR, compaction_service_address
from infra.builders.meta import Manifest, metadata, selector_labels
from infra.builders.pod import container_security, pod_security, pull_secrets
from infra.builders.rbac import TUNER_SERVICE_ACCOUNT
from policy import PoolPolicy
from policy.tuner import Tuner

STATE_PATH = "/var/lib/gpupool"
"""The pod's emptyDir; the clone is a directory inside it, so git creates (and owns) it."""

REPO_PATH = f"{STATE_PATH}/repo"
"""Working clone of the policy repository inside the tuner container."""

GIT_SECRET_PATH = "/etc/gpupool/git"
"""Where the git credentials Secret (``tuner.policy_repo_secret``) is mounted."""

WEBHOOK_TOKEN_DIR = "/etc/gpupool/webhook-token"
"""Where the webhook token Secret (``tuner.webhook_token_secret``) is mounted."""

FORGE_TOKEN_DIR = "/etc/gpupool/forge-token"
"""Where the GitHub token Secret (``tuner.forge_token_secret``) is mounted."""

TUNER_PORT = "http"
"""Name of the tuner's webhook port (``cluster.tuner_port``: ``POST /alerts``)."""

TUNER_OPS_PORT = "ops"
"""Name of the tuner's health and metrics port (``cluster.tuner_ops_port``: ``/healthz``,
``/metrics``), served by handlers of its own so that webhook clients cannot starve it."""

HEALTH_PATH = "/healthz"
"""The tuner's health endpoint (readiness and liveness), on ``TUNER_OPS_PORT``."""

TUNER_MILLICORES, TUNER_MIB = 250, 512
TUNER_RESOURCES = {"cpu": f"{TUNER_MILLICORES}m", "memory": f"{TUNER_MIB}Mi"}
"""Requests and limits of the tuner (it queries Prometheus and runs git; small and bursty)."""

SWEEP_JOB_RESOURCES = {"cpu": 1000, "memory": 384}
"""What each replay process of the advise lever adds to the tuner (millicores, MiB): one
core, and the 210 MiB a day's replay peaked at with room to spare."""


def tuner_resources(policy: PoolPolicy) -> dict[str, str]:
    """The tuner container's requests (= limits): ``TUNER_RESOURCES``, plus one
    ``SWEEP_JOB_RESOURCES`` per ``tuner.advise.jobs`` while the advise lever is on."""
    advise = policy.tuner.advise
    jobs = advise.jobs if advise.enabled else 0
    cpu = TUNER_MILLICORES + jobs * SWEEP_JOB_RESOURCES["cpu"]
    memory = TUNER_MIB + jobs * SWEEP_JOB_RESOURCES["memory"]
    return {"cpu": f"{cpu}m", "memory": f"{memory}Mi"}


POLICY_REMOTE = "origin"
"""Name of the clone's remote: the init container clones under it, and the tuner fetches the
policy branch from it every cycle and pushes its proposal branches to it (``--remote``)."""

CLONE_SCRIPT = """\
set -eu
git check-ref-format --branch "$GIT_BRANCH" >/dev/null
if [ -d "$REPO_DIR/.git" ]; then
  git -C "$REPO_DIR" fetch --quiet -- "$GIT_REMOTE" "refs/heads/$GIT_BRANCH"
  git -C "$REPO_DIR" checkout --quiet --force -B "$GIT_BRANCH" FETCH_HEAD --
else
  git -c credential.helper="${GIT_CREDENTIAL_HELPER:-}" \\
    clone --quiet --origin "$GIT_REMOTE" --branch "$GIT_BRANCH" -- "$GIT_URL" "$REPO_DIR"
  if [ -n "${GIT_CREDENTIAL_HELPER:-}" ]; then
    git -C "$REPO_DIR" config credential.helper "$GIT_CREDENTIAL_HELPER"
  fi
fi
git -C "$REPO_DIR" log -1 --format='policy repository at %H'
"""
"""The init container's script: clone (or, after a pod restart kept the volume, fast-forward)
the policy branch; with https-token auth the repository keeps the credential helper so the
tuner can push its branches.

The script is a constant: policy values reach it only as environment variables, expanded in
double quotes (one word each, never shell code), and git reads none of them as an option:
the branch must pass ``git check-ref-format --branch`` (which refuses a leading ``-``) before
any git command sees it, it is fetched as ``refs/heads/<branch>``, and ``--`` ends the options
before the remote, the URL and the directory. Without those, a branch such as
``--upload-pack=<command>`` ran ``<command>`` on a pod restart (``git fetch`` read it as its
option; docs/design/commands-audit.md)."""

HTTPS_CREDENTIAL_HELPER = (
    '!f() { test "$1" = get || exit 0; '
    f"echo username=$(cat {GIT_SECRET_PATH}/username); "
    f"echo password=$(cat {GIT_SECRET_PATH}/password); }}; f"
)
"""git credential helper reading a ``kubernetes.io/basic-auth`` Secret's files at each use."""

SSH_COMMAND = (
    f"ssh -i {GIT_SECRET_PATH}/ssh-privatekey -o IdentitiesOnly=yes "
    f"-o UserKnownHostsFile={GIT_SECRET_PATH}/known_hosts -o StrictHostKeyChecking=yes"
)
"""``GIT_SSH_COMMAND`` for a ``kubernetes.io/ssh-auth`` Secret (plus a ``known_hosts`` key)."""


def tuner(policy: PoolPolicy) -> list[Manifest]:
    """Tuner Deployment and its Service."""
    return [tuner_deployment(policy), tuner_service(policy)]


def tuner_command(policy: PoolPolicy) -> list[str]:
    """The tuner's command line (the ``gpupool tune`` flags)."""
    settings = policy.tuner
    command = [
        "gpupool",
        "tune",
        "--listen",
        f"0.0.0.0:{policy.cluster.tuner_port}",
        "--ops-listen",
        f"0.0.0.0:{policy.cluster.tuner_ops_port}",
        "--token-file",
        f"{WEBHOOK_TOKEN_DIR}/{settings.webhook_token_key}",
        "--compaction-token-file",
        f"{COMPACTION_TOKEN_DIR}/{settings.compaction_token_key}",
        "--prometheus",
        policy.cluster.prometheus_url,
        "--repo",
        REPO_PATH,
        "--base",
        settings.policy_repo_branch,
        "--policy-path",
        settings.policy_repo_path,
        "--remote",
        POLICY_REMOTE,
    ]
    if settings.forge_repo is not None:
        command += ["--open-pr", "--forge-repo", settings.forge_repo]
        command += ["--forge-token-file", f"{FORGE_TOKEN_DIR}/{settings.forge_token_key}"]
    for workload in policy.workloads:
        if workload.kv_compaction:
            command += ["--compaction-service", compaction_service_address(policy, workload)]
    return command


def token_secrets(settings: Tuner) -> list[tuple[str, str, str, bool]]:
    """``(volume, Secret, mount directory, optional)`` of every token the tuner reads.

    The compaction token is optional: without it the tuner runs and the sidecars refuse its
    requests; once the Secret exists the kubelet fills the volume and the tuner reads the
    file at its next cycle, so it may be created after the first deployment."""
    out = [
        ("webhook-token", settings.webhook_token_secret, WEBHOOK_TOKEN_DIR, False),
        ("compaction-token", settings.compaction_token_secret, COMPACTION_TOKEN_DIR, True),
    ]
    if settings.forge_repo is not None:
        out.append(("forge-token", settings.forge_token_secret, FORGE_TOKEN_DIR, False))
    return out


def git_env(settings: Tuner) -> list[dict[str, Any]]:
    """Environment of every container that runs git: HOME on the writable /tmp, the one
    transport the repository URL uses (``GIT_ALLOW_PROTOCOL``), and how to authenticate (a
    credential helper or an ssh command)."""
    env: list[dict[str, Any]] = [
        {"name": "HOME", "value": "/tmp"},
        # git refuses every other transport (ext::, fd::, a redirect, a submodule's URL)
        {"name": "GIT_ALLOW_PROTOCOL", "value": settings.repo_transport},
    ]
    if settings.policy_repo_auth == "https-token":
        env.append({"name": "GIT_CREDENTIAL_HELPER", "value": HTTPS_CREDENTIAL_HELPER})
    elif settings.policy_repo_auth == "ssh-key":
        env.append({"name": "GIT_SSH_COMMAND", "value": SSH_COMMAND})
    return env


def _git_secret(settings: Tuner) -> str | None:
    """The git credentials Secret, when the repository needs one."""
    return None if settings.policy_repo_auth == "none" else settings.policy_repo_secret


def _mounts(settings: Tuner) -> list[dict[str, Any]]:
    mounts: list[dict[str, Any]] = [
        {"name": "state", "mountPath": STATE_PATH},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    if _git_secret(settings) is not None:
        mounts.append({"name": "git-credentials", "mountPath": GIT_SECRET_PATH, "readOnly": True})
    return mounts


def clone_container(policy: PoolPolicy) -> Manifest:
    """Init container: the policy repository into the pod's volume before the tuner starts."""
    settings = policy.tuner
    return {
        "name": "clone-policy",
        "image": policy.cluster.runtime_image,
        "command": ["sh", "-c", CLONE_SCRIPT],
        "env": [
            {"name": "GIT_URL", "value": settings.policy_repo_url},
            {"name": "GIT_BRANCH", "value": settings.policy_repo_branch},
            {"name": "GIT_REMOTE", "value": POLICY_REMOTE},
            {"name": "REPO_DIR", "value": REPO_PATH},
            *git_env(settings),
        ],
        "resources": {"requests": dict(TUNER_RESOURCES), "limits": dict(TUNER_RESOURCES)},
        "securityContext": container_security(),
        "volumeMounts": _mounts(settings),
    }


def tuner_container(policy: PoolPolicy) -> Manifest:
    """The ``gpupool tune --listen`` container; ready once its HTTP listener answers."""
    settings = policy.tuner
    probe = {"httpGet": {"path": HEALTH_PATH, "port": TUNER_OPS_PORT}}
    tokens = [
        {"name": volume, "mountPath": path, "readOnly": True}
        for volume, _, path, _ in token_secrets(settings)
    ]
    return {
        "name": "tuner",
        "image": policy.cluster.runtime_image,
        "command": tuner_command(policy),
        "env": git_env(settings),
        "ports": [
            {"name": TUNER_PORT, "containerPort": policy.cluster.tuner_port, "protocol": "TCP"},
            {
                "name": TUNER_OPS_PORT,
                "containerPort": policy.cluster.tuner_ops_port,
                "protocol": "TCP",
            },
        ],
        "readinessProbe": probe | {"periodSeconds": 10},
        # a listener that stops answering is restarted (the cycle loop runs beside it)
        "livenessProbe": probe | {"periodSeconds": 30, "timeoutSeconds": 5, "failureThreshold": 3},
        "resources": {"requests": tuner_resources(policy), "limits": tuner_resources(policy)},
        "securityContext": container_security(),
        "volumeMounts": [*_mounts(settings), *tokens],
    }


def _volumes(settings: Tuner) -> list[dict[str, Any]]:
    volumes: list[dict[str, Any]] = [
        {"name": "state", "emptyDir": {}},
        {"name": "tmp", "emptyDir": {}},
    ]
    secret = _git_secret(settings)
    # 0440 + fsGroup: readable by the tuner's group only (ssh refuses wider modes)
    if secret is not None:
        volumes.append(
            {"name": "git-credentials", "secret": {"secretName": secret, "defaultMode": 0o440}}
        )
    for volume, name, _, optional in token_secrets(settings):
        source: dict[str, Any] = {"secretName": name, "defaultMode": 0o440}
        if optional:
            source["optional"] = True
        volumes.append({"name": volume, "secret": source})
    return volumes


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
                    **pull_secrets(policy),
                    "securityContext": pod_security(),
                    "initContainers": [clone_container(policy)],
                    "containers": [tuner_container(policy)],
                    "volumes": _volumes(policy.tuner),
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
            "ports": [
                {"name": TUNER_PORT, "port": port, "targetPort": TUNER_PORT, "protocol": "TCP"}
            ],
        },
    }
