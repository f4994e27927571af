"""The HTTP protocol between the router and engines (both import it; neither owns it).

Dispatch: ``POST {engine}/agentpool/v1/generate`` with a :class:`GenerateRequest`; the engine answers
``200`` with a stream of newline-delimited JSON :class:`EngineEvent` objects:

- ``started``: the prefill of the request began (the router binds the decode node now); with
  ``cached_tokens`` when the node knows them: the prompt tokens it did not compute (its cache or a
  fetch), which the router puts in a disaggregated request's ``usage.prompt_tokens_details``;
- ``token``: output text (colocated and decode phases; ``prefilled`` carries the first token);
- ``prefilled``: prefill done on a prefill node; the KV waits under ``transfer_id`` for the decode
  node, which the router then asks with ``phase=decode`` and ``kv_source``/``transfer_id``;
- ``requeue``: the engine gives the request back unserved (it is draining for a role switch or
  shedding load); the router re-routes it, and this does not count as a failure. One ``reason`` is
  typed, :data:`KV_SOURCE_LOST`: a decode node cannot get the request's KV because the prefill node
  in ``kv_source`` is gone or refuses, and it has sent nothing; the router then places the request
  again from the start (a prefill on another node, then a decode), once;
- ``done``: finished, with ``finish_reason`` and ``usage``;
- ``error``: the engine failed the request.

Load reports: engines ``POST {router}/agentpool/v1/report`` a :class:`LoadReport`, with the role
they serve (``role``) and, while the planner's annotation asks for another one, ``desired_role``.
A report covers the requests the router dispatched to the node up to ``last_dispatch_seq`` (the
router numbers its dispatches per node), so requests sent later count as "sent but not reported".
Each router numbers its own dispatches: a dispatch carries the router's ``router_id`` (random per
router process), the router's answer to a report (:class:`ReportAck`) names it too, and the engine
sends each router the last sequence number of that router's dispatches (-1 before it knows which
router a report target is).
``decode_waiting_tokens`` is the KV (prompt + output) of requests the node prefilled that wait for
decode room outside ``kv_used_tokens`` (a colocated node: SMetric counts it against the KV room).
A report also carries ``t_acc``, the output tokens the node's decode accepted per request and
iteration since its last report (about 1.7 with MTP speculative decoding; absent: no decode
iteration ran, the router keeps the last value, 1 at first), and ``iterations``, the iteration
records the planner fits its models from (:mod:`agentpool.wire.iterations`).

Registration: a report with ``url`` (the engine's base URL) from a node the router does not know
registers it (the router's engine registry, on by default); reports are its heartbeat, and a
registered engine that stops reporting is removed after ``discovery.registryTtl``. An engine that
shuts down cleanly may ``DELETE {router}/agentpool/v1/engines/{node_id}`` (same token).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field

from agentpool.kv import Role
from agentpool.wire.iterations import MAX_ITERATIONS_PER_REPORT, WireIteration

Phase = Literal["both", "prefill", "decode"]
EventType = Literal["started", "token", "prefilled", "requeue", "done", "error"]
TOO_LONG = "ContextLengthError"
"""The engine's error type for a request longer than it takes: the ``type`` of a 400's JSON error,
or the ``reason`` of an ``error`` event (a refusal from SGLang mid-stream); the router answers the
client ``context_length_exceeded``."""

KV_SOURCE_LOST = "kv_source_lost"
"""The ``reason`` of a decode node's ``requeue`` when the KV it was to take cannot be had: the prefill
node named in ``kv_source`` is gone or refuses (and the decode node cannot prefill the prompt itself).
Sent only before any output; other ``requeue`` reasons are free text."""


class KvSource(BaseModel):
    model_config = ConfigDict(extra="forbid")
    node_id: str
    url: str
    transfer_id: str


class GenerateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    request_id: str
    dispatch_seq: int = Field(ge=0)
    phase: Phase
    endpoint: Literal["chat", "completion"]
    body: dict[str, Any]
    prompt_token_ids: list[int]
    cached_tokens: int = Field(0, ge=0)
    fetch_tokens: int = Field(0, ge=0)
    kv_source: KvSource | None = None
    router_id: str | None = Field(None, min_length=1, max_length=64)
    """The router that numbered ``dispatch_seq`` (its :attr:`ReportAck.router_id`)."""


class Usage(BaseModel):
    """The engine's usage object; fields beyond the two counts (``prompt_tokens_details`` with
    ``cached_tokens``, ``completion_tokens_details``, ...) are kept and passed to the client whole."""

    model_config = ConfigDict(extra="allow")
    prompt_tokens: int = 0
    completion_tokens: int = 0


def with_cached_tokens(usage: Usage, cached_tokens: int) -> Usage:
    """``usage`` with ``prompt_tokens_details.cached_tokens`` set (the rest of the details kept): a
    disaggregated request's cache hits are the prefill node's, its usage the decode node's."""
    details = getattr(usage, "prompt_tokens_details", None)
    merged = {**(details if isinstance(details, dict) else {}), "cached_tokens": cached_tokens}
    return Usage.model_validate({**usage.model_dump(), "prompt_tokens_details": merged})


def encode_generate(r: GenerateRequest) -> bytes:
    """``r`` as JSON (orjson: the request body and token ids are the bulk; the fields were validated
    where they came from, so the model's own serializer is not needed)."""
    kv = None if r.kv_source is None else r.kv_source.model_dump()
    return generate_body(
        r.request_id,
        r.dispatch_seq,
        r.phase,
        r.endpoint,
        r.body,
        r.prompt_token_ids,
        r.cached_tokens,
        r.fetch_tokens,
        kv,
        r.router_id,
    )


