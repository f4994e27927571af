"""The records each node's models were fitted on, as the planner's saved state keeps them.

A window refits a node when its iteration records leave the range of the records the node's
models were fitted on (:mod:`agentpool.models.refit`); the refit then fits on those records plus
the window's. Saved with the models, they let a restarted planner refit as the one before it would
have, instead of refitting nothing until a new warmup.

Bounded: at most :data:`RECORDS_PER_PHASE` records per node and phase, and all nodes' records
together at most ``budget`` bytes of JSON (:func:`saved_records` halves the per-phase count until
they fit; the state's ConfigMap holds 1 MiB in all). Thinning keeps, for each of the refit's
regressors (a prefill batch's uncached tokens, query-key pairs and restored tokens; a decode
batch's running requests), the record with its largest value and the one with its smallest
positive value, so the range a window is checked against stays what it was; the rest is taken
evenly spaced. A refit itself thins the fitted records to as many as the window has, so a few
hundred are enough.

A record is saved as when it ran (``at``), how long it took (``seconds``) and its batch (prefill:
``[t_uc, t_c, t_rst]`` per request; decode: ``running``). Its node is not saved: a node whose
phase was fitted on every node's records (too few of its own) keeps them as its own, and the refit
does not look at a fitted record's node.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Literal

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field

from agentpool.models import DecodeIterationRecord, PrefillBatchItem, PrefillIterationRecord
from agentpool.models.fitting import prefill_regressors
from agentpool.models.refit import NodeRecords
from agentpool.wire.iterations import MAX_BATCH_REQUESTS

log = logging.getLogger(__name__)

RECORDS_PER_PHASE = 128  # saved records per node and phase, at most
RECORDS_BYTES = 256 << 10  # all nodes' saved records, as JSON, at most (by default)

FloatArray = npt.NDArray[np.float64]
Tokens = Annotated[float, Field(ge=0)]


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class SavedPrefill(_Wire):
    at: float = Field(ge=0)
    seconds: float = Field(gt=0)
    batch: list[tuple[Tokens, Tokens, Tokens]] = Field(min_length=1, max_length=MAX_BATCH_REQUESTS)

    @staticmethod
    def of(r: PrefillIterationRecord) -> SavedPrefill:
        return SavedPrefill(at=r.at, seconds=r.seconds, batch=[(b.t_uc, b.t_c, b.t_rst) for b in r.batch])

    def record(self, node: str) -> PrefillIterationRecord:
        batch = tuple(PrefillBatchItem(t_uc, t_c, t_rst) for t_uc, t_c, t_rst in self.batch)
        return PrefillIterationRecord(node=node, at=self.at, batch=batch, seconds=self.seconds)


class SavedDecode(_Wire):
    at: float = Field(ge=0)
    seconds: float = Field(gt=0)
    running: int = Field(ge=1)

    @staticmethod
    def of(r: DecodeIterationRecord) -> SavedDecode:
        return SavedDecode(at=r.at, seconds=r.seconds, running=r.running)

    def record(self, node: str) -> DecodeIterationRecord:
        return DecodeIterationRecord(node=node, at=self.at, running=self.running, seconds=self.seconds)


class SavedRecords(_Wire):
    """One node's fitted records, thinned (see the module's notes)."""

    prefill: list[SavedPrefill] = Field(default_factory=list)
    decode: list[SavedDecode] = Field(default_factory=list)

    def node_records(self, node: str) -> NodeRecords:
        return NodeRecords(
            tuple(r.record(node) for r in self.prefill), tuple(r.record(node) for r in self.decode)
        )


class SavedRecordSet(_Wire):
    """Every node's saved records (the state ConfigMap's ``records.json``)."""

    version: Literal[1] = 1
    nodes: dict[str, SavedRecords] = Field(default_factory=dict)


def saved_records(records: Mapping[str, NodeRecords], budget: int = RECORDS_BYTES) -> dict[str, SavedRecords]:
    """Each node's records thinned to at most :data:`RECORDS_PER_PHASE` per phase, fewer while all
    of them take more than ``budget`` bytes of JSON (none when even one each does not fit). Each
    halving thins the records the previous one kept, so it keeps their extremes too."""
    nodes = {
        name: (
            _Kept.of(r.prefill, _prefill_columns(r.prefill)),
            _Kept.of(r.decode, _decode_columns(r.decode)),
        )
        for name, r in sorted(records.items())
    }
    per_phase = RECORDS_PER_PHASE
    while per_phase > 0:
        nodes = {name: (p.thinned(per_phase), d.thinned(per_phase)) for name, (p, d) in nodes.items()}
        size = sum(p.json_bytes() + d.json_bytes() + 32 for p, d in nodes.values())  # 32: the braces, keys
        if size <= budget:
            if per_phase < RECORDS_PER_PHASE:
                log.info("fitted records saved at %d per node and phase (%d bytes)", per_phase, size)
            return {
                name: SavedRecords(prefill=list(p.saved), decode=list(d.saved))
                for name, (p, d) in nodes.items()
            }
        per_phase //= 2
    if records:
        log.warning("no fitted records saved: %d nodes' do not fit in %d bytes", len(records), budget)
    return {}


@dataclass(frozen=True, slots=True)
class _Kept:
    """One node's records of one phase kept so far (as saved), their refit regressors and their
    JSON sizes."""

    saved: tuple[_Wire, ...]
    columns: FloatArray
    sizes: tuple[int, ...]

    @staticmethod
    def of(
        records: Sequence[PrefillIterationRecord] | Sequence[DecodeIterationRecord], columns: FloatArray
    ) -> _Kept:
        """Thinned to :data:`RECORDS_PER_PHASE` before they are converted."""
        idx = _pick(columns, RECORDS_PER_PHASE)
        saved = tuple(_saved(records[i]) for i in idx)
        return _Kept(saved, columns[idx], tuple(len(x.model_dump_json()) for x in saved))

    def thinned(self, n: int) -> _Kept:
        idx = _pick(self.columns, n)
        return _Kept(tuple(self.saved[i] for i in idx), self.columns[idx], tuple(self.sizes[i] for i in idx))

    def json_bytes(self) -> int:
        return sum(self.sizes) + len(self.sizes)  # and a comma each


def _saved(r: PrefillIterationRecord | DecodeIterationRecord) -> SavedPrefill | SavedDecode:
    return SavedPrefill.of(r) if isinstance(r, PrefillIterationRecord) else SavedDecode.of(r)


def _prefill_columns(records: Sequence[PrefillIterationRecord]) -> FloatArray:
    rows = [prefill_regressors(r.batch)[1:] for r in records]
    return np.array(rows, dtype=np.float64).reshape(-1, 3)


def _decode_columns(records: Sequence[DecodeIterationRecord]) -> FloatArray:
    return np.array([r.running for r in records], dtype=np.float64).reshape(-1, 1)


def _pick(columns: FloatArray, n: int) -> list[int]:
    """The indices of at most ``n`` rows, in order: each column's largest and smallest positive
    value's row first, the rest evenly spaced."""
    m = len(columns)
    if m <= n:
        return list(range(m))
    ends: set[int] = set()
    for col in columns.T:
        ends.add(int(col.argmax()))
        positive = np.flatnonzero(col > 0)
        if positive.size:
            ends.add(int(positive[col[positive].argmin()]))
    keep = set(sorted(ends)[:n])
    rest = [i for i in range(m) if i not in keep]
    k = n - len(keep)
    if k > 0:
        keep |= {rest[int(j)] for j in np.linspace(0, len(rest) - 1, k).round().astype(np.int64)}
    return sorted(keep)
