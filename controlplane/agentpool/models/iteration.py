"""Iteration-time and request-time models of a node (evolving-infra §5.1, Eq. 1-4; App. B.3).

Prefill iteration (Eq. 1)::

    T_P_iter = c0 + c1*sum(t_uc) + c2*sum(A) + c3*sum(t_rst)

Decode iteration (Eq. 2), with the MoE fraction of routed experts read::

    phi(B) = 1 - (1 - k/E)**(t_fwd*B)
    T_D_iter(B) = d0 + d1*phi(B) + d2*B

Request times: Eq. 3 (prefill share, fixed cost split by uncached tokens over ``t_bar``) and
Eq. 4 (decode share of ``t_out/t_acc`` iterations among ``B`` running requests).
All times are in seconds.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from agentpool.models.work import Work, attention_pairs


@dataclass(frozen=True, slots=True)
class PrefillBatchItem:
    """One request's part of a prefill iteration: uncached, cached and restored-from-host tokens."""

    t_uc: float
    t_c: float = 0.0
    t_rst: float = 0.0


@dataclass(frozen=True, slots=True)
class PrefillModel:
    """Coefficients of Eq. 1: fixed cost, per uncached token, per query-key pair, per restored token."""

    c0: float
    c1: float
    c2: float
    c3: float

    def __post_init__(self) -> None:
        if min(self.c0, self.c1, self.c2, self.c3) < 0:
            raise ValueError(f"prefill coefficients must be non-negative: {self}")

    def iteration_time(self, batch: Iterable[PrefillBatchItem]) -> float:
        """Eq. 1: time of one prefill iteration over ``batch``."""
        s_uc = s_a = s_rst = 0.0
        for item in batch:
            s_uc += item.t_uc
            s_a += attention_pairs(item.t_uc, item.t_c)
            s_rst += item.t_rst
        return self.c0 + self.c1 * s_uc + self.c2 * s_a + self.c3 * s_rst

    def request_time(self, w: Work, t_bar: float, f_restore: float) -> float:
        """Eq. 3: how long request ``w`` occupies the node in prefill.

        ``t_bar`` is the average number of new tokens per prefill iteration on the node and
        ``f_restore`` the fraction of cached tokens the node restores from host memory.
        """
        if t_bar <= 0:
            raise ValueError(f"t_bar must be positive, got {t_bar}")
        return (
            self.c0 * w.t_uc / t_bar
            + self.c1 * w.t_uc
            + self.c2 * w.attention_pairs
            + self.c3 * f_restore * w.t_c
        )


@dataclass(frozen=True, slots=True)
class DecodeModel:
    """Coefficients of Eq. 2 plus the MoE routing shape (k of E experts, t_fwd tokens per request).

    A dense model uses ``experts_total=0``: then ``phi`` is 1 and ``d1`` is a fixed cost.
    """

    d0: float
    d1: float
    d2: float
    experts_active: int = 8
    experts_total: int = 128
    t_fwd: float = 1.0

    def __post_init__(self) -> None:
        if min(self.d0, self.d1, self.d2) < 0:
            raise ValueError(f"decode coefficients must be non-negative: {self}")
        if self.experts_total < 0 or self.experts_active < 0:
            raise ValueError("expert counts must be non-negative")
        if self.experts_total and self.experts_active > self.experts_total:
            raise ValueError("experts_active cannot exceed experts_total")
        if self.t_fwd <= 0:
            raise ValueError("t_fwd must be positive")

    def phi(self, batch: float) -> float:
        """Expected fraction of routed experts that ``batch`` running requests read."""
        return moe_fraction(batch, self.experts_active, self.experts_total, self.t_fwd)

    def iteration_time(self, batch: float) -> float:
        """Eq. 2: time of one decode iteration with ``batch`` running requests."""
        if batch < 0:
            raise ValueError("batch must be non-negative")
        return self.d0 + self.d1 * self.phi(batch) + self.d2 * batch

    def request_time(self, w: Work, batch: float) -> float:
        """Eq. 4: how long request ``w`` occupies the node in decode among ``batch`` running requests."""
        if batch <= 0:
            raise ValueError("batch must be positive")
        return self.iteration_time(batch) * w.t_out / (batch * w.t_acc)


def moe_fraction(batch: float, k: int, e: int, t_fwd: float = 1.0) -> float:
    """``phi(B) = 1 - (1 - k/E)^(t_fwd*B)``; 1 for a dense model (``e == 0``)."""
    if e == 0:
        return 1.0
    return 1.0 - float((1.0 - k / e) ** (t_fwd * batch))


@dataclass(frozen=True, slots=True)
class NodeModel:
    """A node's fitted models plus its windowed measurements ``t_bar`` and ``f_restore``."""

    prefill: PrefillModel
    decode: DecodeModel
    t_bar: float = 8192.0
    f_restore: float = 0.0

    def prefill_request_time(self, w: Work) -> float:
        return self.prefill.request_time(w, self.t_bar, self.f_restore)

    def decode_request_time(self, w: Work, batch: float) -> float:
        return self.decode.request_time(w, batch)

    def prefill_rate(self, w: Work) -> float:
        """``mu_P``: requests of work ``w`` completed per second in prefill (inf for no work)."""
        t = self.prefill_request_time(w)
        return float("inf") if t <= 0 else 1.0 / t

    def decode_rate(self, w: Work, batch: float) -> float:
        """``mu_D``: requests of work ``w`` completed per second in decode at ``batch`` running."""
        t = self.decode_request_time(w, batch)
        return float("inf") if t <= 0 else 1.0 / t
