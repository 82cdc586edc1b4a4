"""Run a built container's command here, as the pod would: its command with its plain env."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from typing import Any


def container_env(container: Mapping[str, Any]) -> dict[str, Any]:
    """Name -> ``value`` (plain) or ``valueFrom`` (Secret references) of a container's env."""
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def run_container(
    container: Mapping[str, Any], **overrides: str
) -> subprocess.CompletedProcess[str]:
    """The container's command with its plain env values and ``overrides`` (paths mapped
    into a temporary directory, values of Secrets); never raises on a failing command."""
    plain = {k: v for k, v in container_env(container).items() if isinstance(v, str)}
    return subprocess.run(
        container["command"],
        capture_output=True,
        text=True,
        env={**os.environ, **plain, **overrides},
        check=False,
        timeout=120,
    )
