"""The one root of agentpool's errors, split the way kopf splits handler failures.

- :class:`TemporaryError`: the same call may succeed later (a peer or store is down, the node is
  busy or draining, capacity is short): retry, after ``retry_after_s`` when it is set.
- :class:`PermanentError`: the same call fails the same way again (bad input, unknown object): do
  not retry, report it to whoever sent it.

Each service's own errors derive from one of the kinds below (and from their service's root, e.g.
``EngineError``), so an edge never guesses: :func:`http_status` and :func:`grpc_code_name` look a
class up in the one table here (the most specific kind an error derives from wins). The gRPC code
is a name (``grpc.StatusCode[name]`` at the edge): this package imports nothing, so every pure core
may derive its errors from it.
"""

from __future__ import annotations


class AgentpoolError(Exception):
    """Root of every error agentpool raises on purpose."""


class TemporaryError(AgentpoolError):
    """Retry: the same call may succeed later (after ``retry_after_s`` seconds when it is set)."""

    def __init__(self, message: str = "", *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        if retry_after_s is not None and not retry_after_s >= 0:
            raise ValueError(f"retry_after_s must be >= 0, got {retry_after_s}")
        self.retry_after_s = retry_after_s


class PermanentError(AgentpoolError):
    """Report, do not retry: the same call fails the same way again."""


class InvalidInputError(PermanentError, ValueError):
    """The caller's input is malformed, too large or refused for its content."""


class NotFoundError(PermanentError, LookupError):
    """The call names something this service does not hold (never made, expired or released)."""


class UnauthenticatedError(PermanentError):
    """The caller did not prove who it is (no token, a wrong one): the same call fails again."""


class UnavailableError(TemporaryError):
    """This service (or the part asked) cannot serve now: draining, switching, store down, full."""


class OverloadedError(TemporaryError):
    """The caller asks for more than the service takes now (queues or a quota are full)."""


class ConflictError(TemporaryError):
    """The object changed or exists already (a concurrent writer): read it again and retry."""


class UpstreamError(TemporaryError):
    """A service this one depends on failed (an engine, a peer, a backend)."""


# error kind -> (HTTP status, gRPC status code name); the only place these numbers are chosen
CODES: dict[type[AgentpoolError], tuple[int, str]] = {
    AgentpoolError: (500, "INTERNAL"),
    PermanentError: (500, "FAILED_PRECONDITION"),
    TemporaryError: (503, "UNAVAILABLE"),
    InvalidInputError: (400, "INVALID_ARGUMENT"),
    NotFoundError: (404, "NOT_FOUND"),
    UnauthenticatedError: (401, "UNAUTHENTICATED"),
    UnavailableError: (503, "UNAVAILABLE"),
    OverloadedError: (429, "RESOURCE_EXHAUSTED"),
    ConflictError: (409, "ABORTED"),
    UpstreamError: (502, "UNAVAILABLE"),
}


def _codes(error: AgentpoolError | type[AgentpoolError]) -> tuple[int, str]:
    cls = error if isinstance(error, type) else type(error)
    for kind in cls.__mro__:
        if kind in CODES:
            return CODES[kind]
    raise AssertionError(f"{cls.__name__} does not derive from AgentpoolError")  # mypy: unreachable


def http_status(error: AgentpoolError | type[AgentpoolError]) -> int:
    """The HTTP status an edge answers ``error`` with."""
    return _codes(error)[0]


def grpc_code_name(error: AgentpoolError | type[AgentpoolError]) -> str:
    """The name of the gRPC status code an edge aborts with for ``error`` (``grpc.StatusCode[name]``)."""
    return _codes(error)[1]


__all__ = [
    "CODES",
    "AgentpoolError",
    "ConflictError",
    "InvalidInputError",
    "NotFoundError",
    "OverloadedError",
    "PermanentError",
    "TemporaryError",
    "UnauthenticatedError",
    "UnavailableError",
    "UpstreamError",
    "grpc_code_name",
    "http_status",
]
