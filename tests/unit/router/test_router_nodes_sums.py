"""The node table's running sums of outstanding requests equal summing them afresh, exactly."""

from __future__ import annotations

import random

from agentpool.models import Work
from agentpool.router.config import NodeConfig, NodeModelConfig
from agentpool.router.nodes import NodeTable
from agentpool.router.policy import EMPTY_QUEUE, QueuedPrefill, Role
from agentpool.wire.engine import LoadReport


def fresh_sums(table: NodeTable, node: str, after: int) -> tuple[QueuedPrefill, int, int]:
    """The unreported queue (summed in dispatch order) and the decodes after ``after``, from scratch."""
    e = table.get(node)
    q = QueuedPrefill.of([d.work for d in e.prefills.values() if d.seq > after])
    decodes = [d for d in e.decodes.values() if d.seq > after]
    return q, len(decodes), sum(d.kv_tokens for d in decodes)


def test_random_dispatches_finishes_and_reports_keep_the_sums_exact() -> None:
    rng = random.Random(7)
    t = NodeTable(max_report_age_s=5.0)
    t.configure(
        [NodeConfig(id=f"n{i}", url=f"http://h{i}", role=Role.BOTH) for i in range(3)], NodeModelConfig()
    )
    live: dict[str, tuple[str, bool]] = {}  # request -> (node, decoding)
    checked = 0
    for step in range(1500):
        node = f"n{rng.randrange(3)}"
        roll = rng.random()
        if roll < 0.35 or not live:
            rid = f"r{step}"
            prompt = rng.randrange(1, 2_000_000)
            cached = rng.randrange(0, prompt)
            t.dispatch_prefill(node, rid, Work(t_uc=float(prompt - cached), t_c=float(cached)), prompt + 16)
            live[rid] = (node, False)
        elif roll < 0.7:
            rid = rng.choice(list(live))
            where, decoding = live[rid]
            if decoding:
                t.finish_decode(where, rid)
                del live[rid]
            else:
                t.finish_prefill(where, rid)
                t.bind_decode(where, rid, rng.randrange(1, 100_000))
                live[rid] = (where, True)
        elif roll < 0.8:
            rid = rng.choice(list(live))
            where, decoding = live.pop(rid)
            (t.finish_decode if decoding else t.finish_prefill)(where, rid)
        else:
            seq = t.get(node).next_seq - 1 - rng.randrange(0, 20)
            t.apply_report(LoadReport(node_id=node, role=Role.BOTH, last_dispatch_seq=max(-1, seq)), 0.0)
        for n in ("n0", "n1", "n2"):
            e = t.get(n)
            for after in (-1, e.next_seq - 5, e.next_seq - 40, e.next_seq):
                q, count, kv = fresh_sums(t, n, after)
                got = NodeTable._unreported(e, after)
                assert got == q and (got is EMPTY_QUEUE) == (q.requests == 0), (step, n, after)
                assert NodeTable._decodes_after(e, after) == (count, kv), (step, n, after)
                checked += 1
    assert checked == 1500 * 12
    assert any(t.get(n).prefills for n in ("n0", "n1", "n2"))
