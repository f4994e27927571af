"""``bench_engine --parts switch`` flips the engine's role file: every write must name the other role,
whatever the count of the series before (an odd ``--switches`` left the next series writing the role
the engine already served, and it waited for a switch that never came)."""

from __future__ import annotations

import pytest

from bench.bench_engine import switch_roles


@pytest.mark.parametrize("n", [0, 1, 2, 3, 12])
def test_every_role_written_differs_from_the_one_served(n: int) -> None:
    for start in ("prefill", "decode"):
        roles = switch_roles(start, n)
        assert len(roles) == n
        served = start
        for role in roles:
            assert role != served
            served = role


def test_a_second_series_after_an_odd_one_still_switches() -> None:
    first = switch_roles("prefill", 3)
    assert first == ["decode", "prefill", "decode"]
    assert switch_roles(first[-1], 2) == ["prefill", "decode"]
