"""Following a switch in flight (or the initial split): which engines serve their new role yet, and
telling the KV directory each one's new phase (``SwitchPhase``: a D->P switch resets the node's
branch counts, Algorithm E.2 line 14).

:class:`agentpool.planner.controller.PlannerController` keeps the :class:`PendingSwitch`, reads
the pods' roles, and starts the cooldown when nothing is left to follow.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from agentpool.directory.client import DirectoryRpcError
from agentpool.kv import Role
from agentpool.planner.roles import PodRoleState

log = logging.getLogger(__name__)


class PhaseSink(Protocol):
    """Told when an engine serves a new phase: the KV directory (``SwitchPhase``: a D->P switch
    resets the node's branch counts, Algorithm E.2 line 14). ``DirectoryClient`` is one."""

    async def switch_phase(self, node: str, phase: Role) -> Role | None: ...


@dataclass(slots=True)
class PendingSwitch:
    """A switch (or the initial split) in flight: the engines that must serve a new role."""

    applied_at: float
    moves: dict[str, str]  # engine -> the role it was asked to serve
    unannounced: dict[str, str] = field(default_factory=dict)  # switched; the directory not told yet

    @property
    def done(self) -> bool:
        """Every engine serves its new role (or is no longer waited for) and the directory knows."""
        return not self.moves and not self.unannounced

    def settle(self, pods: list[PodRoleState]) -> None:
        """Move each engine that serves its new role to ``unannounced``; drop the ones gone or
        asked for another role since (a patch that failed, a user's change): not waited for."""
        by_name = {p.name: p for p in pods}
        for name, role in list(self.moves.items()):
            pod = by_name.get(name)
            if pod is None or pod.desired_role != role:
                del self.moves[name]
            elif pod.observed_role == role:
                self.unannounced[name] = self.moves.pop(name)


async def announce(
    pending: PendingSwitch, directory: PhaseSink | None, announced: deque[tuple[str, Role]]
) -> None:
    """Tell the directory each switched engine's phase (appended to ``announced``); failures stay
    in ``pending.unannounced`` and are retried at the next look. Without a directory, nothing to tell."""
    if directory is None:
        pending.unannounced.clear()
        return
    for name, value in sorted(pending.unannounced.items()):
        role = Role(value)
        try:
            previous = await directory.switch_phase(name, role)
        except DirectoryRpcError as exc:
            log.warning("directory not told that %s serves %s (retried): %s", name, role.value, exc)
            continue
        del pending.unannounced[name]
        announced.append((name, role))
        log.info(
            "directory: %s switched %s -> %s",
            name,
            "unknown" if previous is None else previous.value,
            role.value,
        )
