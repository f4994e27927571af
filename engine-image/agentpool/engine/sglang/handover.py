"""Recompute after a failed P->D hand-over on the ``sglang`` backend: the prefill again, at the source.

SGLang's decode mode cannot prefill: every request it takes waits for KV from a prefill server's
bootstrap room (a request without one fails its bootstrap). So when the KV transfer of a decode
request fails before any token came out (SGLang ends it with an abort or an error), the decode
agent asks the prefill agent that the router chose (``kv_source.url``) for the prefill once more: the
same prompt and sampling, phase ``prefill``, over the engine protocol. Its ``prefilled`` event names
a new bootstrap room, and the decode agent gives its SGLang the request again with that room. The
client sees nothing of it: an SGLang prefill node streams no token before the decode node does.

What this cannot recover: a prefill agent that is gone or refuses. The decode agent then hands the
request back with ``requeue``, reason ``kv_source_lost`` (:data:`agentpool.wire.engine.KV_SOURCE_LOST`;
nothing was streamed), and the router places it again from the start on a live prefill node. Only
one retry per request here.
"""

from __future__ import annotations

import json

import aiohttp

from agentpool.engine.errors import FetchError
from agentpool.wire.engine import GenerateRequest, encode_generate

GENERATE_PATH = "/agentpool/v1/generate"


async def prefill_again(
    http: aiohttp.ClientSession,
    source_url: str,
    g: GenerateRequest,
    timeout_s: float,
    authorization: str | None,
) -> str:
    """The transfer id of a new prefill of ``g`` on the engine at ``source_url`` (``authorization``:
    the pool's engine token, ``Bearer ...``, which the source requires); raises :class:`FetchError`
    when it does not give one."""
    again = GenerateRequest.model_construct(
        request_id=g.request_id,
        dispatch_seq=0,  # numbered by no router: the source counts it as an unnumbered dispatch
        phase="prefill",
        endpoint=g.endpoint,
        body=g.body,
        prompt_token_ids=g.prompt_token_ids,
        cached_tokens=0,
        fetch_tokens=0,
        kv_source=None,
        router_id=None,
    )
    url = source_url.rstrip("/") + GENERATE_PATH
    headers = {"content-type": "application/json"}
    if authorization is not None:
        headers["Authorization"] = authorization
    try:
        async with http.post(
            url,
            data=encode_generate(again),
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=timeout_s, sock_connect=5),
        ) as r:
            if r.status != 200:
                raise FetchError(f"{url}: HTTP {r.status}: {(await r.text())[:200]}")
            async for line in r.content:
                if not line.strip():
                    continue
                try:
                    ev = json.loads(line)
                except ValueError:
                    raise FetchError(f"{url}: not an event: {line[:100]!r}") from None
                kind = ev.get("type") if isinstance(ev, dict) else None
                if kind == "prefilled" and isinstance(ev.get("transfer_id"), str):
                    return str(ev["transfer_id"])
                if kind in ("requeue", "error", "done"):
                    raise FetchError(f"{url}: the prefill ended with {kind}: {str(ev)[:200]}")
    except (aiohttp.ClientError, TimeoutError) as e:
        raise FetchError(f"{url}: {type(e).__name__}: {e}") from None
    raise FetchError(f"{url}: the prefill ended without a transfer id")
