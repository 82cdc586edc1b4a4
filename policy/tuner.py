"""Where the in-cluster tuner gets its policy repository and its Secrets.

The tuner proposes changes as git branches of the policy repository, so its Deployment
clones that repository first; Alertmanager and the tuner share one bearer token so that only
Alertmanager can trigger a cycle. Secrets are referenced by name, never carried in the bundle.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, model_validator

from policy.base import (
    URL_PATH_CHARS,
    AbsolutePath,
    DnsLabel,
    Duration,
    Invariants,
    StrictModel,
    duration_seconds,
    port_problem,
)

SECRET_KEY_MAX = 253
"""Longest Secret data key (Kubernetes ``IsConfigMapKey``)."""


def _check_secret_key(value: str) -> str:
    """A Secret data key as the API server checks it: ``[-._a-zA-Z0-9]+``, at most 253
    characters, not ``.``, ``..`` or starting with ``..`` (the key is a file name in the
    mounted volume)."""
    if (
        re.fullmatch(r"[-._a-zA-Z0-9]+", value, re.ASCII) is None
        or len(value) > SECRET_KEY_MAX
        or value.startswith("..")
        or value == "."
    ):
        raise ValueError(
            f"expected a Secret key (ASCII letters, digits, '-', '_', '.', at most "
            f"{SECRET_KEY_MAX}, not '.' or starting with '..'), e.g. token, found {value!r}"
        )
    return value


SecretKey = Annotated[str, AfterValidator(_check_secret_key)]
"""A key of a Secret's ``data``: the file name the mounted Secret shows."""

_REF_FORBIDDEN = re.compile(r"[^!-~]|[~^:?*\[\\]|\.\.|@\{|//|/\.|\.lock(?:/|\Z)", re.ASCII)
"""What git's ``check-ref-format`` refuses anywhere in a ref name, made ASCII-only: control
characters, space and non-ASCII; ``~ ^ : ? * [ \\``; ``..``, ``@{``, ``//``; a component that
starts with ``.`` or ends with ``.lock``."""

REFNAME_MAX = 255
"""Longest branch gpupool accepts (git's own limit is the file system's file name)."""


def check_branch(value: str) -> str:
    """``value`` if git accepts it as a branch name (``git check-ref-format --branch``, ASCII
    only): in particular it never starts with ``-``, so no git command reads it as an option."""
    if (
        not value
        or len(value) > REFNAME_MAX
        or value.startswith(("-", ".", "/"))
        or value.endswith(("/", ".", ".lock"))
        or value == "@"
        or _REF_FORBIDDEN.search(value) is not None
    ):
        raise ValueError(
            "expected a git branch name (git check-ref-format --branch: ASCII, no spaces or "
            "~ ^ : ? * [ \\, no '..', '@{', '//', not starting with '-', '.' or '/', not "
            f"ending with '/', '.' or '.lock'), e.g. main or release/2025, found {value!r}"
        )
    return value


Branch = Annotated[str, AfterValidator(check_branch)]
"""A git branch name (``refs/heads/<name>``) that git accepts and no git command mistakes for
an option."""

_USER = r"[A-Za-z0-9][A-Za-z0-9._~-]*"
_HOST = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*"
_REPO_PATH = rf"[A-Za-z0-9._~%+-]{URL_PATH_CHARS}*"
REPO_URL_SCHEMES = {
    "https": re.compile(
        rf"https://(?:{_USER}@)?{_HOST}(?::(?P<port>[0-9]{{1,5}}))?/{_REPO_PATH}", re.ASCII
    ),
    "http": re.compile(
        rf"http://(?:{_USER}@)?{_HOST}(?::(?P<port>[0-9]{{1,5}}))?/{_REPO_PATH}", re.ASCII
    ),
    "ssh": re.compile(
        rf"ssh://(?:{_USER}@)?{_HOST}(?::(?P<port>[0-9]{{1,5}}))?/{_REPO_PATH}"
        rf"|{_USER}@{_HOST}:/?{_REPO_PATH}",
        re.ASCII,
    ),
    "file": re.compile(rf"file:///{_REPO_PATH}", re.ASCII),
}
"""The repository URLs gpupool clones, by git transport (the allow-list): ``https://`` and
``http://`` (smart HTTP), ``ssh://`` and scp-like ``user@host:path`` (ssh), ``file:///`` (a
path in the container). Hosts and users start alphanumeric, so ssh never reads one as an
option; every other transport (``ext::``, ``fd::``, remote helpers) is refused, and the init
container's ``GIT_ALLOW_PROTOCOL`` repeats the scheme so git refuses any other, redirects
and submodules included."""


