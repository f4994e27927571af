"""How far fitted Eq. 1/Eq. 2 models are from the ground truth, on a fixed grid of iterations.

The grid follows evolving-infra Fig. 5: single prefill requests over uncached and cached lengths,
batches of 2-8 chunks, and decode batches of 1-128 requests at several context lengths (only those
whose KV fits in the node's GPU memory). Errors are relative to the noiseless truth.
"""

from __future__ import annotations

from dataclasses import dataclass

from agentpool.models import DecodeModel, PrefillBatchItem, PrefillModel
from agentpool.node.timing import IterationTimes

_UNCACHED = (512, 2048, 4096, 8192)
_CACHED = (0, 16384, 65536, 131072)
_RUNNING = (1, 2, 4, 8, 16, 32, 64, 128)
_CONTEXT = (4096, 16384, 65536)


@dataclass(frozen=True, slots=True)
class FitError:
    """Mean and worst relative error of the fitted models against the truth on the grid."""

    prefill_mean: float
    prefill_max: float
    batch_mean: float  # prefill batches of 2-8 chunks
    decode_mean: float
    decode_max: float

    def as_dict(self) -> dict[str, float]:
        return {
            "prefill_mean": self.prefill_mean,
            "prefill_max": self.prefill_max,
            "prefill_batch_mean": self.batch_mean,
            "decode_mean": self.decode_mean,
            "decode_max": self.decode_max,
        }


def _rel(model: float, truth: float) -> float:
    return abs(model - truth) / truth


def fit_error(
    truth: IterationTimes, prefill: PrefillModel, decode: DecodeModel, kv_capacity_tokens: int
) -> FitError:
    singles = [
        _rel(prefill.iteration_time(b), truth.prefill_s(b))
        for u in _UNCACHED
        for c in _CACHED
        for b in ([PrefillBatchItem(float(u), float(c))],)
    ]
    batches = [
        _rel(prefill.iteration_time(b), truth.prefill_s(b))
        for n in (2, 4, 8)
        for c in _CACHED
        for b in ([PrefillBatchItem(8192.0 / n, float(c))] * n,)
    ]
    decodes = [
        _rel(decode.iteration_time(r), truth.decode_s(r, float(r * ctx)))
        for r in _RUNNING
        for ctx in _CONTEXT
        if r * ctx <= kv_capacity_tokens
    ]
    return FitError(
        sum(singles) / len(singles),
        max(singles),
        sum(batches) / len(batches),
        sum(decodes) / len(decodes),
        max(decodes),
    )
