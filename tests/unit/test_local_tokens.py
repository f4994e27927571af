"""The per-user token files services use when started without a token file."""

from __future__ import annotations

import stat
import threading
from pathlib import Path

import pytest

from agentpool.secret_file import SecretFileError, read_secret_file
from agentpool.secret_file.local_tokens import (
    TOKEN_DIR_ENV,
    LocalToken,
    local_or_given_secret,
    local_token_file,
    router_and_directory_tokens,
    token_dir,
    token_file_or_local,
)


@pytest.mark.parametrize(
    ("env", "want"),
    [
        ({TOKEN_DIR_ENV: "/t/x", "XDG_CONFIG_HOME": "/c"}, "/t/x"),
        ({"XDG_CONFIG_HOME": "/c"}, "/c/agentpool/tokens"),
        ({TOKEN_DIR_ENV: "", "XDG_CONFIG_HOME": "/c"}, "/c/agentpool/tokens"),
        ({}, str(Path.home() / ".config" / "agentpool" / "tokens")),
    ],
)
def test_the_token_folder_comes_from_the_environment(env: dict[str, str], want: str) -> None:
    assert token_dir(env) == Path(want)


def test_the_first_use_makes_a_private_random_token_and_later_uses_read_it(tmp_path: Path) -> None:
    env = {TOKEN_DIR_ENV: str(tmp_path / "a" / "tokens")}
    path = local_token_file(LocalToken.REPORT, env)
    assert path == tmp_path / "a" / "tokens" / "report"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    token = read_secret_file(path, "report token")
    assert len(token) == 64 and int(token, 16) >= 0
    assert local_token_file(LocalToken.REPORT, env) == path
    assert read_secret_file(path, "report token") == token  # not replaced
    other = read_secret_file(local_token_file(LocalToken.ENGINE, env), "engine token")
    assert other != token  # each token its own
    assert sorted(p.name for p in path.parent.iterdir()) == ["engine", "report"]  # nothing left aside


def test_concurrent_first_uses_agree_on_one_token(tmp_path: Path) -> None:
    env = {TOKEN_DIR_ENV: str(tmp_path / "tokens")}
    seen: list[str] = []
    start = threading.Barrier(8)

    def use() -> None:
        start.wait()
        seen.append(local_or_given_secret(None, LocalToken.DIRECTORY, "--dir-token", "directory token", env))

    threads = [threading.Thread(target=use) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(seen) == 8 and len(set(seen)) == 1
    assert [p.name for p in (tmp_path / "tokens").iterdir()] == ["directory"]


def test_a_given_file_wins_and_makes_nothing(tmp_path: Path) -> None:
    env = {TOKEN_DIR_ENV: str(tmp_path / "tokens")}
    given = tmp_path / "mine"
    given.write_text("g" * 20 + "\n")
    assert token_file_or_local(given, LocalToken.ENGINE, "--engine-token-file", env) == given
    assert local_or_given_secret(given, LocalToken.ENGINE, "--engine-token", "engine token", env) == "g" * 20
    assert not (tmp_path / "tokens").exists()


def test_a_folder_or_file_others_can_read_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "tokens"
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    env = {TOKEN_DIR_ENV: str(folder)}
    with pytest.raises(SecretFileError, match=r"folder .* open to other users .*chmod 700"):
        local_token_file(LocalToken.REPORT, env)
    folder.chmod(0o700)
    path = local_token_file(LocalToken.REPORT, env)
    path.chmod(0o640)
    with pytest.raises(SecretFileError, match=r"file .* open to other users .*chmod 600"):
        local_token_file(LocalToken.REPORT, env)


def test_a_folder_that_cannot_be_made_says_how_to_name_another(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    env = {TOKEN_DIR_ENV: str(tmp_path / "a-file" / "tokens")}  # no folder under a file, even for root
    with pytest.raises(SecretFileError, match=rf"cannot use the per-user engine token .*\${TOKEN_DIR_ENV}"):
        local_token_file(LocalToken.ENGINE, env)


def test_a_planner_sends_the_report_token_and_the_directory_token_only_with_a_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOKEN_DIR_ENV, str(tmp_path / "tokens"))
    report, directory = router_and_directory_tokens(None, None, uses_directory=False)
    assert directory is None and report == read_secret_file(tmp_path / "tokens" / "report", "report")
    assert not (tmp_path / "tokens" / "directory").exists()
    given = tmp_path / "dir-token"
    given.write_text("d" * 20)
    assert router_and_directory_tokens(None, given, uses_directory=True) == (report, "d" * 20)
