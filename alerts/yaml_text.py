"""Deterministic YAML text for generated files: insertion order, block style, no folding."""

from __future__ import annotations

from io import StringIO
from typing import Any

from ruamel.yaml import YAML


def to_yaml(data: Any) -> str:
    yaml = YAML(typ="rt")
    yaml.default_flow_style = False
    yaml.width = 1_000_000
    buffer = StringIO()
    yaml.dump(data, buffer)
    return buffer.getvalue()
