"""Kubernetes ``resource.Quantity`` values as exact numbers: one parser for the policy's sizes
and the what-if engine's HPA targets."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Final


def parse_quantity(value: object, field_name: str = "quantity") -> Decimal:
    """A Kubernetes ``resource.Quantity``: ``"2"``, ``"500m"``, ``"1.5k"``, ``"1Gi"``, ``"1e3"``."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f"{field_name}: expected a quantity, got {value!r}")
    match = _QUANTITY.fullmatch(str(value).strip())
    if match is None:
        raise ValueError(f"{field_name}: not a Kubernetes quantity: {value!r}")
    number, suffix = match.group(1), match.group(2) or ""
    try:
        amount = Decimal(number)
    except InvalidOperation as err:  # pragma: no cover - the pattern admits only decimals
        raise ValueError(f"{field_name}: not a Kubernetes quantity: {value!r}") from err
    if suffix[:1] in ("e", "E") and len(suffix) > 1:
        return amount.scaleb(int(suffix[1:]))
    return amount * _SUFFIXES[suffix]


_QUANTITY = re.compile(
    r"([+-]?(?:\d+(?:\.\d*)?|\.\d+))(Ki|Mi|Gi|Ti|Pi|Ei|[eE][+-]?\d+|[numkMGTPE])?"
)
_SUFFIXES: Final[dict[str, Decimal]] = {
    "": Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
    **{s: Decimal(1024**i) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"), start=1)},
}
