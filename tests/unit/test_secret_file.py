"""The one reader of token and password files shared by every service."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentpool.secret_file import MIN_TOKEN_CHARS, SecretFileError, read_optional_secret, read_secret_file


def test_a_token_file_is_read_stripped(tmp_path: Path) -> None:
    (tmp_path / "t").write_text("  " + "a" * MIN_TOKEN_CHARS + "\n")
    assert read_secret_file(tmp_path / "t", "report token") == "a" * MIN_TOKEN_CHARS
    assert read_optional_secret(tmp_path / "t", "report token") == "a" * MIN_TOKEN_CHARS
    assert read_optional_secret(None, "report token") is None


def test_missing_empty_and_short_files_are_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(SecretFileError, match=r"cannot read the directory token file .*missing"):
        read_secret_file(tmp_path / "missing", "directory token")
    (tmp_path / "empty").write_text(" \n")
    with pytest.raises(SecretFileError, match=r"the router token file .*empty is empty"):
        read_optional_secret(tmp_path / "empty", "router token")
    (tmp_path / "short").write_text("abc\n")
    with pytest.raises(SecretFileError, match="3 characters, fewer than 16: use at least 16 characters") as e:
        read_secret_file(tmp_path / "short", "report token")
    assert "abc" not in str(e.value)  # the secret itself is never echoed
    assert read_secret_file(tmp_path / "short", "Redis password", min_chars=1) == "abc"


def test_an_optional_client_context_is_none_without_files_and_checks_them_with() -> None:
    from agentpool.secret_file.tls import TlsFilesError, optional_client_context

    assert optional_client_context(None, None, None) is None
    with pytest.raises(TlsFilesError, match="needs its key file"):
        optional_client_context(None, Path("cert.pem"), None, "the routers")
