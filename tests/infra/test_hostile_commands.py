"""Policy values reach container commands as data: generated branches, URLs and policies.

The init container that clones the policy repository mounts the git credentials; a branch
like ``--upload-pack=<command>`` used to run ``<command>`` there (``git fetch`` read it as its
option on a pod restart). These tests run the rendered init container with real git against
a local ``file://`` repository for generated branches and URLs, with and without the policy's
validation in front, and check every rendered process against the written audit
(docs/design/commands-audit.md).
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from infra.builders.meta import Manifest
from infra.builders.runtime_components import CLONE_SCRIPT, clone_container
from infra.builders.serving_options import ServingOptions
from infra.builders.stack_options import StackOptions
from infra.builders.vllm_container import poststart_command, prestop_command, readiness_command
from infra.bundle import build_bundle
from infra.inputs import load_inputs
from policy import PolicyError, PoolPolicy, parse_policy
from runtime.vllm import load_model_spec, serve_args
from tests.harness import hostile as h
from tests.harness.containers import run_container
from tests.harness.git import git
from tests.harness.policy_docs import set_path
from tests.harness.servers import REPO
from tests.infra.policies import edited, explicit_args, policy_with
from tests.infra.test_serving_schemas import served_policy
from tests.infra.test_tuner_deployment import HTTPS, SSH

AUDIT = REPO / "docs" / "design" / "commands-audit.md"
MARK = "{marker}"
"""Placeholder for the file a payload creates when it runs."""

PAYLOADS = [
    f"touch${{IFS}}{MARK};git-upload-pack",
    f"sh${{IFS}}-c${{IFS}}touch${{IFS}}{MARK}",
    f"/usr/bin/touch${{IFS}}{MARK}",
    f"$(touch${{IFS}}{MARK})",
    f"`touch${{IFS}}{MARK}`",
]
"""Commands without a space (the old branch pattern refused whitespace, nothing else)."""

options = st.builds(
    lambda option, payload, tail: f"--{option}={payload}{tail}",
    st.sampled_from(["upload-pack", "receive-pack", "exec", "template", "config"]),
    st.sampled_from(PAYLOADS),
    st.sampled_from(["", "/x", "\n"]),
)
"""Option-like values: each runs a payload where git reads it as its option."""

branches = st.one_of(options, h.hostile(["main", "release/2025", "gpupool/policy"]))


def _origin(root: Path, branch: str | None) -> Path:
    """A repository with ``main`` (and ``branch``, where git accepts the name)."""
    origin = root / "origin"
    (origin / "policy").mkdir(parents=True)
    (origin / "policy" / "pool.yaml").write_text("cluster: {name: one}\n")
    git(origin, "init", "--quiet", "--initial-branch=main")
    git(origin, "add", ".")
    git(origin, "commit", "-qm", "one")
    if branch is not None and h.is_git_branch(branch):
        git(origin, "update-ref", f"refs/heads/{branch}", "HEAD")
    return origin


def _run_both_paths(container: dict[str, Any], root: Path, origin: Path, **env: str) -> list[int]:
    """The init container on a fresh volume (clone) and on a kept one (fetch): exit codes."""
    fresh, kept = root / "fresh" / "repo", root / "kept" / "repo"
    fresh.parent.mkdir()
    kept.parent.mkdir()
    subprocess.run(["git", "clone", "-q", f"file://{origin}", str(kept)], check=True)
    codes = []
    for repo in (fresh, kept):
        done = run_container(container, REPO_DIR=str(repo), HOME=str(root), **env)
        codes.append(done.returncode)
    return codes


def _one_line_at(exc: PolicyError, field: str) -> None:
    assert exc.problems and all("\n" not in str(p) for p in exc.problems), exc
    assert field in {p.path for p in exc.problems}, exc


@pytest.mark.process
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(template=branches)
@example(template=f"--upload-pack=touch${{IFS}}{MARK};git-upload-pack")
def test_branches_reach_git_as_data(template: str) -> None:
    """A generated branch is refused in one line at ``tuner.policy_repo_branch``, or it is a
    branch git accepts and the init container clones and fetches it; no payload ever runs."""
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        marker = root / "ran"
        branch = template.replace(MARK, str(marker))
        origin = _origin(root, branch)
        try:
            policy = policy_with(
                {"tuner.policy_repo_url": f"file://{origin}", "tuner.policy_repo_branch": branch}
            )
        except PolicyError as exc:
            _one_line_at(exc, "tuner.policy_repo_branch")
            return
        codes = _run_both_paths(clone_container(policy), root, origin)
        assert not marker.exists(), f"the branch {branch!r} ran a command"
        assert h.is_git_branch(branch), f"{branch!r} was accepted, but git refuses it"
        assert codes == [0, 0]
        assert git(root / "kept" / "repo", "rev-parse", "--abbrev-ref", "HEAD").strip() == branch


@pytest.mark.process
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(template=st.one_of(options, st.sampled_from(PAYLOADS)))
def test_the_clone_script_never_reads_a_value_as_an_option(template: str) -> None:
    """Defence in depth: with the policy's validation bypassed (the values set in the
    container's environment directly), the script still refuses an option-like branch before
    git sees it, and passes an option-like URL after ``--``."""
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        marker = root / "ran"
        value = template.replace(MARK, str(marker))
        origin = _origin(root, None)
        container = clone_container(policy_with({"tuner.policy_repo_url": f"file://{origin}"}))
        as_branch = _run_both_paths(container, root, origin, GIT_BRANCH=value)
        assert not marker.exists(), f"GIT_BRANCH={value!r} ran a command"
        assert 0 not in as_branch
        fresh = root / "url" / "repo"
        fresh.parent.mkdir()
        run_container(container, REPO_DIR=str(fresh), HOME=str(root), GIT_URL=value)
        assert not marker.exists(), f"GIT_URL={value!r} ran a command"


URLS = [
    "https://github.com/acme/policy.git",
    "git@github.com:acme/policy.git",
    "ssh://git@git.example.invalid:2222/acme/policy.git",
    "file:///srv/policy",
]
HOSTILE_URLS = [
    f"ext::sh -c touch% {MARK}",
    f"ssh://-oProxyCommand=touch${{IFS}}{MARK}/x",
    f"git@-oProxyCommand=touch${{IFS}}{MARK}:x",
    f"-u{MARK}@host:x",
    "fd::3",
    "file://relative/path",
    "https://\u0261ithub.com/acme/policy.git",  # a look-alike g: another host
]


def _allow_listed(url: str) -> bool:
    """The transports gpupool clones, with a host no program reads as an option (ASCII,
    starting alphanumeric), from the URL's own parts."""
    if not url.isascii() or any(c.isspace() or not c.isprintable() for c in url):
        return False
    scp = re.fullmatch(r"([A-Za-z0-9][^@/:]*)@([A-Za-z0-9][A-Za-z0-9.-]*):(.+)", url)
    if scp is not None:
        return not scp[3].startswith("-")
    parts = urlsplit(url)
    if parts.scheme == "file":
        return parts.netloc == "" and parts.path.startswith("/") and url.startswith("file:///")
    host = parts.hostname or ""
    return (
        parts.scheme in ("https", "http", "ssh")
        and re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9.-]*", host) is not None
        and parts.password is None
        and len(parts.path) > 1
    )


