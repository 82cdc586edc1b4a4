"""Placeholders ``gpupool init`` writes for values only the owner knows: the warning that
names each one until it is replaced.

A placeholder lives on a ``.invalid`` host (RFC 6761 reserves the top-level domain: it never
resolves), so it validates, renders and replays like the real value, yet nothing it points at
can be reached; ``gpupool validate`` says where each one is.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from policy.receivers import WebhookReceiver

if TYPE_CHECKING:
    from policy.pool import PoolPolicy

PLACEHOLDER_TLD = ".invalid"
"""The reserved top-level domain of every placeholder."""

_HOST = re.compile(r"^(?:[a-z][a-z0-9+.-]*://)?(?:[^@/\s]*@)?(?P<host>[^/:\s]+)", re.IGNORECASE)


def is_placeholder(value: str) -> bool:
    """Whether the URL, git remote or image reference ``value`` names a ``.invalid`` host."""
    match = _HOST.match(value)
    return match is not None and match["host"].lower().endswith(PLACEHOLDER_TLD)


def placeholder_warnings(policy: PoolPolicy) -> list[tuple[str, str]]:
    """``(field path, message)`` for every owner-only value still on a placeholder host."""
    fields = [
        ("cluster.runtime_image", policy.cluster.runtime_image, "the image you built and pushed"),
        ("tuner.policy_repo_url", policy.tuner.policy_repo_url, "your policy repository's URL"),
    ]
    fields += [
        (f"alerting.routing.receivers.{i}.url", r.url, "your receiver")
        for i, r in enumerate(policy.alerting.routing.receivers)
        if isinstance(r, WebhookReceiver)
    ]
    return [
        (
            path,
            f"{value} is a placeholder ({PLACEHOLDER_TLD} never resolves): replace it with "
            f"{what} before you apply the bundle",
        )
        for path, value, what in fields
        if is_placeholder(value)
    ]
