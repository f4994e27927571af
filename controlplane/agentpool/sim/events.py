"""What the simulator's event loop passes around: the kinds of its events, a request ready to be
sent, and the log the planners read."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from agentpool.models import OccupancySample, PrefillBatchItem, RequestWorkRecord
from agentpool.node import Request

ISSUE, WAKE, JOIN, SWITCH_DONE, TICK, CALL, NET = range(7)  # event kinds, in the heap's payload order


@dataclass(slots=True)
class Issue:
    """A request ready to be sent, with what the router knows from the harness."""

    req: Request
    turn: int
    new_turn_tokens: int
    last_of_branch: bool
    on_done: Callable[[Request, float], None]


@dataclass(slots=True)
class WindowLog:
    """What the planners read: request works and decode occupancy since the run began."""

    works: list[RequestWorkRecord] = field(default_factory=list)
    occupancy: list[OccupancySample] = field(default_factory=list)
    iterations: dict[int, list[list[PrefillBatchItem]]] = field(default_factory=dict)
