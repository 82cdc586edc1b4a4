"""A Prometheus holding every tuner scenario (raw exporter series backfilled, the recording
rules evaluated over them; one per test module), and a throw-away git repository holding a
copy of the shipped policy; a local stand-in for GitHub's REST API."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness import github as github_replay
from tests.harness.git import git
from tests.harness.servers import REPO, Server
from tests.tuner import scenarios


@pytest.fixture(scope="module")
def scenario_prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = scenarios.build_prometheus(tmp_path_factory.mktemp("tuner-prometheus"))
    yield server
    server.stop()


@pytest.fixture
def github() -> Iterator[github_replay.ReplayGitHub]:
    """A local server standing in for GitHub's REST API (``tests.harness.github``)."""
    with github_replay.serve() as replay:
        yield replay


@pytest.fixture
def policy_repo(tmp_path: Path) -> Path:
    """A git repository whose one commit holds the scenarios' policy/pool.yaml: the shipped
    one with an explicit flex bound (``scenarios.POLICY_TEXT``)."""
    repo = tmp_path / "repo"
    (repo / "policy").mkdir(parents=True)
    (repo / "policy" / "pool.yaml").write_text(scenarios.POLICY_TEXT)
    shutil.copytree(REPO / "policy" / "models", repo / "policy" / "models")
    git(repo, "init", "--quiet", "--initial-branch=main")
    git(repo, "add", ".")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-qm", "init")
    return repo
