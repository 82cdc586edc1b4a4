"""Edge: open a pull request on GitHub (REST API). Optional; the branch is the output."""

from __future__ import annotations

import json
import urllib.request
from dataclasses import dataclass

TOKEN_ENV = "GITHUB_TOKEN"
"""Environment variable holding the token that may open pull requests."""


@dataclass(frozen=True)
class PullRequestCall:
    """Everything one ``POST /repos/{owner}/{repo}/pulls`` needs."""

    url: str
    headers: dict[str, str]
    payload: dict[str, str | bool]


def build_pull_request(
    *, api_url: str, repository: str, token: str, title: str, body: str, head: str, base: str
) -> PullRequestCall:
    """The request GitHub documents for creating a pull request (pure; tested offline)."""
    owner, _, name = repository.partition("/")
    if not owner or not name or "/" in name:
        raise ValueError(f"expected --forge-repo as OWNER/NAME, found {repository!r}")
    if not token:
        raise ValueError(f"{TOKEN_ENV} is empty: set it to a token that may open pull requests")
    return PullRequestCall(
        url=f"{api_url.rstrip('/')}/repos/{owner}/{name}/pulls",
        headers={
            "Accept": "application/vnd.github+json",
            "Authorization": f"Bearer {token}",
            "X-GitHub-Api-Version": "2022-11-28",
            "Content-Type": "application/json",
        },
        payload={"title": title, "body": body, "head": head, "base": base, "draft": False},
    )


def send(call: PullRequestCall, *, timeout_s: float = 30) -> str:
    """POST the call; returns the pull request's ``html_url``."""
    request = urllib.request.Request(
        call.url, data=json.dumps(call.payload).encode(), headers=call.headers, method="POST"
    )
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        return str(json.load(response)["html_url"])
