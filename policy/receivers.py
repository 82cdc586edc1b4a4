"""Alertmanager receivers: where notifications go, each credential a Secret reference.

Every kind (Slack, PagerDuty, email, Opsgenie, webhook) names its credential as a
``SecretRef``, never the value: the policy is committed, so a pasted credential would be too.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BeforeValidator, Field, model_validator

from policy.base import (
    HOST_PATTERN,
    DnsLabel,
    HttpUrlText,
    Invariants,
    StrictModel,
    check_http_url,
    port_problem,
)
from policy.tuner import SecretKey


class SecretRef(StrictModel):
    """A key of a Kubernetes Secret that holds a credential: the policy names it, never holds
    it. The AlertmanagerConfig passes it on as a ``SecretKeySelector`` (the Secret lives in
    ``network.alertmanager_namespace``); the plain ``alertmanager.yml`` reads it as the file
    ``<tuner.alertmanager_secrets_dir>/<name>/<key>`` (the layout of the Alertmanager
    resource's ``spec.secrets`` mounts)."""

    name: DnsLabel
    """Secret name."""
    key: SecretKey
    """Key inside the Secret's ``data``."""

    @model_validator(mode="before")
    @classmethod
    def _not_the_credential(cls, value: object) -> object:
        """A pasted credential is refused without echoing it (errors reach CI logs)."""
        if not isinstance(value, dict):
            raise ValueError(
                "expected a Secret reference {name: <Secret>, key: <key>}, found a "
                f"{type(value).__name__}: never the credential itself, which would be "
                "committed with the policy (docs/alerts.md, Receivers)"
            )
        return value

    def file(self, secrets_dir: str) -> str:
        """The file Alertmanager reads the credential from."""
        return f"{secrets_dir}/{self.name}/{self.key}"

    def selector(self) -> dict[str, str]:
        """prometheus-operator's ``SecretKeySelector``."""
        return {"name": self.name, "key": self.key}


def _check_webhook_url(value: str) -> str:
    """An http(s) URL without a user part: a password in a URL would land in Git."""
    if "@" in value.partition("://")[2].partition("/")[0]:
        raise ValueError(
            "expected a URL without user:password@, found one with a user part (not repeated "
            "here): it would be committed with the policy; put the credential in a Secret and "
            "name it in authorization"
        )
    return check_http_url(value)


def _check_slack_channel(value: str) -> str:
    if re.fullmatch(r"[#@]?[A-Za-z0-9._-]{1,80}", value, re.ASCII) is None:
        raise ValueError(
            "expected a Slack channel (#name), user (@name) or channel ID: ASCII letters, "
            f"digits, '.', '_', '-', at most 80, e.g. #gpupool-alerts, found {value!r}"
        )
    return value


def _check_email(value: str) -> str:
    if re.fullmatch(r"[A-Za-z0-9._%+-]+@" + HOST_PATTERN, value, re.ASCII) is None:
        raise ValueError(
            f"expected an email address (ASCII), e.g. oncall@example.com, found {value!r}"
        )
    return value


def _check_smarthost(value: str) -> str:
    match = re.fullmatch(rf"{HOST_PATTERN}:(?P<port>[0-9]{{1,5}})", value, re.ASCII)
    if match is None or port_problem(match["port"]):
        raise ValueError(
            "expected the SMTP server as HOST:PORT (port 1-65535), e.g. smtp.example.com:587, "
            f"found {value!r}"
        )
    return value


WebhookUrl = Annotated[str, AfterValidator(_check_webhook_url)]
SlackChannel = Annotated[str, AfterValidator(_check_slack_channel)]
EmailAddress = Annotated[str, AfterValidator(_check_email)]
SmartHost = Annotated[str, AfterValidator(_check_smarthost)]


class _Receiver(StrictModel):
    name: DnsLabel
    """Receiver name used in routes."""
    send_resolved: bool = True
    """Also notify when the alert resolves."""


class SlackReceiver(_Receiver):
    """Slack incoming webhook: its URL is the credential, so it comes from a Secret."""

    type: Literal["slack"]
    """Selects this receiver kind (Slack)."""
    api_url: SecretRef
    """Secret key holding the incoming-webhook URL (``https://hooks.slack.com/services/...``)."""
    channel: SlackChannel | None = None
    """Channel or user to post to; unset: the webhook's own channel."""


class PagerDutyReceiver(_Receiver):
    """PagerDuty Events API v2; the alert's ``severity`` becomes the event's severity."""

    type: Literal["pagerduty"]
    """Selects this receiver kind (PagerDuty)."""
    routing_key: SecretRef
    """Secret key holding the integration key of an Events API v2 integration."""
    url: HttpUrlText | None = None
    """Events API endpoint; unset: Alertmanager's default
    (``https://events.pagerduty.com/v2/enqueue``). The EU service region uses
    ``https://events.eu.pagerduty.com/v2/enqueue``."""


class EmailReceiver(_Receiver):
    """Email over SMTP; the password (if the server wants one) comes from a Secret."""

    type: Literal["email"]
    """Selects this receiver kind (email)."""
    to: list[EmailAddress] = Field(min_length=1)
    """Recipients."""
    from_: EmailAddress = Field(alias="from")
    """Sender address."""
    smarthost: SmartHost
    """SMTP server ``HOST:PORT``."""
    auth_username: str | None = Field(None, min_length=1, max_length=256, pattern=r"^[!-~]+$")
    """SMTP user (with ``auth_password``); unset: no authentication."""
    auth_password: SecretRef | None = None
    """Secret key holding the SMTP password (with ``auth_username``)."""
    require_tls: bool = True
    """Refuse a server that does not offer STARTTLS."""

    @model_validator(mode="after")
    def _auth_pair(self) -> EmailReceiver:
        found = Invariants()
        found.require(
            (self.auth_username is None) == (self.auth_password is None),
            "auth_password" if self.auth_password is None else "auth_username",
            "auth_username and auth_password go together (SMTP PLAIN/LOGIN needs both); "
            "expected both or neither",
        )
        found.raise_if_any()
        return self


class OpsgenieReceiver(_Receiver):
    """Opsgenie alerts API; the API key comes from a Secret."""

    type: Literal["opsgenie"]
    """Selects this receiver kind (Opsgenie)."""
    api_key: SecretRef
    """Secret key holding the API key of an Opsgenie API integration."""
    api_url: HttpUrlText | None = None
    """API endpoint; unset: Alertmanager's default (``https://api.opsgenie.com/``). The EU
    instance uses ``https://api.eu.opsgenie.com/``."""


class WebhookReceiver(_Receiver):
    """Alertmanager's webhook (payload version 4) to a URL that is not itself a secret."""

    type: Literal["webhook"]
    """Selects this receiver kind (webhook)."""
    url: WebhookUrl
    """Where Alertmanager POSTs notifications; no credential in it (no ``user:password@``)."""
    authorization: SecretRef | None = None
    """Secret key holding a bearer token sent as ``Authorization: Bearer``; unset: none (the
    tuner's receiver gets ``tuner.webhook_token_secret`` by itself)."""


RECEIVER_TYPES = ("slack", "pagerduty", "email", "opsgenie", "webhook")
"""The ``type`` values of a receiver."""


def _receiver_shape(value: object) -> object:
    """One-line errors for a receiver without a known ``type`` (the old ``webhook_url``
    shape included) before the union reports its own."""
    if not isinstance(value, dict):
        return value
    if "webhook_url" in value and "type" not in value:
        raise ValueError(
            "webhook_url was replaced: write type: webhook and url: <the URL>, or type: "
            "slack/pagerduty/email/opsgenie with the credential as a Secret reference "
            "{name, key} (docs/alerts.md, Receivers)"
        )
    if value.get("type") not in RECEIVER_TYPES:
        raise ValueError(
            f"expected type: one of {', '.join(RECEIVER_TYPES)}, found "
            f"{value.get('type')!r} (docs/alerts.md, Receivers)"
        )
    return value


Receiver = Annotated[
    SlackReceiver | PagerDutyReceiver | EmailReceiver | OpsgenieReceiver | WebhookReceiver,
    Field(discriminator="type"),
    BeforeValidator(_receiver_shape),
]
"""One Alertmanager receiver, by ``type``; every credential is a Secret reference."""
