"""The tuner's proposals in a replay as text (``gpupool whatif --tuner``): when each was made,
what it changed, how its review ended and what it did to the replay's figures."""

from __future__ import annotations

from collections.abc import Callable

from runtime.sim.tuning import ProposalRecord, Span, TunerRun


def clock(seconds: float) -> str:
    """Simulated time as ``h:mm`` from the replay's start."""
    minutes = round(seconds / 60)
    return f"{minutes // 60}:{minutes % 60:02d}"


def change_text(p: ProposalRecord) -> str:
    """The proposal's changes, ``field before -> after`` each."""
    return "; ".join(f"{c.field} {c.before:g} -> {c.after:g}" for c in p.changes)


def outcome_text(p: ProposalRecord) -> str:
    """Merged, refused (and why) or still in review when the replay ended."""
    if p.outcome == "applied" and p.decided_at_s is not None:
        return f"merged at {clock(p.decided_at_s)}"
    if p.outcome == "refused" and p.decided_at_s is not None:
        return f"refused at {clock(p.decided_at_s)}: {p.refusal}"
    return f"in review when the replay ended (due {clock(p.review_due_s)})"


def effect_text(p: ProposalRecord) -> str:
    """The replay's figures before and after a merged proposal ("" where it was not)."""
    b, a = p.before, p.after
    if b is None or a is None:
        return ""

    def pair(name: str, get: Callable[[Span], float], digits: int) -> str:
        return f"{name} {get(b):,.{digits}f} -> {get(a):,.{digits}f}"

    return (
        f"{clock(b.start_s)}-{clock(b.end_s)} vs {clock(a.start_s)}-{clock(a.end_s)}: "
        + ", ".join(
            [
                pair("flex evictions/min", lambda x: x.evictions_per_minute, 2),
                pair(
                    "production pod-minutes unmet per hour",
                    lambda x: x.prod_unmet_pod_minutes_per_hour,
                    1,
                ),
                pair("flex GPUs held", lambda x: x.flex_gpus_mean, 1),
                pair("flex tokens/s", lambda x: x.flex_tokens_per_s, 0),
            ]
        )
    )


def tuner_lines(tuner: TunerRun | None) -> list[str]:
    """The tuner's proposals in the pooled replay; nothing without ``--tuner``."""
    if tuner is None:
        return []
    merged = sum(1 for p in tuner.proposals if p.outcome == "applied")
    lines = [
        f"Tuner in the loop: {tuner.cycles} cycles, one every {tuner.interval_s:g} s of "
        f"simulated time; proposals merged {tuner.review_delay_s:g} s after they are made; "
        f"{len(tuner.proposals)} proposal(s), {merged} merged; "
        f"{tuner.compaction_requests} compaction request(s) (counted, not modelled).",
    ]
    for p in tuner.proposals:
        lines.append(f"- {clock(p.proposed_at_s)} `{p.rule}`: {change_text(p)}; {outcome_text(p)}")
        effect = effect_text(p)
        if effect:
            lines.append(f"  - {effect}")
        lines.append(f"  - why: {p.why}")
    if not tuner.proposals:
        lines.append("- no proposal")
    lines.append("The last cycle's rules that decided nothing:")
    lines += [f"- {n}" for n in tuner.last_noops] or ["- none"]
    return lines
