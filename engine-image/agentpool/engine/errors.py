"""The engine agent's domain errors, mapped to HTTP status codes at the edge (``server.py``)."""

from __future__ import annotations


class EngineError(Exception):
    """Root of the engine agent's errors. ``status`` is the HTTP code the edge answers with."""

    status = 500


class BadRequestError(EngineError):
    """Malformed or oversized input from a caller."""

    status = 400


class UnknownTransferError(EngineError):
    """A transfer id or lease that this engine does not hold (never issued, expired or released)."""

    status = 404


class NotServingError(EngineError):
    """The engine does not serve this phase now (draining, switching or another role)."""

    status = 503


class PoolFullError(EngineError):
    """The host pool has no free or evictable slot for the blocks asked for."""

    status = 503


class FetchError(EngineError):
    """Reading blocks from a peer failed (peer gone, transfer error, timeout or wrong bytes).

    Temporary by nature: the caller recomputes the blocks instead."""

    status = 502


class SwitchFailed(EngineError):
    """The backend refused a role switch and still serves its old role."""

    status = 502


class BackendUnavailable(EngineError):
    """The configured backend cannot run here (a package or a device it needs is missing)."""

    status = 503
