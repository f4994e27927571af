"""Reading a secret (a bearer token, a password) from a file: a mounted Kubernetes Secret.

One reader for every service: the directory, the router, the planners and the engine agent. The content
is stripped of surrounding whitespace; a missing, unreadable, empty or too short file is refused with one
clear :class:`SecretFileError` naming the file (never the secret).
"""

from __future__ import annotations

from pathlib import Path

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
