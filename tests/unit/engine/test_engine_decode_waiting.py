"""``decode_waiting_tokens`` in the engines' load reports (SMetric's KV check on colocated nodes): the
KV of requests prefilled and waiting for decode room, outside ``kv_used_tokens``.

- ``sim``: its node decodes a prefilled request at once, past the KV capacity; the KV over the
  capacity is what the simulator's colocated nodes would hold waiting.
- ``sglang``: SGLang retracts decoding requests when its KV runs short and does not say which; the
  requests with output beyond SGLang's running count, silent longest (and at least the stall time),
  need their prompt and their output so far back.
"""

from __future__ import annotations

from agentpool.engine.sglang.control import decode_waiting_tokens
from agentpool.engine.sglang.iterations import PACER_STALL_S
from agentpool.engine.simstate import decode_waiting_tokens as sim_decode_waiting
from agentpool.node import NodeLoad, NodeStatus, Role


def load(role: Role, used: int, capacity: int) -> NodeLoad:
    return NodeLoad(
        role=role,
        status=NodeStatus.SERVING,
        queue=(),
        running=3,
        remaining_batch_s=0.0,
        kv_used_tokens=used,
        kv_capacity_tokens=capacity,
        kv_room_tokens=max(0, capacity - used),
        bound_waiting=0,
        joining=0,
        gpu_cached_blocks=0,
    )


def test_sim_reports_the_kv_over_capacity_on_a_colocated_node() -> None:
    assert sim_decode_waiting(load(Role.BOTH, 900, 1000)) == 0
    assert sim_decode_waiting(load(Role.BOTH, 1330, 1000)) == 330
    # a decode node's reservations past capacity are not prefilled requests waiting for room there
    assert sim_decode_waiting(load(Role.DECODE, 1330, 1000)) == 0


def test_sglang_counts_the_silent_requests_beyond_sglangs_running_count() -> None:
    # (last chunk at, prompt + output so far) of the agent's requests that had output
    now = 100.0
    silent = now - PACER_STALL_S - 1
    decoding = (now - 0.01, 1020)  # a chunk a moment ago
    longest = (silent - 5, 2050)  # silent longest
    other = (silent, 3010)
    outputs = [decoding, longest, other]
    # three had output; SGLang runs one: two were retracted, and both are silent
    assert decode_waiting_tokens(outputs, running=1, now=now) == 2050 + 3010
    # SGLang runs two: one retracted, the one silent longest
    assert decode_waiting_tokens(outputs, running=2, now=now) == 2050
    assert decode_waiting_tokens(outputs, running=3, now=now) == 0
    # a request silent for less than the stall time may just be between chunks
    assert decode_waiting_tokens(outputs, running=1, now=silent + 1) == 2050
    assert decode_waiting_tokens([decoding, other], running=1, now=now) == 3010
