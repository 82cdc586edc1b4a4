"""Money: the pools' ``cost`` values the harvested GPU-hours in reports, PR comments and advice."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from policy import PolicyError, PoolPolicy, load_policy, parse_policy
from runtime.sim import markdown
from runtime.sim.report import HOURS_PER_MONTH, summarize
from tests.sim.test_headline import _flat, _ints, _replay, _result


def _priced(prod: dict[str, Any] | None, flex: dict[str, Any] | None) -> PoolPolicy:
    document = load_policy().model_dump(mode="json", by_alias=True)
    document["node_pools"][0]["cost"] = prod
    document["node_pools"][1]["cost"] = flex
    return parse_policy(document)


def _lent() -> Any:
    """An hour: flex holds 4 GPUs of gpu-prod and 8 of gpu-flex."""
    return _replay(
        "pooled",
        total=_ints(16),
        prod_busy=_flat(4.0),
        flex_running=_ints(12),
        flex_duty=_flat(1.0),
        flex_by_pool={"gpu-prod": _ints(4), "gpu-flex": _ints(8)},
    )


def test_harvested_gpu_hours_are_valued_at_their_pools_price() -> None:
    policy = _priced({"gpu_hour": 3.0, "currency": "USD"}, {"gpu_hour": 2.0, "currency": "USD"})
    value = summarize(_lent(), policy).harvest_value
    assert value is not None
    assert (value.currency, value.amount, value.unpriced_gpu_h) == ("USD", 4 * 3.0 + 8 * 2.0, 0.0)
    assert value.per_month == pytest.approx(28.0 * HOURS_PER_MONTH)
    assert value.text() == "USD 28 (USD 20,440 a month)"


def test_a_pool_without_a_price_is_said_not_valued() -> None:
    policy = _priced(None, {"gpu_hour": 2.0, "currency": "EUR"})
    value = summarize(_lent(), policy).harvest_value
    assert value is not None and (value.amount, value.unpriced_gpu_h) == (16.0, 4.0)
    assert value.text().endswith("; 4.0 GPU-h on pools without a cost not valued")


def test_without_prices_there_is_no_value() -> None:
    summary = summarize(_lent(), load_policy())
    assert summary.harvest_value is None
    assert markdown.value_text(summary) == "n/a"


@pytest.mark.parametrize(
    ("prod", "message"),
    [
        ({"gpu_hour": 3.0, "currency": "EUR"}, "EUR differs from the USD of the first priced pool"),
        ({"gpu_hour": 0, "currency": "USD"}, "greater than 0"),
        ({"gpu_hour": 3.0, "currency": "usd"}, "should match pattern"),
        ({"gpu_hour": 3.0, "currency": "USD\n"}, "should match pattern"),
    ],
)
def test_prices_are_positive_and_in_one_iso_currency(prod: dict[str, Any], message: str) -> None:
    document = load_policy().model_dump(mode="json", by_alias=True)
    document["node_pools"][0]["cost"] = {"gpu_hour": 3.0, "currency": "USD"}
    document["node_pools"][1]["cost"] = prod
    with pytest.raises(PolicyError, match=message):
        parse_policy(document)


def test_reports_and_pull_request_comments_show_the_value() -> None:
    policy = _priced({"gpu_hour": 3.0, "currency": "USD"}, {"gpu_hour": 2.0, "currency": "USD"})
    fixed = _replay(
        "fixed", total=_ints(16), prod_busy=_flat(4.0), flex_running=_ints(8), flex_duty=_flat(1.0)
    )
    head = _result(policy, _lent(), fixed)
    assert (
        "harvested 12.0 of a 12.0 GPU-h bound (efficiency 1.00), worth USD 28 (USD 20,440 a month)"
        in markdown.headline(head)
    )
    assert "| harvested GPU-h worth | USD 28 (USD 20,440 a month) | n/a |" in markdown.report(head)
    smaller = summarize(
        replace(
            _lent(),
            series=replace(
                _lent().series, flex_by_pool={"gpu-prod": _ints(0), "gpu-flex": _ints(8)}
            ),
        ),
        policy,
    )
    base = replace(head, pooled=smaller)
    comment = markdown.comparison(base, head, base_ref="main", head_ref="lend")
    assert "**Harvested GPU time worth USD 11,680 -> 20,440 a month (+8,760)**" in comment