def repo_url_scheme(url: str) -> str | None:
    """The allow-listed transport of ``url`` (``https``, ``http``, ``ssh``, ``file``), None
    when it is not one gpupool clones."""
    for scheme, grammar in REPO_URL_SCHEMES.items():
        match = grammar.fullmatch(url)
        if match is not None and not port_problem(match.groupdict().get("port")):
            return scheme
    return None


def _check_repo_url(value: str) -> str:
    if repo_url_scheme(value) is None:
        raise ValueError(
            "expected a git URL https://HOST/PATH, http://HOST/PATH, ssh://[USER@]HOST/PATH, "
            "USER@HOST:PATH or file:///PATH (ASCII host and path, port 1-65535), e.g. "
            f"https://github.com/acme/policy.git, found {value!r}"
        )
    return value


RepoUrl = Annotated[str, AfterValidator(_check_repo_url)]
"""A git repository URL with an allow-listed transport (``REPO_URL_SCHEMES``)."""


def _check_repo_path(value: str) -> str:
    segments = value.split("/")
    if (
        not all(re.fullmatch(r"[A-Za-z0-9._-]+", s, re.ASCII) for s in segments)
        or any(s in (".", "..") for s in segments)
        or value.startswith("-")
        or segments[0] == ".git"
        or re.search(r"\.ya?ml\Z", value) is None
    ):
        raise ValueError(
            "expected a YAML file inside the repository, a relative path of ASCII letters, "
            "digits, '.', '_', '-' (no '.' or '..' segment, not in .git, not starting with "
            f"'-'), ending .yaml or .yml, e.g. policy/pool.yaml, found {value!r}"
        )
    return value


def _check_forge_repo(value: str) -> str:
    match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9-]{0,38})/([A-Za-z0-9._-]{1,100})", value)
    if match is None or match[2] in (".", ".."):
        raise ValueError(
            "expected a GitHub repository OWNER/NAME (owner: ASCII letters, digits, '-', at "
            "most 39, starting alphanumeric; name: letters, digits, '.', '_', '-', at most 100, "
            f"not '.' or '..'), e.g. acme/policy, found {value!r}"
        )
    return value


RepoAuth = Literal["none", "https-token", "ssh-key"]

TRACE_MAX_STEPS = 100_000
"""Steps one production trace may hold (a week at 6 s, 69 days at a minute)."""


def _check_vary(value: str) -> str:
    field, sep, values = value.partition("=")
    if not sep or not field.strip() or not values.strip():
        raise ValueError(
            "expected FIELD=V1,V2,... as for gpupool advise --vary, e.g. "
            f"node_pools.gpu-prod.reserve_ratio=0.1,0.2, found {value!r}"
        )
    return value


class AdviseLever(StrictModel):
    """The advisor as a lever of the tuner: every ``every`` it reads production's demand of
    the last ``window`` from Prometheus, sweeps policy variants on it and proposes the
    recommended one as a pull request (docs/tuner.md, "The advisor as a lever")."""

    enabled: bool = False
    """Off by default: a sweep costs CPU minutes (``jobs`` processes for up to ``budget``)
    that the tuner's pod only gets when this is on (its resources grow with ``jobs``)."""
    every: Duration = "1d"
    """Least time between two sweeps; a cycle in between does not sweep."""
    window: Duration = "1d"
    """How much of production's recent history is read and replayed (the sweep's cost grows
    with it: about 3 s of CPU per replayed day and variant)."""
    step: Duration = "1m"
    """Time between two samples of the production trace."""
    budget: Duration = "10m"
    """The sweep starts no replay after this long; variants not reached are listed in the
    pull request, and a sweep whose current-policy replay did not finish proposes nothing."""
    jobs: int = Field(2, ge=1, le=16)
    """Replays run at once (processes in the tuner's pod)."""
    vary: list[Annotated[str, AfterValidator(_check_vary)]] = Field(
        default_factory=list, max_length=8
    )
    """``FIELD=V1,V2,...`` entries swept as a grid, as ``gpupool advise --vary`` (at most 8
    entries and 64 variants); empty: the levers that matter for the policy (``gpupool
    advise``'s default sweep)."""

    @property
    def every_s(self) -> float:
        return duration_seconds(self.every)

    @property
    def window_s(self) -> float:
        return duration_seconds(self.window)

    @property
    def step_s(self) -> float:
        return duration_seconds(self.step)

    @property
    def budget_s(self) -> float:
        return duration_seconds(self.budget)

    @model_validator(mode="after")
    def _trace_fits(self) -> AdviseLever:
        found = Invariants()
        steps = self.window_s / self.step_s
        found.require(
            steps >= 2,
            "window",
            f"window {self.window} must hold two steps of {self.step} at least",
        )
        found.require(
            steps <= TRACE_MAX_STEPS,
            "step",
            f"window {self.window} at step {self.step} is {steps:,.0f} samples, over "
            f"{TRACE_MAX_STEPS:,}; take a longer step",
        )
        found.raise_if_any()
        return self


