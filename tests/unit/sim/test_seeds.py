"""Seeds change the conversation order and the iteration noise; the same seed repeats a run exactly."""

from __future__ import annotations

from functools import cache
from typing import Any

from agentpool.sim.replay import cycle
from agentpool.sim.run import Scenario, load_conversations, run_system
from agentpool.sim.simulator import SimConfig
from agentpool.sim.trace import Conversation


@cache
def _convs() -> tuple[Conversation, ...]:
    convs = load_conversations(Scenario(conversations=20))
    assert convs is not None
    return tuple(convs)


def _run(seed: int, system: str = "agentpool") -> dict[str, Any]:
    sc = Scenario(
        conversations=20,
        agents=12,
        max_pause_s=30.0,
        warmup_s=60.0,
        duration_s=240.0,
        seed=seed,
        static_prefill_nodes=2,
        sim=SimConfig(nodes=4, prefill_nodes=2),
    )
    r = run_system(system, sc, _convs())
    return {k: r[k] for k in ("summary", "split_timeline", "ttft_samples")}


def test_same_seed_gives_identical_results() -> None:
    assert _run(3) == _run(3)


def test_different_seeds_give_different_results() -> None:
    runs = [_run(s, "static-cache-aware") for s in (1, 2, 3)]
    ttfts = [tuple(r["ttft_samples"]) for r in runs]
    assert len(set(ttfts)) == 3
    assert len({r["summary"]["requests"] for r in runs} | {r["summary"]["ttft_s"]["mean"] for r in runs}) > 1


def test_the_seed_draws_a_fresh_conversation_order_every_pass() -> None:
    convs = _convs()
    a, b = cycle(convs, 1), cycle(convs, 2)
    first = [id(a()) for _ in range(len(convs))]
    second = [id(a()) for _ in range(len(convs))]
    assert sorted(first) == sorted(id(c) for c in convs)  # each pass hands out every conversation once
    assert first != second
    assert first != [id(b()) for _ in range(len(convs))]
    plain = cycle(convs)
    assert [id(plain()) for _ in range(len(convs))] == [id(c) for c in convs]
