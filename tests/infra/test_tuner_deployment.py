"""The tuner Deployment: its Secrets, probe, flags and the init container that clones the
policy repository (run here with real git against a local repository)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from alerts.routing import alertmanager_config
from infra.builders.runtime_components import (
    CLONE_SCRIPT,
    POLICY_REMOTE,
    REPO_PATH,
    clone_container,
    tuner_deployment,
)
from policy import PolicyError, PoolPolicy, load_policy
from tests.harness.containers import container_env, run_container
from tests.harness.git import git
from tests.infra.policies import policy_with

HTTPS = {
    "tuner.policy_repo_url": "https://git.example.invalid/acme/policy.git",
    "tuner.policy_repo_auth": "https-token",
    "tuner.policy_repo_secret": "policy-repo-token",
    "tuner.forge_repo": "acme/policy",
}
SSH = {
    "tuner.policy_repo_url": "git@git.example.invalid:acme/policy.git",
    "tuner.policy_repo_auth": "ssh-key",
    "tuner.policy_repo_secret": "policy-repo-ssh",
}


def _pod(policy: PoolPolicy) -> dict[str, Any]:
    spec: dict[str, Any] = tuner_deployment(policy)["spec"]["template"]["spec"]
    return spec


def _mounted_secret(pod: dict[str, Any], flag: str) -> dict[str, str]:
    """``{"name": Secret, "key": file}`` of the token file a tuner flag names."""
    (tuner,) = pod["containers"]
    directory, _, key = tuner["command"][tuner["command"].index(flag) + 1].rpartition("/")
    (mount,) = [m for m in tuner["volumeMounts"] if m["mountPath"] == directory]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    return {"name": volume["secret"]["secretName"], "key": key}


def test_webhook_token_is_the_secret_alertmanager_sends() -> None:
    """One Secret and key: the tuner's --token-file and Alertmanager's token file."""
    policy = load_policy()
    ref = _mounted_secret(_pod(policy), "--token-file")
    (receiver,) = [
        r
        for r in alertmanager_config(policy)["receivers"]
        if r["name"] == policy.alerting.routing.tuner_receiver
    ]
    credentials = receiver["webhook_configs"][0]["http_config"]["authorization"]
    assert credentials["credentials_file"].split("/")[-2:] == [ref["name"], ref["key"]]
    assert credentials["type"] == "Bearer"


def test_ready_when_healthz_answers_and_no_pr_without_a_forge() -> None:
    policy = load_policy()
    pod = _pod(policy)
    (tuner,) = pod["containers"]
    # the probes have a listener of their own, which webhook clients cannot starve
    assert tuner["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "ops"}
    ports = {p["name"]: p["containerPort"] for p in tuner["ports"]}
    assert ports == {"http": policy.cluster.tuner_port, "ops": policy.cluster.tuner_ops_port}
    command = tuner["command"]
    assert command[command.index("--ops-listen") + 1] == f"0.0.0.0:{policy.cluster.tuner_ops_port}"
    assert "--open-pr" not in tuner["command"]
    assert "GITHUB_TOKEN" not in container_env(tuner)
    assert tuner["livenessProbe"]["httpGet"] == tuner["readinessProbe"]["httpGet"]
    command = tuner["command"]
    assert command[command.index("--repo") + 1] == REPO_PATH
    assert command[command.index("--base") + 1] == policy.tuner.policy_repo_branch
    assert command[command.index("--policy-path") + 1] == policy.tuner.policy_repo_path
    # the tuner fetches the policy branch every cycle from the remote the clone is made under
    assert command[command.index("--remote") + 1] == POLICY_REMOTE
    (init,) = pod["initContainers"]
    assert init["image"] == tuner["image"] == policy.cluster.runtime_image
    assert container_env(init)["GIT_URL"] == policy.tuner.policy_repo_url
    assert container_env(init)["REPO_DIR"] == REPO_PATH
    assert "git-credentials" not in {v["name"] for v in pod["volumes"]}
    # the clone lives inside the shared volume, in both containers
    for container in (init, tuner):
        (state,) = [m for m in container["volumeMounts"] if m["name"] == "state"]
        assert REPO_PATH.startswith(state["mountPath"] + "/")


def test_the_ops_port_is_not_the_webhook_port() -> None:
    with pytest.raises(PolicyError, match=r"cluster.tuner_ops_port: expected a port other than"):
        policy_with({"cluster.tuner_ops_port": 9095})


def test_forge_repo_opens_prs_with_the_token_secret() -> None:
    policy = policy_with(HTTPS)
    (tuner,) = _pod(policy)["containers"]
    command = tuner["command"]
    assert command[command.index("--forge-repo") - 1] == "--open-pr"
    assert command[command.index("--forge-repo") + 1] == "acme/policy"
    assert _mounted_secret(_pod(policy), "--forge-token-file") == {
        "name": "gpupool-tuner-github",
        "key": "token",
    }


@pytest.mark.parametrize(
    ("edits", "env"), [(HTTPS, "GIT_CREDENTIAL_HELPER"), (SSH, "GIT_SSH_COMMAND")]
)
def test_git_credentials_reach_both_containers(edits: dict[str, str], env: str) -> None:
    """The clone and the tuner's pushes authenticate the same way, from the named Secret."""
    pod = _pod(policy_with(edits))
    (volume,) = [v for v in pod["volumes"] if v["name"] == "git-credentials"]
    assert volume["secret"]["secretName"] == edits["tuner.policy_repo_secret"]
    for container in (*pod["initContainers"], *pod["containers"]):
        assert env in container_env(container)
        assert "git-credentials" in {m["name"] for m in container["volumeMounts"]}


