"""Shared building blocks of the policy models: strict config, typed units, invariants."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

_DURATION = re.compile(
    r"^(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?(?:(\d+)ms)?$"
)
_DURATION_UNITS_S = (365 * 86400, 7 * 86400, 86400, 3600, 60, 1, 0.001)
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|Ki|Mi|Gi|Ti|Pi|M|G|T|P)?$")


class StrictModel(BaseModel):
    """Frozen, closed models: a typo in pool.yaml is an error, never silently ignored."""

    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        use_attribute_docstrings=True,
        populate_by_name=True,
        validate_default=True,
    )


def duration_seconds(value: str) -> float:
    """Seconds in a Prometheus duration such as ``5m`` or ``1h30m``."""
    match = _DURATION.match(value)
    if match is None or not value:
        raise ValueError(
            f"expected a Prometheus duration such as 30s, 5m or 1h30m, found {value!r}"
        )
    return sum(
        int(n) * unit for n, unit in zip(match.groups(), _DURATION_UNITS_S, strict=True) if n
    )


def _check_duration(value: str) -> str:
    if duration_seconds(value) <= 0:
        raise ValueError(f"expected a positive duration, found {value!r}")
    return value


def _check_dns_label(value: str) -> str:
    if len(value) > 63 or not _DNS_LABEL.match(value):
        raise ValueError(
            f"expected a Kubernetes name (lower-case letters, digits and '-', at most 63 "
            f"characters, starting and ending alphanumeric), found {value!r}"
        )
    return value


def _check_quantity(value: str) -> str:
    if not _QUANTITY.match(value):
        raise ValueError(f"expected a Kubernetes quantity such as 500m, 16Gi or 2, found {value!r}")
    return value


Duration = Annotated[str, AfterValidator(_check_duration)]
"""A Prometheus duration (``30s``, ``5m``, ``1h30m``): alert ``for:`` and query windows."""

DnsLabel = Annotated[str, AfterValidator(_check_dns_label)]
"""A Kubernetes object name (RFC 1123 label)."""

Quantity = Annotated[str, AfterValidator(_check_quantity)]
"""A Kubernetes resource quantity (``16Gi``, ``500m``)."""

Fraction = Annotated[float, Field(ge=0.0, le=1.0)]
"""A share in [0, 1]; gpupool writes utilization and ratios as fractions, never percent."""


class InvariantViolation(ValueError):
    """One or more broken cross-field rules; each names the field paths it involves.

    Raised from ``model_validator(mode="after")``; pydantic keeps the exception in the
    error's ``ctx`` so the loader can point every violation at its line in pool.yaml.
    """

    def __init__(self, violations: list[tuple[str, str]]) -> None:
        self.violations = violations
        super().__init__("; ".join(f"{path}: {message}" for path, message in violations))


class Invariants:
    """Collects violations so one validation reports every broken rule, not just the first."""

    def __init__(self) -> None:
        self._found: list[tuple[str, str]] = []

    def require(self, ok: bool, path: str, message: str) -> None:
        if not ok:
            self._found.append((path, message))

    def raise_if_any(self) -> None:
        if self._found:
            raise InvariantViolation(self._found)
