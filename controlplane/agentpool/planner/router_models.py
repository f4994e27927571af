"""Pushes the planner's fitted per-node models to every router replica (:mod:`agentpool.wire.fits`).

The controller hands over each node's current model after the fit and after every window (the
coefficients are frozen, ``t_bar_n`` and ``f_n`` change); :meth:`ModelBroadcast.publish` numbers the
set (milliseconds of the wall clock, at least one above the previous set, so a restarted planner
continues above its earlier sets) and ``PUT``s it to every router. A router that fails is retried:
the router source tells the broadcast which version each router reported in its last work batch
(:meth:`ModelBroadcast.sync`), and a router behind the current set gets it again, e.g. after it
restarted empty. A router that answers 409 holds a newer set (another planner, or a clock that
went back): the next set is numbered above it and pushed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence

import aiohttp
from pydantic import ValidationError

from agentpool.models import NodeModel
from agentpool.wire.fits import MODELS_PATH, ModelSet, WireNodeModel

log = logging.getLogger(__name__)


class ModelBroadcast:
    def __init__(
        self,
        urls: Sequence[str],
        session: aiohttp.ClientSession,
        token: str | None = None,
        clock: Callable[[], float] = time.time,
        timeout_s: float = 5.0,
        first_version: int = 0,
        server_hostname: str | None = None,
    ) -> None:
        """``server_hostname``: the name routers' certificates are checked against (None: each
        URL's host)."""
        self.urls = [u.rstrip("/") for u in urls]
        self._session = session
        self._server_hostname = server_hostname
        self._headers = {} if token is None else {"Authorization": f"Bearer {token}"}
        self._clock = clock
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._last_version = first_version
        self.current: ModelSet | None = None
        self.held: dict[str, int | None] = dict.fromkeys(self.urls)  # version each router holds
        self.failures = 0

    def set_urls(self, urls: Sequence[str]) -> None:
        """Push to exactly ``urls`` from now on (a new router gets the current set at the next sync)."""
        self.urls = [u.rstrip("/") for u in urls]
        self.held = {u: self.held.get(u) for u in self.urls}

    def next_set(self, models: Mapping[str, NodeModel], fitted_at: float) -> ModelSet:
        version = max(self._last_version + 1, int(self._clock() * 1000))
        self._last_version = version
        self.current = ModelSet(
            version=version,
            fitted_at=fitted_at,
            models={n: WireNodeModel.of(m) for n, m in sorted(models.items())},
        )
        return self.current

    async def publish(self, models: Mapping[str, NodeModel], fitted_at: float) -> None:
        """Number a new set of ``models`` and push it to every router (failures are logged)."""
        self.next_set(models, fitted_at)
        await asyncio.gather(*(self._push(u) for u in self.urls))

    async def sync(self, reported: Mapping[str, int | None]) -> None:
        """Push the current set again to each router whose reported version is not it."""
        current = self.current
        if current is None:
            return
        behind = [u for u in self.urls if u in reported and reported[u] != current.version]
        for u in behind:
            self.held[u] = reported[u]
        await asyncio.gather(*(self._push(u) for u in behind))

    async def _push(self, url: str) -> None:
        current = self.current
        if current is None:
            return
        body = current.model_dump_json()
        headers = {"Content-Type": "application/json", **self._headers}
        try:
            async with self._session.put(
                url + MODELS_PATH,
                data=body,
                headers=headers,
                timeout=self._timeout,
                server_hostname=self._server_hostname,
            ) as resp:
                text = await resp.read()
                if resp.status == 409:
                    answer = json.loads(text)
                    held = answer.get("version") if isinstance(answer, dict) else None
                    if not isinstance(held, int):
                        raise ValueError(f"a 409 without the version it holds: {text[:200]!r}")
                    if held == current.version:  # it has this set already
                        self.held[url] = held
                        return
                    log.warning("router %s holds model set %d, newer than %d", url, held, current.version)
                    self._last_version = max(self._last_version, held)
                    self.held[url] = held
                    return
                resp.raise_for_status()
        except (aiohttp.ClientError, TimeoutError, ValidationError, ValueError) as e:
            self.failures += 1
            log.warning("model set %d not pushed to %s (retried): %s", current.version, url, e)
            return
        self.held[url] = current.version
