"""Block sizes each vLLM 0.32 attention backend accepts, as its ``get_supported_kernel_block_sizes``
declares them (``vllm/v1/attention/backends/...``). vLLM rejects any other size at start-up."""

from __future__ import annotations

from dataclasses import dataclass

from policy.workloads import AttentionBackend


@dataclass(frozen=True)
class BlockRule:
    """Legal block sizes of one vLLM backend: every multiple of ``step``, or exactly ``fixed``."""

    vllm_name: str
    """``--attention-backend`` value (``AttentionBackendEnum`` member)."""
    step: int
    """Block size in tokens must be a multiple of this."""
    fixed: bool
    """True when ``step`` is the only legal size (FlashMLA 64, CUTLASS MLA 128, CPU MLA 16)."""
    source: str
    """File in the vLLM package that declares the rule."""

    def allows(self, block_size: int) -> bool:
        return block_size == self.step if self.fixed else block_size % self.step == 0

    def describe(self) -> str:
        return f"exactly {self.step}" if self.fixed else f"a multiple of {self.step}"

    def nearest(self, ideal_tokens: float) -> int:
        """Legal block size closest to ``ideal_tokens`` (ties go to the smaller block)."""
        if self.fixed:
            return self.step
        below = max(self.step, int(ideal_tokens // self.step) * self.step)
        above = below + self.step
        return below if ideal_tokens - below <= above - ideal_tokens else above


BLOCK_RULES: dict[tuple[AttentionBackend, bool], BlockRule] = {
    ("flash_attn", False): BlockRule(
        "FLASH_ATTN", 16, False, "v1/attention/backends/flash_attn.py"
    ),
    ("flash_attn", True): BlockRule(
        "FLASH_ATTN_MLA", 16, False, "v1/attention/backends/mla/flashattn_mla.py"
    ),
    ("triton", False): BlockRule("TRITON_ATTN", 16, False, "v1/attention/backends/triton_attn.py"),
    ("triton", True): BlockRule("TRITON_MLA", 16, False, "v1/attention/backends/mla/triton_mla.py"),
    ("flex", False): BlockRule(
        "FLEX_ATTENTION", 16, False, "v1/attention/backends/flex_attention.py"
    ),
    ("cpu", False): BlockRule("CPU_ATTN", 32, False, "v1/attention/backends/cpu_attn.py"),
    ("cpu", True): BlockRule("CPU_MLA", 16, True, "v1/attention/backends/mla/cpu_mla.py"),
    ("flashmla", True): BlockRule("FLASHMLA", 64, True, "v1/attention/backends/mla/flashmla.py"),
    ("cutlass_mla", True): BlockRule(
        "CUTLASS_MLA", 128, True, "v1/attention/backends/mla/cutlass_mla.py"
    ),
}
"""Rule per (gpupool backend name, model is MLA); ``tests/vllm/test_vllm_contract.py`` checks
every entry against the installed vLLM."""


class BackendError(ValueError):
    """A backend that cannot serve the model, or a block size it does not accept."""


def block_rule(backend: AttentionBackend, mla: bool) -> BlockRule:
    """The rule for ``backend`` serving an MLA (or a standard attention) model."""
    rule = BLOCK_RULES.get((backend, mla))
    if rule is None:
        kind = "MLA" if mla else "standard-attention (non-MLA)"
        usable = sorted(b for (b, m) in BLOCK_RULES if m == mla)
        raise BackendError(
            f"attention backend {backend!r} cannot serve a {kind} model; use one of {usable}"
        )
    return rule


def check_block_size(rule: BlockRule, block_size: int) -> None:
    """Refuse a block size the backend would refuse at start-up, before anything starts."""
    if not rule.allows(block_size):
        raise BackendError(
            f"block size {block_size} tokens is not supported by {rule.vllm_name}: it must be "
            f"{rule.describe()} (vllm/{rule.source})"
        )
