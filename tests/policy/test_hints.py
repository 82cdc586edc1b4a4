"""Errors that teach: the nearest field for a typo, fractions that say so, quantities as
Kubernetes reads them."""

from __future__ import annotations

from typing import Any

import pytest

from policy import PolicyError, load_policy, parse_policy


def _problems(**edits: Any) -> list[str]:
    document = load_policy().model_dump(mode="json", by_alias=True)
    for dotted, value in edits.items():
        *path, last = dotted.split("__")
        node = document
        for part in path:
            node = node[int(part)] if part.isdigit() else node[part]
        node[last] = value
    with pytest.raises(PolicyError) as caught:
        parse_policy(document)
    return [f"{p.path}: {p.message}" for p in caught.value.problems]


@pytest.mark.parametrize(
    ("edit", "line"),
    [
        (
            {"node_pools__0__gpus_per_nodes": 8},
            "node_pools.0.gpus_per_nodes: unknown field; did you mean 'gpus_per_node'?",
        ),
        (
            {"elastic__shed_while_production_abve": 0.7},
            "elastic.shed_while_production_abve: unknown field; did you mean "
            "'shed_while_production_above'?",
        ),
        (
            {"workloads__0__snapshot_volume__acess_mode": "ReadWriteMany"},
            "workloads.0.snapshot_volume.acess_mode: unknown field; did you mean 'access_mode'?",
        ),
        (
            {"alerting__thresholds__flex_eviction_rate__fr": "5m"},
            "alerting.thresholds.flex_eviction_rate.fr: unknown field; did you mean 'for'?",
        ),
        ({"zzz": 1}, "zzz: unknown field (check the spelling; `gpupool schema` lists every field)"),
    ],
)
def test_an_unknown_key_names_the_nearest_field(edit: dict[str, Any], line: str) -> None:
    (found,) = _problems(**edit)
    assert found.startswith(line), found


def test_a_percentage_for_a_fraction_says_it_is_a_fraction() -> None:
    (found,) = _problems(node_pools__0__reserve_ratio=15)
    assert found == (
        "node_pools.0.reserve_ratio: Input should be less than or equal to 1: a fraction, so "
        "15 % is 0.15, found 15"
    )


@pytest.mark.parametrize(("value", "text"), [(8, "8"), (0.5, "0.5"), ("8", "8"), ("64Gi", "64Gi")])
def test_quantities_take_bare_numbers_as_kubernetes_does(value: object, text: str) -> None:
    document = load_policy().model_dump(mode="json", by_alias=True)
    document["workloads"][0]["resources"]["cpu"] = value
    assert parse_policy(document).workloads[0].resources.cpu == text


def test_a_boolean_is_no_quantity() -> None:
    (found,) = _problems(workloads__0__resources__cpu=True)
    assert found.startswith("workloads.0.resources.cpu: Input should be a valid string")
