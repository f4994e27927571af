"""The operator's failures, as kopf should treat them (:mod:`agentpool.errors`' two kinds, which the
handlers map to kopf's in one place): permanent (the spec is wrong; the status says why and nothing
retries until the pool changes) or temporary (retry with a back-off)."""

from __future__ import annotations

from agentpool.errors import AgentpoolError, PermanentError, TemporaryError


class PoolError(AgentpoolError):
    """Base of the operator's own errors."""


class InvalidPool(PoolError, PermanentError):
    """The pool cannot be served as written: `Degraded/InvalidSpec`, no retry."""


class NotYet(PoolError, TemporaryError):
    """Waiting for something in the cluster (e.g. engines to drain); retry after `delay_s`."""

    def __init__(self, message: str, delay_s: float) -> None:
        super().__init__(message, retry_after_s=delay_s)
        self.delay_s = delay_s