@pytest.mark.parametrize("edits", [HTTPS, SSH], ids=["https", "ssh"])
def test_variants_are_strictly_valid_kubernetes(edits: dict[str, str]) -> None:
    deployment = tuner_deployment(policy_with(edits))
    kubernetes_validate.validate(deployment, kubernetes_validate.latest_version(), strict=True)


@pytest.mark.parametrize(
    ("edits", "field"),
    [
        ({"tuner.policy_repo_auth": "https-token"}, "policy_repo_secret"),
        (
            {**SSH, "tuner.policy_repo_url": "https://git.example.invalid/a/b.git"},
            "policy_repo_url",
        ),
        ({"tuner.forge_repo": "not a repo"}, "forge_repo"),
    ],
)
def test_bad_tuner_settings_are_refused(edits: dict[str, str], field: str) -> None:
    with pytest.raises(PolicyError, match=f"tuner.{field}"):
        policy_with(edits)


def _run_init(container: dict[str, Any], repo_dir: Path, home: Path) -> None:
    """The init container's command with its env, the volume path mapped into ``repo_dir``."""
    assert container["command"] == ["sh", "-c", CLONE_SCRIPT]
    result = run_container(container, REPO_DIR=str(repo_dir), HOME=str(home))
    assert result.returncode == 0, result.stderr


@pytest.mark.process
def test_init_container_clones_then_fast_forwards_the_policy_branch(tmp_path: Path) -> None:
    origin = tmp_path / "origin"
    (origin / "policy").mkdir(parents=True)
    (origin / "policy" / "pool.yaml").write_text("cluster: {name: one}\n")
    git(origin, "init", "--quiet", "--initial-branch=release")
    git(origin, "add", ".")
    git(origin, "commit", "-qm", "one")
    policy = policy_with(
        {"tuner.policy_repo_url": f"file://{origin}", "tuner.policy_repo_branch": "release"}
    )
    container = clone_container(policy)
    clone = tmp_path / "state" / "repo"
    clone.parent.mkdir()
    _run_init(container, clone, tmp_path)
    assert (clone / policy.tuner.policy_repo_path).read_text() == "cluster: {name: one}\n"
    assert git(clone, "rev-parse", "--abbrev-ref", "HEAD").strip() == "release"
    assert git(clone, "remote").strip() == POLICY_REMOTE

    # a pod restart keeps the volume: the init container fetches the new head instead
    (origin / "policy" / "pool.yaml").write_text("cluster: {name: two}\n")
    git(origin, "commit", "-qam", "two")
    git(clone, "branch", "gpupool-tuner/kept")  # the tuner's own branches survive
    _run_init(container, clone, tmp_path)
    assert (clone / "policy" / "pool.yaml").read_text() == "cluster: {name: two}\n"
    assert git(clone, "rev-parse", "HEAD") == git(origin, "rev-parse", "HEAD")
    assert git(clone, "branch", "--list", "gpupool-tuner/kept") != ""


@pytest.mark.process
def test_init_container_fails_on_a_missing_branch(tmp_path: Path) -> None:
    origin = tmp_path / "origin"
    origin.mkdir()
    git(origin, "init", "--quiet", "--initial-branch=main")
    git(origin, "commit", "--allow-empty", "-qm", "one")
    container = clone_container(
        policy_with({"tuner.policy_repo_url": f"file://{origin}", "tuner.policy_repo_branch": "x"})
    )
    result = run_container(container, REPO_DIR=str(tmp_path / "repo"), HOME=str(tmp_path))
    assert result.returncode != 0
    assert "branch x not found" in result.stderr
    assert not (tmp_path / "repo").exists()
