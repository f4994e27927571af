"""The engine agent's domain errors. Each is temporary (retry) or permanent (report) by its kind in
:mod:`agentpool.errors`, whose one table gives the HTTP status the edge answers with
(:mod:`agentpool.engine.http_errors`)."""

from __future__ import annotations

from agentpool.errors import (
    AgentpoolError,
    InvalidInputError,
    NotFoundError,
    UnauthenticatedError,
    UnavailableError,
    UpstreamError,
)


class EngineError(AgentpoolError):
    """Root of the engine agent's errors (500 unless a kind below says otherwise)."""


class BadRequestError(EngineError, InvalidInputError):
    """Malformed or oversized input from a caller (400)."""


class ContextLengthError(BadRequestError):
    """A request longer than the engine takes (its context length, or all of its KV): 400, and the
    error's ``type`` names it, so that the router answers ``context_length_exceeded``."""


class Unauthenticated(EngineError, UnauthenticatedError):
    """A call to the engine's API or lease channel without the engine token, or with a wrong one (401)."""


class UnknownTransferError(EngineError, NotFoundError):
    """A transfer id or lease that this engine does not hold (never issued, expired or released; 404)."""


class NotServingError(EngineError, UnavailableError):
    """The engine does not serve this phase now (draining, switching or another role; 503)."""


class PoolFullError(EngineError, UnavailableError):
    """The host pool has no free or evictable slot for the blocks asked for (503)."""


class FetchError(EngineError, UpstreamError):
    """Reading blocks from a peer failed (peer gone, transfer error, timeout or wrong bytes; 502).

    Temporary by nature: the caller recomputes the blocks instead. ``evicted``: host blocks this node
    evicted to make room before the fetch failed (the fetcher sets it; the caller reports them gone)."""

    def __init__(self, message: str = "", *, retry_after_s: float | None = None) -> None:
        super().__init__(message, retry_after_s=retry_after_s)
        self.evicted: list[int] = []


class SwitchFailed(EngineError, UpstreamError):
    """The backend refused a role switch and still serves its old role (502)."""


class BackendUnavailable(EngineError, UnavailableError):
    """The configured backend cannot run here (a package or a device it needs is missing; 503)."""
