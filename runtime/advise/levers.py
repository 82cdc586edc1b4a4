"""Policy variants for a sweep: the levers that matter for a policy, or the user's ``--vary``.

Pure. A variant is a tuple of ``ValueEdit``s on the policy document (the same edits
``recommended.yaml`` applies to the user's file). Paths name list entries by their ``name``
(``node_pools.gpu-prod.reserve_ratio``) or index; ``move_nodes=N`` moves N nodes from the
prod pool to the first flex pool (negative: back), as node names on the ``labels`` target
and as ``max_nodes`` (the NodePool limits on the ``karpenter`` target).
"""

from __future__ import annotations

import difflib
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

from policy.pool import PoolPolicy
from runtime.tuner.proposals import PolicyPath
from runtime.tuner.yamledit import ValueEdit, lookup, render

MOVE_NODES = "move_nodes"
"""The ``--vary`` lever that moves nodes between the prod pool and the first flex pool."""

RESERVE = "reserve"
"""The ``--vary`` lever of the prod pool's reserve: a share (``0.1``) or replica slots
(``{replicas: 2, of: NAMESPACE/NAME}``), the other form cleared."""

MAX_VARIANTS = 64
"""Variants a sweep replays by default (``--max-variants`` raises it)."""


class LeverError(ValueError):
    """A ``--vary`` the policy cannot take; one line naming the field and what is expected."""


@dataclass(frozen=True)
class Variant:
    """One policy of a sweep: its edits of the current policy, and its name: each lever it
    moves as ``FIELD=VALUE`` (``current`` for none)."""

    edits: tuple[ValueEdit, ...]
    name: str = "current"


CURRENT = Variant(())


@dataclass(frozen=True)
class Lever:
    """A field and the values a sweep tries for it (``--vary FIELD=V1,V2``)."""

    field: str
    values: tuple[object, ...]


def parse_vary(spec: str) -> Lever:
    """``FIELD=V1,V2,...`` -> Lever; values are YAML (``true``, ``0.2``, ``auto``,
    ``{replicas: 2, of: ns/name}``), split at commas outside brackets and braces."""
    field, sep, values = spec.partition("=")
    if not sep or not field or not values:
        raise LeverError(
            f"--vary {spec!r}: expected FIELD=V1,V2,... "
            "(e.g. elastic.shed_while_production_above=0.6,0.7)"
        )
    parsed = []
    try:
        texts = _split_values(values)
    except ValueError as exc:
        raise LeverError(f"--vary {field}: {exc}") from None
    for text in texts:
        try:
            parsed.append(YAML(typ="safe").load(text))
        except YAMLError:
            raise LeverError(f"--vary {field}: {text!r} is not a YAML value") from None
    return Lever(field.strip(), tuple(parsed))


def _split_values(text: str) -> list[str]:
    out, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += {"[": 1, "{": 1, "]": -1, "}": -1}.get(char, 0)
        if char == "," and depth == 0:
            out.append(text[start:i].strip())
            start = i + 1
    out.append(text[start:].strip())
    if any(not part for part in out):
        raise ValueError(f"empty value in {text!r}")
    return out


def grid(policy: PoolPolicy, levers: Sequence[Lever]) -> list[Variant]:
    """Every combination of the levers' values, the current policy first; each value that
    equals the current one adds no edit (so the current policy appears once)."""
    document = policy.model_dump(mode="json", by_alias=True)
    choices = [
        [
            (f"{label(lever.field)}={render(v)}", _edits(policy, document, lever, v))
            for v in lever.values
        ]
        for lever in levers
    ]
    variants = [CURRENT]
    for combo in itertools.product(*choices):
        edits = tuple(e for _, moved in combo for e in moved)
        if all(v.edits != edits for v in variants):
            variants.append(Variant(edits, ", ".join(name for name, moved in combo if moved)))
    return variants


def default_levers(policy: PoolPolicy) -> list[list[Lever]]:
    """The levers that matter for ``policy``, as groups: the first is swept as a grid
    (lending x the prod pool's reserve), each later group one at a time around the current
    policy (nodes moved, thresholds, flex bounds)."""
    prod = policy.prod_pool
    reserves: list[object] = [*sorted({0.0, 0.05, 0.1, 0.2, prod.reserve_ratio})]
    named = [w for w in policy.production if w.name is not None]
    if named:
        reserves += [{"replicas": n, "of": named[0].slot_ref} for n in (1, 2)]
    elastic = policy.elastic
    grow, shed = elastic.grow_while_production_below, elastic.shed_while_production_above
    singles = [
        Lever(MOVE_NODES, (-1, 1, 2)),
        Lever("elastic.grow_while_production_below", (round(grow - 0.1, 2), round(grow + 0.1, 2))),
        Lever("elastic.shed_while_production_above", (round(shed - 0.1, 2), round(shed + 0.1, 2))),
        *(
            Lever(f"workloads.{w.name}.max_replicas", ("auto",))
            for w in policy.workloads
            if w.max_replicas != "auto"
        ),
    ]
    structure = [
        Lever(f"node_pools.{prod.name}.lend_idle", (True, False)),
        Lever(RESERVE, tuple(reserves)),
    ]
    return [structure, *([lever] for lever in singles)]


def default_variants(policy: PoolPolicy) -> list[Variant]:
    """The current policy, the grid of the first lever group, then each later lever alone."""
    groups = default_levers(policy)
    variants = grid(policy, groups[0])
    for group in groups[1:]:
        for variant in grid(policy, group)[1:]:
            if all(v.edits != variant.edits for v in variants):
                variants.append(variant)
    return variants


