"""Deterministic YAML text for every generated file: block style, no aliases, no folding.

libyaml's emitter (PyYAML's ``CSafeDumper``) writes the same bytes as ruamel.yaml's pure
Python one for these documents, about 14x faster (bench/render.py); ruamel.yaml stays the
tool for reading and editing the reviewed policy, where comments must survive.
"""

from __future__ import annotations

from typing import Any

import yaml

_BaseDumper: type[yaml.SafeDumper] = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


class _Dumper(_BaseDumper):  # type: ignore[misc,valid-type]
    """Never emits anchors: a shared sub-dict (a label selector) must read the same twice."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _represent_str(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    """Multi-line strings (embedded configs, dashboards) as ``|`` blocks: diffs show lines."""
    return dumper.represent_scalar(
        "tag:yaml.org,2002:str", data, style="|" if "\n" in data else None
    )


_Dumper.add_representer(str, _represent_str)
_Dumper.add_representer(tuple, yaml.SafeDumper.represent_list)


def to_yaml(data: Any, *, sort_keys: bool) -> str:
    """Block-style YAML; byte-identical for equal data. ``sort_keys=False`` keeps the
    insertion order (rule files read alert, expr, for, labels, annotations in that order)."""
    return yaml.dump(
        data,
        Dumper=_Dumper,
        sort_keys=sort_keys,
        default_flow_style=False,
        width=4096,  # never fold long strings (args, descriptions): folds hurt diffs
        allow_unicode=True,
    )
