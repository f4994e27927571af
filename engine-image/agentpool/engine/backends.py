"""The backends the engine agent can run, by the config's ``backend`` name."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from agentpool.engine.backend import BackendFactory
from agentpool.engine.sglang.backend import SglangBackend
from agentpool.engine.simbackend import SimBackend

BACKENDS: Mapping[str, BackendFactory] = MappingProxyType(
    {"sim": SimBackend.create, "sglang": SglangBackend.create}
)
