"""One streamed chat completion through the router's OpenAI API, as an agent harness sends it.

:func:`stream_chat` posts the body with the branch headers, reads the server-sent events and
returns what the harness saw: when the first event came, how many tokens, the usage (with
``prompt_tokens_details.cached_tokens`` when the router passes it on), and how it failed if it
did. A 429 or 503 before any output is retried after ``Retry-After`` (capped), as harnesses do;
the time to first token counts from the first attempt.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from agentpool.router.openai_api import CONTEXT_LENGTH_EXCEEDED

BRANCH = "x-agentpool-branch"
PARENT = "x-agentpool-parent-branch"
BRANCH_END = "x-agentpool-branch-end"
CHAT_PATH = "/v1/chat/completions"


@dataclass(frozen=True, slots=True)
class BranchHeaders:
    """What a harness tells the router about the agent context a request belongs to."""

    branch: str
    parent: str | None = None
    end: bool = False

    def headers(self) -> dict[str, str]:
        out = {BRANCH: self.branch}
        if self.parent is not None:
            out[PARENT] = self.parent
        if self.end:
            out[BRANCH_END] = "true"
        return out


@dataclass(slots=True)
class Outcome:
    """What one request saw. Times are ``time.monotonic()`` seconds."""

    sent_at: float
    first_at: float | None = None
    done_at: float | None = None
    tokens: int = 0
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    retries: int = 0
    error: str | None = None  # None: completed
    code: str | None = None  # OpenAI's error code of a refusal (HTTP 4xx), when it gave one
    unreachable: bool = False  # the router could not be connected to (nothing was sent)

    @property
    def ok(self) -> bool:
        return self.error is None and self.done_at is not None

    @property
    def failed(self) -> bool:
        """Not completed, and not refused as too long (which is no failure of the pool)."""
        return not self.ok and not self.too_long

    @property
    def too_long(self) -> bool:
        """The pool refused it as longer than its model takes (400 ``context_length_exceeded``): what
        an agent's harness would stop the conversation on, not a failure of the pool."""
        return self.code == CONTEXT_LENGTH_EXCEEDED

    @property
    def streamed(self) -> bool:
        """Output had started when it ended (a failure after this point loses partial output)."""
        return self.first_at is not None


async def stream_chat(
    session: aiohttp.ClientSession,
    url: str,
    body: dict[str, Any],
    branch: BranchHeaders | None,
    *,
    max_retries: int = 30,
    max_retry_wait_s: float = 5.0,
    stream_timeout_s: float = 600.0,
    on_first: Callable[[], None] | None = None,
) -> Outcome:
    """Send ``body`` (``stream`` is forced on) to ``url``'s chat API; never raises for HTTP or network
    failures, which end up in :attr:`Outcome.error`. ``on_first`` is called when the first event
    arrives (the first token)."""
    payload = json.dumps({**body, "stream": True, "stream_options": {"include_usage": True}})
    headers = {"content-type": "application/json", **(branch.headers() if branch else {})}
    out = Outcome(sent_at=time.monotonic())
    target = url.rstrip("/") + CHAT_PATH
    while True:
        try:
            async with asyncio.timeout(stream_timeout_s):
                retry_after = await _attempt(session, target, payload, headers, out, on_first)
        except TimeoutError:
            out.error = f"no answer within {stream_timeout_s:.0f} s"
            return out
        except (aiohttp.ClientError, ConnectionError) as e:
            out.error = f"{type(e).__name__}: {e}"
            out.unreachable = isinstance(e, aiohttp.ClientConnectorError)
            return out
        if retry_after is None:
            return out
        if out.retries >= max_retries:
            out.error = f"still refused after {max_retries} retries: {out.error}"
            return out
        out.retries += 1
        out.error = None
        await asyncio.sleep(min(retry_after, max_retry_wait_s))


async def _attempt(
    session: aiohttp.ClientSession,
    target: str,
    payload: str,
    headers: dict[str, str],
    out: Outcome,
    on_first: Callable[[], None] | None,
) -> float | None:
    """One POST; returns a wait in seconds when the router asked to retry, else None (done)."""
    async with session.post(target, data=payload.encode(), headers=headers) as resp:
        if resp.status in (429, 503):
            out.error = f"HTTP {resp.status}: {await _message(resp)}"
            try:
                return max(0.05, float(resp.headers.get("Retry-After", "1")))
            except ValueError:
                return 1.0
        if resp.status != 200:
            message, out.code = await _error(resp)
            out.error = f"HTTP {resp.status}: {message}"
            return None
        async for raw in resp.content:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                if out.error is None:
                    out.done_at = time.monotonic()
                return None
            event = json.loads(data)
            if out.first_at is None:
                out.first_at = time.monotonic()
                if on_first is not None:
                    on_first()
            if "error" in event:
                out.error = str(event["error"].get("message", event["error"]))
                continue
            _count(event, out)
        out.error = out.error or "the stream ended without [DONE]"
        return None


def _count(event: dict[str, Any], out: Outcome) -> None:
    usage = event.get("usage")
    if usage:
        out.tokens = int(usage.get("completion_tokens", out.tokens))
        out.prompt_tokens = int(usage.get("prompt_tokens", 0))
        details = usage.get("prompt_tokens_details") or {}
        if details.get("cached_tokens") is not None:
            out.cached_tokens = int(details["cached_tokens"])
        return
    for choice in event.get("choices", ()):
        delta = choice.get("delta") or {}
        if delta.get("content") or choice.get("text"):
            out.tokens += 1


async def _message(resp: aiohttp.ClientResponse) -> str:
    return (await _error(resp))[0]


async def _error(resp: aiohttp.ClientResponse) -> tuple[str, str | None]:
    """An error answer's message and OpenAI error code (None when it has none)."""
    text = (await resp.content.read(2000)).decode(errors="replace")
    try:
        error = json.loads(text)["error"]
        code = error.get("code")
        return str(error["message"]), code if isinstance(code, str) else None
    except (ValueError, KeyError, TypeError, AttributeError):
        return text.strip()[:300], None


async def end_branch(session: aiohttp.ClientSession, url: str, branch: str) -> bool:
    """``DELETE /v1/branches/{branch}``: True if the router ended it, False if it did not know it."""
    async with session.delete(f"{url.rstrip('/')}/v1/branches/{branch}") as resp:
        if resp.status == 404:
            return False
        if resp.status != 200:
            raise aiohttp.ClientResponseError(
                resp.request_info, (), status=resp.status, message=await _message(resp)
            )
        return True
