"""Pure iteration-time models (evolving-infra §5.1), SLO deadlines and prefill costs."""

from agentpool.models.iteration import (
    DecodeModel,
    NodeModel,
    PrefillBatchItem,
    PrefillModel,
    moe_fraction,
)
from agentpool.models.slo import LinearAttentionCost, TtftSlo
from agentpool.models.work import Work, attention_pairs

__all__ = [
    "DecodeModel",
    "LinearAttentionCost",
    "NodeModel",
    "PrefillBatchItem",
    "PrefillModel",
    "TtftSlo",
    "Work",
    "attention_pairs",
    "moe_fraction",
]
