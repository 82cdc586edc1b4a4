"""Edge: read pool.yaml, validate it, and report every problem as ``FILE:LINE: path: message``."""

from __future__ import annotations

import difflib
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ValidationError
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import MarkedYAMLError, YAMLError

import policy.bounded_read as bounded_read
import policy.fast_yaml as fast_yaml
from policy.base import InvariantViolation
from policy.bounded_read import POLICY_BYTES
from policy.effects import pool_warnings
from policy.image_pins import image_warnings
from policy.migrations import RENAMED_FIELDS
from policy.placeholders import placeholder_warnings
from policy.pool import PoolPolicy

DEFAULT_POLICY = Path(__file__).with_name("pool.yaml")
"""The reviewed default policy shipped with the package."""


Severity = Literal["error", "warning"]
"""An ``error`` stops validate, render and Pulumi; a ``warning`` is printed and changes nothing."""


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a policy file, located as precisely as the YAML allows."""

    file: str
    line: int
    path: str
    message: str
    severity: Severity = "error"

    def __str__(self) -> str:
        where = f"{self.path}: " if self.path else ""
        label = "warning: " if self.severity == "warning" else ""
        return f"{self.file}:{self.line}: {label}{where}{self.message}"


class PolicyError(Exception):
    """A policy file that cannot be used; ``problems`` lists every reason."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


def read_text(path: Path) -> str:
    """The file's text (at most ``POLICY_BYTES``); raises PolicyError when it cannot be read."""
    try:
        return bounded_read.read_text(path, POLICY_BYTES)
    except FileNotFoundError:
        raise PolicyError([Problem(str(path), 0, "", "file not found")]) from None
    except bounded_read.FileRefused as exc:
        raise PolicyError([Problem(str(path), exc.line or 0, "", str(exc))]) from None
    except OSError as exc:
        raise PolicyError([Problem(str(path), 0, "", f"cannot read file: {exc}")]) from None


def parse_yaml(text: str, source: str) -> Any:
    """Round-trip YAML (keeps line numbers and comments); raises PolicyError on bad YAML.

    Merge keys (``<<: *anchor``) are YAML 1.1 and accepted. Nesting is bounded by the
    parser's recursion: a document nested deeper than Python's stack is refused, not crashed."""
    try:
        return YAML(typ="rt").load(text)
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else 0
        what = " ".join(str(x) for x in (exc.context, exc.problem) if x)
        raise PolicyError([Problem(source, line, "", f"invalid YAML: {what}")]) from None
    except RecursionError:
        raise PolicyError(
            [
                Problem(
                    source,
                    0,
                    "",
                    "invalid YAML: nested too deeply (expected a policy's few levels of "
                    "mappings and lists, found hundreds)",
                )
            ]
        ) from None
    except AttributeError as exc:
        if "add_referent" not in str(exc):
            raise
        cycle = fast_yaml.AliasCycle(0)  # ruamel's constructor crashes on ``&a {<<: *a}``
        message = f"invalid YAML: {cycle} (expected {cycle.expected})"
        raise PolicyError([Problem(source, 0, "", message)]) from None


def read_yaml(path: Path) -> Any:
    """``path`` read and parsed by ``parse_yaml``."""
    return parse_yaml(read_text(path), str(path))


def parse_document(text: str, source: str) -> Any:
    """The data ``parse_yaml`` reads, with line marks but without comments: libyaml's parse
    (``policy.fast_yaml.Parsed``) where it reads the text alike ruamel, else ruamel's (whose
    refusal is the one reported). What no loader reads (``fast_yaml.Unreadable``) is one line."""
    try:
        return fast_yaml.parse(text)
    except fast_yaml.Unreadable as exc:
        message = f"invalid YAML: {exc} (expected {exc.expected})"
        raise PolicyError([Problem(source, exc.line, "", message)]) from None
    except (fast_yaml.Refused, yaml.YAMLError, YAMLError):
        return parse_yaml(text, source)


def read_document(path: Path) -> Any:
    """``path`` read and parsed by ``parse_document``."""
    return parse_document(read_text(path), str(path))


def parse_policy(document: Any, source: str = "<policy>") -> PoolPolicy:
    """Validate an already-parsed document; errors point at lines when it came from ruamel or
    ``parse_document``."""
    data = document.data if isinstance(document, fast_yaml.Parsed) else document
    if not isinstance(data, dict):
        found = "an empty file" if data is None else type(data).__name__
        raise PolicyError([Problem(source, 1, "", f"expected a mapping at the top, found {found}")])
    try:
        return PoolPolicy.model_validate(data)
    except ValidationError as exc:
        raise PolicyError(_problems(exc, document, source)) from None