@settings(max_examples=60, deadline=None)
@given(template=st.one_of(h.hostile(URLS), st.sampled_from(HOSTILE_URLS)))
@example(template="ssh://-oProxyCommand=x/y")
def test_repository_urls_are_allow_listed(template: str) -> None:
    url = template.replace(MARK, "/tmp/ran")
    try:
        policy = policy_with({"tuner.policy_repo_url": url})
    except PolicyError as exc:
        _one_line_at(exc, "tuner.policy_repo_url")
        return
    assert _allow_listed(url), f"{url!r} was accepted, but it is no allow-listed transport"
    env = {e["name"]: e["value"] for e in clone_container(policy)["env"] if "value" in e}
    assert env["GIT_ALLOW_PROTOCOL"] == ("ssh" if "://" not in url else url.split("://")[0]), (
        "git may use another transport than the URL's"
    )


# --- the audit ------------------------------------------------------------------------------


def _variants() -> Iterator[list[Manifest]]:
    """The bundles whose processes the audit covers: every optional container and hook."""
    inputs = load_inputs(REPO / "policy" / "pool.yaml")
    for edits in (
        {},
        HTTPS,
        SSH,
        {"kv_cache.kv_preservation": "filesystem", "workloads.0.kv_compaction": False},
        {"tuner.forge_repo": "acme/policy", "kv_cache.python_hash_seed": 7},
    ):
        policy = policy_with(edits)
        for target in ("labels", "karpenter"):
            yield build_bundle(policy, stack=StackOptions(target), vllm_args=inputs.vllm_args)
    served = served_policy()
    for mode in ("inference-extension", "services"):
        options = ServingOptions(mode)
        yield build_bundle(
            served, stack=StackOptions("labels", serving=options), vllm_args=explicit_args(served)
        )


