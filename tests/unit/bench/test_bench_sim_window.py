"""``bench_sim_window --block-tokens``: the block size reaches the run; a bad one is a usage error."""

from __future__ import annotations

import re

import pytest

from bench import bench_sim_window

SMALL = ["--nodes", "2", "--warmup", "60", "--duration", "120", "--start", "1"]


def _fingerprint(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert bench_sim_window.main(argv) == 0
    found = re.search(r"fingerprint ([0-9a-f]{16})$", capsys.readouterr().out.strip())
    assert found is not None
    return found.group(1)


def test_the_block_size_reaches_the_run(capsys: pytest.CaptureFixture[str]) -> None:
    default = _fingerprint(SMALL, capsys)
    assert _fingerprint([*SMALL, "--block-tokens", "512"], capsys) == default
    assert _fingerprint([*SMALL, "--block-tokens", "1024"], capsys) != default


@pytest.mark.parametrize("value", ["1000", "0"])
def test_a_block_size_off_the_traces_blocks_is_a_usage_error(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as e:
        bench_sim_window.main(["--block-tokens", value])
    assert e.value.code == 2
    assert f"positive multiple of the trace's 64 tokens, got {value}" in capsys.readouterr().err
