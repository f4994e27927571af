"""Pure iteration-time models (evolving-infra §5.1), SLO deadlines and prefill costs."""

from agentpool.models.coefficients import IterationCoefficients, decode_shape
from agentpool.models.fetch import (
    DEFAULT_COPY_PRICE_S_PER_TOKEN,
    DEFAULT_FETCH_MODEL,
    PAPER_LITERAL_FETCH_MODEL,
    FetchModel,
    copy_price,
)
from agentpool.models.iteration import (
    DecodeModel,
    NodeModel,
    PrefillBatchItem,
    PrefillModel,
    moe_fraction,
)
from agentpool.models.records import (
    DecodeIterationRecord,
    IterationRecord,
    MoeShape,
    PrefillIterationRecord,
)
from agentpool.models.slo import LinearAttentionCost, TtftSlo
from agentpool.models.windows import (
    DEFAULT_OCCUPANCY,
    OccupancyCount,
    OccupancySample,
    PrefillWindowStats,
    RequestWorkRecord,
    SlicedWindow,
    WorkSlice,
    mean_work,
    measure_prefill_window,
    slice_window,
    with_window_stats,
)
from agentpool.models.work import Work, attention_pairs

__all__ = [
    "DEFAULT_COPY_PRICE_S_PER_TOKEN",
    "DEFAULT_FETCH_MODEL",
    "DEFAULT_OCCUPANCY",
    "PAPER_LITERAL_FETCH_MODEL",
    "DecodeIterationRecord",
    "DecodeModel",
    "FetchModel",
    "IterationCoefficients",
    "IterationRecord",
    "LinearAttentionCost",
    "MoeShape",
    "NodeModel",
    "OccupancyCount",
    "OccupancySample",
    "PrefillBatchItem",
    "PrefillIterationRecord",
    "PrefillModel",
    "PrefillWindowStats",
    "RequestWorkRecord",
    "SlicedWindow",
    "TtftSlo",
    "Work",
    "WorkSlice",
    "attention_pairs",
    "copy_price",
    "decode_shape",
    "mean_work",
    "measure_prefill_window",
    "moe_fraction",
    "slice_window",
    "with_window_stats",
]
