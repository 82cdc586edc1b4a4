"""Pure: the branch name, title and markdown body of a proposal."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from datetime import UTC, datetime

from runtime.tuner.proposals import Proposal
from runtime.tuner.snapshot import Window, series_name

BRANCH_PREFIX = "gpupool-tuner/"


def branch_name(proposal: Proposal, *, base_text: str, new_text: str) -> str:
    """Derived from the change's content: the same edit of the same policy is the same
    branch, so a re-run on unchanged data finds it instead of proposing again."""
    digest = hashlib.sha256(f"{base_text}\0{new_text}".encode()).hexdigest()[:12]
    return f"{BRANCH_PREFIX}{proposal.rule}-{digest}"


def manifest_section(manifest_diff: str) -> list[str]:
    """The body's "Rendered manifest diff" section (``gpupool diff`` of both policies)."""
    lines = ["## Rendered manifest diff", ""]
    if not manifest_diff.strip():
        return [*lines, "_`gpupool diff`: no rendered object changes._"]
    return [*lines, "```diff", manifest_diff.rstrip("\n"), "```"]


def pr_body(
    proposal: Proposal,
    *,
    windows: Mapping[str, Window],
    at: float,
    window: str,
    policy_path: str,
    manifest_diff: str,
    whatif: str | None = None,
) -> str:
    """Markdown with the evidence a reviewer needs: windows, before/after, effect, diff, and
    (``whatif``) the closed-loop replay of the policy before and after."""
    when = datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    lines = [
        f"Proposed by `gpupool tune` (rule `{proposal.rule}`) from the {window} ending {when}.",
        "",
        "## Change",
        "",
        f"| `{policy_path}` field | before | after |",
        "|---|---|---|",
        *(f"| `{c.dotted}` | {c.before:g} | {c.after:g} |" for c in proposal.changes),
        "",
        "## Why",
        "",
        proposal.rationale,
        "",
        "## Expected effect",
        "",
        proposal.expected_effect,
        "",
        "## Evidence",
        "",
        "| series | condition | window |",
        "|---|---|---|",
        *(f"| `{e.series}` | {e.condition} | {e.summary} |" for e in proposal.evidence),
        "",
        "<details><summary>Other series read this cycle</summary>",
        "",
        *(
            f"- `{name}`: {w.summary()}" if w.samples else f"- `{name}`: no samples"
            for name, w in sorted(windows.items())
            if name not in {series_name(e.series) for e in proposal.evidence}
        ),
        "",
        "</details>",
        "",
        *manifest_section(manifest_diff),
    ]
    if whatif is not None:
        lines += ["", "## What-if", "", whatif.rstrip("\n")]
    lines += [
        "",
        "Merge to apply with `pulumi up` after review; close to reject (the tuner will not "
        "propose the same edit of the same policy again).",
    ]
    return "\n".join(lines) + "\n"
