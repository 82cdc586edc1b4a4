"""Edge: the recommended policy as the owner's own file, and what it changes in the cluster.

``recommended.yaml`` is the owner's pool.yaml with only the recommended variant's values
edited in place (every comment, blank line and flow mapping kept). The model configs it
names are copied beside it under the same relative paths, so ``gpupool validate
DIR/recommended.yaml`` reads it as it would read the policy. ``recommended.diff`` is
``gpupool diff`` of the two policies on the stack's target.
"""

from __future__ import annotations

import tempfile
from pathlib import Path, PurePosixPath

from infra.builders.stack_options import StackOptions, Target
from infra.diff import diff_documents
from infra.pipeline import render_policy_file
from policy.bounded_read import MODEL_CONFIG_BYTES, read_bytes
from policy.loader import read_text
from policy.pool import PoolPolicy
from runtime.advise.levers import Variant
from runtime.tuner.yamledit import edit_values

POLICY = "recommended.yaml"
DIFF = "recommended.diff"


class RecommendedError(ValueError):
    """The recommended policy cannot be written beside its model configs."""


def recommended_files(
    policy_file: Path, policy: PoolPolicy, variant: Variant, *, target: Target
) -> dict[str, bytes]:
    """``recommended.yaml``, the model configs it names and ``recommended.diff``; raises
    ``PolicyError`` when the edited file does not validate (it always should: the sweep
    validated the variant)."""
    text = read_text(policy_file)
    edited, _ = edit_values(text, variant.edits)
    configs: dict[str, bytes] = {}
    for hf_config in sorted({w.hf_config for w in policy.workloads}):
        relative = PurePosixPath(hf_config)
        if relative.is_absolute():
            continue  # read from where it is, wherever the file lies
        if ".." in relative.parts:
            raise RecommendedError(
                f"{policy_file}: hf_config {hf_config!r} leaves the policy's folder; keep model "
                "configs under it so the recommended policy can be written beside copies"
            )
        configs[hf_config] = read_bytes(policy_file.parent / hf_config, MODEL_CONFIG_BYTES)
    files = {POLICY: edited.encode("utf-8"), **configs}
    with tempfile.TemporaryDirectory(prefix="gpupool-advise-") as scratch:
        root = Path(scratch)
        for name, data in files.items():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_bytes(data)
        stack = StackOptions(target)
        before = render_policy_file(policy_file, stack=stack)
        after = render_policy_file(root / POLICY, stack=stack)
    diff = diff_documents(before, after) or "no object changes\n"
    return {**files, DIFF: diff.encode("utf-8")}
