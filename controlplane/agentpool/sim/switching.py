"""Phase switches of a simulated pool, as the planners decide them: the node drains (its queued
requests are routed again), goes down for the switch's downtime (keeping or dropping its KV by the
system's switch mode), then serves in its new role."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from agentpool.kv import Tier
from agentpool.node import Node, NodeStatus, Role
from agentpool.sim.events import SWITCH_DONE
from agentpool.sim.systems import SwitchMode

if TYPE_CHECKING:
    from agentpool.sim.simulator import Simulator


@dataclass(slots=True)
class Switch:
    node: int
    to: Role
    decided_at: float
    drained_at: float = -1.0


def split_of(nodes: Sequence[Node]) -> tuple[int, int, int]:
    """(prefill, decode, out of service) counts of ``nodes`` by current role."""
    p = sum(1 for n in nodes if n.role in (Role.PREFILL, Role.BOTH) and n.status is not NodeStatus.DOWN)
    d = sum(1 for n in nodes if n.role is Role.DECODE and n.status is not NodeStatus.DOWN)
    return p, d, len(nodes) - p - d


class PhaseSwitches:
    """The switches in progress of a :class:`~agentpool.sim.simulator.Simulator`, and their steps."""

    def __init__(self, sim: Simulator) -> None:
        self.sim = sim
        self.active: dict[int, Switch] = {}  # node index -> its switch
        self.last_at: float | None = None  # when the last switch was decided

    def begin(self, index: int, to: Role) -> None:
        """Start switching node ``index`` to ``to``: it drains, its queued requests are routed again."""
        sim = self.sim
        node = sim.nodes[index]
        if index in self.active or node.role is to:
            return
        self.active[index] = Switch(index, to, sim.now)
        self.last_at = sim.now
        taken = node.begin_drain()
        sim._changed(index)
        for r in taken:
            sim.queued[index] = sim.queued[index].with_request(r.uncached_tokens, r.cached_tokens, -1)
            sim._changed(index)
            r.reroutes += 1
            sim._route(sim._issues.pop(r.rid))
        sim._after_step(node)

    def drained(self, node: Node, sw: Switch) -> None:
        """``node`` has drained: down for the switch's downtime (its KV kept or dropped)."""
        sim = self.sim
        sw.drained_at = sim.now
        mode = sim.system.switch
        keep_kv = mode not in (SwitchMode.RELAUNCH, SwitchMode.STRANDED)
        node.go_down(keep_kv=keep_kv)
        sim._changed(node.index)
        if not keep_kv:
            held = list(sim.directory.index.host_access(node.name))
            sim.directory.apply_removed(node.name, held, Tier.HOST)
        delay = {
            SwitchMode.IN_PLACE: sim.preset.switch_in_place_s,
            SwitchMode.STRANDED: sim.preset.switch_in_place_s,
            SwitchMode.RELAUNCH: sim.preset.relaunch_s,
            SwitchMode.FREE: 0.0,
        }[mode]
        sim.metrics.record_split(sim.now, sim.split())
        sim.schedule(sim.now + delay, SWITCH_DONE, node.index)

    def done(self, index: int) -> None:
        """Node ``index``'s downtime is over: it serves in its new role."""
        sim = self.sim
        node = sim.nodes[index]
        sw = self.active.pop(index)
        node.finish_switch(sw.to)
        sim._changed(index)
        sim.directory.switch_phase(node.name, sw.to)
        sim.metrics.switch(node.name, sw.decided_at, sw.drained_at, sim.now, sim.system.switch)
        sim.metrics.record_split(sim.now, sim.split())
        if sw.to is Role.DECODE:
            sim._retry_pending_decode()
        sim._after_step(node)