def processes(objects: list[Manifest]) -> Iterator[tuple[str, str, list[str]]]:
    """``(container, what, argv)`` of every process a pod runs: the container itself and each
    exec probe and hook (``what``: ``container``, ``readinessProbe``, ``preStop``, ...)."""
    for obj in objects:
        pod = obj.get("spec", {}).get("template", {}).get("spec", {})
        for c in [*pod.get("initContainers", []), *pod.get("containers", [])]:
            yield c["name"], "container", [*c.get("command", []), *c.get("args", [])]
            probes = {
                p: c[p] for p in ("startupProbe", "readinessProbe", "livenessProbe") if p in c
            }
            hooks = c.get("lifecycle", {})
            for what, action in [*probes.items(), *hooks.items()]:
                if "exec" in action:
                    yield c["name"], what, list(action["exec"]["command"])


SCRIPTS = {
    CLONE_SCRIPT,
    prestop_command(0)[2],
    poststart_command()[2],
    readiness_command(0, 0)[2],
}
"""The only ``sh -c`` programs: constants of the builders, up to their integers."""


def _digits(text: str) -> str:
    return re.sub(r"[0-9]+", "0", text)


def _check_processes(objects: list[Manifest], audit: str) -> None:
    for container, what, argv in processes(objects):
        assert f"`{container}`" in audit, f"{container} is not in {AUDIT.name}"
        if argv[:2] == ["sh", "-c"]:
            assert _digits(argv[2]) in {_digits(s) for s in SCRIPTS}, (container, what, argv[2])
            continue
        for word in argv:
            if word.startswith("-"):
                flag = word.split("=")[0] if word.startswith("--") else word
                assert f"`{flag}" in audit or f" {flag}" in audit, (
                    f"{container} ({what}): {word!r} is an option the audit does not list"
                )


def test_every_rendered_process_is_in_the_audit() -> None:
    audit = AUDIT.read_text()
    seen = set()
    for objects in _variants():
        _check_processes(objects, audit)
        seen |= {(c, w) for c, w, _ in processes(objects)}
    # every optional process appeared in some variant
    assert {c for c, _ in seen} == {
        "clone-policy",
        "tuner",
        "gpupool-plugin",
        "vllm",
        "kv-compaction",
        "kv-snapshot-gc",
        "epp",
    }
    assert {w for c, w in seen if c == "vllm"} == {
        "container",
        "readinessProbe",
        "postStart",
        "preStop",
    }


MODEL_NAMES = ["meta-llama/Llama-3.1-8B-Instruct", "/models/llama", "org/model"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    field=st.sampled_from(["workloads.0.model", "tuner.policy_repo_path", "tuner.forge_repo"]),
    value=h.hostile([*MODEL_NAMES, "policy/pool.yaml", "acme/policy"]),
)
@example(field="workloads.0.model", value="--trust-remote-code")
@example(field="tuner.policy_repo_path", value="-x.yaml")
def test_no_policy_value_becomes_an_option(field: str, value: str) -> None:
    """A value that follows a flag never starts with ``-`` (an argv parser would read it as
    an option); refused values are refused in one line at their field."""
    doc = edited()
    set_path(doc, field, value)
    try:
        policy: PoolPolicy = parse_policy(doc)
    except PolicyError as exc:
        _one_line_at(exc, field)
        return
    audit = AUDIT.read_text()
    _check_processes(
        build_bundle(policy, stack=StackOptions("labels"), vllm_args=_real_args(policy)), audit
    )


def _real_args(policy: PoolPolicy) -> dict[str, list[str]]:
    """vLLM's arguments as ``runtime.vllm`` renders them (the model id among them)."""
    model = load_model_spec(REPO / "policy" / "models" / "llama-3.1-8b-instruct.json")
    return {w.name: serve_args(policy, w, model) for w in policy.workloads}
