"""gpupool's typed policy: the single source of truth every manifest and rule is derived from."""

from policy.loader import (
    DEFAULT_POLICY,
    PolicyError,
    Problem,
    load_policy,
    parse_policy,
    policy_warnings,
)
from policy.pool import PoolPolicy

__all__ = [
    "DEFAULT_POLICY",
    "PolicyError",
    "PoolPolicy",
    "Problem",
    "load_policy",
    "parse_policy",
    "policy_warnings",
]
