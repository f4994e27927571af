"""Where the planner reads and writes engines' roles: the :class:`RoleBoard` seam.

In a cluster the board is the engine pods' annotations (:class:`agentpool.planner.kube.PodRoles`);
a local pool can keep the desired role in a file per engine instead. Either way the planner sees,
per engine, its desired role (what the planner last asked for), its observed role (what the engine
says it serves) and whether a user pinned it, and it writes only desired roles and Events.

- desired role: ``prefill``, ``decode``, or ``both`` while colocated (warmup);
- pinned: the planner never changes a pinned engine's role;
- observed role: while it differs from the desired role, or is missing, the engine is draining.
  In a cluster it comes from the routers (:class:`ServedRoles`): each engine's load report says
  which role it serves, and every router's work batch carries the latest one per engine. Engines
  write nothing to the Kubernetes API.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

ROLE_ANNOTATION = "agentpool.io/role"
PINNED_ANNOTATION = "agentpool.io/role-pinned"
OBSERVED_ROLE_ANNOTATION = "agentpool.io/observed-role"


def split_label(roles: Iterable[str | None], colocated_pool: bool = False) -> str:
    """The split of ``roles`` as ``kubectl get`` shows it: ``4P5D``, ``4P4D1C`` while one node
    serves both phases, ``9C`` for a colocated pool (whose nodes all serve both)."""
    counts = Counter(roles)
    prefill, decode, both = counts["prefill"], counts["decode"], counts["both"]
    if colocated_pool and not prefill and not decode:
        return f"{both}C"
    return f"{prefill}P{decode}D" + (f"{both}C" if both else "")


@dataclass(frozen=True, slots=True)
class PodRoleState:
    """What the planner reads about one engine."""

    name: str
    desired_role: str | None
    observed_role: str | None
    pinned: bool

    @property
    def draining(self) -> bool:
        return self.observed_role != self.desired_role

    @staticmethod
    def of(name: str, annotations: Mapping[str, str] | None, served: str | None) -> PodRoleState:
        """From the pod's annotations and the role the engine says it serves (``served``; None
        while no router has heard from it): ``agentpool.io/role-pinned`` with any value but
        ``false`` pins (a typo therefore pins rather than unpins)."""
        notes = dict(annotations or {})
        pinned_value = notes.get(PINNED_ANNOTATION)
        return PodRoleState(
            name=name,
            desired_role=notes.get(ROLE_ANNOTATION),
            observed_role=served,
            pinned=pinned_value is not None and pinned_value.strip().lower() != "false",
        )


class ServedRoles:
    """The role each engine serves, as the routers heard it from the engine's load reports.

    Every router carries each engine's latest report (:class:`agentpool.wire.work.WireServedRole`);
    the newest (by the router's receive time) wins, so a router that heard from an engine long ago
    does not undo a switch another router has already seen.
    """

    def __init__(self) -> None:
        self._roles: dict[str, tuple[float, str]] = {}
        self._kv_capacity: dict[str, tuple[float, int]] = {}

    def update(self, node: str, role: str, at: float, kv_capacity_tokens: int | None = None) -> None:
        known = self._roles.get(node)
        if known is None or at >= known[0]:
            self._roles[node] = (at, role)
        if kv_capacity_tokens is not None:
            capacity = self._kv_capacity.get(node)
            if capacity is None or at >= capacity[0]:
                self._kv_capacity[node] = (at, kv_capacity_tokens)

    def get(self, node: str) -> str | None:
        known = self._roles.get(node)
        return known[1] if known is not None else None

    def kv_capacity(self, node: str) -> float:
        """The KV tokens ``node``'s GPU memory holds, from its newest report that said
        (``inf``: none did, so the planner does not limit its decode capacity by KV room)."""
        known = self._kv_capacity.get(node)
        return float(known[1]) if known is not None else math.inf


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """The object an Event is about (the AgentServingPool, normally)."""

    api_version: str
    kind: str
    name: str
    namespace: str
    uid: str | None = None


class RoleBoard(Protocol):
    """Engines' roles as the planner reads and writes them."""

    async def pods(self) -> list[PodRoleState]:
        """Every engine of the pool, by name."""
        ...

    async def set_role(self, pod: str, role: str) -> None:
        """Set ``pod``'s desired role; nothing else about it changes."""
        ...

    async def record_event(self, about: ObjectRef, reason: str, message: str, warning: bool = False) -> None:
        """Record an Event (or its local equivalent) about ``about``."""
        ...
