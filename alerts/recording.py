"""The catalogue as recording rules: alerts, the HPA and the dashboard read these series."""

from __future__ import annotations

from alerts.rules import Group, group
from policy.pool import PoolPolicy
from runtime.metrics.catalogue import Catalogue


def groups(policy: PoolPolicy, catalogue: Catalogue) -> list[Group]:
    return [group("gpupool.catalogue", policy, [q.recording_rule() for q in catalogue])]
