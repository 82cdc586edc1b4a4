"""Alertmanager routing from ``policy.alerting.routing``, in two forms from one route list.

- ``alertmanager_config``: a complete plain ``alertmanager.yml`` (gpupool's own Alertmanager,
  or one to merge by hand); every credential is a ``*_file`` path under
  ``tuner.alertmanager_secrets_dir`` (``<dir>/<secret>/<key>``, the layout of the
  Alertmanager resource's ``spec.secrets`` mounts). Fields Alertmanager 0.25 accepts.
- ``alertmanager_config_object``: a prometheus-operator ``AlertmanagerConfig`` whose
  credentials are ``SecretKeySelector`` references; the operator adds its route as a child
  of the cluster Alertmanager's root route (forcing ``continue: true``), so the cluster's
  own routes and receivers stay. Its top route matches gpupool's alert names only: under the
  matcher strategy ``None`` it would otherwise take every alert of the cluster.

Tuner triggers (alerts labelled ``gpupool_tuner="true"``) go to the tuner's receiver first and
``continue`` on to the severity routes, so people still hear them. A critical alert inhibits
the warning of the same alertname and namespace only for alert names the generated rules
define at both severities (``paired_alertnames``): an inhibit rule with no such pair would
match nothing and only mislead. Each alert's severity is one policy knob, so today there are
no pairs and no inhibit rules. The tuner refuses unauthenticated webhooks, so its receiver
sends the bearer token of ``tuner.webhook_token_secret``.
"""

from __future__ import annotations

import json
from typing import Any

from alerts.bundle import alert_names, all_groups
from alerts.rules import TUNER_LABEL, Group
from policy.pool import PoolPolicy
from policy.receivers import (
    EmailReceiver,
    OpsgenieReceiver,
    PagerDutyReceiver,
    Receiver,
    SecretRef,
    SlackReceiver,
    WebhookReceiver,
)


def paired_alertnames(groups: list[Group]) -> list[str]:
    """Alert names that some rule defines as ``critical`` and another as ``warning``."""
    severities: dict[str, set[str]] = {}
    for g in groups:
        for rule in g["rules"]:
            if "alert" in rule:
                severities.setdefault(rule["alert"], set()).add(rule["labels"]["severity"])
    return sorted(n for n, s in severities.items() if {"critical", "warning"} <= s)


Match = tuple[str, str, str]
"""One matcher: ``(label, operator, value)``."""

INHIBIT_EQUAL = ["alertname", "namespace"]
"""Labels a critical alert and the warning it inhibits share."""


def _inhibit(groups: list[Group]) -> list[tuple[list[Match], list[Match]]]:
    """``(source, target)`` matchers: critical inhibits warning, for paired names only."""
    names = paired_alertnames(groups)
    if not names:
        return []
    only = ("alertname", "=~", "|".join(names))
    return [([("severity", "=", "critical"), only], [("severity", "=", "warning"), only])]


def _matcher(label: str, op: str, value: str) -> str:
    return f"{label}{op}{json.dumps(value)}"


def inhibit_rules(groups: list[Group]) -> list[dict[str, Any]]:
    """Critical inhibits warning (same alertname and namespace), for paired names only."""
    return [
        {
            "source_matchers": [_matcher(*m) for m in source],
            "target_matchers": [_matcher(*m) for m in target],
            "equal": INHIBIT_EQUAL,
        }
        for source, target in _inhibit(groups)
    ]


PAGERDUTY_SEVERITY = (
    "{{ if .CommonLabels.severity }}{{ .CommonLabels.severity }}{{ else }}error{{ end }}"
)
"""PagerDuty event severity: the group's ``severity`` (gpupool's critical/warning/info are
PagerDuty severities), ``error`` (Alertmanager's default) for a group that mixes them."""


def _routes(policy: PoolPolicy) -> list[tuple[str, Match, bool]]:
    """``(receiver, (label, op, value), continue)`` under the top route, in order."""
    routing = policy.alerting.routing
    routes: list[tuple[str, Match, bool]] = []
    if routing.tuner_receiver is not None:
        routes.append((routing.tuner_receiver, (TUNER_LABEL, "=", "true"), True))
    routes += [
        (receiver, ("severity", "=", severity), False)
        for severity, receiver in sorted(routing.by_severity.items())
    ]
    return routes


def _bearer(policy: PoolPolicy, receiver: WebhookReceiver) -> SecretRef | None:
    """The webhook's bearer token: its own, or the tuner's token for the tuner's receiver."""
    if receiver is policy.alerting.routing.tuner_webhook():
        return SecretRef(name=policy.tuner.webhook_token_secret, key=policy.tuner.webhook_token_key)
    return receiver.authorization


