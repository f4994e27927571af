"""One engine iteration on the wire (evolving-infra §5.1 "Online fitting").

Engines put the iterations they ran since their last report into their load report
(``LoadReport.iterations``, ``POST {router}/agentpool/v1/report``); every router keeps them in its
work log and the planner reads them back with the work records (:mod:`agentpool.wire.work`). With
several router replicas each one gets every engine's reports, so the planner sees every iteration
once per router: it keeps one copy per ``(node, seq, at)``.

- ``seq``: the engine's own iteration number (from 0, per engine process); with ``at`` it names
  the iteration, so copies that reach the planner through several routers are dropped.
- ``at``: wall-clock time the iteration started (seconds since the epoch, the engine's clock).
- ``seconds``: the measured iteration time.
- prefill: ``batch``, per request of the batch its uncached (``t_uc``), cached (``t_c``) and
  restored-from-host (``t_rst``) tokens (Eq. 1);
- decode: ``running``, the requests of the batch (Eq. 2).

An engine may send a sample of its iterations instead of all (the fit needs hundreds per node and
phase, ``t_bar``/``f_n`` are means): at most :data:`MAX_ITERATIONS_PER_REPORT` per report.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from agentpool.models import DecodeIterationRecord, PrefillBatchItem, PrefillIterationRecord

MAX_ITERATIONS_PER_REPORT = 4096
MAX_BATCH_REQUESTS = 4096


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class WirePrefillItem(_Wire):
    t_uc: int = Field(ge=0)
    t_c: int = Field(0, ge=0)
    t_rst: int = Field(0, ge=0)


class WirePrefillIteration(_Wire):
    phase: Literal["prefill"] = "prefill"
    seq: int = Field(ge=0)
    at: float = Field(ge=0)
    seconds: float = Field(gt=0)
    batch: list[WirePrefillItem] = Field(min_length=1, max_length=MAX_BATCH_REQUESTS)

    def record(self, node: str) -> PrefillIterationRecord:
        items = tuple(PrefillBatchItem(float(b.t_uc), float(b.t_c), float(b.t_rst)) for b in self.batch)
        return PrefillIterationRecord(node=node, at=self.at, batch=items, seconds=self.seconds)


class WireDecodeIteration(_Wire):
    phase: Literal["decode"] = "decode"
    seq: int = Field(ge=0)
    at: float = Field(ge=0)
    seconds: float = Field(gt=0)
    running: int = Field(ge=1)

    def record(self, node: str) -> DecodeIterationRecord:
        return DecodeIterationRecord(node=node, at=self.at, running=self.running, seconds=self.seconds)


WireIteration = Annotated[WirePrefillIteration | WireDecodeIteration, Field(discriminator="phase")]
"""A prefill or a decode iteration, told apart by ``phase``."""