class Tuner(StrictModel):
    """The tuner Deployment's repository, forge and Secret references."""

    webhook_token_secret: DnsLabel = "gpupool-tuner-webhook"
    """Secret holding the webhook bearer token, in ``cluster.system_namespace`` (the tuner
    reads it as a mounted file, ``--token-file``) and, with the same value, in
    ``network.alertmanager_namespace`` (the AlertmanagerConfig's tuner receiver names it
    there; a plain ``alertmanager.yml`` reads it as a file of ``spec.secrets``)."""
    webhook_token_key: SecretKey = "token"
    """Key of the token inside ``webhook_token_secret``."""
    alertmanager_secrets_dir: AbsolutePath = "/etc/alertmanager/secrets"
    """Where Alertmanager sees the Secrets of its ``spec.secrets`` (prometheus-operator mounts
    each at ``<dir>/<secret>/<key>``): every credential file of the plain ``alertmanager.yml``
    (the tuner receiver's ``credentials_file``, the receivers' ``*_file``) lives here."""
    policy_repo_url: RepoUrl
    """Your policy repository (the one holding this file); cloned into the tuner's volume at
    pod start. No default: only you know it. One of the transports gpupool allows:
    ``https://``, ``http://``, ``ssh://``, ``USER@HOST:PATH``, ``file:///`` (ASCII host and
    path)."""
    policy_repo_branch: Branch = "main"
    """Branch the tuner clones and proposes changes against: a name git accepts (``git
    check-ref-format --branch``), ASCII, never starting with ``-``."""
    policy_repo_path: Annotated[str, AfterValidator(_check_repo_path)] = "policy/pool.yaml"
    """The policy file inside that repository (``gpupool tune --policy-path``)."""
    policy_repo_auth: RepoAuth = "none"
    """How git authenticates: ``none`` (public or file URL), ``https-token`` (a
    ``kubernetes.io/basic-auth`` Secret: ``username``, ``password`` = token) or ``ssh-key``
    (a ``kubernetes.io/ssh-auth`` Secret: ``ssh-privatekey`` and ``known_hosts``)."""
    policy_repo_secret: DnsLabel | None = None
    """Secret with the git credentials; required unless ``policy_repo_auth`` is ``none``."""
    forge_repo: Annotated[str, AfterValidator(_check_forge_repo)] | None = None
    """``OWNER/NAME`` on GitHub: when set, the tuner pushes each proposal and opens a pull
    request (``--open-pr``) with the token of ``forge_token_secret``; unset: branches only."""
    forge_token_secret: DnsLabel = "gpupool-tuner-github"
    """Secret holding the GitHub token that may open pull requests (used with ``forge_repo``)."""
    forge_token_key: SecretKey = "token"
    """Key of the token inside ``forge_token_secret``."""
    compaction_token_secret: DnsLabel = "gpupool-compaction-token"
    """Secret holding the bearer token of the tuner's compaction requests; create it with the
    same value in ``cluster.system_namespace`` (the tuner) and ``cluster.flex_namespace`` (the
    sidecars). Optional: while it is absent the tuner only logs its requests."""
    compaction_token_key: SecretKey = "token"
    """Key of the token inside ``compaction_token_secret``."""
    advise: AdviseLever = Field(default_factory=AdviseLever)
    """The advisor as a lever: a periodic sweep on production's own recent demand, proposed
    as a pull request (off by default)."""

    @property
    def repo_transport(self) -> str:
        """The git transport ``policy_repo_url`` uses (``https``, ``http``, ``ssh`` or
        ``file``): the init container's ``GIT_ALLOW_PROTOCOL``, so git refuses any other."""
        scheme = repo_url_scheme(self.policy_repo_url)
        assert scheme is not None  # RepoUrl validated it
        return scheme

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
