"""Reading a secret (a bearer token, a password) from a file: a mounted Kubernetes Secret.

One reader for every service: the directory, the router, the planners and the engine agent. The content
is stripped of surrounding whitespace; a missing, unreadable, empty or too short file is refused with one
clear :class:`SecretFileError` naming the file (never the secret). :class:`BearerAuth` checks a bearer
token in constant time (the router's reports, the engine's API and lease channel).
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Self

MIN_TOKEN_CHARS = 16


class SecretFileError(ValueError):
    """A secret file is missing, unreadable, empty or shorter than required."""


def read_secret_file(path: Path, what: str, min_chars: int = MIN_TOKEN_CHARS) -> str:
    """The stripped content of ``path`` (``what`` names it in errors: "directory token", ...)."""
    try:
        value = path.read_text().strip()
    except OSError as e:
        raise SecretFileError(f"cannot read the {what} file {path}: {e.strerror or e}") from None
    if not value:
        raise SecretFileError(f"the {what} file {path} is empty")
    if len(value) < min_chars:
        raise SecretFileError(
            f"the {what} in {path} has {len(value)} characters, fewer than {min_chars}: "
            f"use at least {min_chars} characters"
        )
    return value


def read_optional_secret(path: Path | None, what: str, min_chars: int = MIN_TOKEN_CHARS) -> str | None:
    """:func:`read_secret_file`, or None without a file (the service then sends no token)."""
    return None if path is None else read_secret_file(path, what, min_chars)


@dataclass(frozen=True, slots=True)
class BearerAuth:
    """Who may call: ``expected`` is the whole ``Authorization`` header value wanted; ``None``: anyone
    (an explicit opt-out). Subclasses name their token in errors (``what``) and may raise their own
    ``error`` class (a ``ValueError``)."""

    expected: bytes | None
    what: ClassVar[str] = "token"
    error: ClassVar[type[ValueError]] = SecretFileError

    @classmethod
    def token(cls, token: str) -> Self:
        token = token.strip()
        if len(token) < MIN_TOKEN_CHARS:
            raise cls.error(f"the {cls.what} must have at least {MIN_TOKEN_CHARS} characters")
        if any(c.isspace() for c in token):
            raise cls.error(f"the {cls.what} must not contain whitespace")
        return cls(f"Bearer {token}".encode())

    @classmethod
    def token_file(cls, path: Path) -> Self:
        return cls.token(read_secret_file(path, cls.what, MIN_TOKEN_CHARS))

    @classmethod
    def unauthenticated(cls) -> Self:
        return cls(None)

    @property
    def open(self) -> bool:
        return self.expected is None

    @property
    def header(self) -> str | None:
        """The ``Authorization`` header value a client sends (None when open)."""
        return None if self.expected is None else self.expected.decode()

    def allows(self, authorization: str | bytes | None) -> bool:
        """Whether a call with this ``Authorization`` header value may proceed (constant time)."""
        if self.expected is None:
            return True
        given = authorization.encode("utf-8", "replace") if isinstance(authorization, str) else authorization
        return hmac.compare_digest(given or b"", self.expected)
