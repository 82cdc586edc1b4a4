"""Alertmanager configuration from ``policy.alerting.routing``.

Tuner triggers (alerts labelled ``gpupool_tuner="true"``) go to the tuner's receiver first and
``continue`` on to the severity routes, so people still hear them. A critical alert inhibits
the warning of the same alertname and namespace only for alert names the generated rules
define at both severities (``paired_alertnames``): an inhibit rule with no such pair would
match nothing and only mislead. Each alert's severity is one policy knob, so today there are
no pairs and no inhibit rules. The tuner refuses unauthenticated webhooks, so its
receiver sends the bearer token from ``policy.tuner.webhook_credentials_file`` (the Secret
``tuner.webhook_token_secret``, which the Alertmanager resource must list in ``spec.secrets``).
"""

from __future__ import annotations

from typing import Any

from alerts.bundle import all_groups
from alerts.rules import TUNER_LABEL, Group
from policy.alerting import Receiver
from policy.pool import PoolPolicy


def paired_alertnames(groups: list[Group]) -> list[str]:
    """Alert names that some rule defines as ``critical`` and another as ``warning``."""
    severities: dict[str, set[str]] = {}
    for g in groups:
        for rule in g["rules"]:
            if "alert" in rule:
                severities.setdefault(rule["alert"], set()).add(rule["labels"]["severity"])
    return sorted(n for n, s in severities.items() if {"critical", "warning"} <= s)


def inhibit_rules(groups: list[Group]) -> list[dict[str, Any]]:
    """Critical inhibits warning (same alertname and namespace), for paired names only."""
    names = paired_alertnames(groups)
    if not names:
        return []
    only = f'alertname=~"{"|".join(names)}"'
    return [
        {
            "source_matchers": ['severity="critical"', only],
            "target_matchers": ['severity="warning"', only],
            "equal": ["alertname", "namespace"],
        }
    ]


def alertmanager_config(policy: PoolPolicy) -> dict[str, Any]:
    """The complete ``alertmanager.yml`` as a dict."""
    routing = policy.alerting.routing
    routes: list[dict[str, Any]] = []
    if routing.tuner_receiver is not None:
        routes.append(
            {
                "receiver": routing.tuner_receiver,
                "matchers": [f'{TUNER_LABEL}="true"'],
                "continue": True,
            }
        )
    routes += [
        {"receiver": receiver, "matchers": [f'severity="{severity}"']}
        for severity, receiver in sorted(routing.by_severity.items())
    ]
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
        "receivers": [
            {"name": r.name, "webhook_configs": [_webhook(policy, r)]} for r in routing.receivers
        ],
    }


def _webhook(policy: PoolPolicy, receiver: Receiver) -> dict[str, Any]:
    hook: dict[str, Any] = {"url": str(receiver.webhook_url), "send_resolved": True}
    if receiver.name == policy.alerting.routing.tuner_receiver:
        hook["http_config"] = {
            "authorization": {
                "type": "Bearer",
                "credentials_file": policy.tuner.webhook_credentials_file,
            }
        }
    return hook
