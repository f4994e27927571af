"""Per-user token files: what a service uses when it is started by hand without a token file.

In a cluster every token comes from a Secret the operator generates and mounts, and every service is
given its file. Started from a command line on one machine, the directory, the routers, the engines
and the planners find the pool's three tokens in one per-user folder instead::

    $AGENTPOOL_TOKEN_DIR  (default: $XDG_CONFIG_HOME/agentpool/tokens, else ~/.config/agentpool/tokens)
        directory   the directory's bearer token (directory, routers, engines, planners)
        report      the routers' report token (engines' load reports, planners' fitted models)
        engine      the pool's engine token (routers and peer engines call the engines with it)

The first service that needs a token creates its file: 32 random bytes in hex, mode 0600, in a folder
of mode 0700; every later one reads it, so services started by the same user agree without flags and
nothing is served without a token. A folder or file that others may read is refused, as ``ssh`` refuses
a private key others can read. Concurrent first starts are safe: the file appears whole or not at all
(written aside, then hard-linked into place), and the loser of a race reads the winner's token.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import stat
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path

from agentpool.secret_file import SecretFileError, read_secret_file

log = logging.getLogger(__name__)

TOKEN_DIR_ENV = "AGENTPOOL_TOKEN_DIR"


class LocalToken(StrEnum):
    """The pool's tokens, by the name of their file in the token folder."""

    DIRECTORY = "directory"
    REPORT = "report"
    ENGINE = "engine"


def token_dir(env: Mapping[str, str]) -> Path:
    """The per-user token folder: ``$AGENTPOOL_TOKEN_DIR``, else under ``$XDG_CONFIG_HOME`` or
    ``~/.config``."""
    if env.get(TOKEN_DIR_ENV):
        return Path(env[TOKEN_DIR_ENV])
    config_home = Path(env["XDG_CONFIG_HOME"]) if env.get("XDG_CONFIG_HOME") else Path.home() / ".config"
    return config_home / "agentpool" / "tokens"


def local_token_file(token: LocalToken, env: Mapping[str, str] | None = None) -> Path:
    """The path of ``token``'s per-user file, created with a new random token if absent.

    :class:`SecretFileError` when the folder cannot be made, is open to other users, or the file is
    readable by others (the message says which flag names a file instead)."""
    folder = token_dir(os.environ if env is None else env)
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        _check_private(folder, "folder")
        path = folder / token.value
        if not path.exists():
            _create(path)
        _check_private(path, "file")
    except OSError as e:
        raise SecretFileError(
            f"cannot use the per-user {token.value} token in {folder}: {e.strerror or e} "
            f"(set ${TOKEN_DIR_ENV}, or give the service its token file)"
        ) from None
    return path


def token_file_or_local(
    given: Path | None, token: LocalToken, what: str, env: Mapping[str, str] | None = None
) -> Path:
    """``given`` when a file was named; else the per-user file of ``token``, and a log line saying so
    (``what`` names the option that would have named one)."""
    if given is not None:
        return given
    path = local_token_file(token, env)
    log.info("%s not given: using the per-user %s token %s", what, token.value, path)
    return path


def local_or_given_secret(
    given: Path | None, token: LocalToken, option: str, what: str, env: Mapping[str, str] | None = None
) -> str:
    """The ``what`` (named in errors) in ``given``, or in the per-user file of ``token``
    (:func:`token_file_or_local`; ``option`` names the setting that would have named a file)."""
    return read_secret_file(token_file_or_local(given, token, option, env), what)


def router_and_directory_tokens(
    report_file: Path | None, directory_file: Path | None, uses_directory: bool
) -> tuple[str, str | None]:
    """What a client of the routers and the directory (a planner) sends: the routers' report token, and
    the directory's token when it uses one (each from its file or the per-user one). Blocking reads."""
    report = local_or_given_secret(report_file, LocalToken.REPORT, "--router-token-file", "router token")
    if not uses_directory:
        return report, None
    directory = local_or_given_secret(
        directory_file, LocalToken.DIRECTORY, "--directory-token-file", "directory token"
    )
    return report, directory


def _create(path: Path) -> None:
    aside = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32) + "\n")
        with contextlib.suppress(FileExistsError):  # another service made it first: use theirs
            os.link(aside, path)
    finally:
        aside.unlink(missing_ok=True)


def _check_private(path: Path, kind: str) -> None:
    mode = path.stat().st_mode
    if not mode & (stat.S_IRWXG | stat.S_IRWXO):
        return
    if kind == "folder":
        fix = f"set ${TOKEN_DIR_ENV} to a folder of your own, or chmod 700 {path} if only you use it"
    else:
        fix = f"chmod 600 {path}"
    raise SecretFileError(
        f"the token {kind} {path} is open to other users (mode {stat.filemode(mode)}): {fix}"
    )
