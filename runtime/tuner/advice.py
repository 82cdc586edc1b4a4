"""Pure: the advise lever's decisions and its pull request's text.

Every ``tuner.advise.every`` a cycle without a rule's proposal sweeps policy variants on
production's own recent demand (the edge is ``cycle.py``) and proposes the advisor's pick.
Here: whether a sweep is due, which variants it replays, whether the pick is worth a
proposal, and the branch, title and body of that proposal.
"""

from __future__ import annotations

import hashlib
import math
import shlex
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import PurePosixPath
from typing import Any

from policy.pool import PoolPolicy
from policy.tuner import AdviseLever
from runtime.advise import levers, report
from runtime.advise.front import Rated
from runtime.advise.sweep import Sweep
from runtime.tuner.proposals import NoOp, TunerState
from runtime.tuner.prtext import BRANCH_PREFIX, manifest_section
from runtime.tuner.yamledit import lookup, render

RULE = "advise"
"""Rule name of the lever's proposals and no-ops (and the metrics' label)."""

FOLDER = "advise"
"""Folder beside the policy file that the proposal's branch writes the trace and plot to."""

TRACE = "production.csv"
"""The production trace the sweep replayed (``timestamp,gpus_demanded,duty_cycle``)."""


def due(lever: AdviseLever, state: TunerState, *, at: float, cooldown_s: float) -> NoOp | None:
    """None when the lever may sweep now; otherwise the no-op saying when it may."""
    last = state.last_advise_at
    if last is not None and at - last < lever.every_s:
        return NoOp(
            RULE,
            f"last sweep {at - last:.0f} s ago; tuner.advise.every is {lever.every}",
        )
    since = None if state.last_proposal_at is None else at - state.last_proposal_at
    if since is not None and since < cooldown_s:
        return NoOp(RULE, f"cooldown: last proposal {since:.0f} s ago; no sweep until it ends")
    return None


def variants(policy: PoolPolicy, lever: AdviseLever) -> list[levers.Variant]:
    """The sweep's variants, the current policy first: the grid of ``tuner.advise.vary``
    (at most ``MAX_VARIANTS``, counted before it is built), or the levers that matter for
    the policy (``gpupool advise``'s default). Raises ``LeverError`` naming the entry the
    policy cannot take."""
    if not lever.vary:
        return levers.default_variants(policy)
    try:
        chosen = [levers.parse_vary(v) for v in lever.vary]
        size = math.prod(len(c.values) for c in chosen)
        if size > levers.MAX_VARIANTS:
            raise levers.LeverError(
                f"a grid of {size:,} variants, over {levers.MAX_VARIANTS}; vary fewer values"
            )
        return levers.grid(policy, chosen)
    except levers.LeverError as exc:
        raise levers.LeverError(f"tuner.advise.vary: {exc}") from None


def branch_name(base_text: str) -> str:
    """Derived from the base policy alone: one advise proposal per policy as committed, so a
    later sweep of the same policy (whatever its pick) finds it instead of opening another;
    the next proposal waits for the policy to change (the merge, or any edit)."""
    digest = hashlib.sha256(base_text.encode()).hexdigest()[:12]
    return f"{BRANCH_PREFIX}{RULE}-{digest}"


def artifact_paths(policy_path: str) -> tuple[str, str]:
    """(trace, plot) as committed on the proposal's branch: ``advise/`` beside the policy."""
    folder = PurePosixPath(policy_path).parent / FOLDER
    return str(folder / TRACE), str(folder / report.PLOT)


def choose(pick: Rated | None) -> Rated | NoOp:
    """The pick when it changes the policy; otherwise why nothing is proposed."""
    if pick is None:
        return NoOp(
            RULE,
            "no variant of the sweep is acceptable (production short beyond the goals' "
            "allowance, waiting longer, or more than 5 evictions a minute): nothing proposed",
        )
    if not pick.point.variant.edits:
        return NoOp(
            RULE,
            "the current policy is the sweep's pick: no variant harvests more with "
            "production unharmed; nothing proposed",
        )
    return pick


def title(pick: Rated) -> str:
    return f"Advise: {pick.point.variant.name}"


def pr_body(
    sweep: Sweep,
    rated: Sequence[Rated],
    pick: Rated,
    *,
    policy: PoolPolicy,
    policy_path: str,
    window: str,
    at: float,
    samples: int,
    plot_link: str,
    manifest_diff: str,
    vary: Sequence[str],
) -> str:
    """Markdown: the change, the sweep (recommendation, front, plot, table), the rendered
    manifest diff and the command that repeats the sweep from the committed trace."""
    when = datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    trace, _ = artifact_paths(policy_path)
    document: Mapping[str, Any] = policy.model_dump(mode="json", by_alias=True)
    varied = "".join(f" \\\n  --vary {shlex.quote(v)}" for v in vary)
    lines = [
        f"Proposed by `gpupool tune` (the advise lever) from production's demand over the "
        f"{window} ending {when} ({samples:,} samples, committed as `{trace}`): the "
        f"advisor's pick of {len(sweep.points)} policy variants replayed on it.",
        "",
        "## Change",
        "",
        f"| `{policy_path}` field | before | after |",
        "|---|---|---|",
        *(
            f"| `{e.dotted}` | `{render(lookup(document, e.path))}` | `{render(e.value)}` |"
            for e in pick.point.variant.edits
        ),
        "",
        report.markdown(sweep, rated, pick, plot_link=plot_link).rstrip("\n"),
        "",
        *manifest_section(manifest_diff),
        "",
        "## Repeat the sweep",
        "",
        "```",
        f"gpupool advise --policy {policy_path} --prod-trace {trace}{varied} \\",
        "  --out advice",
        "```",
        "",
        "Merge to apply with `pulumi up` after review; close to reject (the lever proposes "
        "nothing more for this policy until it changes).",
    ]
    return "\n".join(lines) + "\n"