def generate_body(
    request_id: str,
    dispatch_seq: int,
    phase: Phase,
    endpoint: Literal["chat", "completion"],
    body: dict[str, Any],
    prompt_token_ids: list[int],
    cached_tokens: int,
    fetch_tokens: int,
    kv_source: dict[str, str] | None,
    router_id: str | None,
    *,
    prompt_token_ids_json: bytes | None = None,
) -> bytes:
    """A :class:`GenerateRequest`'s JSON from its fields, for a caller whose fields are already
    valid (the router's dispatch: no model is built only to be serialized). Same bytes as
    :func:`encode_generate` of the model.

    ``prompt_token_ids_json``: ``orjson.dumps(prompt_token_ids)`` when the caller has it (the
    router's prompt memo keeps each message's part: a long prompt's ids are most of the body); it is
    put in place between the other fields' JSON, which orjson writes the same either way."""
    if prompt_token_ids_json is None:
        return orjson.dumps(
            {
                "request_id": request_id,
                "dispatch_seq": dispatch_seq,
                "phase": phase,
                "endpoint": endpoint,
                "body": body,
                "prompt_token_ids": prompt_token_ids,
                "cached_tokens": cached_tokens,
                "fetch_tokens": fetch_tokens,
                "kv_source": kv_source,
                "router_id": router_id,
            }
        )
    head = orjson.dumps(
        {
            "request_id": request_id,
            "dispatch_seq": dispatch_seq,
            "phase": phase,
            "endpoint": endpoint,
            "body": body,
        }
    )
    tail = orjson.dumps(
        {
            "cached_tokens": cached_tokens,
            "fetch_tokens": fetch_tokens,
            "kv_source": kv_source,
            "router_id": router_id,
        }
    )
    return b'%s,"prompt_token_ids":%s,%s' % (head[:-1], prompt_token_ids_json, tail[1:])


class EngineEvent(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: EventType
    text: str = ""
    transfer_id: str | None = None
    finish_reason: str | None = None
    usage: Usage | None = None
    cached_tokens: int | None = Field(None, ge=0)
    """With ``started``: the prompt tokens the node took from a cache or a fetch (absent: unknown)."""
    reason: str = ""
    """With ``requeue``: why; with ``error``: :data:`TOO_LONG` for a request longer than the engine takes."""
    message: str = ""
    # with ``error``: 4xx when the request's content is at fault (the engine is fine), else absent/5xx
    status: int | None = Field(None, ge=400, le=599)


@dataclass(slots=True)
class Event:
    """A ``token`` or ``started`` event read without pydantic: :class:`EngineEvent`'s fields and
    defaults (a value: never modified; not frozen, which would cost more to build than pydantic's
    validation). :func:`parse_event` gives one for a line with nothing but ``type`` and ``text``
    (every token of every stream), and the validated :class:`EngineEvent` for any other line."""

    type: EventType
    text: str = ""
    transfer_id: str | None = None
    finish_reason: str | None = None
    usage: Usage | None = None
    cached_tokens: int | None = None
    reason: str = ""
    message: str = ""
    status: int | None = None


AnyEvent = Event | EngineEvent  # what :func:`parse_event` gives: the same attributes either way


def parse_event(line: bytes) -> AnyEvent:
    """One event line (raises ``ValueError`` for a line :class:`EngineEvent` would not accept).

    The lean path takes only lines whose keys are ``type`` (``token`` or ``started``) and
    ``text`` (a string): :class:`EngineEvent` checks those fields and nothing else, and its
    defaults fill the rest, so both give the same event; every other line, and any line orjson
    cannot read, goes to :class:`EngineEvent` (same acceptance and errors as before)."""
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError:
        obj = None
    if type(obj) is dict:
        kind = obj.get("type")
        if kind == "token" or kind == "started":
            text = obj.get("text", "")
            if type(text) is str and len(obj) == (2 if "text" in obj else 1):
                return Event(kind, text)
    return EngineEvent.model_validate_json(line)


class QueuedItem(BaseModel):
    model_config = ConfigDict(extra="forbid")
    request_id: str
    t_uc: int = Field(ge=0)
    t_c: int = Field(0, ge=0)


class LoadReport(BaseModel):
    model_config = ConfigDict(extra="forbid")
    node_id: str = Field(min_length=1, max_length=200)
    role: Role
    url: str | None = Field(None, pattern=r"^https?://[^\s/]+(/\S*)?$", max_length=2000)
    desired_role: Role | None = None
    last_dispatch_seq: int = Field(-1, ge=-1)
    remaining_batch_s: float = Field(0.0, ge=0)
    queue: list[QueuedItem] = Field(default_factory=list, max_length=100_000)
    running_decode: int = Field(0, ge=0)
    kv_room_tokens: int = Field(0, ge=0)
    kv_used_tokens: int = Field(0, ge=0)
    decode_waiting_tokens: int = Field(0, ge=0)
    """KV tokens (prompt + output) of requests the node prefilled that wait for decode room and are
    not in ``kv_used_tokens`` (colocated nodes; SMetric's TPOT check, ``NodeState.decode_waiting_tokens``)."""
    accepting: bool = True
    t_acc: float | None = Field(None, gt=0, le=64, allow_inf_nan=False)
    iterations: list[WireIteration] = Field(default_factory=list, max_length=MAX_ITERATIONS_PER_REPORT)


class ReportAck(BaseModel):
    """The router's answer to an accepted load report."""

    model_config = ConfigDict(extra="ignore")
    ok: bool = True
    router_id: str | None = Field(None, min_length=1, max_length=64)
