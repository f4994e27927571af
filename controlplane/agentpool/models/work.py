"""Request work ``w = (t_uc, t_c, t_out, t_acc)`` (evolving-infra §5.1, Table 1)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Work:
    """The work one request brings to the cluster after KV reuse.

    t_uc: uncached input tokens the prefill must compute.
    t_c: cached prefix tokens (reused from GPU or host memory, locally or fetched).
    t_out: output tokens to decode.
    t_acc: tokens accepted per decode iteration (1 without speculative decoding).
    """

    t_uc: float
    t_c: float = 0.0
    t_out: float = 0.0
    t_acc: float = 1.0

    def __post_init__(self) -> None:
        if self.t_uc < 0 or self.t_c < 0 or self.t_out < 0:
            raise ValueError(f"token counts must be non-negative: {self}")
        if self.t_acc <= 0:
            raise ValueError(f"t_acc must be positive, got {self.t_acc}")

    @property
    def t_in(self) -> float:
        """All input tokens: cached plus uncached."""
        return self.t_uc + self.t_c

    @property
    def attention_pairs(self) -> float:
        """Query-key pairs of the prefill: ``A = t_uc*t_c + t_uc*(t_uc+1)/2``."""
        return attention_pairs(self.t_uc, self.t_c)


def attention_pairs(t_uc: float, t_c: float) -> float:
    """Causal query-key pairs when ``t_uc`` new tokens follow ``t_c`` cached ones."""
    return t_uc * t_c + t_uc * (t_uc + 1.0) / 2.0
