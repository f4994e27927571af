"""Who may take the planner's Lease (pure part of `agentpool.operator.lease`)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from agentpool.operator.lease import Holder, lease_body, may_take, parse_args

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("holder", "expected"),
    [
        (Holder(None, None, 15), True),  # free
        (Holder("", NOW, 15), True),  # released
        (Holder("me", NOW, 15), True),  # mine: renew
        (Holder("other", NOW - timedelta(seconds=5), 15), False),  # held and fresh
        (Holder("other", NOW - timedelta(seconds=15), 15), False),  # exactly at the edge: still held
        (Holder("other", NOW - timedelta(seconds=16), 15), True),  # expired
    ],
)
def test_may_take(holder: Holder, expected: bool) -> None:
    assert may_take(holder, "me", NOW) is expected


def test_a_lease_round_trips() -> None:
    body = lease_body("ns", "pool-planner", "router-abc", 15, NOW, "7", 2)
    holder = Holder.of(body)
    assert holder == Holder("router-abc", NOW, 15.0)
    assert body["metadata"]["resourceVersion"] == "7"
    assert body["spec"]["leaseTransitions"] == 2


def test_the_command_line() -> None:
    args = parse_args(
        ["--namespace", "n", "--name", "l", "--identity", "i", "--", "python", "-m", "x", "--flag"]
    )
    assert args.command == ["python", "-m", "x", "--flag"]
    with pytest.raises(SystemExit):
        parse_args(["--namespace", "n", "--name", "l", "--identity", "i"])
    with pytest.raises(SystemExit):
        parse_args(["--namespace", "n", "--name", "l", "--identity", "i", "--renew-s", "20", "--", "x"])
