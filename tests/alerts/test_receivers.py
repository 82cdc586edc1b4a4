"""Receivers by type: the AlertmanagerConfig against its CRD, the plain alertmanager.yml through
``amtool check-config``, credentials only by reference, and one-line errors for bad receivers."""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from alerts.bundle import alert_names
from alerts.manifests import monitoring_objects
from alerts.render import bundle_files
from alerts.routing import alertmanager_config
from infra.builders.compaction_sidecar import POLICY_CONFIGMAP
from infra.builders.stack_options import StackOptions
from infra.bundle import build_bundle
from infra.render import fragment_documents, render_documents
from infra.yaml_text import to_yaml
from policy import DEFAULT_POLICY, PoolPolicy, parse_policy
from runtime.cli.app import app
from tests.harness.servers import require_binary
from tests.infra.policies import edited, explicit_args
from tests.infra.test_serving_schemas import crd_validator, schema_errors

SECRET_VALUES = {
    ("am-slack", "url"): "https://hooks.slack.com/services/T0SECRET/B0SECRET/xoxSlackSecret1",
    ("am-pagerduty", "routing-key"): "pdRoutingKeySecret0123456789abcd",
    ("am-mail", "password"): "smtpPasswordSecret-42",
    ("am-opsgenie", "api-key"): "opsgenieKeySecret-7f3a",
    ("am-relay", "token"): "relayBearerSecret-e1",
    ("gpupool-tuner-webhook", "token"): "tunerTokenSecret-9b",
}
"""What a cluster's Secrets hold: the files a test Alertmanager reads, and what must never be
rendered."""

RECEIVERS: list[dict[str, Any]] = [
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
    },
    {
        "name": "mail",
        "type": "email",
        "to": ["oncall@example.com", "platform@example.com"],
        "from": "gpupool@example.com",
        "smarthost": "smtp.example.com:587",
        "auth_username": "gpupool",
        "auth_password": {"name": "am-mail", "key": "password"},
    },
    {"name": "genie", "type": "opsgenie", "api_key": {"name": "am-opsgenie", "key": "api-key"}},
    {
        "name": "relay",
        "type": "webhook",
        "url": "http://alert-relay.monitoring.svc:8080/gpupool",
        "authorization": {"name": "am-relay", "key": "token"},
    },
    {
        "name": "tuner",
        "type": "webhook",
        "url": "http://gpupool-tuner.gpupool-system.svc:9095/alerts",
    },
]
"""One receiver of each type, plus the tuner's."""


def every_type_document() -> Any:
    """The shipped policy with ``RECEIVERS``, routed so that each one receives something."""
    return edited(
        {
            "alerting.routing": {
                "receivers": copy.deepcopy(RECEIVERS),
                "by_severity": {"critical": "pager", "warning": "chat", "info": "mail"},
                "default_receiver": "relay",
                "tuner_receiver": "tuner",
            },
        }
    )


@pytest.fixture(scope="module")
def every_type() -> PoolPolicy:
    return parse_policy(every_type_document())


def _object(policy: PoolPolicy) -> dict[str, Any]:
    (config,) = [o for o in monitoring_objects(policy) if o["kind"] == "AlertmanagerConfig"]
    return config


def test_the_alertmanager_config_is_valid_for_its_crd(every_type: PoolPolicy) -> None:
    config = _object(every_type)
    assert schema_errors(config) == []
    # Child routes are preserved unknown fields in the CRD: check them against the route schema.
    crd = crd_validator(config["apiVersion"], config["kind"])
    route_schema = crd.schema["properties"]["spec"]["properties"]["route"]
    for child in config["spec"]["route"]["routes"]:
        assert list(type(crd)(route_schema).iter_errors(child)) == []
    assert config["metadata"]["namespace"] == every_type.network.alertmanager_home


def test_credentials_are_secret_references_in_the_alertmanager_namespace(
    every_type: PoolPolicy,
) -> None:
    spec = _object(every_type)["spec"]
    by_name = {r["name"]: r for r in spec["receivers"]}
    assert by_name["chat"]["slackConfigs"][0]["apiURL"] == {"name": "am-slack", "key": "url"}
    assert by_name["pager"]["pagerdutyConfigs"][0]["routingKey"] == {
        "name": "am-pagerduty",
        "key": "routing-key",
    }
    assert by_name["mail"]["emailConfigs"][0]["authPassword"] == {
        "name": "am-mail",
        "key": "password",
    }
    assert by_name["genie"]["opsgenieConfigs"][0]["apiKey"] == {
        "name": "am-opsgenie",
        "key": "api-key",
    }
    relay, tuner = by_name["relay"]["webhookConfigs"][0], by_name["tuner"]["webhookConfigs"][0]
    assert relay["httpConfig"]["authorization"]["credentials"] == {
        "name": "am-relay",
        "key": "token",
    }
    assert tuner["httpConfig"]["authorization"]["credentials"] == {
        "name": every_type.tuner.webhook_token_secret,
        "key": every_type.tuner.webhook_token_key,
    }


