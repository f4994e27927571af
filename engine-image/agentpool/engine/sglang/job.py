"""One request of the ``sglang`` backend: its event stream back to the router and what the agent
knows of it in SGLang (its ``rid``, its output so far, a hand-over being redone)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentpool.engine.jobs import EventStream
from agentpool.wire.engine import GenerateRequest


@dataclass(eq=False, kw_only=True)
class SglangJob(EventStream):
    rid: str
    prompt_tokens: int
    cached_tokens: int = 0  # the router's estimate until SGLang says
    output: bool = False  # SGLang answered with output (or the prefill was handed over)
    text: str = ""
    handover: tuple[GenerateRequest, dict[str, Any]] | None = None  # a decode: to prefill it again
    retrying: bool = False  # its hand-over failed: a new prefill at the source is under way
    tokens_out: int = 0  # SGLang's completion tokens so far
    last_output_at: float = 0.0  # monotonic time of its last chunk
