"""Hostile policy values for property tests, and the grammars of the programs that read them.

The strategies draw what a typo, a paste or an attacker puts in a policy file: text of any
script with any trailing character, look-alike digits and letters, option-like strings, and
numbers across ``int32`` and beyond. The oracles are the consumers' own rules, written here
from their sources (not imported from ``policy``): what the Kubernetes API server,
Prometheus and the registries accept. Go's ``regexp`` anchors ``$`` at the end of the text
and its ``\\w``/``\\d`` are ASCII, so each is a Python ``fullmatch`` under ``re.ASCII``.

``trace_files`` draws trace files the same way, from a grammar of good and malformed rows;
``write_azure_trace`` and ``write_mooncake_trace`` write large well-formed ones.
"""

from __future__ import annotations

import gzip
import io
import json
import math
import re
import subprocess
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from hypothesis import assume
from hypothesis import strategies as st
from ruamel.yaml import YAML
from typer.testing import CliRunner, Result

from runtime.cli.app import app
from tests.infra.test_cli import write_policy

TRAILERS = ["\n", "\r\n", "\r", " ", "\t", "\x0b", "\x0c", "\x00", "\u00a0", "\u2028", "\u200b"]
"""Characters a ``$`` anchor, a ``strip()`` or a YAML block scalar treats specially."""

LOOKALIKES = {
    **{c: ("\u0665", "\uff15", "\u0e53", "\u00b2") for c in "0123456789"},
    **{c: ("\u0430", "\u0435", "\u0456", "\u043e", "\u0441", "\u0440") for c in "aeiocpx"},
    **{c: ("\u0391", "\u0395", "\u0397", "\u039a", "\u039c", "\u03a4") for c in "AEHKMT"},
    **{c: ("\u00f1", "\u015f", "\u00fc", "\u00fd", "\u0131") for c in "nsuy"},
}
"""ASCII characters and the non-ASCII ones that look like them (or that ``\\d``/``\\w`` of
Python's ``re``, ``str.isdigit`` or ``float`` accept)."""

any_text = st.text(st.characters(exclude_categories=["Cs"]), max_size=24)
"""Text of any script (no lone surrogates: no file holds them)."""


def hostile(valid: list[str]) -> st.SearchStrategy[str]:
    """Values near ``valid`` ones: as is, with a leading or trailing character, one character
    swapped for a look-alike, an option-like prefix, or text of any script."""
    base = st.sampled_from(valid)

    def swapped(value: str, data: st.DataObject) -> str:
        spots = [i for i, c in enumerate(value) if c in LOOKALIKES]
        if not spots:
            return value + "\u0665"
        i = data.draw(st.sampled_from(spots))
        return value[:i] + data.draw(st.sampled_from(LOOKALIKES[value[i]])) + value[i + 1 :]

    return st.one_of(
        base,
        st.builds(lambda v, t: v + t, base, st.sampled_from(TRAILERS)),
        st.builds(lambda t, v: t + v, st.sampled_from(TRAILERS), base),
        st.builds(swapped, base, st.data()),
        st.builds(lambda v: "-" + v, base),
        any_text,
    )


INT_EDGES = [0, -1, 1, 2**31 - 1, 2**31, -(2**31), -(2**31) - 1, 2**32, 2**63, 10**23, 3 * 10**9]
"""The int32 and int64 boundaries, and the issue's own numbers."""

numbers = st.one_of(
    st.sampled_from(INT_EDGES),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.integers(min_value=-10, max_value=100_000),
    st.floats(allow_nan=True, allow_infinity=True),
)
"""Numbers across int32 and beyond (and floats, infinities and NaN)."""


# --- the consumers' grammars ---------------------------------------------------------------

DNS_1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", re.ASCII)
DNS_1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?", re.ASCII)
DNS_1123_SUBDOMAIN = re.compile(
    r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*", re.ASCII
)
"""k8s.io/apimachinery/pkg/util/validation: IsDNS1123Label (<= 63), IsDNS1035Label (<= 63),
IsDNS1123Subdomain (<= 253)."""

QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]", re.ASCII)
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?", re.ASCII)
"""apimachinery IsQualifiedName (a label key's name part, <= 63) and IsValidLabelValue."""

PROMETHEUS_DURATION = re.compile(
    r"(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?",
    re.ASCII,
)
"""prometheus/common model.ParseDuration (a non-empty match; int64 milliseconds)."""

PROMETHEUS_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*", re.ASCII)
"""prometheus/common model.LabelName (legacy validation)."""

