"""Trace loaders: real public traces, every kind of malformed row, tiling and prefix reuse."""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.sim.traces import (
    FlexTrace,
    ProductionTrace,
    TraceError,
    bundled,
    diurnal,
    load_alibaba_duty_cycle,
    load_azure_llm,
    load_flex_trace,
    load_gpu_demand_csv,
    load_mooncake,
    load_production_trace,
    prefix_reuse,
)

Bundled = Literal["alibaba", "azure-code", "mooncake"]

UPSTREAM_BLOBS: dict[Bundled, str] = {
    "alibaba": "9092ababe4b5aafc1150e6b4f13612a636d75ccb",
    "azure-code": "62bd8109d0f2b1bc48206d397ecca48d8de03aab",
    "mooncake": "e4838049c0dcfc358a5f24ab08251279475cba94",
}
"""``git hash-object`` of the public trace each bundled copy was compressed from (sources in
runtime/sim/data/README.md): for azure-code and mooncake the file at the upstream commit, for
alibaba the 76-container extract of the upstream archive."""

AZURE_SLICE = (
    Path(__file__).resolve().parents[1] / "fixtures" / "traces" / "azure-code-first-1000.csv"
)


def _git_blob_id(data: bytes) -> str:
    """What ``git hash-object`` prints for a file holding ``data``."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _source(name: Bundled, form: str, folder: Path) -> Path:
    """The bundled trace ``name`` as shipped (``gz``) or decompressed into ``folder`` under the
    upstream file name (``plain``), as a user who downloaded the trace has it."""
    packaged = bundled(name)
    if form == "gz":
        return packaged
    plain = folder / packaged.stem  # x.csv.gz -> x.csv
    plain.write_bytes(gzip.decompress(packaged.read_bytes()))
    return plain


FORMS = pytest.mark.parametrize("form", ["plain", "gz"])


def _reuse_share(trace: FlexTrace) -> float:
    """Prompt blocks served from a prefix over all prompt blocks."""
    blocks = -(-trace.input_tokens // trace.block_tokens)
    return float(trace.prefix_blocks.sum() / blocks.sum())


# --- the real traces ---------------------------------------------------------------------


@FORMS
def test_alibaba_duty_cycle(form: str, tmp_path: Path) -> None:
    trace = load_production_trace(_source("alibaba", form, tmp_path))
    assert trace.source.startswith("pod_gpu_duty_cycle_half_a.csv")
    assert trace.held.size == 1441
    assert trace.step_s == 57.0
    assert trace.start_s == 1662858720.0
    assert trace.duration_s == 1441 * 57
    assert (trace.held.min(), trace.held.max()) == (59, 67)
    assert trace.busy.mean() == pytest.approx(4.7212, abs=1e-4)
    # README: mean duty cycle 7.5 % of the GPUs held
    assert trace.busy.sum() / trace.held.sum() == pytest.approx(0.075, abs=0.001)
    assert ((trace.busy >= 0) & (trace.busy <= trace.held)).all()


@FORMS
def test_azure_code(form: str, tmp_path: Path) -> None:
    trace = load_flex_trace(_source("azure-code", form, tmp_path))
    assert trace.arrival_s.size == 8819
    assert trace.arrival_s[0] == 0.0
    # 18:17:03.9799600 to 19:14:19.9280160, exactly in the 7th digit
    assert trace.duration_s == pytest.approx(3435.948056, abs=1e-7)
    assert round(float(trace.input_tokens.mean())) == 2048
    assert trace.input_tokens.max() == 7437
    assert round(float(trace.output_tokens.mean())) == 28
    assert trace.block_tokens == 0
    assert not trace.prefix_blocks.any()
    assert np.isnan(trace.prefix_last_seen).all()


@FORMS
def test_mooncake_synthetic(form: str, tmp_path: Path) -> None:
    trace = load_flex_trace(_source("mooncake", form, tmp_path))
    assert trace.arrival_s.size == 3993
    assert trace.block_tokens == 512
    assert trace.arrival_s[0] == 0.0
    assert trace.duration_s == 1022.025
    # vLLM never caches the last prompt token
    assert (trace.prefix_blocks * 512 <= trace.input_tokens - 1).all()
    has = trace.prefix_blocks > 0
    assert (trace.prefix_last_seen[has] <= trace.arrival_s[has]).all()
    assert np.isnan(trace.prefix_last_seen[~has]).all()
    # README: "~64% block reuse" counts every reused block, wherever it sits (63.96 %); the
    # leading-prefix count can only be lower and, capped, is 77,740 of 121,877 blocks (63.79 %)
    assert 0.63 < _reuse_share(trace) < 0.6396


@pytest.mark.parametrize("name", sorted(UPSTREAM_BLOBS))
def test_bundled_copies_decompress_to_the_upstream_files(name: Bundled) -> None:
    assert _git_blob_id(gzip.decompress(bundled(name).read_bytes())) == UPSTREAM_BLOBS[name]


def test_the_azure_test_slice_is_the_head_of_the_bundled_trace() -> None:
    full = gzip.decompress(bundled("azure-code").read_bytes()).splitlines(keepends=True)
    assert AZURE_SLICE.read_bytes() == b"".join(full[:1001])  # header + 1,000 requests


def test_specific_loaders_read_the_bundled_traces() -> None:
    assert load_alibaba_duty_cycle(bundled("alibaba")).held.size == 1441
    assert load_azure_llm(bundled("azure-code")).arrival_s.size == 8819
    assert load_mooncake(bundled("mooncake")).arrival_s.size == 3993


def test_unknown_bundled_name() -> None:
    with pytest.raises(ValueError, match="alibaba, azure-code, mooncake"):
        bundled("nope")  # type: ignore[arg-type]


# --- malformed input ---------------------------------------------------------------------

Loader = Callable[[Path], object]

ALI = "value,timestamp_anon,container_ip\n"
DEM = "timestamp,gpus_demanded\n"
DEM3 = "timestamp,gpus_demanded,duty_cycle\n"
AZ = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
T0 = "2023-11-16 18:17:03.9799600"
T1 = "2023-11-16 18:17:04.0319600"
MC = '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}\n'


_DROP = object()


def _mc(**fields: object) -> str:
    """A valid Mooncake line at 10 ms with ``fields`` replaced (``_DROP``: left out)."""
    record: dict[str, object] = {
        "timestamp": 10,
        "input_length": 600,
        "output_length": 5,
        "hash_ids": [1, 3],
    }
    record.update(fields)
    return json.dumps({k: v for k, v in record.items() if v is not _DROP}) + "\n"


HEADERS = (
    "value,timestamp_anon,container_ip | timestamp,gpus_demanded"
    " | timestamp,gpus_demanded,duty_cycle"
)
FLEX = (
    "expected the Azure header TIMESTAMP,ContextTokens,GeneratedTokens"
    " or Mooncake JSON lines (starting with '{')"
)
ALI_COLUMNS = "expected 3 columns (value,timestamp_anon,container_ip)"
AZ_COLUMNS = "expected 3 columns (TIMESTAMP,ContextTokens,GeneratedTokens)"
NO_ROWS = "expected at least one data row, found none"
PERCENT = "expected a duty cycle 0..100 %"
INT0, INT1 = "expected an integer >= 0", "expected an integer >= 1"
AFTER, AT_OR_AFTER = "expected a time after the previous row's", "expected a time at or after"
MS = "expected milliseconds >= 0"

BAD: list[tuple[str, Loader, str, int | None, str | None, str]] = [
    # (case, loader, content, line, field, expectation)
    ("ali-value", load_production_trace, ALI + "abc,0,c1\n", 2, "value", f"{PERCENT}, found 'abc'"),
    ("ali-over", load_alibaba_duty_cycle, ALI + "0,0,c1\n120,0,c2\n", 3, "value",
     f"{PERCENT}, found '120'"),
    ("ali-negative", load_alibaba_duty_cycle, ALI + "-1,0,c1\n", 2, "value", "found '-1'"),
    ("ali-nan", load_alibaba_duty_cycle, ALI + "nan,0,c1\n", 2, "value", "found 'nan'"),
    ("ali-time", load_alibaba_duty_cycle, ALI + "1,-57,c1\n", 2, "timestamp_anon",
     "expected seconds >= 0, found '-57'"),
    ("ali-container", load_alibaba_duty_cycle, ALI + "1,0, \n", 2, "container_ip",
     "expected a container id"),
    ("ali-twice", load_alibaba_duty_cycle, ALI + "1,0,c1\n2,0,c2\n3,57,c1\n4,0,c1\n", 5,
     "container_ip",
     "expected each container once per timestamp, found c1 at 0 again (first on line 2)"),
    ("ali-missing", load_alibaba_duty_cycle, ALI + "1,0\n", 2, "container_ip",
     f"{ALI_COLUMNS}, found 2"),
    ("ali-extra", load_alibaba_duty_cycle, ALI + "1,0,c1,x\n", 2, "column 4",
     f"{ALI_COLUMNS}, found 4"),
    ("ali-gap", load_alibaba_duty_cycle, ALI + "1,0,a\n1,57,a\n1,114,a\n1,285,a\n1,342,a\n", 5,
     "timestamp_anon", "expected samples every 57 s (the median spacing), found 285, 171 s after"),
    ("ali-one-sample", load_alibaba_duty_cycle, ALI + "1,0,a\n1,0,b\n", None, "timestamp_anon",
     "expected 2 distinct timestamps at least, found 1"),
    ("ali-empty", load_alibaba_duty_cycle, ALI, None, None, NO_ROWS),
    ("ali-header", load_alibaba_duty_cycle, "value,timestamp,container\n1,0,a\n", 1, None,
     "expected the header value,timestamp_anon,container_ip, found 'value,timestamp,container'"),
    ("prod-header", load_production_trace, "time,gpus\n0,1\n", 1, None,
     f"expected one of the headers {HEADERS}, found 'time,gpus'"),
    ("prod-empty", load_production_trace, "", 1, None, "found an empty line"),
    ("dem-back", load_production_trace, DEM + "0,3\n60,4\n30,5\n", 4, "timestamp",
     f"{AFTER} 60, found '30'"),
    ("dem-same", load_gpu_demand_csv, DEM + "0,3\n60,4\n60,5\n", 4, "timestamp", f"{AFTER} 60"),
    ("dem-time", load_gpu_demand_csv, DEM + "soon,3\n", 2, "timestamp",
     "expected seconds >= 0, found 'soon'"),
    ("dem-fraction", load_gpu_demand_csv, DEM + "0,2.5\n", 2, "gpus_demanded",
     f"{INT0}, found '2.5'"),
    ("dem-negative", load_gpu_demand_csv, DEM + "0,1\n60,-1\n", 3, "gpus_demanded",
     f"{INT0}, found '-1'"),
    ("dem-duty", load_gpu_demand_csv, DEM3 + "0,4,0.5\n60,4,1.5\n", 3, "duty_cycle",
     "expected a busy fraction 0..1, found '1.5'"),
    ("dem-no-duty", load_gpu_demand_csv, DEM3 + "0,4\n", 2, "duty_cycle",
     "expected 3 columns (timestamp,gpus_demanded,duty_cycle), found 2"),
    ("dem-extra", load_gpu_demand_csv, DEM + "0,4,0.5\n", 2, "column 3",
     "expected 2 columns (timestamp,gpus_demanded), found 3"),
    ("dem-one", load_gpu_demand_csv, DEM + "0,4\n", None, "timestamp",
     "expected 2 samples at least, found 1"),
    ("dem-grid", load_gpu_demand_csv, DEM + "0,1\n0.0001,1\n100000,1\n", 3, "timestamp",
     "expected spacing that resamples to at most 10,000,000 samples"),
    ("dem-overflow", load_gpu_demand_csv, DEM + "0,1\n1e-300,1\n1e300,1\n", 3, "timestamp",
     "found 1e-300 s over 1e+300 s (inf samples)"),
    ("dem-empty", load_gpu_demand_csv, DEM + "\n", None, None, NO_ROWS),
    ("az-stamp", load_azure_llm, AZ + "2023/11/16 18:17:03,10,2\n", 2, "TIMESTAMP",
     "expected YYYY-MM-DD HH:MM:SS[.fffffff], found '2023/11/16 18:17:03'"),
    ("az-date", load_azure_llm, AZ + "2023-02-30 18:17:03.1,10,2\n", 2, "TIMESTAMP",
     "expected a real date and time, found '2023-02-30 18:17:03.1'"),
    ("az-back", load_flex_trace, AZ + f"{T1},10,2\n{T0},10,2\n", 3, "TIMESTAMP",
     f"{AT_OR_AFTER} the previous row's, found '{T0}'"),
    ("az-zero", load_azure_llm, AZ + f"{T0},0,2\n", 2, "ContextTokens", f"{INT1}, found '0'"),
    ("az-generated", load_azure_llm, AZ + f"{T0},10,0\n", 2, "GeneratedTokens",
     f"{INT1}, found '0'"),
    ("az-text", load_azure_llm, AZ + f"{T0},10,many\n", 2, "GeneratedTokens", "found 'many'"),
    ("az-missing", load_azure_llm, AZ + f"{T0},10\n", 2, "GeneratedTokens",
     f"{AZ_COLUMNS}, found 2"),
    ("az-extra", load_azure_llm, AZ + f"{T0},10,2,7\n", 2, "column 4", f"{AZ_COLUMNS}, found 4"),
    ("az-header", load_azure_llm, MC, 1, None,
     "expected the header TIMESTAMP,ContextTokens,GeneratedTokens, found '{"),
    ("az-empty", load_azure_llm, AZ, None, None, NO_ROWS),
    ("mc-json", load_mooncake, MC + '{"timestamp": 1,\n', 2, None,
     "expected a JSON object, found bad JSON"),
    ("mc-list", load_flex_trace, MC + "[1, 2]\n", 2, None, "expected a JSON object, found list"),
    ("mc-key", load_mooncake, MC + _mc(hash_ids=_DROP), 2, "hash_ids",
     "expected this key, found it missing"),
    ("mc-stamp-type", load_mooncake, MC + _mc(timestamp="10"), 2, "timestamp", f"{MS}, found '10'"),
    ("mc-stamp-bool", load_mooncake, MC + _mc(timestamp=True), 2, "timestamp", f"{MS}, found True"),
    ("mc-back", load_mooncake, _mc(timestamp=50) + _mc(timestamp=40), 2, "timestamp",
     f"{AT_OR_AFTER} the previous row's 50, found 40"),
    ("mc-negative", load_mooncake, _mc(timestamp=-1), 1, "timestamp", f"{MS}, found -1"),
    ("mc-input-type", load_mooncake, MC + _mc(input_length="600"), 2, "input_length",
     f"{INT1}, found '600'"),
    ("mc-zero-output", load_mooncake, MC + _mc(output_length=0), 2, "output_length",
     f"{INT1}, found 0"),
    ("mc-float-output", load_mooncake, MC + _mc(output_length=2.5), 2, "output_length",
     f"{INT1}, found 2.5"),
    ("mc-ids-type", load_mooncake, MC + _mc(hash_ids=[1, "b"]), 2, "hash_ids",
     'expected a list of integers, found [1, "b"]'),
    ("mc-ids-count", load_mooncake, MC + _mc(hash_ids=[1, 2, 3]), 2, "hash_ids",
     "expected 2 ids (one per 512 input tokens), found 3"),
    ("mc-empty", load_mooncake, "\n\n", None, None, NO_ROWS),
    ("flex-unknown", load_flex_trace, "\n\nwhen,prompt,output\n", 3, None,
     f"{FLEX}, found 'when,prompt,output'"),
    ("flex-empty", load_flex_trace, "", 1, None, f"{FLEX}, found an empty line"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("case", "load", "content", "line", "field", "expectation"),
    BAD,
    ids=[case[0] for case in BAD],
)
def test_malformed_input_names_file_line_field_and_expectation(
    tmp_path: Path,
    case: str,
    load: Loader,
    content: str,
    line: int | None,
    field: str | None,
    expectation: str,
) -> None:
    path = tmp_path / f"{case}.trace"
    path.write_text(content)
    with pytest.raises(TraceError) as info:
        load(path)
    where = str(path) if line is None else f"{path}:{line}"
    message = str(info.value)
    assert message.startswith(f"{where}: {field}: " if field else f"{where}: "), message
    assert expectation in message, message
    assert "\n" not in message
    assert (info.value.source, info.value.line, info.value.field) == (str(path), line, field)


def test_unreadable_files_are_trace_errors(tmp_path: Path) -> None:
    missing = tmp_path / "absent.csv"
    with pytest.raises(TraceError, match=r"absent\.csv: expected a trace file, found none$"):
        load_flex_trace(missing)
    corrupt = tmp_path / "corrupt.csv.gz"
    corrupt.write_bytes(b"not gzip at all")
    with pytest.raises(TraceError, match=r"corrupt\.csv\.gz:1: expected gzip data"):
        load_production_trace(corrupt)
    truncated = tmp_path / "truncated.jsonl.gz"
    truncated.write_bytes(gzip.compress(MC.encode())[:-12])
    with pytest.raises(TraceError, match=r"truncated\.jsonl\.gz:[0-9]+: expected gzip data"):
        load_mooncake(truncated)
    latin = tmp_path / "latin.csv"
    latin.write_bytes((AZ + f"{T0},10,2\n").encode() + b"caf\xe9,1,1\n")
    with pytest.raises(TraceError, match=r"latin\.csv:3: expected UTF-8 text"):
        load_azure_llm(latin)
    with pytest.raises(TraceError, match="expected a regular file, found a directory"):
        load_flex_trace(tmp_path)


def test_trace_error_format_and_pickling() -> None:
    assert str(TraceError("a.csv", 3, "value", "expected x")) == "a.csv:3: value: expected x"
    assert str(TraceError("a.csv", None, "value", "expected x")) == "a.csv: value: expected x"
    assert str(TraceError("a.csv", 3, None, "expected x")) == "a.csv:3: expected x"
    assert str(TraceError("a.csv", None, None, "expected x")) == "a.csv: expected x"
    error = pickle.loads(pickle.dumps(TraceError("a.csv", 3, "value", "expected x")))
    assert (error.source, error.line, error.field, error.message) == (
        "a.csv",
        3,
        "value",
        "expected x",
    )
    assert isinstance(error, ValueError)


# --- what the loaders compute ------------------------------------------------------------


def test_gz_reads_transparently(tmp_path: Path) -> None:
    content = AZ + f"{T0},10,2\n{T1},20,3\n"
    plain = tmp_path / "a.csv"
    plain.write_text(content)
    packed = tmp_path / "a.csv.gz"
    packed.write_bytes(gzip.compress(content.encode()))
    one, two = load_azure_llm(plain), load_azure_llm(packed)
    assert one.source == "a.csv" and two.source == "a.csv.gz"
    np.testing.assert_array_equal(one.arrival_s, two.arrival_s)
    assert one.arrival_s[1] == pytest.approx(0.052, abs=1e-12)  # 7 digits kept exactly
    np.testing.assert_array_equal(two.input_tokens, [10, 20])


def test_alibaba_accepts_any_row_order(tmp_path: Path) -> None:
    rows = ["10,0,a", "20,0,b", "30,57,a", "40,114,a", "50,114,b", "60,114,c"]
    ordered, shuffled = tmp_path / "ordered.csv", tmp_path / "shuffled.csv"
    ordered.write_text(ALI + "\n".join(rows) + "\n")
    shuffled.write_text(ALI.upper() + "\n".join(rows[::-1]) + "\n")
    blank = tmp_path / "blank.csv"  # not the vectorised path: the row-by-row one
    blank.write_bytes((ALI + "\n".join(rows[:3]) + "\n\n" + "\n".join(rows[3:])).encode())
    crlf = tmp_path / "crlf.csv"
    crlf.write_bytes((ALI + "\n".join(rows)).replace("\n", "\r\n").encode())
    for path in (ordered, shuffled, blank, crlf):
        trace = load_production_trace(path)
        assert (trace.start_s, trace.step_s) == (0.0, 57.0)
        np.testing.assert_array_equal(trace.held, [2, 1, 3])
        np.testing.assert_allclose(trace.busy, [0.3, 0.3, 1.5])


def test_gpu_demand_csv_resamples_onto_the_smallest_spacing(tmp_path: Path) -> None:
    path = tmp_path / "demand.csv"
    path.write_text(" Timestamp , GPUs_demanded \n100,4\n160,6\n\n190,5\n310,2\n")
    trace = load_production_trace(path)
    assert (trace.start_s, trace.step_s, trace.duration_s) == (100.0, 30.0, 240.0)
    np.testing.assert_array_equal(trace.held, [4, 4, 6, 5, 5, 5, 5, 2])
    np.testing.assert_array_equal(trace.busy, trace.held)  # no duty_cycle: fully busy
    with_duty = tmp_path / "duty.csv"
    with_duty.write_text(DEM3 + "0,4,0.25\n0.1,8,0.5\n0.3,2,1\n")
    trace = load_gpu_demand_csv(with_duty)
    assert trace.step_s == pytest.approx(0.1)
    np.testing.assert_array_equal(trace.held, [4, 8, 8, 2])  # 0.3 / 0.1 is 2.999...
    np.testing.assert_allclose(trace.busy, [1, 4, 4, 2])


def test_at_is_sample_and_hold_clipped_to_the_trace() -> None:
    trace = ProductionTrace(
        "t", 500.0, 10.0, np.array([1, 2, 3], dtype=np.int64), np.array([0.5, 1, 3])
    )
    held, busy = trace.at(np.array([-5.0, 0, 9.99, 10, 20, 29, 30, 1e6]))
    np.testing.assert_array_equal(held, [1, 1, 1, 2, 3, 3, 3, 3])
    np.testing.assert_array_equal(busy, [0.5, 0.5, 0.5, 1, 3, 3, 3, 3])
    one_held, one_busy = trace.at(15.0)
    assert (int(one_held), float(one_busy)) == (2, 1.0)
    assert trace.duration_s == 30.0
    with pytest.raises(ValueError, match="finite"):
        trace.at(math.nan)
    with pytest.raises(ValueError, match="read-only"):
        trace.held[0] = 9
    with pytest.raises(ValueError, match="busy <= held"):
        ProductionTrace("t", 0.0, 1.0, np.array([1], dtype=np.int64), np.array([2.0]))


def test_mooncake_prefix_worked_example(tmp_path: Path) -> None:
    path = tmp_path / "small.jsonl"
    path.write_text(
        "\n".join(
            [
                _mc(timestamp=0, input_length=1536, hash_ids=[1, 2, 3]).strip(),
                _mc(timestamp=1000, input_length=1100, hash_ids=[1, 2, 9]).strip(),
                _mc(timestamp=1500, input_length=1024, hash_ids=[1, 2]).strip(),  # capped to 1
                _mc(timestamp=2500, input_length=1537, hash_ids=[1, 2, 3, 4]).strip(),
                _mc(timestamp=2500, input_length=600, hash_ids=[5, 1]).strip(),  # new first id
            ]
        )
        + "\n"
    )
    trace = load_mooncake(path)
    np.testing.assert_array_equal(trace.arrival_s, [0, 1, 1.5, 2.5, 2.5])
    np.testing.assert_array_equal(trace.prefix_blocks, [0, 2, 1, 3, 0])
    # block 1 last held at 1.5 s; block 3 of request 4 last held by request 1 only
    np.testing.assert_array_equal(trace.prefix_last_seen, [np.nan, 0, 1, 0, np.nan])


def _reference_prefix(
    arrival: list[float], tokens: list[int], ids: list[list[int]], block: int
) -> tuple[list[int], list[float]]:
    """Brute force over all earlier requests, straight from the definition."""
    blocks: list[int] = []
    seen: list[float] = []
    for i, own in enumerate(ids):
        shared = 0
        while (
            shared < len(own)
            and (shared + 1) * block <= tokens[i] - 1
            and any(own[shared] in ids[j] for j in range(i))
        ):
            shared += 1
        blocks.append(shared)
        holders = [arrival[j] for j in range(i) if shared and own[shared - 1] in ids[j]]
        seen.append(max(holders) if holders else math.nan)
    return blocks, seen


@st.composite
def _small_traces(draw: st.DrawFn) -> tuple[list[float], list[int], list[list[int]]]:
    size = draw(st.integers(1, 12))
    gaps = draw(st.lists(st.integers(0, 3), min_size=size, max_size=size))
    arrival = np.cumsum(gaps).astype(float).tolist()
    ids = draw(
        st.lists(st.lists(st.integers(0, 6), min_size=1, max_size=5), min_size=size, max_size=size)
    )
    tokens = [draw(st.integers(1, 4 * len(own))) for own in ids]
    return arrival, tokens, ids


@settings(max_examples=150, deadline=None)
@given(_small_traces())
def test_prefix_reuse_matches_brute_force(
    trace: tuple[list[float], list[int], list[list[int]]],
) -> None:
    arrival, tokens, ids = trace
    blocks, seen = prefix_reuse(
        np.asarray(arrival, dtype=np.float64), np.asarray(tokens, dtype=np.int64), ids, 4
    )
    want_blocks, want_seen = _reference_prefix(arrival, tokens, ids, 4)
    np.testing.assert_array_equal(blocks, want_blocks)
    np.testing.assert_array_equal(seen, want_seen)


# --- tiling ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mooncake() -> FlexTrace:
    return load_mooncake(bundled("mooncake"))


def test_tiled_conserves_requests_and_keeps_prefixes_inside_copies(mooncake: FlexTrace) -> None:
    size = mooncake.arrival_s.size
    period = math.floor(mooncake.duration_s) + 1  # 1023 s
    tiled = mooncake.tiled(3 * period)
    assert tiled.arrival_s.size == 3 * size
    assert (np.diff(tiled.arrival_s) >= 0).all()
    assert tiled.block_tokens == 512
    for copy in range(3):
        part = slice(copy * size, (copy + 1) * size)
        np.testing.assert_allclose(tiled.arrival_s[part], mooncake.arrival_s + copy * period)
        np.testing.assert_array_equal(tiled.prefix_blocks[part], mooncake.prefix_blocks)
        np.testing.assert_array_equal(tiled.input_tokens[part], mooncake.input_tokens)
        np.testing.assert_array_equal(tiled.output_tokens[part], mooncake.output_tokens)
        seen = tiled.prefix_last_seen[part]
        assert (seen[~np.isnan(seen)] >= copy * period).all()  # never points into a copy before
        assert tiled.prefix_blocks[copy * size] == 0
    cut = mooncake.tiled(1.5 * period)
    assert (cut.arrival_s < 1.5 * period).all()
    assert cut.arrival_s.size == size + int((mooncake.arrival_s < 0.5 * period).sum())


def test_tiled_rate_scale_compresses_time(mooncake: FlexTrace) -> None:
    size = mooncake.arrival_s.size
    fast = mooncake.tiled(4000, rate_scale=2)
    np.testing.assert_allclose(np.diff(fast.arrival_s[:size]), np.diff(mooncake.arrival_s) / 2)
    period = math.floor(mooncake.duration_s / 2) + 1  # 512 s
    assert fast.arrival_s[size] == period
    assert fast.arrival_s.size == size * 7 + int((mooncake.arrival_s / 2 < 4000 - 7 * period).sum())
    has = fast.prefix_blocks[:size] > 0
    np.testing.assert_allclose(
        fast.prefix_last_seen[:size][has], mooncake.prefix_last_seen[has] / 2
    )
    slow = mooncake.tiled(4000, rate_scale=0.5)
    assert slow.arrival_s.size == size + int((mooncake.arrival_s * 2 < 4000 - 2045).sum())
    with pytest.raises(ValueError, match="rate_scale"):
        mooncake.tiled(100, rate_scale=0)
    with pytest.raises(ValueError, match="horizon_s"):
        mooncake.tiled(-1)


def test_tiled_day_covers_the_day(mooncake: FlexTrace) -> None:
    """(Its cost is measured by bench/whatif.py, not asserted here.)"""
    day = mooncake.tiled(86_400, rate_scale=1.5)
    assert day.arrival_s.size > 500_000
    assert day.arrival_s[-1] < 86_400
    assert (np.diff(day.arrival_s) >= 0).all()


def test_tiled_single_request_trace() -> None:
    one = FlexTrace(
        "one",
        np.zeros(1),
        np.ones(1, dtype=np.int64),
        np.ones(1, dtype=np.int64),
        np.zeros(1, dtype=np.int64),
        np.full(1, np.nan),
        0,
    )
    np.testing.assert_array_equal(one.tiled(3.5).arrival_s, [0, 1, 2, 3])  # period 1 s


# --- the synthetic day -------------------------------------------------------------------


def test_diurnal_is_seeded_bounded_and_peaks_in_the_afternoon() -> None:
    day = diurnal(hours=24, peak_gpus=60, trough_gpus=20, seed=3)
    again = diurnal(hours=24, peak_gpus=60, trough_gpus=20, seed=3)
    other = diurnal(hours=24, peak_gpus=60, trough_gpus=20, seed=4)
    np.testing.assert_array_equal(day.held, again.held)
    assert (day.held != other.held).any()
    assert day.source == "diurnal(seed=3)"
    assert (day.start_s, day.step_s, day.held.size, day.duration_s) == (0.0, 60.0, 1440, 86_400)
    np.testing.assert_allclose(day.busy, day.held * 0.5)
    for seed in range(10):
        week = diurnal(hours=24 * 7, peak_gpus=60, trough_gpus=20, seed=seed, noise=0.2)
        assert week.held.min() >= 20 and week.held.max() <= 60
        hourly = diurnal(hours=24, peak_gpus=60, trough_gpus=20, seed=seed).held.reshape(24, 60)
        assert 14 <= int(hourly.mean(axis=1).argmax()) <= 17  # the 16:00 peak, under noise
        assert 2 <= int(hourly.mean(axis=1).argmin()) <= 5  # the 04:00 trough
    smooth = diurnal(hours=24, peak_gpus=60, trough_gpus=20, seed=0, noise=0)
    assert (smooth.held[4 * 60], smooth.held[16 * 60]) == (20, 60)
    at_peak = np.flatnonzero(smooth.held == 60)
    assert np.mean(at_peak) / 60 == pytest.approx(16, abs=0.05)
    with pytest.raises(ValueError, match="trough_gpus <= peak_gpus"):
        diurnal(hours=1, peak_gpus=1, trough_gpus=2, seed=0)
