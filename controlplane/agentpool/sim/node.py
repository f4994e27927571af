"""Compatibility names: the node model moved to :mod:`agentpool.node` (a pure core of its own)."""

from agentpool.node import (
    Advance,
    GpuCache,
    IterationHook,
    NodeStatus,
    Role,
)
from agentpool.node import Iteration as SimIteration
from agentpool.node import Node as SimNode
from agentpool.node import Request as SimRequest

__all__ = [
    "Advance",
    "GpuCache",
    "IterationHook",
    "NodeStatus",
    "Role",
    "SimIteration",
    "SimNode",
    "SimRequest",
]