def test_the_top_route_takes_gpupools_alerts_only(every_type: PoolPolicy) -> None:
    """The operator forces ``continue: true`` on it and, under the matcher strategy ``None``,
    adds no namespace matcher: without its own matcher it would page for every alert."""
    route = _object(every_type)["spec"]["route"]
    (matcher,) = route["matchers"]
    assert matcher["name"] == "alertname" and matcher["matchType"] == "=~"
    assert set(matcher["value"].split("|")) == set(alert_names(every_type))


@pytest.mark.process
def test_the_plain_config_passes_amtool_with_credentials_from_files(
    every_type: PoolPolicy, tmp_path: Path
) -> None:
    config = tmp_path / "alertmanager.yml"
    config.write_text(to_yaml(alertmanager_config(every_type), sort_keys=False))
    result = subprocess.run(
        [require_binary("amtool"), "check-config", str(config)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "6 receivers" in result.stdout
    files = {
        value
        for receiver in alertmanager_config(every_type)["receivers"]
        for configs in receiver.values()
        if isinstance(configs, list)
        for c in configs
        for key, value in [*c.items(), *c.get("http_config", {}).get("authorization", {}).items()]
        if key.endswith("_file")
    }
    secrets = every_type.tuner.alertmanager_secrets_dir
    assert files == {f"{secrets}/{name}/{key}" for name, key in SECRET_VALUES}


def test_no_secret_value_is_rendered_anywhere(every_type: PoolPolicy) -> None:
    """Every file of ``gpupool render`` (the policy ConfigMap included) and of ``gpupool
    alerts render``: only references, never what the Secrets hold."""
    objects = build_bundle(
        every_type, stack=StackOptions("labels"), vllm_args=explicit_args(every_type)
    )
    tree = render_documents(objects) | fragment_documents(every_type)
    assert any(POLICY_CONFIGMAP in text for text in tree.values())
    assert any("kind: AlertmanagerConfig" in text for text in tree.values())
    rendered = {**tree, **{f"alerts/{k}": v for k, v in bundle_files(every_type).items()}}
    leaks = [
        (path, ref)
        for path, text in rendered.items()
        for ref, v in SECRET_VALUES.items()
        if v in text
    ]
    assert leaks == []
    # ... while the names of the Secrets are there, so the grep looked at the right files.
    assert all(any(name in text for text in rendered.values()) for name, _ in SECRET_VALUES)


def _receiver_error(tmp_path: Path, receiver: dict[str, Any], **routing: Any) -> list[str]:
    """``gpupool validate`` of the shipped policy whose first receiver is ``receiver``: what
    it prints."""
    doc = every_type_document()
    doc["alerting"]["routing"]["receivers"][0] = receiver
    doc["alerting"]["routing"].update(routing)
    path = tmp_path / "pool.yaml"
    path.write_text(to_yaml(doc, sort_keys=False))
    (tmp_path / "models").symlink_to(DEFAULT_POLICY.parent / "models")
    result = CliRunner().invoke(app, ["validate", str(path)])
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    return result.output.splitlines()


@pytest.mark.parametrize(
    ("receiver", "routing", "where", "says"),
    [
        (
            {"name": "chat", "webhook_url": "https://hooks.slack.com/services/T0/B0/x"},
            {},
            "alerting.routing.receivers.0",
            "webhook_url was replaced: write type: webhook and url",
        ),
        ({"name": "chat", "type": "teams"}, {}, "alerting.routing.receivers.0", "found 'teams'"),
        (
            {"name": "chat", "type": "slack", "api_url": "https://hooks.slack.com/services/x"},
            {},
            "alerting.routing.receivers.0.slack.api_url",
            "found a str: never the credential itself",
        ),
        (
            {"name": "chat", "type": "slack"},
            {},
            "alerting.routing.receivers.0.slack.api_url",
            "required field is missing",
        ),
        (
            {"name": "chat", "type": "webhook", "url": "https://user:pw@relay.example.com/x"},
            {},
            "alerting.routing.receivers.0.webhook.url",
            "without user:password@",
        ),
        (
            {**RECEIVERS[2], "name": "chat", "auth_password": None},
            {},
            "alerting.routing.receivers.0.email.auth_password",
            "auth_username and auth_password go together",
        ),
        (
            {**RECEIVERS[2], "name": "chat", "smarthost": "smtp.example.com"},
            {},
            "alerting.routing.receivers.0.email.smarthost",
            "HOST:PORT",
        ),
        (
            {"name": "chat", "type": "slack", "api_url": {"name": "Bad_Name", "key": "url"}},
            {},
            "alerting.routing.receivers.0.slack.api_url.name",
            "'Bad_Name'",
        ),
        (
            RECEIVERS[0],
            {"tuner_receiver": "chat"},
            "alerting.routing.tuner_receiver",
            "must be type: webhook without authorization",
        ),
    ],
    ids=[
        "old-webhook-url",
        "unknown-type",
        "credential-inline",
        "credential-missing",
        "password-in-url",
        "email-user-without-password",
        "smarthost-without-port",
        "secret-name",
        "tuner-not-a-webhook",
    ],
)
def test_bad_receivers_get_one_line_errors(
    tmp_path: Path, receiver: dict[str, Any], routing: dict[str, Any], where: str, says: str
) -> None:
    (line,) = _receiver_error(tmp_path, receiver, **routing)
    assert f" {where}: " in line, line
    assert says in line, line
    assert "pw@" not in line and "hooks.slack.com/services/x" not in line  # never echoed
