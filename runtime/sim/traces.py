"""Edge: load the traces the what-if engine replays into validated numpy arrays.

Two kinds: a *production* trace (GPUs production holds and how busy they are, sampled on a
regular grid) that decides what the pool can lend, and a *flex* trace (request arrivals
with token counts and, where the format records prompt block hashes, reusable KV prefixes)
that the borrowed GPUs serve. Files are streamed line by line (``.gz`` transparently, within
``TRACE_BYTES``) into flat arrays by pure parsers. A malformed row is a ``TraceError``
naming the file, line and field and what was expected; nothing is skipped except blank
lines, which carry no data.
"""

import itertools
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Final, Literal

from policy.bounded_read import TRACE_BYTES, TRACE_LINE_BYTES, FileRefused, read_lines
from runtime.sim.trace_model import MAX_REPLAY_REQUESTS, FlexTrace, ProductionTrace, TraceError
from runtime.sim.trace_parsers import (
    ALIBABA_HEADER,
    AZURE_HEADER,
    DEMAND_DUTY_HEADER,
    DEMAND_HEADER,
    demand_csv,
    diurnal,
    parse_alibaba,
    parse_azure,
    parse_demand,
    parse_mooncake,
    prefix_reuse,
)
from runtime.sim.trace_rows import header_of, lower, peeked, shown_line

__all__ = [
    "MAX_REPLAY_REQUESTS",
    "TRACE_BYTES",
    "FlexTrace",
    "ProductionTrace",
    "TraceError",
    "bundled",
    "demand_csv",
    "diurnal",
    "load_alibaba_duty_cycle",
    "load_azure_llm",
    "load_flex_trace",
    "load_gpu_demand_csv",
    "load_mooncake",
    "load_production_trace",
    "prefix_reuse",
]
"""The trace types and parsers' public names, read from here with the loaders."""

_BUNDLED: Final = {
    "alibaba": ("alibaba-genai", "pod_gpu_duty_cycle_half_a.csv.gz"),
    "azure-code": ("azure-llm-2023", "AzureLLMInferenceTrace_code.csv.gz"),
    "mooncake": ("mooncake", "synthetic_trace.jsonl.gz"),
}


def bundled(name: Literal["alibaba", "azure-code", "mooncake"]) -> Path:
    """Path of a trace shipped in the package (``runtime/sim/data/README.md`` cites them)."""
    if name not in _BUNDLED:
        raise ValueError(f"unknown bundled trace {name!r}; expected one of {', '.join(_BUNDLED)}")
    folder, file = _BUNDLED[name]
    path = Path(str(resources.files("runtime.sim") / "data" / folder / file))
    if not path.is_file():
        raise FileNotFoundError(
            f"bundled trace {name!r} is missing at {path}: the package was installed without "
            "its runtime/sim/data files (package-data)"
        )
    return path


# --- reading (the edge) ------------------------------------------------------------------


def _read_lines(path: Path) -> Iterator[str]:
    """The file's lines without line endings, streamed (``.gz`` inflated by suffix) within
    ``TRACE_BYTES`` and ``TRACE_LINE_BYTES``."""
    source = str(path)
    try:
        yield from read_lines(path, TRACE_BYTES, TRACE_LINE_BYTES)
    except FileNotFoundError:
        raise TraceError(source, None, None, "expected a trace file, found none") from None
    except FileRefused as exc:
        raise TraceError(source, exc.line, None, str(exc)) from None
    except OSError as exc:
        raise TraceError(source, None, None, f"cannot read the trace: {exc}") from None


def load_production_trace(path: Path) -> ProductionTrace:
    """A production trace in any supported CSV format, told apart by its header line."""
    first, lines = peeked(_read_lines(path))
    header = header_of(first)
    if header == lower(ALIBABA_HEADER):
        return parse_alibaba(str(path), path.name, lines)
    if header in (lower(DEMAND_HEADER), lower(DEMAND_DUTY_HEADER)):
        return parse_demand(str(path), path.name, lines)
    accepted = " | ".join(",".join(h) for h in (ALIBABA_HEADER, DEMAND_HEADER, DEMAND_DUTY_HEADER))
    raise TraceError(
        str(path), 1, None, f"expected one of the headers {accepted}, found {shown_line(first)}"
    )


def load_alibaba_duty_cycle(path: Path) -> ProductionTrace:
    """Alibaba cluster-trace-v2026-GenAI ``pod_gpu_duty_cycle``: one row per container and
    sample, each container holding one GPU."""
    return parse_alibaba(str(path), path.name, _read_lines(path))


def load_gpu_demand_csv(path: Path) -> ProductionTrace:
    """Generic ``timestamp,gpus_demanded[,duty_cycle]`` (seconds, GPUs, busy fraction).

    Without ``duty_cycle`` production GPUs read as fully busy (1.0): the conservative choice,
    since it never makes production look idler than it is, so it never invites flex load.
    Irregular samples are resampled, sample-and-hold, onto a grid of the smallest spacing.
    """
    return parse_demand(str(path), path.name, _read_lines(path))


def load_flex_trace(path: Path) -> FlexTrace:
    """A flex trace: Mooncake JSON lines (first non-empty line starts with ``{``) or Azure CSV."""
    stream = _read_lines(path)
    line, first = 1, next(stream, "")
    while not first.strip():  # leading blank lines: counted, not kept
        following = next(stream, None)
        if following is None:
            line, first = 1, ""
            break
        line, first = line + 1, following
    lines = itertools.chain([first], stream)
    if first.lstrip().startswith("{"):
        return parse_mooncake(str(path), path.name, lines, start=line)
    if line == 1 and header_of(first) == lower(AZURE_HEADER):
        return parse_azure(str(path), path.name, lines)
    raise TraceError(
        str(path),
        line,
        None,
        f"expected the Azure header {','.join(AZURE_HEADER)} or Mooncake JSON lines "
        f"(starting with '{{'), found {shown_line(first)}",
    )


def load_azure_llm(path: Path) -> FlexTrace:
    """Azure LLM inference trace (``TIMESTAMP,ContextTokens,GeneratedTokens``; Splitwise)."""
    return parse_azure(str(path), path.name, _read_lines(path))


def load_mooncake(path: Path) -> FlexTrace:
    """Mooncake JSON lines (``timestamp`` ms, ``input_length``, ``output_length``,
    ``hash_ids``), with the reusable prefix of every request."""
    return parse_mooncake(str(path), path.name, _read_lines(path))
