"""Measurements of one simulated run and their summary.

Scored over the measurement window ``[warmup, warmup + duration)``: requests that complete in it.

- throughput: completed requests and output tokens per second;
- TTFT, TPOT, E2E: mean and p50/p90/p95/p99 (TTFT counts from when the request was sent, or from
  the agent's arrival for the first request of an open-loop agent that waited for admission);
- KV reuse: hit rate ``h`` (cached or fetched prompt tokens over prompt tokens) and the ideal
  ``h*`` of an unlimited cache shared by all nodes with no switches, for the same requests at the
  same moments (a prompt's blocks exist once some prefill computed them, an output's once it was
  decoded); lost KV reuse ``1 - h/h*``;
- TPS within SLO: output tokens per second of requests meeting both the TTFT deadline
  ``b + a*L`` and the TPOT limit;
- prefill load imbalance: per minute, the mean queueing time on the most loaded prefill node over
  the mean across prefill nodes (evolving-infra App. C.3), averaged over minutes;
- switches (count, mean time from decision to serving, downtime) and the split over time.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np

from agentpool.models import TtftSlo
from agentpool.node import Request
from agentpool.sim.systems import SwitchMode

_PCTS = (50, 90, 95, 99)


def _stats(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {"mean": float("nan"), **{f"p{p}": float("nan") for p in _PCTS}}
    a = np.asarray(values, dtype=np.float64)
    out = {"mean": float(a.mean())}
    for p, v in zip(_PCTS, np.percentile(a, _PCTS), strict=True):
        out[f"p{p}"] = float(v)
    return out


class Metrics:
    def __init__(self, slo: TtftSlo, tpot_slo_s: float, warmup_s: float, duration_s: float) -> None:
        self.slo = slo
        self.tpot_slo_s = tpot_slo_s
        self.start = warmup_s
        self.end = warmup_s + duration_s
        self._ideal: set[int] = set()
        # one row per scored request: input, output, cached, ideal, fetched, ttft, tpot, e2e, prefill node,
        # prefill start, queueing time, decode node
        self.rows: list[tuple[int, int, int, int, int, float, float, float, int, float, float, int]] = []
        self.completed_total = 0
        self.issued = 0
        self.evicted_blocks = 0
        self.switches: list[dict[str, float | str]] = []  # node, times, mode
        self.split_timeline: list[tuple[float, int, int, int]] = []
        self.planner_log: list[dict[str, float | str]] = []
        self.fit_error: dict[str, float] | None = None  # fitted models against the ground truth
        self.per_minute: dict[int, int] = {}  # completed requests per minute of the run

    # -- ideal cache ------------------------------------------------------------------------------
    def ideal_prefix(self, blocks: Sequence[int], cap: int) -> int:
        """Leading blocks of ``blocks[:cap]`` that some earlier request computed (prefix-closed set)."""
        s = self._ideal
        n = min(cap, len(blocks))
        if n == 0 or blocks[0] not in s:
            return 0
        if blocks[n - 1] in s:
            return n
        lo, hi = 1, n - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if blocks[mid] in s:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def ideal_add(self, produced: Sequence[int]) -> None:
        """A request finished: its produced blocks are computed (its prompt's since its first token)."""
        self._ideal.update(produced)

    # -- events -----------------------------------------------------------------------------------
    def first_token(self, req: Request, known_blocks: int = 0) -> None:
        """``req``'s prompt is computed. Its first ``known_blocks`` blocks are known to be in the ideal
        set already (its ideal prefix when it was routed: the set only grows), so only the rest is
        added (each block looked up in a set of millions costs a memory access)."""
        self._ideal.update(req.blocks[known_blocks:])

    def done(self, req: Request) -> None:
        self.completed_total += 1
        minute = int(req.done_at // 60.0)
        self.per_minute[minute] = self.per_minute.get(minute, 0) + 1
        if not self.start <= req.done_at < self.end:
            return
        ttft = req.first_token_at - req.issued_at
        tpot = (req.done_at - req.first_token_at) / (req.output_tokens - 1) if req.output_tokens > 1 else 0.0
        self.rows.append(
            (
                req.input_tokens,
                req.output_tokens,
                req.cached_tokens,
                req.ideal_cached_tokens,
                req.fetch_tokens,
                ttft,
                tpot,
                req.done_at - req.issued_at,
                req.prefill_node,
                req.prefill_start,
                req.prefill_start - req.enqueued_at,
                req.decode_node,
            )
        )

    def switch(
        self, node: str, decided_at: float, drained_at: float, done_at: float, mode: SwitchMode
    ) -> None:
        self.switches.append(
            {
                "node": node,
                "decided_at": decided_at,
                "drained_at": drained_at,
                "done_at": done_at,
                "duration_s": done_at - decided_at,
                "downtime_s": done_at - drained_at,
                "mode": mode.value,
            }
        )

    def record_split(self, at: float, split: tuple[int, int, int]) -> None:
        if self.split_timeline and self.split_timeline[-1][1:] == split:
            return
        self.split_timeline.append((at, *split))

    # -- summary ----------------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        dur = self.end - self.start
        rows = self.rows
        n = len(rows)
        inp = sum(r[0] for r in rows)
        out_tokens = sum(r[1] for r in rows)
        cached = sum(r[2] for r in rows)
        ideal = sum(r[3] for r in rows)
        h = cached / inp if inp else 0.0
        h_star = ideal / inp if inp else 0.0
        ttft = [r[5] for r in rows]
        tpot = [r[6] for r in rows if r[1] > 1]
        e2e = [r[7] for r in rows]
        within = sum(
            r[1] for r in rows if r[5] <= self.slo.deadline(r[0]) and (r[1] <= 1 or r[6] <= self.tpot_slo_s)
        )
        in_window = [s for s in self.switches if self.start <= float(s["decided_at"]) < self.end]
        return {
            "requests": n,
            "throughput_rps": n / dur if dur > 0 else 0.0,
            "output_tps": out_tokens / dur if dur > 0 else 0.0,
            "tps_within_slo": within / dur if dur > 0 else 0.0,
            "slo_attainment": (
                sum(
                    1
                    for r in rows
                    if r[5] <= self.slo.deadline(r[0]) and (r[1] <= 1 or r[6] <= self.tpot_slo_s)
                )
                / n
                if n
                else 0.0
            ),
            "ttft_s": _stats(ttft),
            "tpot_s": _stats(tpot),
            "e2e_s": _stats(e2e),
            "hit_rate": h,
            "ideal_hit_rate": h_star,
            "lost_kv_reuse": (1.0 - h / h_star) if h_star > 0 else 0.0,
            "uncached_tokens_per_request": (inp - cached) / n if n else 0.0,
            "fetched_tokens_per_request": sum(r[4] for r in rows) / n if n else 0.0,
            "prefill_imbalance": self.prefill_imbalance(),
            "mean_queue_s": float(np.mean([r[10] for r in rows])) if rows else float("nan"),
            "switches": len(in_window),
            "switches_total": len(self.switches),  # the warmup's too
            "switch_mean_s": float(np.mean([float(s["duration_s"]) for s in in_window]))
            if in_window
            else 0.0,
            "switch_downtime_s": float(sum(float(s["downtime_s"]) for s in in_window)),
            "evicted_blocks": self.evicted_blocks,
            "unique_blocks": len(self._ideal),  # distinct KV blocks computed in the whole run
            "final_split": list(self.split_timeline[-1][1:]) if self.split_timeline else [],
            "fit_error": self.fit_error,
        }

    def prefill_imbalance(self) -> float:
        """Mean over minutes of (max over prefill nodes of mean queueing time) / (mean over nodes)."""
        per: dict[int, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
        for r in self.rows:
            per[int(r[9] // 60.0)][r[8]].append(r[10])
        ratios = []
        for nodes in per.values():
            means = [sum(v) / len(v) for v in nodes.values()]
            avg = sum(means) / len(means)
            if len(means) > 1 and avg > 0:
                ratios.append(max(means) / avg)
        return float(np.mean(ratios)) if ratios else 1.0

    def ttfts(self) -> list[float]:
        return [r[5] for r in self.rows]
