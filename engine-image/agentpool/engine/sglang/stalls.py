"""What a silent request of the ``sglang`` backend waits for, in words, for the stall log
(:class:`agentpool.engine.stall_watch.StallWatch`, as the ``sim`` backend's ``sim_wait``).

The agent cannot see inside SGLang's scheduler; it says what it knows: the request's SGLang ``rid``
(to find it in SGLang's own log), whether SGLang answered anything yet and when its last chunk
came, a hand-over being redone at the prefill source, and SGLang's last load (running and waiting
requests, KV use) with the process and its readiness.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentpool.engine.jobs import EventStream
from agentpool.engine.sglang.job import SglangJob

if TYPE_CHECKING:
    from agentpool.engine.sglang.backend import SglangBackend


def sglang_wait(b: SglangBackend, s: EventStream, now: float) -> str:
    """What request ``s`` of backend ``b`` waits for at ``now`` (monotonic), and SGLang's state."""
    parts = []
    if isinstance(s, SglangJob):
        parts.append(f"SGLang rid {s.rid}")
        if s.retrying:
            parts.append("its KV hand-over failed: the prefill is being redone at the source")
        elif not s.output:
            uncached = s.prompt_tokens - s.cached_tokens
            parts.append(f"no output from SGLang yet ({s.prompt_tokens} prompt tokens, ~{uncached} uncached)")
        else:
            parts.append(f"{s.tokens_out} tokens out, the last chunk {now - s.last_output_at:.1f} s ago")
    if s.waiting_for:
        parts.append(f"waiting for {s.waiting_for} for {now - s.waiting_since:.1f} s")
    sl = b.last_load
    load = (
        "no load read from SGLang yet"
        if sl is None
        else f"SGLang's last load: {sl.running} running, {sl.waiting} waiting, KV {sl.used_tokens} of "
        f"{sl.capacity_tokens} tokens"
    )
    state = b.not_ready_reason() or "ready"
    parts.append(
        f"{load} ({b.load_errors} load reads failed); SGLang pid {b.process.pid}, {state}; "
        f"{len(b.jobs)} of our requests in it"
    )
    return "; ".join(parts)