def load_policy(path: Path = DEFAULT_POLICY) -> PoolPolicy:
    """Read and validate a policy file; raises PolicyError listing every problem."""
    return parse_policy(read_document(path), str(path))


def locate(
    document: Any, source: str, path: str, message: str, severity: Severity = "error"
) -> Problem:
    """A Problem at the line of ``path`` (``workloads.0.name``) in the round-trip document."""
    return Problem(source, _line_of(document, path.split(".")), path, message, severity)


def policy_warnings(
    policy: PoolPolicy, document: Any = None, source: str = "<policy>"
) -> list[Problem]:
    """What a valid policy probably does not mean, as located warnings (never an error).

    ``validate`` and ``render`` print them after the file is accepted; ``document`` is the
    parsed YAML the policy came from (its lines), None when there is none.
    """
    found = [*pool_warnings(policy), *image_warnings(policy), *placeholder_warnings(policy)]
    return sorted(
        (locate(document, source, path, message, "warning") for path, message in found),
        key=lambda p: (p.line, p.path),
    )


def _problems(exc: ValidationError, document: Any, source: str) -> list[Problem]:
    problems: list[Problem] = []
    for error in exc.errors():
        loc = [str(part) for part in error["loc"]]
        cause = (error.get("ctx") or {}).get("error")
        if isinstance(cause, InvariantViolation):
            for rel_path, message in cause.violations:
                problems.append(locate(document, source, ".".join([*loc, rel_path]), message))
            continue
        # Not ``locate``: a mapping key in ``loc`` may itself contain dots (label keys).
        line = _line_of(document, loc)
        problems.append(Problem(source, line, ".".join(loc), _describe(error)))
    return sorted(problems, key=lambda p: (p.line, p.path))


def _describe(error: Any) -> str:
    kind = error["type"]
    found = error.get("input")
    if kind == "missing":
        return "required field is missing"
    if kind == "extra_forbidden":
        renamed = RENAMED_FIELDS.get(tuple(str(part) for part in error["loc"]))
        if renamed is not None:
            return f"{renamed} (docs/policy.md, Migrating)"
        return _unknown(error["loc"])
    message = str(error["msg"]).removeprefix("Value error, ")
    if kind == "value_error":
        return message  # gpupool's own validators name what they found
    limit = (error.get("ctx") or {}).get("le")
    if kind == "less_than_equal" and limit == 1 and isinstance(found, int | float) and found > 1:
        share = found / 100
        return f"{message}: a fraction, so {found:g} % is {share:g}, found {found!r}"
    if isinstance(found, dict | list):
        return f"{message}, found a {'mapping' if isinstance(found, dict) else 'list'}"
    return f"{message}, found {found!r}"


def _unknown(loc: tuple[Any, ...]) -> str:
    """An unknown key's message: the nearest field of its mapping, when one is near."""
    allowed = sorted(_fields_at([str(part) for part in loc[:-1]]))
    near = difflib.get_close_matches(str(loc[-1]), allowed, n=1, cutoff=0.6)
    if near:
        return f"unknown field; did you mean {near[0]!r}? (`gpupool schema` lists every field)"
    return "unknown field (check the spelling; `gpupool schema` lists every field)"


def _fields_at(loc: list[str]) -> set[str]:
    """The keys the mapping at ``loc`` (``node_pools.0``) allows, as written in YAML; empty
    where no model is there (a free mapping, such as labels)."""
    models: list[type[BaseModel]] = [PoolPolicy]
    for part in loc:
        if part.isdigit():
            continue  # an entry of a list keeps its models
        models = [
            found
            for model in models
            for name, field in model.model_fields.items()
            if part in (name, field.alias)
            for found in _models_in(field.annotation)
        ]
    return {field.alias or name for model in models for name, field in model.model_fields.items()}


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The models an annotation holds: itself, or inside Optional, unions, lists, tuples."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _models_in(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType, list, tuple):
        return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]
    return []


def _line_of(document: Any, loc: list[str]) -> int:
    """1-based line of the deepest node of ``loc`` present in the parsed document."""
    if isinstance(document, fast_yaml.Parsed):
        return fast_yaml.line_of(document.node, loc)
    node, line = document, 1
    for part in loc:
        if isinstance(node, CommentedMap) and part in node:
            if part in node.lc.data:  # a key merged in (``<<: *anchor``) has no line here
                line = node.lc.key(part)[0] + 1
            node = node[part]
        elif isinstance(node, CommentedSeq) and part.isdigit() and int(part) < len(node):
            line = node.lc.item(int(part))[0] + 1
            node = node[int(part)]
        else:
            break
    return line
