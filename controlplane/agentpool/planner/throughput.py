"""Node rates and split throughput Θ (evolving-infra §5.1 "node throughput", Eq. 5), vectorized.

The planner evaluates every candidate split on every slice, which is O(N·m) rates per candidate;
the rates of all nodes on all slices are therefore computed as numpy arrays. The arithmetic is
exactly that of :class:`agentpool.models.NodeModel` (Eq. 3 and Eq. 4); the unit tests check the
two against each other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from agentpool.models import NodeModel, WorkSlice

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class SliceArrays:
    """The window's slices as columns: average work components and decode occupancy, shape (m,)."""

    t_uc: FloatArray
    t_c: FloatArray
    t_out: FloatArray
    t_acc: FloatArray
    occupancy: FloatArray

    @property
    def kv_per_request(self) -> FloatArray:
        """KV tokens a decoding request holds at most: its prompt and its output (the room the
        router reserves when it binds a request to a decode node), per slice."""
        result: FloatArray = self.t_uc + self.t_c + self.t_out
        return result

    @staticmethod
    def of(slices: Sequence[WorkSlice]) -> SliceArrays:
        def col(values: list[float]) -> FloatArray:
            return np.asarray(values, dtype=np.float64)

        return SliceArrays(
            t_uc=col([s.work.t_uc for s in slices]),
            t_c=col([s.work.t_c for s in slices]),
            t_out=col([s.work.t_out for s in slices]),
            t_acc=col([s.work.t_acc for s in slices]),
            occupancy=col([s.decode_occupancy for s in slices]),
        )


@dataclass(frozen=True, slots=True)
class NodeArrays:
    """Coefficients of a set of nodes as columns of shape (n, 1), ready to broadcast over slices."""

    c0: FloatArray
    c1: FloatArray
    c2: FloatArray
    c3: FloatArray
    t_bar: FloatArray
    f_restore: FloatArray
    d0: FloatArray
    d1: FloatArray
    d2: FloatArray
    log_miss: FloatArray  # log(1 - k/E) per node; 0 where every expert is read (dense or k == E)
    all_experts: npt.NDArray[np.bool_]  # phi == 1: a dense model, or k == E
    t_fwd: FloatArray
    kv_capacity: FloatArray | None = None  # decode KV tokens a node holds (None: not limited)

    @staticmethod
    def of(models: Sequence[NodeModel], kv_capacity: Sequence[float] | None = None) -> NodeArrays:
        """``kv_capacity``: each node's decode KV room in tokens (``inf``: not limited); None: no
        node is limited (Eq. 4 as the paper writes it)."""

        def col(values: Sequence[float]) -> FloatArray:
            return np.asarray(values, dtype=np.float64).reshape(-1, 1)

        if kv_capacity is not None and len(kv_capacity) != len(models):
            raise ValueError(f"{len(kv_capacity)} KV capacities for {len(models)} nodes")
        limited = kv_capacity is not None and any(c < np.inf for c in kv_capacity)

        return NodeArrays(
            c0=col([m.prefill.c0 for m in models]),
            c1=col([m.prefill.c1 for m in models]),
            c2=col([m.prefill.c2 for m in models]),
            c3=col([m.prefill.c3 for m in models]),
            t_bar=col([m.t_bar for m in models]),
            f_restore=col([m.f_restore for m in models]),
            d0=col([m.decode.d0 for m in models]),
            d1=col([m.decode.d1 for m in models]),
            d2=col([m.decode.d2 for m in models]),
            log_miss=col([_log_miss(m) for m in models]),
            all_experts=np.asarray([_log_miss(m) == 0.0 for m in models], dtype=np.bool_).reshape(-1, 1),
            t_fwd=col([m.decode.t_fwd for m in models]),
            kv_capacity=col(kv_capacity) if limited and kv_capacity is not None else None,
        )

    def prefill_rates(self, s: SliceArrays) -> FloatArray:
        """``mu_P`` (Eq. 3 inverted) of every node on every slice, shape (n, m)."""
        pairs = s.t_uc * s.t_c + s.t_uc * (s.t_uc + 1.0) / 2.0
        seconds = (
            self.c0 * s.t_uc / self.t_bar
            + self.c1 * s.t_uc
            + self.c2 * pairs
            + self.c3 * self.f_restore * s.t_c
        )
        return _inverse(seconds)

    def decode_iteration_times(self, batch: FloatArray) -> FloatArray:
        """Eq. 2 of every node at per-slice batch sizes ``batch`` (shape (m,)), shape (n, m)."""
        phi = np.where(self.all_experts, 1.0, -np.expm1(self.t_fwd * batch * self.log_miss))
        result: FloatArray = self.d0 + self.d1 * phi + self.d2 * batch
        return result

    def decode_rates(self, s: SliceArrays, decode_nodes: int) -> FloatArray:
        """``mu_D`` (Eq. 4 inverted) of every node at ``B = q̄/decode_nodes``, shape (n, m).

        With no request in decode (``q̄ = 0``) a node completes nothing: rate 0. A node with a KV
        capacity runs at most the requests whose KV it holds: ``B = min(q̄/decode_nodes,
        capacity / kv_per_request)`` (the rest wait for KV room and add nothing to its rate).
        """
        if decode_nodes < 1:
            raise ValueError(f"decode rates need at least one decode node, got {decode_nodes}")
        batch: FloatArray = s.occupancy / float(decode_nodes)
        if self.kv_capacity is not None:
            with np.errstate(divide="ignore", invalid="ignore"):
                room = np.where(s.kv_per_request > 0, self.kv_capacity / s.kv_per_request, np.inf)
            batch = np.minimum(batch, room)
        # B*t_acc / (T_iter(B)*t_out): requests completed per second; a vanishing batch gives ~0.
        with np.errstate(divide="ignore", invalid="ignore"):
            rates = batch * s.t_acc / (self.decode_iteration_times(batch) * s.t_out)
        result: FloatArray = np.where(batch > 0, rates, 0.0)
        return result


def _log_miss(m: NodeModel) -> float:
    """``log(1 - k/E)``: phi(B) = 1 - exp(t_fwd * B * log_miss); 0 when phi is always 1."""
    k, e = m.decode.experts_active, m.decode.experts_total
    if e == 0 or k >= e:
        return 0.0
    return float(np.log1p(-k / e))


def _inverse(seconds: FloatArray) -> FloatArray:
    with np.errstate(divide="ignore"):
        result: FloatArray = np.where(seconds > 0, 1.0 / np.where(seconds > 0, seconds, 1.0), np.inf)
    return result


def split_throughput(prefill: Sequence[NodeModel], decode: Sequence[NodeModel], s: WorkSlice) -> float:
    """Eq. 5: ``min(sum mu_P over prefill nodes, sum mu_D over decode nodes)`` on one slice."""
    arrays = SliceArrays.of([s])
    p = float(NodeArrays.of(prefill).prefill_rates(arrays).sum()) if prefill else 0.0
    d = float(NodeArrays.of(decode).decode_rates(arrays, len(decode)).sum()) if decode else 0.0
    return min(p, d)
