"""Azure trace loading and the internal-fragmentation report."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.vllm.backends import block_rule
from runtime.vllm.fragmentation import neighbour_block_sizes, waste_report
from runtime.vllm.trace import TraceError, load_azure_trace

AZURE_CODE = (
    Path(__file__).resolve().parents[1] / "fixtures" / "traces" / "azure-code-first-1000.csv"
)
"""First 1,000 requests of the public Azure LLM inference trace (Splitwise, ISCA'24)."""

HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
FLASH = block_rule("flash_attn", mla=False)


def test_hand_computed_waste() -> None:
    # lengths 10, 16, 17 at block 16: reserved 16 + 16 + 32 = 64, used 43, wasted 21
    report = waste_report([10, 16, 17, 600], chosen_block_size=16, rule=FLASH, max_model_len=512)
    assert report.too_long == 1  # 600 > 512: vLLM rejects it; left out of both sides
    by_size = {w.label: w for w in report.paged}
    chosen = by_size["paged, block 16"]
    assert (chosen.reserved_tokens, chosen.used_tokens, chosen.wasted_tokens) == (64, 43, 21)
    assert chosen.waste_share == 21 / 64
    assert not by_size["paged, block 8"].legal  # flash_attn needs multiples of 16
    assert by_size["paged, block 8"].reserved_tokens == 16 + 16 + 24
    assert report.contiguous.reserved_tokens == 3 * 512
    assert report.contiguous.wasted_tokens == 3 * 512 - 43
    assert neighbour_block_sizes(16) == [8, 16, 32, 64]


def test_real_azure_trace_meets_the_goal() -> None:
    requests = load_azure_trace(AZURE_CODE)
    assert len(requests) == 1000
    report = waste_report(
        [r.total_tokens for r in requests], chosen_block_size=16, rule=FLASH, max_model_len=8192
    )
    chosen = next(w for w in report.paged if w.label == "paged, block 16")
    assert chosen.waste_share < 0.02
    assert report.contiguous.waste_share > 0.60
    shares = [w.waste_share for w in report.paged]
    assert shares == sorted(shares)  # larger blocks waste more


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("2023-11-16 18:17:03.9799600,4808\n", ":2: expected 3 columns, found 2"),
        ("2023-11-16 18:17:03.9799600,4808,10\nnot-a-time,1,1\n", ":3: TIMESTAMP: expected"),
        ("2023-11-16 18:17:03.9799600,-4,10\n", ":2: ContextTokens: expected an integer >= 1"),
        ("2023-11-16 18:17:03.9799600,4,x\n", ":2: GeneratedTokens: expected an integer >= 0"),
        ("", ":1: the trace has a header but no requests"),
    ],
)
def test_malformed_rows_name_file_and_line(tmp_path: Path, body: str, message: str) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text(HEADER + body)
    with pytest.raises(TraceError) as error:
        load_azure_trace(trace)
    assert str(error.value).startswith(f"{trace}:")
    assert message in str(error.value)


def test_wrong_header(tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text("timestamp,input_length,output_length\n1,2,3\n")
    with pytest.raises(TraceError, match=r"trace.csv:1: expected the header TIMESTAMP"):
        load_azure_trace(trace)
