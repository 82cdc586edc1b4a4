"""Where the tuner proposes: the repository and its policy file, and the forge that takes
its pull requests (``--open-pr``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from infra.builders.stack_options import Target as NodePoolTarget
from runtime.tuner import forge, gitrepo


@dataclass(frozen=True)
class Target:
    """The repository the tuner proposes to, and where it keeps its own files."""

    repo: Path
    policy_path: str = "policy/pool.yaml"
    """Policy file, relative to the repository root."""
    base: str = "HEAD"
    """Ref the proposal branches from (and the PR's base)."""
    remote: str = "origin"
    """Remote the base branch is fetched from at the start of every cycle (when the
    repository has it and ``base`` names a local branch), and proposal branches are pushed to
    (``--open-pr``)."""
    fetch: bool = True
    """False: decide against the local ``base`` as it is, even when the remote exists."""
    render_target: NodePoolTarget = "labels"
    """Node-pool target the PR's manifest diff is rendered for (as ``gpupool diff -t``)."""

    @property
    def tuner_dir(self) -> Path:
        """``<git dir>/gpupool-tuner``: state and PR bodies, outside the work tree."""
        return gitrepo.common_dir(self.repo) / "gpupool-tuner"


@dataclass(frozen=True)
class ForgeOptions:
    """Where to open pull requests (``--open-pr``)."""

    repository: str
    token: str
    api_url: str = "https://api.github.com"


def open_pull_request(
    target: Target, options: ForgeOptions, title: str, body: str, branch: str
) -> str:
    """Push ``branch`` and open its pull request against ``target.base``; the PR's URL."""
    gitrepo.push(target.repo, target.remote, branch)
    base = gitrepo.git(target.repo, "rev-parse", "--abbrev-ref", target.base).strip()
    call = forge.build_pull_request(
        api_url=options.api_url,
        repository=options.repository,
        token=options.token,
        title=title,
        body=body,
        head=branch,
        base=base,
    )
    return forge.send(call)
