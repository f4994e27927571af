"""SLO deadlines and the SMetric prefill cost (DESIGN.md; smetric.md §4)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TtftSlo:
    """TTFT deadline ``base + per_token * L`` for a prompt of ``L`` tokens (seconds)."""

    base: float
    per_token: float

    def __post_init__(self) -> None:
        if self.base <= 0 or self.per_token < 0:
            raise ValueError(f"TTFT SLO needs base > 0 and per_token >= 0: {self}")

    def deadline(self, prompt_tokens: float) -> float:
        return self.base + self.per_token * prompt_tokens


@dataclass(frozen=True, slots=True)
class LinearAttentionCost:
    """SMetric's prefill cost ``c_linear*n + c_attn*n*(L - n/2)`` for ``n`` uncached of ``L`` tokens."""

    c_linear: float
    c_attn: float

    def cost(self, uncached: float, prompt_tokens: float) -> float:
        if uncached < 0 or prompt_tokens < uncached:
            raise ValueError(f"need 0 <= uncached <= prompt tokens, got {uncached}, {prompt_tokens}")
        return self.c_linear * uncached + self.c_attn * uncached * (prompt_tokens - uncached / 2.0)
