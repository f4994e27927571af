"""Drive an SGLang server's role switch and read its load, over its HTTP endpoints.

Switch: ``POST /pause_generation`` (``mode: retract``: running requests go back to the waiting queue
and keep their place), ``POST /pd_role_switch`` (``new_role``), ``POST /continue_generation``. A refused
switch is answered with a continue, so the server never stays paused. Load: ``GET /v1/loads``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
from pydantic import BaseModel, ConfigDict, ValidationError

from agentpool.engine.errors import EngineError
from agentpool.engine.sglang.iterations import PACER_STALL_S
from agentpool.errors import UpstreamError
from agentpool.node import Role


class SglangError(EngineError, UpstreamError):
    """The SGLang server refused or failed a control call (502)."""


class _RankLoad(BaseModel):
    model_config = ConfigDict(extra="ignore")
    num_running_reqs: int = 0
    num_waiting_reqs: int = 0
    num_waiting_uncached_tokens: int = 0
    num_used_tokens: int = 0
    max_total_num_tokens: int = 0


class _Loads(BaseModel):
    model_config = ConfigDict(extra="ignore")
    loads: list[_RankLoad]


@dataclass(frozen=True, slots=True)
class SglangLoad:
    running: int
    waiting: int
    waiting_uncached_tokens: int
    used_tokens: int
    capacity_tokens: int


def decode_waiting_tokens(outputs: Sequence[tuple[float, int]], running: int, now: float) -> int:
    """KV tokens of requests SGLang prefilled that wait for decode room (a load report's
    ``decode_waiting_tokens``). ``outputs``: (monotonic time of the last chunk, prompt + output tokens
    so far) of each of the agent's requests that had output and have not finished; ``running``: SGLang's
    running count (``/v1/loads``). SGLang retracts decoding requests when its KV runs short (their KV is
    freed; they wait to be prefilled again) and does not say which: those beyond ``running`` that have
    been silent longest, and at least ``PACER_STALL_S`` (a running one gets a chunk after every pass),
    are taken as waiting; each needs its prompt and its output so far back."""
    surplus = len(outputs) - running
    if surplus <= 0:
        return 0
    silent = sorted(o for o in outputs if now - o[0] >= PACER_STALL_S)
    return sum(tokens for _, tokens in silent[:surplus])


@dataclass(frozen=True, slots=True)
class SwitchTimes:
    pause_s: float
    switch_s: float
    total_s: float


class SglangControl:
    def __init__(self, base_url: str, session: aiohttp.ClientSession, timeout_s: float = 60.0) -> None:
        self.base = base_url.rstrip("/")
        self.session = session
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            async with self.session.post(self.base + path, json=body, timeout=self.timeout) as r:
                text = await r.text()
                if r.status != 200:
                    raise SglangError(f"{path}: HTTP {r.status}: {text[:300]}")
                try:
                    out = await r.json(content_type=None)
                except ValueError:
                    out = {"raw": text}
                return out if isinstance(out, dict) else {"value": out}
        except (aiohttp.ClientError, TimeoutError) as e:
            raise SglangError(f"{path}: {type(e).__name__}: {e}") from None

    async def pause(self) -> None:
        await self._post("/pause_generation", {"mode": "retract"})

    async def resume(self) -> None:
        await self._post("/continue_generation", {})

    async def role_switch(self, role: Role) -> dict[str, Any]:
        if role is Role.BOTH:
            raise SglangError(
                "SGLang switches between prefill and decode only; a colocated node is relaunched"
            )
        out = await self._post("/pd_role_switch", {"new_role": role.value})
        if out.get("success") is False:
            raise SglangError(f"/pd_role_switch refused: {out.get('message', '')}")
        return out

    async def switch(self, role: Role) -> SwitchTimes:
        t0 = time.monotonic()
        await self.pause()
        t1 = time.monotonic()
        try:
            await self.role_switch(role)
        finally:
            await self.resume()
        t2 = time.monotonic()
        return SwitchTimes(t1 - t0, t2 - t1, t2 - t0)

    async def load(self) -> SglangLoad:
        try:
            async with self.session.get(self.base + "/v1/loads", timeout=self.timeout) as r:
                if r.status != 200:
                    raise SglangError(f"/v1/loads: HTTP {r.status}")
                loads = _Loads.model_validate(await r.json(content_type=None)).loads
        except (aiohttp.ClientError, TimeoutError, ValueError, ValidationError) as e:
            raise SglangError(f"/v1/loads: {type(e).__name__}: {e}") from None
        return SglangLoad(
            running=sum(x.num_running_reqs for x in loads),
            waiting=sum(x.num_waiting_reqs for x in loads),
            waiting_uncached_tokens=sum(x.num_waiting_uncached_tokens for x in loads),
            used_tokens=sum(x.num_used_tokens for x in loads),
            capacity_tokens=sum(x.max_total_num_tokens for x in loads),
        )
