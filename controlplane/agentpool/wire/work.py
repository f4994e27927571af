"""The wire format between routers and the planner: ``GET /agentpool/v1/work?since=<cursor>``.

A router keeps a bounded log of per-request work records, occupancy samples and the iteration
records its engines report (``agentpool.router.work_log``) and answers with a :class:`WorkBatch`;
the planner (``agentpool.planner.router_source``) polls every router and feeds its inbox. These
pydantic models are the only definition of the format; both sides convert to the plain values of
``agentpool.models`` at the edge.

Cursors are opaque strings ``"<epoch>.<seq>"``: ``epoch`` is random per router process and ``seq``
numbers the router's entries (all kinds share one sequence, from 1). A batch holds the entries
after ``since`` in sequence order; ``next`` is the cursor to send next. When the router no longer
holds some entries after ``since`` (its ring buffer overwrote them) it says how many in
``dropped``; when ``since`` is from another epoch (the router restarted) or absent, the batch
starts at the oldest entry it holds and ``reset`` is true.

``served`` is not part of the log: every batch carries, for each engine that reported to the
router, the role it last said it serves and when (:class:`WireServedRole`). This is how the planner
learns which role an engine serves (engines write nothing to the Kubernetes API).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from agentpool.models import IterationRecord, OccupancyCount, OccupancySample, RequestWorkRecord, Work
from agentpool.wire.iterations import WireIteration

WORK_PATH = "/agentpool/v1/work"
MAX_BATCH = 10_000


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class WireRequestWork(_Wire):
    """One finished request: its work after KV reuse, stamped when it finished (wall clock, s)."""

    seq: int = Field(ge=1)
    at: float
    t_uc: float = Field(ge=0)
    t_c: float = Field(ge=0)
    t_out: float = Field(ge=0)
    t_acc: float = Field(default=1.0, gt=0)  # tokens accepted per decode iteration (engine reports)

    def record(self) -> RequestWorkRecord:
        work = Work(t_uc=self.t_uc, t_c=self.t_c, t_out=self.t_out, t_acc=self.t_acc)
        return RequestWorkRecord(self.at, work)


class WireOccupancy(_Wire):
    """``requests`` counted by the router at ``at`` (wall clock, s), as ``counts`` says."""

    seq: int = Field(ge=1)
    at: float
    requests: float = Field(ge=0)
    counts: OccupancyCount = OccupancyCount.IN_FLIGHT

    def sample(self, source: str) -> OccupancySample:
        return OccupancySample(self.at, self.requests, self.counts, source)


class WireNodeIteration(_Wire):
    """An iteration ``node`` reported to the router (:mod:`agentpool.wire.iterations`)."""

    seq: int = Field(ge=1)
    node: str
    iteration: WireIteration

    def record(self) -> IterationRecord:
        return self.iteration.record(self.node)


class WireServedRole(_Wire):
    """The role ``node`` said it serves in its last load report to the router, received at ``at``
    (the router's wall clock, s), and the KV tokens its GPU memory holds in all (the report's room
    plus used; None when the report gave neither), which bounds what it can decode."""

    node: str
    role: Literal["prefill", "decode", "both"]
    at: float
    kv_capacity_tokens: int | None = Field(default=None, ge=1)


class WorkBatch(_Wire):
    """What ``GET /agentpool/v1/work`` answers.

    ``models_version``: the version of the planner's fitted models the router uses
    (:mod:`agentpool.wire.fits`; None before the first push), so the planner knows whom to update.
    ``config_generation``: the pool generation of the configuration the router runs (its config
    file's ``generation``; None when the file has none), which the planner shows the operator.
    """

    router: str
    epoch: str
    next: str
    requests: list[WireRequestWork] = Field(default_factory=list)
    occupancy: list[WireOccupancy] = Field(default_factory=list)
    iterations: list[WireNodeIteration] = Field(default_factory=list)
    models_version: int | None = None
    config_generation: int | None = Field(default=None, ge=0)
    served: list[WireServedRole] = Field(default_factory=list)
    dropped: int = Field(default=0, ge=0)
    reset: bool = False
    more: bool = False


def format_cursor(epoch: str, seq: int) -> str:
    return f"{epoch}.{seq}"


def parse_cursor(cursor: str) -> tuple[str, int]:
    """``(epoch, seq)``; ValueError for anything else."""
    epoch, sep, seq = cursor.rpartition(".")
    if not sep or not epoch or not seq.isdigit():
        raise ValueError(f"not a work-log cursor: {cursor!r}")
    return epoch, int(seq)
