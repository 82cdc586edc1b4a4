"""Offline edges: the YAML splice, the GitHub request, settings files, the CLI's bad input."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from infra.builders.stack_options import StackOptions
from infra.diff import diff_documents
from infra.pipeline import render_policy_file
from policy import DEFAULT_POLICY, PolicyError, load_policy
from runtime.cli.app import app
from runtime.tuner.forge import build_pull_request
from runtime.tuner.gitrepo import branch_of, commit_on_new_branch, git, push, resolve
from runtime.tuner.manifests import PolicyChange, manifest_diff
from runtime.tuner.proposals import Change
from runtime.tuner.settings import TunerSettings, load_settings
from runtime.tuner.webhook import Triggers, notification_key
from runtime.tuner.yamledit import YamlEditError, edit_scalars
from tests.harness.servers import REPO

SHIPPED = DEFAULT_POLICY.read_text()


def test_splice_changes_only_the_value_and_keeps_comment_column() -> None:
    change = Change(("elastic", "shed_while_production_above"), 0.65, 0.7)
    out, document = edit_scalars(SHIPPED, [change])
    assert document["elastic"]["shed_while_production_above"] == 0.7
    changed = [
        (a, b) for a, b in zip(SHIPPED.splitlines(), out.splitlines(), strict=True) if a != b
    ]
    [line] = [x for x in SHIPPED.splitlines() if x.startswith("  shed_while_production_above:")]
    assert "0.65   #" in line  # the shipped value, then its comment (whatever it says)
    assert changed == [(line, line.replace("0.65   #", "0.7    #"))]  # same comment column


def test_splice_refuses_a_field_not_written_in_the_file() -> None:
    with pytest.raises(YamlEditError, match="not written in the policy file"):
        edit_scalars(SHIPPED, [Change(("kv_cache", "no_such_field"), 1, 2)])


def test_pull_request_call_follows_the_rest_api() -> None:
    call = build_pull_request(
        api_url="https://api.github.com/",
        repository="acme/gpupool",
        token="t0k",
        title="T",
        body="B",
        head="gpupool-tuner/x",
        base="main",
    )
    assert call.url == "https://api.github.com/repos/acme/gpupool/pulls"
    assert call.headers["Authorization"] == "Bearer t0k"
    assert call.headers["Accept"] == "application/vnd.github+json"
    assert call.payload == {
        "title": "T",
        "body": "B",
        "head": "gpupool-tuner/x",
        "base": "main",
        "draft": False,
    }
    with pytest.raises(ValueError, match="OWNER/NAME"):
        build_pull_request(
            api_url="x", repository="acme", token="t", title="", body="", head="", base=""
        )
    with pytest.raises(ValueError, match="GITHUB_TOKEN"):
        build_pull_request(
            api_url="x", repository="a/b", token="", title="", body="", head="", base=""
        )


def test_settings_file_errors_name_line_and_field(tmp_path: Path) -> None:
    path = tmp_path / "tuner.yaml"
    path.write_text("window: 30m\nmin_observation: 2h\ncooldown: soon\n")
    with pytest.raises(PolicyError) as caught:
        load_settings(path)
    text = str(caught.value)
    assert f"{path}:3: cooldown:" in text
    path.write_text("cooldown: 2h\n")
    assert load_settings(path).cooldown_s == 7200


def test_retired_settings_say_what_became_of_them(tmp_path: Path) -> None:
    path = tmp_path / "tuner.yaml"
    path.write_text("cooldown: 2h\nshed_above_step: 0.05\nscale_down_stabilization_max_s: 900\n")
    with pytest.raises(PolicyError) as caught:
        load_settings(path)
    text = str(caught.value)
    assert f"{path}:2: shed_above_step: renamed shed_threshold_step" in text
    assert f"{path}:3: scale_down_stabilization_max_s: removed" in text


def test_notification_key_ignores_order_and_repeats() -> None:
    alerts = [{"fingerprint": "a", "startsAt": "t1"}, {"fingerprint": "b", "startsAt": "t2"}]
    one = {"groupKey": "g", "status": "firing", "alerts": alerts}
    two = {"groupKey": "g", "status": "firing", "alerts": list(reversed(alerts))}
    assert notification_key(one) == notification_key(two)
    triggers = Triggers()
    assert triggers.offer(notification_key(one), "x") is True
    assert triggers.offer(notification_key(two), "x") is False


def test_cli_rejects_bad_listen_address_and_missing_token(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(
        app,
        ["tune", "--prometheus", "http://127.0.0.1:1", "--repo", str(tmp_path), "--listen", "nope"],
    )
    assert result.exit_code == 1 and "HOST:PORT" in result.output
    result = runner.invoke(
        app,
        [
            "tune",
            "--prometheus",
            "http://127.0.0.1:1",
            "--repo",
            str(tmp_path),
            "--listen",
            "127.0.0.1:9095",
        ],
        env={"GPUPOOL_TUNER_TOKEN": ""},
    )
    assert result.exit_code == 1 and "GPUPOOL_TUNER_TOKEN" in result.output


@pytest.mark.parametrize("repository", ["not-a-repo", "acme/..", "acme/policy/extra"])
def test_a_bad_forge_repo_is_one_line_before_any_cycle(tmp_path: Path, repository: str) -> None:
    """``tune --open-pr`` checks the repository with the pull request's own checks
    (``forge.check_pull_request_target``) before it reads Prometheus or touches the repo."""
    token = tmp_path / "token"
    token.write_text("t0ken\n")
    args = ["tune", "--once", "--prometheus", "http://127.0.0.1:1", "--repo", str(tmp_path)]
    args += ["--open-pr", "--forge-repo", repository, "--forge-token-file", str(token)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1, result.output
    expected = f"expected --forge-repo as OWNER/NAME, found {repository!r}"
    assert expected in result.output and "Traceback" not in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["token"]


def test_every_setting_is_documented_with_its_default() -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs" / "tuner.md").read_text()
    for name, field in TunerSettings.model_fields.items():
        assert field.description, f"TunerSettings.{name} has no docstring"
        assert f"`{name}`" in docs, f"docs/tuner.md does not list {name}"
    assert TunerSettings().window == "30m" and TunerSettings().cooldown == "1h"


@pytest.mark.process
def test_proposal_branch_is_pushed_to_the_remote(policy_repo: Path, tmp_path: Path) -> None:
    """What ``--open-pr`` does before its API call, against a real (local, bare) remote."""
    remote = tmp_path / "remote.git"
    git(tmp_path, "init", "--quiet", "--bare", str(remote))
    git(policy_repo, "remote", "add", "origin", str(remote))
    base = resolve(policy_repo, "HEAD")
    text = SHIPPED.replace("max_replicas: auto", "max_replicas: 10")
    commit = commit_on_new_branch(
        policy_repo,
        base=base,
        branch="gpupool-tuner/t-1",
        path="policy/pool.yaml",
        text=text,
        message="T\n\nbody",
    )
    push(policy_repo, "origin", "gpupool-tuner/t-1")
    assert git(remote, "rev-parse", "refs/heads/gpupool-tuner/t-1").strip() == commit
    assert git(remote, "log", "-1", "--format=%an %s", commit).strip() == "gpupool-tuner T"


@pytest.mark.process
def test_manifest_diff_renders_with_the_model_configs_committed_at_the_base(
    policy_repo: Path, tmp_path: Path
) -> None:
    """The PR body's diff is ``gpupool diff`` of both policies (``render_policy_file``), with the
    base commit's model configs even when the work tree lost or changed them."""
    base_text = DEFAULT_POLICY.read_text()
    new_text = base_text.replace("    max_replicas: auto", "    max_replicas: 10", 1)
    assert new_text != base_text
    expected_root = tmp_path / "expected"
    shutil.copytree(REPO / "policy" / "models", expected_root / "models")
    (expected_root / "before.yaml").write_text(base_text)
    (expected_root / "after.yaml").write_text(new_text)
    expected = diff_documents(
        render_policy_file(expected_root / "before.yaml", stack=StackOptions("labels")),
        render_policy_file(expected_root / "after.yaml", stack=StackOptions("labels")),
    )
    for model in (policy_repo / "policy" / "models").iterdir():
        model.write_text("not json")  # the work tree is never read
    change = PolicyChange(
        policy_repo,
        resolve(policy_repo, "HEAD"),
        "policy/pool.yaml",
        load_policy(DEFAULT_POLICY),
        base_text,
        new_text,
    )
    diff = manifest_diff(change, target="labels")
    assert diff == expected
    assert "maxReplicas" in diff


@pytest.mark.process
def test_only_a_local_branch_base_is_fetched(policy_repo: Path) -> None:
    """``branch_of`` decides what a cycle fetches: the branch ``--base`` names (``HEAD``: the
    checked-out one); a commit, a tag or a detached HEAD is used as committed."""
    head = resolve(policy_repo, "HEAD")
    git(policy_repo, "tag", "v1")
    assert branch_of(policy_repo, "HEAD") == "main"
    assert branch_of(policy_repo, "main") == "main"
    assert branch_of(policy_repo, head) is None
    assert branch_of(policy_repo, "v1") is None
    git(policy_repo, "checkout", "--quiet", "--detach")
    assert branch_of(policy_repo, "HEAD") is None
