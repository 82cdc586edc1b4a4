"""The request and token counts that add up over replay steps and fleets."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TokenCounts:
    """What a fleet served: one step's (``request_stream.StepResult``) or a replay's running totals
    (``replay_model.FleetTotals``); both are this type, so adding one to the other is ``add``."""

    completed: int = 0
    output_tokens: int = 0
    prompt_tokens: int = 0
    hit_tokens: float = 0.0
    """Prefix hits as served (with the tier when the fleet preserves its KV, else without)."""
    hit_tokens_with_tier: float = 0.0
    hit_tokens_without_tier: float = 0.0
    query_tokens: int = 0
    """Prompt tokens of the requests with block hashes (the prefix hit rate's denominator)."""

    def add(self, other: TokenCounts) -> None:
        """Add ``other``'s counts to these (a later step's, or one step's to the totals)."""
        self.completed += other.completed
        self.output_tokens += other.output_tokens
        self.prompt_tokens += other.prompt_tokens
        self.hit_tokens += other.hit_tokens
        self.hit_tokens_with_tier += other.hit_tokens_with_tier
        self.hit_tokens_without_tier += other.hit_tokens_without_tier
        self.query_tokens += other.query_tokens
