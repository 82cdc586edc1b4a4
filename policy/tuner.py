"""Where the in-cluster tuner gets its policy repository and its Secrets.

The tuner proposes changes as git branches of the policy repository, so its Deployment
clones that repository first; Alertmanager and the tuner share one bearer token so that only
Alertmanager can trigger a cycle. Secrets are referenced by name, never carried in the bundle.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from policy.base import DnsLabel, Invariants, StrictModel

_SECRET_KEY = r"^[-._a-zA-Z0-9]+$"
"""Characters Kubernetes allows in a Secret data key."""

RepoAuth = Literal["none", "https-token", "ssh-key"]


class Tuner(StrictModel):
    """The tuner Deployment's repository, forge and Secret references."""

    webhook_token_secret: DnsLabel = "gpupool-tuner-webhook"
    """Secret (in ``cluster.system_namespace``) holding the webhook bearer token: the tuner
    reads it as a mounted file (``--token-file``), Alertmanager as its receiver's
    ``credentials_file`` (list it in the Alertmanager resource's ``spec.secrets``)."""
    webhook_token_key: str = Field("token", pattern=_SECRET_KEY)
    """Key of the token inside ``webhook_token_secret``."""
    alertmanager_secrets_dir: str = Field("/etc/alertmanager/secrets", pattern=r"^/\S*[^/]$")
    """Where Alertmanager sees the Secrets of its ``spec.secrets`` (prometheus-operator mounts
    each at ``<dir>/<secret>/<key>``); the tuner receiver's ``credentials_file`` lives here."""
    policy_repo_url: str = Field(pattern=r"^(https?://|ssh://|file://|git@)\S+$")
    """Your policy repository (the one holding this file); cloned into the tuner's volume at
    pod start. No default: only you know it."""
    policy_repo_branch: str = Field("main", pattern=r"^[^\s~^:?*\[\\]+$")
    """Branch the tuner clones and proposes changes against."""
    policy_repo_path: str = Field("policy/pool.yaml", pattern=r"^[^/\s][^\s]*\.ya?ml$")
    """The policy file inside that repository (``gpupool tune --policy-path``)."""
    policy_repo_auth: RepoAuth = "none"
    """How git authenticates: ``none`` (public or file URL), ``https-token`` (a
    ``kubernetes.io/basic-auth`` Secret: ``username``, ``password`` = token) or ``ssh-key``
    (a ``kubernetes.io/ssh-auth`` Secret: ``ssh-privatekey`` and ``known_hosts``)."""
    policy_repo_secret: DnsLabel | None = None
    """Secret with the git credentials; required unless ``policy_repo_auth`` is ``none``."""
    forge_repo: str | None = Field(None, pattern=r"^[\w.-]+/[\w.-]+$")
    """``OWNER/NAME`` on GitHub: when set, the tuner pushes each proposal and opens a pull
    request (``--open-pr``) with the token of ``forge_token_secret``; unset: branches only."""
    forge_token_secret: DnsLabel = "gpupool-tuner-github"
    """Secret holding the GitHub token that may open pull requests (used with ``forge_repo``)."""
    forge_token_key: str = Field("token", pattern=_SECRET_KEY)
    """Key of the token inside ``forge_token_secret``."""
    compaction_token_secret: DnsLabel = "gpupool-compaction-token"
    """Secret holding the bearer token of the tuner's compaction requests; create it with the
    same value in ``cluster.system_namespace`` (the tuner) and ``cluster.flex_namespace`` (the
    sidecars). Optional: while it is absent the tuner only logs its requests."""
    compaction_token_key: str = Field("token", pattern=_SECRET_KEY)
    """Key of the token inside ``compaction_token_secret``."""

    @property
    def webhook_credentials_file(self) -> str:
        """The token file as Alertmanager sees it."""
        secret, key = self.webhook_token_secret, self.webhook_token_key
        return f"{self.alertmanager_secrets_dir}/{secret}/{key}"

    def referenced_secrets(self) -> dict[str, str]:
        """Field name -> Secret the tuner's pod reads in ``cluster.system_namespace`` (the git
        and forge Secrets only when ``policy_repo_auth`` and ``forge_repo`` use them)."""
        out = {
            "webhook_token_secret": self.webhook_token_secret,
            "compaction_token_secret": self.compaction_token_secret,
        }
        if self.policy_repo_auth != "none" and self.policy_repo_secret is not None:
            out["policy_repo_secret"] = self.policy_repo_secret
        if self.forge_repo is not None:
            out["forge_token_secret"] = self.forge_token_secret
        return out

    @model_validator(mode="after")
    def _auth_has_secret(self) -> Tuner:
        found = Invariants()
        found.require(
            self.policy_repo_auth == "none" or self.policy_repo_secret is not None,
            "policy_repo_secret",
            f"policy_repo_auth {self.policy_repo_auth!r} needs the name of a Secret with the "
            "git credentials",
        )
        https = self.policy_repo_url.startswith(("https://", "http://"))
        found.require(
            self.policy_repo_auth != "https-token" or https,
            "policy_repo_url",
            f"https-token auth needs an http(s) URL, found {self.policy_repo_url!r}",
        )
        found.require(
            self.policy_repo_auth != "ssh-key" or not https,
            "policy_repo_url",
            f"ssh-key auth needs an ssh URL, found {self.policy_repo_url!r}",
        )
        found.raise_if_any()
        return self