_ALNUM = r"[a-z0-9]+"
_SEPARATOR = r"(?:[._]|__|[-]+)"
_PATH_COMPONENT = rf"{_ALNUM}(?:{_SEPARATOR}{_ALNUM})*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*(?::[0-9]+)?"
IMAGE_REFERENCE = re.compile(
    rf"(?P<name>(?:{_DOMAIN}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*)"
    r"(?::[\w][\w.-]{0,127})?"
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?",
    re.ASCII,
)
"""github.com/distribution/reference ReferenceRegexp (without IPv6 hosts); the name is at
most 255 characters."""

INT32 = (-(2**31), 2**31 - 1)


def is_dns_label(value: Any) -> bool:
    return isinstance(value, str) and len(value) <= 63 and bool(DNS_1123_LABEL.fullmatch(value))


def is_service_name(value: Any) -> bool:
    return isinstance(value, str) and len(value) <= 63 and bool(DNS_1035_LABEL.fullmatch(value))


def is_subdomain(value: Any) -> bool:
    return (
        isinstance(value, str) and len(value) <= 253 and bool(DNS_1123_SUBDOMAIN.fullmatch(value))
    )


def is_label_key(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    prefix, _, name = value.rpartition("/")
    return (
        len(name) <= 63
        and bool(QUALIFIED_NAME.fullmatch(name))
        and (not prefix or is_subdomain(prefix))
    )


def is_label_value(value: Any) -> bool:
    return isinstance(value, str) and len(value) <= 63 and bool(LABEL_VALUE.fullmatch(value))


def duration_ms(value: str) -> int:
    """Milliseconds of a string ``PROMETHEUS_DURATION`` matches."""
    match = PROMETHEUS_DURATION.fullmatch(value)
    assert match is not None
    units_ms = (31536000000, 604800000, 86400000, 3600000, 60000, 1000, 1)
    return sum(int(n) * u for n, u in zip(match.groups()[1::2], units_ms, strict=True) if n)


def is_prometheus_duration(value: Any) -> bool:
    """Prometheus parses it (non-empty, its grammar, within int64 milliseconds)."""
    if not isinstance(value, str) or not value or not PROMETHEUS_DURATION.fullmatch(value):
        return False
    return duration_ms(value) < 2**63


def is_prometheus_label(value: Any) -> bool:
    return isinstance(value, str) and bool(PROMETHEUS_LABEL.fullmatch(value))


def is_image_reference(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    match = IMAGE_REFERENCE.fullmatch(value)
    return match is not None and len(match["name"]) <= 255


def is_git_branch(value: Any) -> bool:
    """What git itself says (``git check-ref-format --branch``), and no leading ``-``."""
    if not isinstance(value, str) or "\x00" in value:
        return False
    done = subprocess.run(
        ["git", "check-ref-format", "--branch", value], capture_output=True, check=False
    )
    return done.returncode == 0 and not value.startswith("-")


# --- running the CLI on a document ---------------------------------------------------------

runner = CliRunner()


def yaml_round_trips(doc: Any) -> str:
    """``doc`` as YAML text; the example is dropped when YAML cannot hold a value as is (a
    NEL ``\\x85`` is a line break to YAML, so no policy file can hold one)."""
    buf = io.StringIO()
    YAML(typ="rt").dump(doc, buf)
    assume(YAML(typ="safe").load(buf.getvalue()) == doc)
    return buf.getvalue()


def validate_and_render(folder: Path, doc: Any) -> tuple[Path, Result, Result, Path]:
    """Write ``doc`` as a policy file in ``folder`` and run ``gpupool validate`` and
    ``gpupool render --out`` on it: (file, validate's result, render's result, out dir)."""
    yaml_round_trips(doc)
    source = write_policy(folder, doc)
    out = folder / "build"
    checked = runner.invoke(app, ["validate", str(source)])
    rendered = runner.invoke(app, ["render", str(source), "--out", str(out)])
    return source, checked, rendered, out


def clear_outcome(source: Path, checked: Result, rendered: Result, out: Path) -> list[str] | None:
    """Either both commands succeed (None), or both fail with one ``FILE:LINE: PATH: message``
    line per problem, no traceback and nothing rendered (the PATHs)."""
    for result in (checked, rendered):
        assert "Traceback" not in result.output, result.output
        assert result.exception is None or isinstance(result.exception, SystemExit), repr(
            result.exception
        )
    if checked.exit_code == 0:
        assert rendered.exit_code == 0, rendered.output
        return None
    assert (checked.exit_code, rendered.exit_code) == (1, 1), checked.output + rendered.output
    assert not out.exists(), "a refused policy rendered files"
    paths = []
    for result in (checked, rendered):
        lines = result.output.strip().splitlines()
        assert lines, result.output
        for line in lines:
            assert re.match(rf"{re.escape(str(source))}:[0-9]+: [^ ]+: \S", line), line
            paths.append(line.split(": ", 2)[1])
    return paths


def check_field(folder: Path, doc: Any, field: str, value: Any, valid: bool) -> bool:
    """Run validate and render on ``doc`` (``value`` at ``field``). ``valid``: what the
    consumer's grammar says of ``value``. An invalid value must be refused at ``field``; an
    accepted one must be valid. Returns whether the policy was accepted."""
    source, checked, rendered, out = validate_and_render(folder, doc)
    paths = clear_outcome(source, checked, rendered, out)
    if paths is None:
        assert valid, f"{field}: {value!r} was accepted, but its consumer refuses it"
        return True
    if not valid:
        assert field in paths, (field, value, paths)
    return False


# --- trace files, from a grammar of rows -----------------------------------------------------

AZURE_TRACE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"
DEMAND_TRACE_HEADER = "timestamp,gpus_demanded,duty_cycle"
"""Headers of the flex and production traces ``trace_files`` draws."""

_cell = st.one_of(
    st.sampled_from(["", " ", "-1", "0", "1", "1e309", "nan", "inf", "0x10", "1_000", "\u0665"]),
    st.integers(-(2**70), 2**70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    any_text.filter(lambda t: "\n" not in t and "\r" not in t),
)
"""A CSV cell: numbers at and past every bound, look-alike digits, text of any script."""


@st.composite
def _azure_row(draw: st.DrawFn, ms: int, broken: bool) -> str:
    second = ms // 1000
    stamp = f"2023-11-16 {18 + second // 3600:02d}:{second // 60 % 60:02d}:{second % 60:02d}"
    stamp += f".{ms % 1000:03d}{draw(st.integers(0, 9999)):04d}"
    good = f"{stamp},{draw(st.integers(1, 9000))},{draw(st.integers(1, 900))}"
    if not broken:
        return good
    return draw(
        st.one_of(
            st.builds(lambda c: good.rsplit(",", 1)[0] + "," + c, _cell),  # a bad last cell
            st.builds(lambda c: c + good[len(stamp) :], _cell),  # a bad time
            st.just(good + ",1"),  # a column too many
            st.just(stamp),  # columns missing
            st.just('"' + good),  # an open quote
            st.just(""),  # a blank line
        )
    )


@st.composite
def _mooncake_row(draw: st.DrawFn, ms: int, broken: bool) -> str:
    tokens = draw(st.integers(1, 3000))
    ids = draw(st.lists(st.integers(0, 50), min_size=-(-tokens // 512), max_size=-(-tokens // 512)))
    record: dict[str, Any] = {
        "timestamp": ms,
        "input_length": tokens,
        "output_length": draw(st.integers(1, 500)),
        "hash_ids": ids,
    }
    key = draw(st.sampled_from(sorted(record)))
    depth = draw(st.sampled_from([2, 50, 5_000, 50_000]))
    change = draw(
        st.one_of(
            st.just("drop"),
            st.just("nested"),
            st.builds(lambda v: ("set", v), numbers),
            st.builds(lambda v: ("set", v), any_text),
            st.just(("set", [2**63, 1])),
            st.just(("set", [True])),
        )
    )
    if not broken:
        return json.dumps(record)
    if change == "drop":
        del record[key]
    elif change == "nested":  # hash_ids nested until the parser's stack runs out
        return (
            json.dumps(record)[:-1].replace('"hash_ids": [', '"hash_ids": ' + "[" * depth, 1)
            + "]" * depth
            + "}"
        )
    else:
        record[key] = change[1]
    if any(isinstance(v, float) and not math.isfinite(v) for v in record.values()):
        return str(record)  # not JSON: Python's repr of the record
    return json.dumps(record)


@st.composite
def _csv_row(draw: st.DrawFn, good: list[str], broken: bool) -> str:
    """A CSV row of ``good`` cells, or (``broken``) with one cell drawn from ``_cell``, a cell
    too many or too few, an open quote, or blank."""
    cells = list(good)
    if not broken:
        return ",".join(cells)
    change = draw(st.sampled_from(["cell", "more", "fewer", "quote", "blank"]))
    if change == "cell":
        cells[draw(st.integers(0, len(cells) - 1))] = draw(_cell)
    elif change == "more":
        cells.append("1")
    elif change == "fewer":
        cells.pop()
    elif change == "quote":
        cells[0] = '"' + cells[0]
    elif change == "blank":
        cells = [""]
    return ",".join(cells)


def _production_lines(draw: st.DrawFn, kind: str, rows: int, bad: int | None) -> list[str]:
    """A demand trace (a sample a minute, jittered) or an Alibaba one (four containers a
    minute) of ``rows`` rows, row ``bad`` broken by ``_csv_row``."""
    if kind == "demand":
        good = [
            [f"{i * 60 + draw(st.integers(0, 59))}", str(draw(st.integers(0, 64))), "0.5"]
            for i in range(rows)
        ]
        header = DEMAND_TRACE_HEADER
    else:
        good = [
            [f"{draw(st.floats(0, 100)):.2f}", f"{i // 4 * 60}", f"10.0.0.{i % 4}"]
            for i in range(rows)
        ]
        header = "value,timestamp_anon,container_ip"
    return [header, *(draw(_csv_row(r, i == bad)) for i, r in enumerate(good))]


TRACE_KINDS = {
    "azure": ".csv",
    "mooncake": ".jsonl",
    "demand": ".csv",
    "alibaba": ".csv",
}
"""Kinds of trace ``trace_files`` draws: two flex, two production; their file suffix."""


@st.composite
def trace_files(draw: st.DrawFn) -> tuple[str, str, bytes]:
    """``(kind, file name, bytes)`` of a trace (``TRACE_KINDS``), rows drawn from a grammar of
    good and malformed rows, arriving in bursts (many in one second) or spread out,
    sometimes truncated or gzipped (whole or cut short)."""
    kind = draw(st.sampled_from(sorted(TRACE_KINDS)))
    rows = draw(st.integers(0, 30))
    bad = draw(st.one_of(st.none(), st.integers(0, max(rows - 1, 0))))  # the broken row
    burst = draw(st.booleans())
    times = sorted(
        draw(st.lists(st.integers(0, 999 if burst else 7_200_000), min_size=rows, max_size=rows))
    )
    if kind == "azure":
        lines = [AZURE_TRACE_HEADER, *(draw(_azure_row(t, i == bad)) for i, t in enumerate(times))]
    elif kind == "mooncake":
        lines = [draw(_mooncake_row(t, i == bad)) for i, t in enumerate(times)]
    else:
        lines = _production_lines(draw, kind, rows, bad)
    ending = draw(st.sampled_from(["\n", "\r\n"]))
    data = (ending.join(lines) + draw(st.sampled_from(["", ending]))).encode()
    data = data[: draw(st.integers(0, len(data)))] if bad is not None else data
    suffix = TRACE_KINDS[kind]
    packing = draw(
        st.sampled_from(["plain", "gz", "gz-cut"] if bad is not None else ["plain", "gz"])
    )
    if packing == "plain":
        return kind, f"trace{suffix}", data
    packed = gzip.compress(data)
    if packing == "gz-cut":
        packed = packed[: draw(st.integers(0, len(packed) - 1))]
    return kind, f"trace{suffix}.gz", packed


def write_azure_trace(path: Path, size: int) -> None:
    """An Azure trace of about ``size`` bytes: 50 requests a second, token counts varied."""
    start = datetime(2023, 11, 16, 18)
    written, row = 0, 0
    with path.open("w") as out:
        written += out.write("TIMESTAMP,ContextTokens,GeneratedTokens\n")
        while written < size:
            stamp = (start + timedelta(seconds=row // 50)).isoformat(" ")
            written += out.write(f"{stamp}.{row % 50:07d},{row % 7919 + 1},{row % 499 + 1}\n")
            row += 1


def write_mooncake_trace(path: Path, size: int) -> None:
    """A Mooncake trace of about ``size`` bytes: a request every 10 ms, prompts of up to 16
    blocks, a varying share of them a prefix shared with earlier requests."""
    written, row, fresh = 0, 0, 10**6
    with path.open("w") as out:
        while written < size:
            tokens = 100 + row * 7919 % 8000
            blocks = -(-tokens // 512)
            shared = row % (blocks + 1)
            ids = [row % 100 * 100 + k for k in range(shared)]
            ids += range(fresh, fresh + blocks - shared)
            fresh += blocks - shared
            record = {
                "timestamp": row * 10,
                "input_length": tokens,
                "output_length": 1 + row % 499,
                "hash_ids": ids,
            }
            written += out.write(json.dumps(record) + "\n")
            row += 1
