"""Who may post engine load reports: a bearer token read from a file, or (explicitly) anyone.

Reports steer routing and role switches, so they are authenticated by default: the router refuses to
start without a token unless it is told, in so many words, to accept unauthenticated reports.
The token is read from a file (a mounted Kubernetes Secret), never from a command line.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from pathlib import Path

from agentpool.secret_file import MIN_TOKEN_CHARS, read_secret_file

TOKEN_FILE_ENV = "AGENTPOOL_REPORT_TOKEN_FILE"


class AuthConfigError(ValueError):
    """The report token is missing, unreadable or too short."""


@dataclass(frozen=True, slots=True)
class ReportAuth:
    """``expected``: the whole ``Authorization`` header value wanted; ``None``: reports are open."""

    expected: bytes | None

    @classmethod
    def token(cls, token: str) -> ReportAuth:
        token = token.strip()
        if len(token) < MIN_TOKEN_CHARS:
            raise AuthConfigError(f"the report token must have at least {MIN_TOKEN_CHARS} characters")
        if any(c.isspace() for c in token):
            raise AuthConfigError("the report token must not contain whitespace")
        return cls(f"Bearer {token}".encode())

    @classmethod
    def token_file(cls, path: Path) -> ReportAuth:
        return cls.token(read_secret_file(path, "report token", MIN_TOKEN_CHARS))

    @classmethod
    def unauthenticated(cls) -> ReportAuth:
        return cls(None)

    @property
    def open(self) -> bool:
        return self.expected is None

    def allows(self, authorization: str | None) -> bool:
        """Whether a request with this ``Authorization`` header may post a report (constant time)."""
        if self.expected is None:
            return True
        given = (authorization or "").encode("utf-8", "replace")
        return hmac.compare_digest(given, self.expected)
