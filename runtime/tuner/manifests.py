"""The rendered-manifest diff of a proposal, for the PR body (``gpupool diff``)."""

from __future__ import annotations

from policy import PoolPolicy


def manifest_diff(before: PoolPolicy, after: PoolPolicy) -> str | None:
    """Unified diff of the manifests the two policies render; None while no renderer exists."""
    del before, after
    return None
