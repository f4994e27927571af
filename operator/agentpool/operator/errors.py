"""The operator's failures, as kopf should treat them: permanent (the spec is wrong; the status
says why and nothing retries until the pool changes) or temporary (retry with a back-off)."""

from __future__ import annotations


class PoolError(Exception):
    """Base of the operator's own errors."""


class InvalidPool(PoolError):
    """The pool cannot be served as written: `Degraded/InvalidSpec`, no retry."""


class NotYet(PoolError):
    """Waiting for something in the cluster (e.g. engines to drain); retry after `delay_s`."""

    def __init__(self, message: str, delay_s: float) -> None:
        super().__init__(message)
        self.delay_s = delay_s