def _plain_receiver(policy: PoolPolicy, r: Receiver) -> dict[str, Any]:
    """One ``receivers`` entry of ``alertmanager.yml``; credentials as files."""
    secrets = policy.tuner.alertmanager_secrets_dir
    base: dict[str, Any] = {"send_resolved": r.send_resolved}
    if isinstance(r, SlackReceiver):
        channel = {} if r.channel is None else {"channel": r.channel}
        return {"slack_configs": [{"api_url_file": r.api_url.file(secrets), **channel, **base}]}
    if isinstance(r, PagerDutyReceiver):
        url = {} if r.url is None else {"url": r.url}
        key = {"routing_key_file": r.routing_key.file(secrets), **url}
        return {"pagerduty_configs": [{**key, "severity": PAGERDUTY_SEVERITY, **base}]}
    if isinstance(r, EmailReceiver):
        mail: dict[str, Any] = {"to": ", ".join(r.to), "from": r.from_, "smarthost": r.smarthost}
        if r.auth_username is not None and r.auth_password is not None:
            mail["auth_username"] = r.auth_username
            mail["auth_password_file"] = r.auth_password.file(secrets)
        return {"email_configs": [{**mail, "require_tls": r.require_tls, **base}]}
    if isinstance(r, OpsgenieReceiver):
        api = {} if r.api_url is None else {"api_url": r.api_url}
        return {"opsgenie_configs": [{"api_key_file": r.api_key.file(secrets), **api, **base}]}
    hook: dict[str, Any] = {"url": r.url, **base}
    token = _bearer(policy, r)
    if token is not None:
        hook["http_config"] = {
            "authorization": {"type": "Bearer", "credentials_file": token.file(secrets)}
        }
    return {"webhook_configs": [hook]}


def alertmanager_config(policy: PoolPolicy) -> dict[str, Any]:
    """The complete ``alertmanager.yml`` as a dict."""
    routing = policy.alerting.routing
    routes: list[dict[str, Any]] = []
    for receiver, match, cont in _routes(policy):
        route: dict[str, Any] = {"receiver": receiver, "matchers": [_matcher(*match)]}
        routes.append({**route, "continue": True} if cont else route)
    return {
        "route": {
            "receiver": routing.default_receiver,
            "group_by": list(routing.group_by),
            "group_wait": routing.group_wait,
            "group_interval": routing.group_interval,
            "repeat_interval": routing.repeat_interval,
            "routes": routes,
        },
        "inhibit_rules": inhibit_rules(all_groups(policy)),
        "receivers": [{"name": r.name, **_plain_receiver(policy, r)} for r in routing.receivers],
    }


def _object_receiver(policy: PoolPolicy, r: Receiver) -> dict[str, Any]:
    """One ``spec.receivers`` entry of the AlertmanagerConfig; credentials as references."""
    base: dict[str, Any] = {"sendResolved": r.send_resolved}
    if isinstance(r, SlackReceiver):
        channel = {} if r.channel is None else {"channel": r.channel}
        return {"slackConfigs": [{"apiURL": r.api_url.selector(), **channel, **base}]}
    if isinstance(r, PagerDutyReceiver):
        url = {} if r.url is None else {"url": r.url}
        key = {"routingKey": r.routing_key.selector(), **url}
        return {"pagerdutyConfigs": [{**key, "severity": PAGERDUTY_SEVERITY, **base}]}
    if isinstance(r, EmailReceiver):
        mail: dict[str, Any] = {"to": ", ".join(r.to), "from": r.from_, "smarthost": r.smarthost}
        if r.auth_username is not None and r.auth_password is not None:
            mail["authUsername"] = r.auth_username
            mail["authPassword"] = r.auth_password.selector()
        return {"emailConfigs": [{**mail, "requireTLS": r.require_tls, **base}]}
    if isinstance(r, OpsgenieReceiver):
        api = {} if r.api_url is None else {"apiURL": r.api_url}
        return {"opsgenieConfigs": [{"apiKey": r.api_key.selector(), **api, **base}]}
    hook: dict[str, Any] = {"url": r.url, **base}
    token = _bearer(policy, r)
    if token is not None:
        hook["httpConfig"] = {"authorization": {"type": "Bearer", "credentials": token.selector()}}
    return {"webhookConfigs": [hook]}


def _object_matcher(name: str, op: str, value: str) -> dict[str, str]:
    return {"name": name, "matchType": op, "value": value}


def alertmanager_config_object(policy: PoolPolicy) -> dict[str, Any]:
    """The ``AlertmanagerConfig`` (monitoring.coreos.com/v1alpha1) ``spec``."""
    routing = policy.alerting.routing
    names = "|".join(alert_names(policy))
    routes: list[dict[str, Any]] = []
    for receiver, match, cont in _routes(policy):
        route: dict[str, Any] = {"receiver": receiver, "matchers": [_object_matcher(*match)]}
        routes.append({**route, "continue": True} if cont else route)
    inhibit = [
        {
            "sourceMatch": [_object_matcher(*m) for m in source],
            "targetMatch": [_object_matcher(*m) for m in target],
            "equal": INHIBIT_EQUAL,
        }
        for source, target in _inhibit(all_groups(policy))
    ]
    return {
        "route": {
            "receiver": routing.default_receiver,
            "matchers": [_object_matcher("alertname", "=~", names)],
            "groupBy": list(routing.group_by),
            "groupWait": routing.group_wait,
            "groupInterval": routing.group_interval,
            "repeatInterval": routing.repeat_interval,
            "routes": routes,
        },
        "inhibitRules": inhibit,
        "receivers": [{"name": r.name, **_object_receiver(policy, r)} for r in routing.receivers],
    }
