"""The controller follows a switch through the role seam and retries the directory (fakes at the
planner's own seams: a RoleBoard in memory, a PhaseSink that fails once)."""

from __future__ import annotations

import grpc
from prometheus_client import CollectorRegistry

from agentpool.directory.client import DirectoryRpcError
from agentpool.kv import Role
from agentpool.models import MoeShape
from agentpool.planner.config import PlannerConfig
from agentpool.planner.controller import PlannerController
from agentpool.planner.core import LastSwitch
from agentpool.planner.inbox import PlannerInbox
from agentpool.planner.metrics import PlannerMetrics
from agentpool.planner.roles import ObjectRef, PodRoleState
from agentpool.planner.switch_follow import PendingSwitch


class Board:
    def __init__(self, roles: dict[str, tuple[str, str]]) -> None:
        self.roles = roles  # name -> (desired, observed)

    async def pods(self) -> list[PodRoleState]:
        return [PodRoleState(n, d, o, False) for n, (d, o) in sorted(self.roles.items())]

    async def set_role(self, pod: str, role: str) -> None:
        self.roles[pod] = (role, self.roles[pod][1])

    async def record_event(self, about: ObjectRef, reason: str, message: str, warning: bool = False) -> None:
        pass


class FlakyDirectory:
    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls: list[tuple[str, Role]] = []

    async def switch_phase(self, node: str, phase: Role) -> Role | None:
        self.calls.append((node, phase))
        if self.failures:
            self.failures -= 1
            raise DirectoryRpcError(grpc.StatusCode.UNAVAILABLE, "directory restarting")
        return Role.DECODE


def controller(board: Board, directory: FlakyDirectory) -> PlannerController:
    return PlannerController(
        pods=board,
        inbox=PlannerInbox(),
        config=PlannerConfig,
        pool=ObjectRef("v1", "X", "p", "ns"),
        metrics=PlannerMetrics(CollectorRegistry()),
        shape=MoeShape(),
        directory=directory,
    )


async def test_a_switch_completes_only_once_the_directory_heard_of_every_switched_engine() -> None:
    board = Board({"e0": ("prefill", "prefill"), "e1": ("prefill", "decode"), "e2": ("decode", "decode")})
    directory = FlakyDirectory(failures=1)
    c = controller(board, directory)
    c._pending = PendingSwitch(100.0, {"e1": "prefill"})
    c._last_switch = LastSwitch(100.0)
    assert not await c.observe_switch(at=110.0)  # e1 still drains: nothing to tell
    assert directory.calls == []
    board.roles["e1"] = ("prefill", "prefill")
    assert not await c.observe_switch(at=120.0)  # switched, but the directory failed: retried
    assert directory.calls == [("e1", Role.PREFILL)] and c.last_switch == LastSwitch(100.0)
    assert await c.observe_switch(at=130.0)
    assert directory.calls == [("e1", Role.PREFILL)] * 2 and list(c.announced) == [("e1", Role.PREFILL)]
    assert c.last_switch == LastSwitch(100.0, 130.0)  # the cooldown counts from here


async def test_an_engine_asked_for_another_role_since_is_not_waited_for() -> None:
    board = Board({"e1": ("decode", "decode")})  # the patch to prefill never landed
    c = controller(board, FlakyDirectory(failures=0))
    c._pending = PendingSwitch(100.0, {"e1": "prefill"})
    c._last_switch = LastSwitch(100.0)
    assert await c.observe_switch(at=105.0)
    assert list(c.announced) == [] and c.last_switch == LastSwitch(100.0, 105.0)
