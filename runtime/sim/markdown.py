"""A what-if result as text: the headline, a table, assumptions; one run or base vs head."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from runtime.sim.class_text import class_lines
from runtime.sim.goals import Goal, production_unharmed
from runtime.sim.report import KvTier, Summary
from runtime.sim.tuner_text import tuner_lines
from runtime.sim.whatif import Result

MARKER = "<!-- gpupool-whatif -->"
"""Hidden marker of the pull-request comment (the check updates the comment carrying it)."""
LIMIT = 65_000
"""GitHub refuses comments over 65,536 characters; stay under with room for the diff."""

Row = tuple[str, str, str]


def rows(pooled: Summary, fixed: Summary) -> list[Row]:
    """(figure, pooled, fixed) for the table of one run; GPU-hours unless it says."""
    return [
        *((name, text(pooled), text(fixed)) for name, text in FIGURES),
        *(
            (f"allocated share, {pool}", f"{share:.0%}", "")
            for pool, share in pooled.allocation_share.items()
        ),
        *((f"duty cycle, {pool}", f"{duty:.0%}", "") for pool, duty in pooled.duty_cycle.items()),
    ]


def _number(x: float, digits: int = 1) -> str:
    return f"{x:,.{digits}f}"


def _hit_rate(rate: float | None) -> str:
    return "n/a" if rate is None else f"{rate:.1%}"


def efficiency_text(efficiency: float | None) -> str:
    """Harvest efficiency, or n/a where there was nothing to harvest."""
    return "n/a" if efficiency is None else f"{efficiency:.2f}"


def value_text(summary: Summary) -> str:
    """The harvest's value at the pools' prices; n/a without ``node_pools[].cost`` and in the
    fixed topology (its flex GPUs belong to no pool)."""
    return "n/a" if summary.harvest_value is None else summary.harvest_value.text()


def value_delta(base: Summary, head: Summary) -> str | None:
    """``Harvested GPU time worth USD 146,080 -> 152,000 a month (+5,920)``: the change's
    value per month, in the style of a cost-estimate comment; None unless both are priced
    in one currency."""
    b, h = base.harvest_value, head.harvest_value
    if b is None or h is None or b.currency != h.currency:
        return None
    return (
        f"Harvested GPU time worth {h.currency} {b.per_month:,.0f} -> {h.per_month:,.0f} a month "
        f"({h.per_month - b.per_month:+,.0f})"
    )


def evicted_text(summary: Summary) -> str:
    """``12 (9)``: flex pods evicted over the replay (the evictions plot's events, which the
    eviction alert counts) and, of them, running replicas (the KV tier's evictions)."""
    return f"{summary.evictions_total:,} ({summary.kv_tier.evicted_replicas:,})"


def losses_text(summary: Summary) -> str:
    """``report.HarvestLosses`` in the table's order."""
    lost = summary.harvest_lost
    parts = (lost.production_headroom, lost.reserve, lost.other_free, lost.flex_starting)
    return " / ".join(f"{value:,.1f}" for value in parts)


def pending_text(summary: Summary) -> str:
    """Production pod-minutes pending by cause: ``preemption / fragmented / capacity``."""
    return " / ".join(f"{summary.prod_pending_pod_minutes.get(c, 0.0):,.1f}" for c in CAUSES)


CAUSES = ("preemption", "fragmented", "capacity")
"""Why a production pod waited (``runtime.sim.cluster_objects.Waiting``), in the report's order."""


def capped_text(summary: Summary, unit: str = "") -> str:
    """Hours each workload's bound capped it, ``19.3{unit} (llama-8b-flex)`` for each it
    capped; 0.0 where it never did; n/a in the fixed topology (no HPA there)."""
    if not summary.flex_capped_h:
        return "n/a"
    if not any(summary.flex_capped_h.values()):
        return "0.0"
    return ", ".join(f"{h:,.1f}{unit} ({name})" for name, h in summary.flex_capped_h.items() if h)


def _first_minute(tier: KvTier) -> str:
    if tier.note is not None:
        return tier.note
    kept, survived = tier.first_minute_hit_rate_with_tier, tier.first_minute_hit_rate_without_tier
    return f"{kept:.1%} / {survived:.1%}"


def _saved(tier: KvTier) -> str:
    return "n/a" if tier.prefill_tokens_saved is None else f"{tier.prefill_tokens_saved:,.0f}"


FigureRow = tuple[str, Callable[[Summary], str]]
"""A row of the one-run table: its name and the figure's text for one replay."""

FIGURES: tuple[FigureRow, ...] = (
    ("useful GPU-h (production served + flex busy)", lambda s: _number(s.useful_gpu_h)),
    ("cluster duty cycle", lambda s: f"{s.cluster_duty_cycle:.1%}"),
    (
        "harvested / bound GPU-h",
        lambda s: f"{_number(s.harvested_gpu_h)} / {_number(s.harvest_bound_gpu_h)}",
    ),
    ("harvest efficiency", lambda s: efficiency_text(s.harvest_efficiency)),
    (
        "bound not harvested, GPU-h (production headroom / reserve / other free / flex starting)",
        losses_text,
    ),
    (
        "production busy GPU-h wanted / short",
        lambda s: f"{_number(s.prod_busy_gpu_h)} / {_number(s.prod_short_gpu_h, 2)}",
    ),
    ("production pod-minutes pending (preemption / fragmented / capacity)", pending_text),
    (
        "flex evictions/min (mean / max)",
        lambda s: f"{s.evictions_per_minute_mean:.2f} / {s.evictions_per_minute_max:.2f}",
    ),
    ("flex pods evicted (running replicas)", evicted_text),
    ("harvested GPU-h worth", value_text),
    ("flex tokens/s", lambda s: _number(s.flex_tokens_per_s, 0)),
    ("flex capped by max_replicas, h", capped_text),
    ("KV hit rate", lambda s: _hit_rate(s.kv_hit_rate)),
    ("KV tokens lost to evictions", lambda s: _number(s.kv_tokens_lost, 0)),
    (
        "KV hit rate, 1st minute after an eviction, with / without the snapshot tier",
        lambda s: _first_minute(s.kv_tier),
    ),
    ("prefill tokens the snapshot tier saves", lambda s: _saved(s.kv_tier)),
    ("flex GPU duty cycle", lambda s: f"{s.flex_duty_cycle:.0%}"),
)
"""The one-run table's rows before the per-pool ones, in the report's order."""


def tier_lines(summary: Summary) -> list[str]:
    """What the KV snapshot tier buys in this replay, with the policy's mode stated."""
    t = summary.kv_tier
    served = "with the tier" if t.served_with_tier else "without the tier"
    if t.note is None:
        first = (
            f"{t.first_minute_hit_rate_with_tier:.1%} with the snapshot tier, "
            f"{t.first_minute_hit_rate_without_tier:.1%} without "
            f"(evicted running flex replicas: {t.evicted_replicas:,}; prompt tokens queried "
            f"in their first minutes: {t.first_minute_query_tokens:,})"
        )
    else:
        first = f"n/a: {t.note}"
    return [
        f"KV snapshot tier: this policy has `kv_cache.kv_preservation: {t.kv_preservation}`, so "
        f"the replay served {served}; with and without count the same served requests:",
        f"- prefix hit rate in the first minute after an eviction: {first}",
        "- prefill tokens the tier saves over the replay (recompute avoided after every "
        f"replica exit): {_saved(t)}",
        "- KV tokens lost with or without the tier (in-flight context of replicas that went "
        f"away): {summary.kv_tokens_lost:,.0f}",
    ]


def check_lines(summary: Summary) -> list[str]:
    """The closed-loop properties, each with whether it held in this replay."""
    c = summary.checks
    grace_s = c["prod_wait_bound_s"]
    items = [
        (
            "idle flex never asks beyond the GPUs its pool can place",
            c["flex_budget_beyond_pool_gpus_max"] == 0,
            f"budget beyond placeable GPUs: {c['flex_budget_beyond_pool_gpus_max']:g} (max), "
            f"flex pods pending: {c['flex_pods_pending_max']:g} (max)",
        ),
        (
            "flex never sheds itself while production needs nothing",
            c["flex_self_shed_minutes"] == 0,
            f"{c['flex_self_shed_minutes']:.1f} minutes of shedding with production's share "
            "under the shed threshold and every reserve intact",
        ),
        (
            "production never waits longer than a flex pod's graceful shutdown",
            c["prod_wait_max_s"] <= grace_s,
            f"longest wait {c['prod_wait_max_s']:.0f} s (bound {grace_s:.0f} s: shutdown budget "
            f"and one loop step); {c['prod_waited_while_flex_ran_pod_minutes']:.1f} production "
            "pod-minutes pending while flex ran",
        ),
    ]
    return [f"- {'holds' if ok else 'VIOLATED'}: {name} ({detail})" for name, ok, detail in items]


VERDICT = {True: "met", False: "MISSED", None: "n/a"}


def _verdict(goal: Goal) -> str:
    return f"{VERDICT[goal.met]}: {goal.value}"


def goal_lines(result: Result) -> list[str]:
    """The product's goals, each met, MISSED or not applicable in this replay."""
    return [f"- {VERDICT[g.met]}: {g.name} {g.value} (goal {g.target})" for g in result.goals]


def notable_lines(result: Result) -> list[str]:
    """One line per loss a reader must not miss, with its cause and the fix: each workload's
    requests dropped over ``max_model_len`` (any: each is work refused), then each MISSED
    goal."""
    lines = []
    for name, r in result.pooled.requests.items():
        if r.dropped:
            limit = result.max_model_len.get(name)
            over = f"its max_model_len ({limit:,} tokens)" if limit else "max_model_len"
            total = r.arrived + r.dropped  # ``arrived``: the requests vLLM accepted
            lines.append(
                f"- DROPPED: {r.dropped:,} of {total:,} {name} requests "
                f"({r.dropped / total:.1%}) are longer than {over}, which vLLM refuses; "
                f"raise {name}'s max_model_len (its KV cache must hold one such request: "
                "`gpupool vllm-args` shows the plan) or send longer requests to a model with "
                "a longer context"
            )
    lines += [f"- MISSED: {g.name}: {g.cause}" for g in result.goals if g.cause]
    return lines


def report(result: Result, *, plots: Sequence[str] = ()) -> str:
    """Markdown of one run (``gpupool whatif --policy``); ``plots``: image paths relative to
    the report's folder, shown after the headline in their order."""
    p, f = result.pooled, result.fixed
    lines = [
        f"## What-if: pooled vs fixed topology, {p.hours:g} h",
        "",
        headline(result),
        "",
        *_section(["Notable:", *notable] if (notable := notable_lines(result)) else []),
        *_section([f"![{Path(name).stem}]({name})" for name in plots]),
        "| | pooled | fixed |",
        "|---|---:|---:|",
        *(f"| {a} | {b} | {c} |" for a, b, c in rows(p, f)),
        "",
        "Closed-loop checks:",
        *check_lines(p),
        "",
        "Product goals:",
        *goal_lines(result),
        "",
        *tier_lines(p),
        "",
        *_section(class_lines(p, f)),
        *_section(tuner_lines(result.tuner)),
        "Assumptions:",
        *(f"- {a}" for a in result.assumptions),
        "",
        _requests(p),
    ]
    return "\n".join(lines) + "\n"


def _section(lines: list[str]) -> list[str]:
    """``lines`` and a blank line after them; nothing for no lines."""
    return [*lines, ""] if lines else []


def headline(result: Result) -> str:
    """One line: the useful GPU-hours ratio first, then harvest, production, evictions and
    flex tokens/s (and the bound, where it capped flex)."""
    p, f = result.pooled, result.fixed
    harmed = "unharmed" if production_unharmed(p, f) else "HARMED"
    pending = ", ".join(f"{p.prod_pending_pod_minutes.get(c, 0.0):,.1f} {c}" for c in CAUSES)
    parts = [
        f"**{result.useful_gpu_h_ratio:.2f}x cluster useful GPU-hours** (pooled "
        f"{p.useful_gpu_h:,.1f} vs fixed {f.useful_gpu_h:,.1f}; cluster duty cycle "
        f"{f.cluster_duty_cycle:.1%} -> {p.cluster_duty_cycle:.1%})",
        f"harvested {p.harvested_gpu_h:,.1f} of a {p.harvest_bound_gpu_h:,.1f} GPU-h bound "
        f"(efficiency {efficiency_text(p.harvest_efficiency)})"
        + ("" if p.harvest_value is None else f", worth {p.harvest_value.text()}"),
        f"production {harmed} ({p.prod_short_gpu_h:,.2f} busy GPU-h short vs "
        f"{f.prod_short_gpu_h:,.2f} fixed; pending pod-minutes: {pending})",
        f"flex evictions max {p.evictions_per_minute_max:.2f}/min",
        f"flex tokens/s {p.flex_tokens_per_s:,.0f} pooled vs {f.flex_tokens_per_s:,.0f} fixed",
    ]
    if any(p.flex_capped_h.values()):
        parts.append(f"flex capped by max_replicas for {capped_text(p, ' h')}")
    return "; ".join(parts)


def _requests(summary: Summary) -> str:
    lines = [
        "| workload | arrived | completed | outstanding | dropped (over max_model_len) |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, r in summary.requests.items():
        lines.append(
            f"| {name} | {r.arrived:,} | {r.completed:,} | {r.outstanding:,} | {r.dropped:,} |"
        )
    return "\n".join(lines)


def comparison(
    base: Result, head: Result, *, base_ref: str, head_ref: str, plots: Sequence[str] = ()
) -> str:
    """The pull-request comment: what merging ``head`` changes against ``base``."""
    b, h = base.pooled, head.pooled
    lines = [
        MARKER,
        f"## gpupool what-if: `{base_ref}` -> `{head_ref}`, {h.hours:g} h replay",
        "",
        *([] if (worth := value_delta(b, h)) is None else [f"**{worth}**", ""]),
        f"Head: {headline(head)}",
        "",
        *_section(["Notable (head):", *n] if (n := notable_lines(head)) else []),
        f"Base: {headline(base)}",
        "",
        _change_line(base, head),
        "",
        *_comparison_table(base, head, base_ref=base_ref, head_ref=head_ref),
        "",
        *(f"Plot: `{name}`" for name in plots),
        "",
        *_comparison_details(base, head),
    ]
    text = "\n".join(lines) + "\n"
    if len(text) > LIMIT:
        raise ValueError(f"the what-if comment is {len(text):,} characters, over {LIMIT:,}")
    return text


def _delta(name: str, before: float, after: float, digits: int = 1, unit: str = "") -> str:
    """``name 1.0 -> 2.0 (+1.0)``."""
    change = after - before
    return f"{name} {before:,.{digits}f} -> {after:,.{digits}f}{unit} ({change:+,.{digits}f})"


def _change_line(base: Result, head: Result) -> str:
    """The headline figures' changes from ``base`` to ``head``, on one line."""
    b, h = base.pooled, head.pooled
    return "; ".join(
        [
            _delta("useful GPU-h ratio", base.useful_gpu_h_ratio, head.useful_gpu_h_ratio, 2, "x"),
            _delta("harvested GPU-h", b.harvested_gpu_h, h.harvested_gpu_h),
            _delta("production busy GPU-h short", b.prod_short_gpu_h, h.prod_short_gpu_h, 2),
            _delta(
                "production pod-minutes unmet", b.prod_unmet_pod_minutes, h.prod_unmet_pod_minutes
            ),
            _delta(
                "evictions/min (max)", b.evictions_per_minute_max, h.evictions_per_minute_max, 2
            ),
            _delta("flex tokens/s", b.flex_tokens_per_s, h.flex_tokens_per_s, 0),
        ]
    )


def _comparison_table(base: Result, head: Result, *, base_ref: str, head_ref: str) -> list[str]:
    """The one-run table's figures and the goals' verdicts, base against head."""
    return [
        f"| | base `{base_ref}` | head `{head_ref}` |",
        "|---|---:|---:|",
        f"| pooled / fixed useful GPU-h | {base.useful_gpu_h_ratio:.2f}x "
        f"| {head.useful_gpu_h_ratio:.2f}x |",
        *(
            f"| {name} | {before} | {after} |"
            for (name, before, _), (_, after, _) in zip(
                rows(base.pooled, base.fixed), rows(head.pooled, head.fixed), strict=True
            )
        ),
        *(
            f"| goal: {gb.name} ({gb.target}) | {_verdict(gb)} | {_verdict(gh)} |"
            for gb, gh in zip(base.goals, head.goals, strict=True)
        ),
    ]


def _comparison_details(base: Result, head: Result) -> list[str]:
    """The folded part of the comment: assumptions, checks, goals, the KV tier, traffic
    classes, the tuner and the requests."""
    b, h = base.pooled, head.pooled
    return [
        "<details><summary>Assumptions and details</summary>",
        "",
        "Base:",
        *(f"- {a}" for a in base.assumptions),
        "",
        "Head:",
        *(f"- {a}" for a in head.assumptions),
        "",
        "Closed-loop checks (head):",
        *check_lines(h),
        "",
        "Product goals (head):",
        *goal_lines(head),
        "",
        "Base:",
        *tier_lines(b),
        "",
        "Head:",
        *tier_lines(h),
        "",
        *_section(["Head:", *class_lines(h, head.fixed)] if h.traffic_classes else []),
        *_section(["Base:", *tuner_lines(base.tuner)] if base.tuner else []),
        *_section(["Head:", *tuner_lines(head.tuner)] if head.tuner else []),
        _requests(h),
        "",
        "</details>",
    ]
