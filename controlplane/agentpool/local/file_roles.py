"""Engine roles of a local pool, for the planner: a file per engine instead of a pod annotation.

:class:`FileRoleBoard` implements the planner's :class:`~agentpool.planner.roles.RoleBoard`:

- desired role: ``<roles>/<engine>`` holds ``prefill``, ``decode`` or ``both``; the planner writes
  it (atomically: a temporary file renamed over it) and the engine reads it (``roleFile`` in its
  config), as an engine in a cluster reads its pod's ``agentpool.io/role`` annotation;
- pinned: ``<roles>/<engine>.pinned`` exists and does not hold ``false``;
- observed role: what the engine says it serves, ``GET <engine>/agentpool/v1/state``'s ``role``
  (in a cluster the planner reads it from the routers instead). An engine that does not answer is
  left out, as a pod that is gone is;
- Events: one JSON line each in ``<roles>/../events.log``, and the log.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path

import aiohttp

from agentpool.kv import Role
from agentpool.planner.roles import ObjectRef, PodRoleState

log = logging.getLogger(__name__)
STATE_PATH = "/agentpool/v1/state"
ROLES = tuple(Role)  # the role strings in the files


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        return None


def write_role(path: Path, role: str) -> None:
    """Replace ``path``'s content with ``role`` atomically (a reader never sees a partial file)."""
    if role not in ROLES:
        raise ValueError(f"not a role: {role!r} (one of {', '.join(ROLES)})")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(role + "\n")
    os.replace(tmp, path)


class FileRoleBoard:
    def __init__(
        self,
        roles_dir: Path,
        engines: Mapping[str, str],
        session: aiohttp.ClientSession,
        timeout_s: float = 2.0,
    ) -> None:
        self.roles_dir = roles_dir
        self.engines = dict(engines)  # engine name -> base URL
        self._session = session
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.events_file = roles_dir.parent / "events.log"

    async def _observed(self, url: str) -> tuple[bool, str | None]:
        """(answered, the role it serves)."""
        try:
            async with self._session.get(url.rstrip("/") + STATE_PATH, timeout=self._timeout) as r:
                if r.status != 200:
                    return False, None
                state = await r.json()
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return False, None
        role = state.get("role") if isinstance(state, dict) else None
        return True, role if isinstance(role, str) else None

    def _files(self, name: str) -> tuple[str | None, str | None]:
        return _read(self.roles_dir / name), _read(self.roles_dir / f"{name}.pinned")

    async def pods(self) -> list[PodRoleState]:
        names = sorted(self.engines)
        observed = await asyncio.gather(*(self._observed(self.engines[n]) for n in names))
        out = []
        for name, (answered, role) in zip(names, observed, strict=True):
            if not answered:
                continue
            desired, pinned = await asyncio.to_thread(self._files, name)
            out.append(
                PodRoleState(
                    name=name,
                    desired_role=desired or None,
                    observed_role=role,
                    pinned=pinned is not None and pinned.lower() != "false",
                )
            )
        return out

    async def set_role(self, pod: str, role: str) -> None:
        if pod not in self.engines:
            raise ValueError(f"no engine {pod!r} in this pool")
        await asyncio.to_thread(write_role, self.roles_dir / pod, role)

    async def record_event(self, about: ObjectRef, reason: str, message: str, warning: bool = False) -> None:
        line = json.dumps(
            {"at": time.time(), "about": about.name, "reason": reason, "message": message, "warning": warning}
        )
        (log.warning if warning else log.info)("%s: %s", reason, message)
        await asyncio.to_thread(self._append, line)

    def _append(self, line: str) -> None:
        with self.events_file.open("a") as fh:
            fh.write(line + "\n")
