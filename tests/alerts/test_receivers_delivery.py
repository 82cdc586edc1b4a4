"""A real Alertmanager, configured by the rendered ``alertmanager.yml``, delivers firing alerts
to local servers standing in for Slack, PagerDuty, Opsgenie, an SMTP server and the tuner's
webhook, each credential read from the file of its Secret (``<secrets dir>/<name>/<key>``)."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator

import pytest

from alerts.routing import alertmanager_config
from infra.yaml_text import to_yaml
from tests.alerts.conftest import fast_policy
from tests.alerts.smtp import Mail, Smtp, start_smtp
from tests.alerts.webhook import Delivery, Webhook, start_webhook
from tests.harness.servers import start_alertmanager

pytestmark = pytest.mark.slow

DELIVERY_TIMEOUT_S = 60.0
"""Bounded wait for one notification: group_wait is 1 s, so a delivery takes seconds."""

PAGERDUTY_KEY = "pdRoutingKeySecret0123456789abcd"
OPSGENIE_KEY = "opsgenieKeySecret-7f3a"
SMTP_PASSWORD = "smtpPasswordSecret-42"
TUNER_TOKEN = "tunerTokenSecret-9b"
SLACK_PATH = "/slack/services/T0SECRET/B0SECRET/xoxSlackSecret1"
"""The secret part of a Slack incoming-webhook URL (its path), served locally here."""


def _routing(services: Webhook, smtp: Smtp) -> dict[str, object]:
    return {
        "receivers": [
            {
                "name": "chat",
                "type": "slack",
                "api_url": {"name": "am-slack", "key": "url"},
                "channel": "#gpupool-alerts",
            },
            {
                "name": "pager",
                "type": "pagerduty",
                "routing_key": {"name": "am-pagerduty", "key": "routing-key"},
                "url": f"{services.url}/pagerduty/v2/enqueue",
            },
            {
                "name": "mail",
                "type": "email",
                "to": ["oncall@example.com"],
                "from": "gpupool@example.com",
                "smarthost": smtp.address,
                "auth_username": "gpupool",
                "auth_password": {"name": "am-mail", "key": "password"},
                "require_tls": False,
            },
            {
                "name": "genie",
                "type": "opsgenie",
                "api_key": {"name": "am-opsgenie", "key": "api-key"},
                "api_url": f"{services.url}/opsgenie/",
            },
            {"name": "tuner", "type": "webhook", "url": f"{services.url}/tuner"},
        ],
        "by_severity": {"critical": "pager", "warning": "chat", "info": "mail"},
        "default_receiver": "genie",
        "tuner_receiver": "tuner",
    }


@pytest.fixture(scope="module")
def services() -> Iterator[Webhook]:
    hook = start_webhook()
    yield hook
    hook.stop()


@pytest.fixture(scope="module")
def smtp() -> Iterator[Smtp]:
    server = start_smtp()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def delivered(
    services: Webhook, smtp: Smtp, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """Alertmanager started on the rendered config, the Secrets' files written, five alerts
    posted (one per route); yields the rendered config's text."""
    work = tmp_path_factory.mktemp("receivers")
    secrets = work / "secrets"
    policy = fast_policy(
        services.url,
        tuner={"alertmanager_secrets_dir": str(secrets)},
        routing=_routing(services, smtp),
    )
    files = {
        ("am-slack", "url"): f"{services.url}{SLACK_PATH}",
        ("am-pagerduty", "routing-key"): PAGERDUTY_KEY,
        ("am-mail", "password"): SMTP_PASSWORD,
        ("am-opsgenie", "api-key"): OPSGENIE_KEY,
        (policy.tuner.webhook_token_secret, policy.tuner.webhook_token_key): TUNER_TOKEN,
    }
    for (name, key), value in files.items():
        (secrets / name).mkdir(parents=True, exist_ok=True)
        # No trailing newline, as `kubectl create secret --from-literal` writes it:
        # Alertmanager 0.25 reads auth_password_file and api_key_file verbatim.
        (secrets / name / key).write_text(value)
    config = to_yaml(alertmanager_config(policy), sort_keys=False)
    alertmanager = start_alertmanager(config, work / "am")
    try:
        alerts = [
            {"alertname": "ProdCapacityAtRisk", "severity": "critical"},
            {"alertname": "GPUMemoryPressure", "severity": "warning"},
            {"alertname": "FlexNotGrowing", "severity": "info"},
            {"alertname": "FlexEvictionRateHigh", "severity": "warning", "gpupool_tuner": "true"},
            {"alertname": "UnroutedByseverity"},
        ]
        body = json.dumps(
            [{"labels": labels, "annotations": {"summary": "s"}} for labels in alerts]
        )
        request = urllib.request.Request(
            f"{alertmanager.url}/api/v2/alerts",
            data=body.encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert answer.status == 200
        yield config
    finally:
        alertmanager.stop()


def _first(services: Webhook, prefix: str) -> Delivery:
    deadline = time.monotonic() + DELIVERY_TIMEOUT_S
    while time.monotonic() < deadline:
        for d in services.snapshot():
            if d.path.startswith(prefix):
                return d
        time.sleep(0.25)
    pytest.fail(f"nothing delivered to {prefix} within {DELIVERY_TIMEOUT_S:.0f} s")


def _mail(smtp: Smtp) -> Mail:
    deadline = time.monotonic() + DELIVERY_TIMEOUT_S
    while time.monotonic() < deadline:
        if mails := smtp.snapshot():
            return mails[0]
        time.sleep(0.25)
    pytest.fail(f"no mail within {DELIVERY_TIMEOUT_S:.0f} s")


def test_the_rendered_config_holds_paths_not_credentials(delivered: str) -> None:
    for secret in (PAGERDUTY_KEY, OPSGENIE_KEY, SMTP_PASSWORD, TUNER_TOKEN, SLACK_PATH):
        assert secret not in delivered
    assert "api_url_file:" in delivered and "routing_key_file:" in delivered


def test_slack_posts_to_the_url_from_its_file(delivered: str, services: Webhook) -> None:
    d = _first(services, "/slack/")
    assert d.path == SLACK_PATH
    assert d.payload["channel"] == "#gpupool-alerts"
    (attachment,) = d.payload["attachments"]
    name = attachment["title"].split()[1]  # "[FIRING:1] <alertname> (<labels>)"
    assert name in {"GPUMemoryPressure", "FlexEvictionRateHigh"}  # the warnings


def test_pagerduty_sends_the_routing_key_from_its_file(delivered: str, services: Webhook) -> None:
    d = _first(services, "/pagerduty/")
    assert d.payload["routing_key"] == PAGERDUTY_KEY
    assert d.payload["event_action"] == "trigger"
    assert d.payload["payload"]["severity"] == "critical"  # the alert's, not PagerDuty's "error"


def test_opsgenie_sends_the_api_key_from_its_file(delivered: str, services: Webhook) -> None:
    d = _first(services, "/opsgenie/")
    assert d.path == "/opsgenie/v2/alerts"
    assert d.authorization == f"GenieKey {OPSGENIE_KEY}"
    assert "UnroutedByseverity" in d.payload["message"]


def test_the_tuner_webhook_sends_the_token_from_its_file(delivered: str, services: Webhook) -> None:
    d = _first(services, "/tuner")
    assert d.authorization == f"Bearer {TUNER_TOKEN}"
    assert d.payload["groupLabels"]["alertname"] == "FlexEvictionRateHigh"


def test_email_authenticates_with_the_password_from_its_file(delivered: str, smtp: Smtp) -> None:
    mail = _mail(smtp)
    assert (mail.username, mail.password) == ("gpupool", SMTP_PASSWORD)
    assert mail.recipients == ["oncall@example.com"]
    assert mail.sender == "gpupool@example.com"
    assert "FlexNotGrowing" in mail.data