def _edits(
    policy: PoolPolicy, document: Mapping[str, Any], lever: Lever, value: object
) -> tuple[ValueEdit, ...]:
    """The edits that give ``lever`` the value ``value`` (none where it has it already)."""
    if lever.field == MOVE_NODES:
        return _move_nodes(policy, value)
    if lever.field == RESERVE:
        return _reserve(policy, value)
    path = resolve(document, lever.field)
    if lookup(document, path) == value:
        return ()
    return (ValueEdit(path, value),)


def _reserve(policy: PoolPolicy, value: object) -> tuple[ValueEdit, ...]:
    """The prod pool's reserve as a share (a number) or in slots (a mapping), the other
    form cleared."""
    prod = policy.prod_pool
    index = policy.node_pools.index(prod)
    ratio, slots = ("node_pools", index, "reserve_ratio"), ("node_pools", index, "reserve")
    current_slots = None if prod.reserve is None else prod.reserve.model_dump(mode="json")
    if isinstance(value, Mapping):
        wanted: tuple[tuple[PolicyPath, object], ...] = ((ratio, 0.0), (slots, dict(value)))
    else:
        wanted = ((ratio, value), (slots, None))
    current: dict[PolicyPath, object] = {ratio: prod.reserve_ratio, slots: current_slots}
    return tuple(ValueEdit(p, v) for p, v in wanted if current[p] != v)


def _move_nodes(policy: PoolPolicy, value: object) -> tuple[ValueEdit, ...]:
    """``value`` nodes from the prod pool to the first flex pool (negative: back)."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise LeverError(f"--vary {MOVE_NODES}: expected whole numbers of nodes, found {value!r}")
    if value == 0:
        return ()
    prod, flex = policy.prod_pool, policy.flex_pools[0]
    if (prod.gpus_per_node, prod.gpu_model) != (flex.gpus_per_node, flex.gpu_model):
        raise LeverError(
            f"--vary {MOVE_NODES}: pools {prod.name!r} and {flex.name!r} hold different GPUs "
            f"({prod.gpus_per_node} x {prod.gpu_model} vs {flex.gpus_per_node} x "
            f"{flex.gpu_model}); vary each pool's max_nodes instead"
        )
    source, sink = (prod, flex) if value > 0 else (flex, prod)
    count = abs(value)
    i, j = policy.node_pools.index(source), policy.node_pools.index(sink)
    edits = [
        ValueEdit(("node_pools", i, "max_nodes"), source.max_nodes - count),
        ValueEdit(("node_pools", j, "max_nodes"), sink.max_nodes + count),
    ]
    if len(source.nodes) >= count and count:
        kept, moved = source.nodes[:-count], source.nodes[-count:]
        edits += [
            ValueEdit(("node_pools", i, "nodes"), list(kept)),
            ValueEdit(("node_pools", j, "nodes"), [*sink.nodes, *moved]),
        ]
    return tuple(edits)


def label(field: str) -> str:
    """``field`` as a variant's name shows it, its section dropped (``gpu-prod.lend_idle``,
    ``grow_while_production_below``); ``resolve`` reads it back."""
    section, _, rest = field.partition(".")
    return rest if section in LABEL_SECTIONS and rest else field


LABEL_SECTIONS = ("node_pools", "workloads", "elastic")
"""Sections a field may be named without (``label``): ``gpu-prod.lend_idle``."""


def resolve(document: Mapping[str, Any], dotted: str) -> PolicyPath:
    """``node_pools.gpu-prod.reserve_ratio`` -> ``("node_pools", 0, "reserve_ratio")``:
    list entries by ``name`` or index, the section of a ``label`` implied; an unknown part
    raises ``LeverError`` naming the nearest field."""
    head = dotted.split(".", 1)[0]
    if head not in document:
        for section in LABEL_SECTIONS:
            entries = document.get(section)
            names = [e.get("name") for e in entries] if isinstance(entries, list) else entries
            if names is not None and head in names:
                return _resolve(document, f"{section}.{dotted}", dotted)
    return _resolve(document, dotted, dotted)


def _resolve(document: Mapping[str, Any], dotted: str, shown: str) -> PolicyPath:
    node: Any = document
    path: list[str | int] = []
    for part in dotted.split("."):
        here = ".".join(str(p) for p in path) or "the policy"
        if isinstance(node, list):
            names = [e.get("name") for e in node if isinstance(e, Mapping)]
            if part.isdigit() and int(part) < len(node):
                index = int(part)
            elif part in names:
                index = names.index(part)
            else:
                raise LeverError(
                    f"--vary {shown}: {here} has no entry {part!r}; expected an index below "
                    f"{len(node)} or one of {', '.join(map(str, names))}"
                )
            path.append(index)
            node = node[index]
        elif isinstance(node, Mapping):
            if part not in node:
                near = difflib.get_close_matches(part, list(node), n=1)
                hint = f"; did you mean {near[0]!r}?" if near else ""
                raise LeverError(f"--vary {shown}: {here} has no field {part!r}{hint}")
            path.append(part)
            node = node[part]
        else:
            raise LeverError(f"--vary {shown}: {here} is a value, not a mapping or list")
    if isinstance(node, Mapping) or (isinstance(node, list) and path[-1] != "nodes"):
        raise LeverError(f"--vary {shown}: names a section, not a value; name a field in it")
    return tuple(path)
