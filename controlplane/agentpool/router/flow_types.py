"""The request flow's types (:mod:`agentpool.router.flow`): the request it serves (:class:`Prepared`,
read with :class:`Routing`), where its answer goes (:class:`Output`, :class:`Finish`), and the errors it
ends with (:class:`FlowError` and its kinds; the server maps them to HTTP)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from agentpool.errors import (
    AgentpoolError,
    InvalidInputError,
    OverloadedError,
    UnavailableError,
    UpstreamError,
)
from agentpool.router.config import RouterConfig
from agentpool.router.openai_api import REJECTED_BY_ENGINE
from agentpool.router.policy import Policy, PolicyContext, RequestView
from agentpool.wire.engine import Usage

Endpoint = Literal["chat", "completion"]


class FlowError(AgentpoolError):
    """Base of the errors a request flow ends with; the server maps their kinds to HTTP."""


class Overloaded(FlowError, OverloadedError):
    """Every eligible node is over its queue limit: answer 429 with Retry-After."""


class NoCapacity(FlowError, UnavailableError):
    """No node can serve the request now (none configured, all draining or refusing): 503."""


class RequestFailed(FlowError, UpstreamError):
    """Engines failed before the first token and the retries are spent: 502."""


class StreamBroken(FlowError, UpstreamError):
    """An engine failed after the client got the first token."""


class BadRequest(FlowError, InvalidInputError):
    """An engine refused the request for its content: the client's fault (400); no engine is blamed.
    ``code``: OpenAI's error code for the answer."""

    def __init__(self, message: str, code: str = REJECTED_BY_ENGINE) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class Finish:
    finish_reason: str
    usage: Usage


class Output:
    """Where the flow puts the answer's text as the engines send it (the server's collector or its SSE
    stream): :meth:`chunk` per piece; ``sent`` (set by the flow): whether any text went out, after
    which a failure cannot be retried (the client has its first token)."""

    __slots__ = ("sent",)

    def __init__(self) -> None:
        self.sent = False

    async def chunk(self, text: str) -> None:
        raise NotImplementedError


@dataclass(slots=True)
class Prepared:
    """A validated, tokenized, resolved request ready for routing."""

    request_id: str
    endpoint: Endpoint
    body: dict[str, object]
    token_ids: list[int]
    view: RequestView
    branch: str | None = None
    excluded: set[str] = field(default_factory=set)
    hashes: Sequence[int] = ()  # full pages as resolved: placed with the branch once a node takes it
    token_ids_json: bytes | None = None  # orjson.dumps(token_ids), when the prompt memo had it


@dataclass(slots=True)
class Routing:
    """What the flow reads on every request; the service swaps it on a config reload."""

    config: RouterConfig
    policy: Policy
    ctx: PolicyContext
