"""Who may post engine load reports: a bearer token read from a file, or (explicitly) anyone.

Reports steer routing and role switches, so they are authenticated by default: the router refuses to
start without a token unless it is told, in so many words, to accept unauthenticated reports. The
same holds for the engine token it sends (``--insecure-engines-without-token``).
The token is read from a file (a mounted Kubernetes Secret), never from a command line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from agentpool.secret_file import BearerAuth

TOKEN_FILE_ENV = "AGENTPOOL_REPORT_TOKEN_FILE"
ENGINE_TOKEN_FILE_ENV = "AGENTPOOL_ENGINE_TOKEN_FILE"
"""The file with the pool's engine token, which the router sends to the engines."""


class AuthConfigError(ValueError):
    """A token (report, engine, directory) is missing, unreadable or too short, or its options clash."""


@dataclass(frozen=True, slots=True)
class ReportAuth(BearerAuth):
    """``expected``: the whole ``Authorization`` header value wanted; ``None``: reports are open."""

    what: ClassVar[str] = "report token"
    error: ClassVar[type[ValueError]] = AuthConfigError


@dataclass(frozen=True, slots=True)
class EngineToken(BearerAuth):
    """The pool's engine token the router sends to the engines (``EngineClient``)."""

    what: ClassVar[str] = "engine token"
    error: ClassVar[type[ValueError]] = AuthConfigError
