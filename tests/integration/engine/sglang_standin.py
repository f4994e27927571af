"""A stand-in for ``python -m sglang.launch_server`` (SGLang needs GPUs): the engine agent launches it
with the arguments it would give SGLang, and it answers SGLang's endpoints and publishes SGLang's KV
events, frame for frame, so the agent's sglang backend runs end to end on a CPU machine.

``sglang_standin.py --record FILE [--load-s S] -- <SGLang arguments>``: writes its arguments to FILE,
answers ``/health`` with 503 for S seconds (model loading), then serves:

- ``POST /generate`` (``input_ids``, ``sampling_params.max_new_tokens``, ``stream``, ``rid``, bootstrap
  fields): words ``w0 w1 ...``, streamed as ``data: {json}`` lines with the text so far and
  ``meta_info`` (``cached_tokens`` from its prefix cache), then ``data: [DONE]``; ``stream: false``
  answers one JSON object. A request over ``--context-length`` with its ``max_new_tokens`` (or
  over ``--standin-model-context``, the model's own) is refused with SGLang's message: an error
  chunk in a stream, HTTP 400 otherwise. A prefill publishes ``BlockStored``
  for its new full pages (block hashes
  as SGLang 0.5.23 makes them: ``hash_str_to_int64`` of each page's chained hash), on ``GPU``
  and, with ``--enable-hierarchical-cache`` (write-through), on ``CPU_PINNED``. Requests run in
  SGLang's kind of loop: a prefill pass for the waiting requests (up to ``--chunked-prefill-size``
  uncached tokens), else a decode pass for the running ones, each followed by every request's chunk;
  a pass lasts ``--standin-prefill-s P0,P1`` (``P0 + P1 * uncached tokens``) or
  ``--standin-decode-s D0,D2`` (``D0 + D2 * running``). With ``--speculative-algorithm`` a decode
  pass emits 1 or 2 tokens per request in turn, and a finished request's ``meta_info`` has SGLang's
  ``spec_verify_ct``, ``spec_accept_length`` (completion tokens / verify passes), ``spec_accept_rate``,
  ``spec_accept_token_num`` and ``spec_draft_token_num``; every finished one has ``e2e_latency``;
- P->D (``--standin-check-rooms``): a prefill-mode stand-in keeps each prefilled request's
  ``bootstrap_room`` and answers ``GET /standin/room/{room}`` on its ``--disaggregation-bootstrap-port``
  (200; 404 while the room is not prefilled yet; 410 for the next N rooms after
  ``POST /standin/fail_transfers`` ``{"count": N}``); a decode-mode stand-in asks the
  ``bootstrap_host``/``bootstrap_port`` it is given (waiting up to 5 s for the room, as SGLang's decode
  side waits for the prefill) and, when the transfer fails (410, no answer, no room in time), ends
  the request as SGLang ends a failed transfer (a chunk with ``finish_reason`` ``abort``,
  ``status_code`` 500);
- ``GET /v1/loads``, ``POST /pause_generation``, ``/continue_generation``, ``/pd_role_switch`` (only
  while paused; clears the prefix cache and publishes ``AllBlocksCleared``, as SGLang does),
  ``/abort_request``;
- HiCache L3 storage (``--hicache-storage-backend dynamic --hicache-storage-backend-extra-config``):
  checks the extra config as SGLang's ``StorageBackendFactory`` does (``backend_name``,
  ``module_path``, ``class_name``; the module must be importable) and then, since that class needs
  SGLang and torch, drives what it delegates to (``agentpool.engine.sglang.l3_client.L3Client``, keys
  suffixed per rank as it suffixes them) like SGLang's cache controller: every computed page
  (``--standin-page-bytes`` bytes derived from its storage key, a chained SHA-256 over the page's
  tokens as SGLang's ``get_hash_str``) goes into the stand-in's host tier and is written through to
  storage (``batch_set``); a prompt page missing from its device/host cache is looked up with
  ``batch_exists`` and read back (``batch_get``), checked byte for byte against the page it would
  compute, and counted as cached (a mismatch is recomputed); ``/pd_role_switch`` clears its own host
  tier and calls the backend's ``clear()``, as SGLang 0.5.23's switch does;
- retraction (``POST /standin/retract`` ``{"running": N}``, ``null`` to lift it): the KV now holds N
  running requests; SGLang retracts the newest decodes beyond it back to the front of the waiting
  queue (no chunks meanwhile; ``/v1/loads`` counts them waiting) and admits no prefill while the
  batch is full; a retracted request is prefilled again (prompt and output so far) and goes on;
- ``GET /standin/requests``: the generate payloads it got (for the tests), and ``l3`` counters.
SIGTERM: exits 0 after printing ``stand-in stopped``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import importlib.util
import json
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import zmq
import zmq.asyncio
from aiohttp import ClientError, ClientSession, ClientTimeout, web

sys.path.insert(0, str(Path(__file__).parents[2] / "unit" / "engine"))
from sglang_frames import cleared, message, stored

from agentpool.engine.sglang.l3_client import L3Client, key_suffix


def storage_key(prior: str | None, tokens: list[int]) -> str:
    """A page's storage key of SGLang's kind: SHA-256 over the previous key and the page's tokens."""
    h = hashlib.sha256(bytes.fromhex(prior) if prior else b"")
    for t in tokens:
        h.update(t.to_bytes(4, "little"))
    return h.hexdigest()


def event_hash(key: str) -> int:
    """The block hash SGLang 0.5.23 puts in a KV event for the page of storage key ``key``
    (``hash_str_to_int64`` of the page hash: not ours; the agent maps them by token ids)."""
    u = int(key[:16], 16)
    return u - (1 << 64) if u >= 1 << 63 else u


def page_bytes_of(key: str, n: int) -> np.ndarray:
    """The KV bytes the stand-in "computes" for a page (derived from its key, so copies are checkable)."""
    rng = np.random.default_rng(int(key[:16], 16))
    return rng.integers(0, 256, n, dtype=np.uint8)


class StandInStorage:
    """The L3 storage backend as SGLang 0.5.23's factory loads it, driven as its cache controller does."""

    def __init__(self, extra_json: str, page_bytes: int) -> None:
        extra = json.loads(extra_json)
        for f in ("backend_name", "module_path", "class_name"):  # the factory's required fields
            if f not in extra:
                raise SystemExit(f"Missing required field '{f}' in backend config for 'dynamic' backend")
        if importlib.util.find_spec(extra["module_path"]) is None:
            raise SystemExit(
                f"Failed to import backend '{extra['backend_name']}' from '{extra['module_path']}'"
            )
        cfg = argparse.Namespace(is_mla_model=False, tp_rank=0, tp_size=1, pp_size=1, attn_cp_size=1)
        self.suffix = key_suffix(cfg)
        self.page_bytes = page_bytes
        self.client = L3Client(Path(extra["agentpool_socket"]), page_bytes)
        self.stats = {"written_pages": 0, "hit_pages": 0, "mismatched_pages": 0, "clears": 0}

    def backup(self, keys: list[str], pages: list[np.ndarray]) -> None:
        ok = self.client.write([k + self.suffix for k in keys], pages)
        self.stats["written_pages"] += sum(ok)

    def prefetch(self, keys: list[str]) -> int:
        """How many leading pages storage gives back byte-exact (``batch_exists`` then ``batch_get``)."""
        n = self.client.exists([k + self.suffix for k in keys])
        dst = [np.zeros(self.page_bytes, dtype=np.uint8) for _ in range(n)]
        got = self.client.read([k + self.suffix for k in keys[:n]], dst)
        good = 0
        for k, hit, d in zip(keys, got, dst, strict=False):
            if not hit:
                break
            if not np.array_equal(d, page_bytes_of(k, self.page_bytes)):
                self.stats["mismatched_pages"] += 1
                break
            good += 1
        self.stats["hit_pages"] += good
        return good


@dataclass(eq=False)
class Req:
    body: dict[str, Any]
    ids: list[int]
    n: int
    out: asyncio.Queue[dict[str, Any]] = field(default_factory=asyncio.Queue)
    created: float = field(default_factory=time.time)
    cached: int = 0
    done: int = 0
    verify: int = 0
    retracted: bool = False


class StandIn:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.chunk = args.chunked_prefill_size
        self.p0, self.p1 = (float(x) for x in args.standin_prefill_s.split(","))
        self.d0, self.d2 = (float(x) for x in args.standin_decode_s.split(","))
        self.spec = args.speculative_algorithm is not None
        self.draft = args.speculative_num_draft_tokens
        self.check_rooms = args.standin_check_rooms
        self.rooms: set[int] = set()
        self.failed_rooms: set[int] = set()
        self.fail_rooms = 0
        self.waiting: list[Req] = []
        self.batch: list[Req] = []
        self.max_running: int | None = None  # POST /standin/retract: KV for this many running requests
        self.wake = asyncio.Event()
        self.page = args.page_size
        self.role = args.disaggregation_mode or "null"
        self.write_through = args.enable_hierarchical_cache
        kv = json.loads(args.kv_events_config)
        self.ctx = zmq.asyncio.Context()
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.bind(kv["endpoint"])
        self.topic = kv["topic"]
        self.seq = 0
        self.ready_at = time.monotonic() + args.load_s
        self.paused = False
        self.unpaused = asyncio.Event()
        self.unpaused.set()
        self.cache: dict[tuple[int, ...], int] = {}  # page-aligned prefix -> SGLang's event block hash
        self.host_tier: dict[str, np.ndarray] = {}  # storage key -> page bytes (write-through)
        self.recomputed_pages = 0
        self.storage: StandInStorage | None = None
        if args.hicache_storage_backend is not None:
            if args.hicache_storage_backend != "dynamic" or not args.enable_hierarchical_cache:
                raise SystemExit("the stand-in knows the dynamic storage backend, with a host tier, only")
            self.storage = StandInStorage(args.hicache_storage_backend_extra_config, args.standin_page_bytes)
        self.requests: list[dict[str, Any]] = []
        self.aborted: list[str] = []
        self.calls: list[str] = []

    async def publish(self, events: list[Any]) -> None:
        await self.pub.send_multipart(message(self.seq, events, topic=self.topic))
        self.seq += 1

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/health", self.health)
        app.router.add_post("/generate", self.generate)
        app.router.add_get("/v1/loads", self.loads)
        app.router.add_post("/pause_generation", self.pause)
        app.router.add_post("/continue_generation", self.resume)
        app.router.add_post("/pd_role_switch", self.switch)
        app.router.add_post("/abort_request", self.abort)
        app.router.add_get("/standin/requests", self.recorded)
        app.router.add_post("/standin/fail_transfers", self.fail_transfers)
        app.router.add_post("/standin/retract", self.retract)
        return app

    def bootstrap_app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/standin/room/{room}", self.room)
        return app

    async def room(self, r: web.Request) -> web.Response:
        room = int(r.match_info["room"])
        return web.Response(status=200 if room in self.rooms else 410 if room in self.failed_rooms else 404)

    async def fail_transfers(self, r: web.Request) -> web.Response:
        self.fail_rooms = int((await r.json())["count"])
        return web.json_response({})

    async def retract(self, r: web.Request) -> web.Response:
        running = (await r.json())["running"]
        self.max_running = None if running is None else int(running)
        self.wake.set()
        return web.json_response({})

    async def transfer_ok(self, q: Req) -> bool:
        """A decode request's KV: is its room there on the prefill side's bootstrap server?"""
        b = q.body
        url = f"http://{b.get('bootstrap_host')}:{b.get('bootstrap_port')}/standin/room/{b.get('bootstrap_room')}"
        try:
            async with ClientSession() as http:
                for _ in range(100):
                    async with http.get(url, timeout=ClientTimeout(total=5)) as resp:
                        if resp.status != 404:
                            return resp.status == 200
                    await asyncio.sleep(0.05)
        except (ClientError, TimeoutError):
            pass
        return False

    async def health(self, r: web.Request) -> web.Response:
        if time.monotonic() < self.ready_at:
            return web.Response(status=503, text="loading")
        return web.Response(text="")

    async def prefill(self, ids: list[int]) -> int:
        """Cache the prompt's full pages; publish what is new. Returns the tokens found cached (in its
        device/host cache, or read back from L3 storage)."""
        cached = 0
        parent: int | None = None
        new_hashes: list[int] = []
        new_tokens: list[int] = []
        first_parent: int | None = None
        full = len(ids) - len(ids) % self.page
        keys: list[str] = []
        for i in range(0, full, self.page):
            keys.append(storage_key(keys[-1] if keys else None, ids[i : i + self.page]))
        from_storage = 0
        written: list[str] = []
        for n, i in enumerate(range(0, full, self.page)):
            key = tuple(ids[: i + self.page])
            if key in self.cache:
                cached = i + self.page
                parent = self.cache[key]
                continue
            if self.storage is not None and not new_hashes and from_storage == 0:
                from_storage = self.storage.prefetch(keys[n:])  # the first miss: ask L3 storage
            if from_storage > 0:
                from_storage -= 1
                cached = i + self.page
                self.host_tier[keys[n]] = page_bytes_of(keys[n], self.storage.page_bytes)  # type: ignore[union-attr]
            else:
                self.recomputed_pages += 1
                if self.storage is not None:
                    self.host_tier[keys[n]] = page_bytes_of(keys[n], self.storage.page_bytes)
                    written.append(keys[n])
            h = event_hash(keys[n])
            if not new_hashes:
                first_parent = parent
            self.cache[key] = h
            new_hashes.append(h)
            new_tokens.extend(ids[i : i + self.page])
            parent = h
        if self.storage is not None and written:
            self.storage.backup(written, [self.host_tier[k] for k in written])  # write-through to L3
        if new_hashes:
            events = [stored(new_hashes, first_parent, new_tokens, self.page, "GPU")]
            if self.write_through:
                events.append(stored(new_hashes, first_parent, new_tokens, self.page, "CPU_PINNED"))
            await self.publish(events)
        return cached

    def chunk_of(self, q: Req, fin: dict[str, Any] | None) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "id": q.body.get("rid"),
            "finish_reason": fin,
            "prompt_tokens": len(q.ids),
            "completion_tokens": q.done,
            "cached_tokens": q.cached,
        }
        if fin is not None:
            if self.spec:
                meta["spec_verify_ct"] = q.verify
                if q.verify:
                    drafts = q.verify * (self.draft - 1)
                    accepted = q.done - 1 - q.verify
                    meta |= {
                        "spec_accept_rate": accepted / drafts,
                        "spec_accept_length": q.done / q.verify,
                        "spec_accept_token_num": accepted,
                        "spec_draft_token_num": drafts,
                    }
            meta["e2e_latency"] = time.time() - q.created
        return {"text": "".join(f"w{i} " for i in range(q.done)), "meta_info": meta}

    def emit(self, q: Req) -> bool:
        """``q``'s chunk after a pass; True when it finished."""
        fin = {"type": "length", "length": q.n} if q.done >= q.n else None
        q.out.put_nowait(self.chunk_of(q, fin))
        return fin is not None

    async def scheduler(self) -> None:
        """SGLang's loop: a prefill pass for the waiting requests, else a decode pass."""
        while True:
            await self.unpaused.wait()
            for q in [*self.waiting, *self.batch]:
                if q.body.get("rid") in self.aborted:
                    q.out.put_nowait(self.chunk_of(q, {"type": "abort", "message": "aborted"}))
                    self.waiting = [w for w in self.waiting if w is not q]
                    self.batch = [b for b in self.batch if b is not q]
            loop = asyncio.get_running_loop()
            t0 = loop.time()  # a pass lasts its time from here, the stand-in's own work included
            cap = self.max_running
            while cap is not None and len(self.batch) > cap:  # the KV ran short: retract the newest
                q = self.batch.pop()
                q.retracted = True
                self.waiting.insert(0, q)
            full = cap is not None and self.role != "decode" and len(self.batch) >= cap
            if self.waiting and not full:
                passed, uncached = [], 0
                while self.waiting and (cap is None or len(self.batch) + len(passed) < cap):
                    q = self.waiting[0]
                    if self.role == "decode":  # the KV came by transfer: straight into the batch
                        self.waiting.pop(0)
                        if self.check_rooms and not await self.transfer_ok(q):
                            msg = f"KVTransferError(bootstrap_room={q.body.get('bootstrap_room')}): failed"
                            q.out.put_nowait(
                                self.chunk_of(q, {"type": "abort", "message": msg, "status_code": 500})
                            )
                            continue
                        self.batch.append(q)
                        continue
                    if passed and uncached + len(q.ids) > self.chunk:
                        break
                    self.waiting.pop(0)
                    q.cached = await self.prefill(q.ids)
                    room = q.body.get("bootstrap_room")
                    if isinstance(room, int):
                        if self.fail_rooms > 0:
                            self.fail_rooms -= 1
                            self.failed_rooms.add(room)
                        else:
                            self.rooms.add(room)
                    uncached += len(q.ids) - q.cached
                    passed.append(q)
                if passed:
                    await asyncio.sleep(t0 + self.p0 + self.p1 * uncached - loop.time())
                    for q in passed:
                        q.done = min(q.n, q.done + 1) if q.retracted else 1
                        q.retracted = False
                        if not self.emit(q) and q.body.get("stream"):
                            self.batch.append(q)
                continue
            if self.batch:
                await asyncio.sleep(t0 + self.d0 + self.d2 * len(self.batch) - loop.time())
                for q in list(self.batch):
                    q.verify += 1
                    q.done = min(q.n, q.done + (1 + q.verify % 2 if self.spec else 1))
                    if self.emit(q):
                        self.batch.remove(q)
                continue
            self.wake.clear()
            await self.wake.wait()

    async def generate(self, r: web.Request) -> web.StreamResponse:
        body = await r.json()
        self.requests.append(body)
        ids = body["input_ids"]
        n = body.get("sampling_params", {}).get("max_new_tokens", 16)
        if not ids or not isinstance(n, int) or n < 1:
            return web.json_response({"error": {"message": "bad request"}}, status=400)
        stream = bool(body.get("stream"))
        context = self.args.context_length or self.args.standin_model_context
        # refused as SGLang 0.5.23's tokenizer manager refuses: the prompt alone reaching the context,
        # or the prompt and max_new_tokens over it
        if context is not None and (len(ids) >= context or len(ids) + n > context):
            message = (
                f"Requested token count exceeds the model's maximum context length of {context} tokens. "
                f"You requested a total of {len(ids) + n} tokens: {len(ids)} tokens from the input "
                f"messages and {n} tokens for the completion."
            )
            if not stream:
                return web.json_response({"error": {"message": message}}, status=400)
            resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
            await resp.prepare(r)
            error = {"message": message, "type": "invalid_request_error", "code": 400, "retryable": False}
            await resp.write(f"data: {json.dumps({'error': error})}\n\n".encode())
            await resp.write(b"data: [DONE]\n\n")
            return resp
        q = Req(body, ids, n if stream else 1)
        self.waiting.append(q)
        self.wake.set()
        if not stream:
            return web.json_response(await q.out.get())
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(r)
        while True:
            chunk = await q.out.get()
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
            if chunk["meta_info"]["finish_reason"] is not None:
                break
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def loads(self, r: web.Request) -> web.Response:
        rank = {
            "dp_rank": 0,
            "num_running_reqs": len(self.batch),
            "num_waiting_reqs": len(self.waiting),
            "num_waiting_uncached_tokens": 0,
            "num_used_tokens": 1000 * len(self.batch),
            "max_total_num_tokens": 500000,
            "token_usage": 0.0,
        }
        body = {"timestamp": "2026-12-01T00:00:00Z", "version": "stand-in", "loads": [rank]}
        return web.json_response(body)

    async def pause(self, r: web.Request) -> web.Response:
        self.calls.append("pause")
        self.paused = True
        self.unpaused.clear()
        return web.json_response({"message": "Generation paused successfully.", "status": "ok"})

    async def resume(self, r: web.Request) -> web.Response:
        self.calls.append("continue")
        self.paused = False
        self.unpaused.set()
        return web.json_response({"message": "Generation continued successfully.", "status": "ok"})

    async def switch(self, r: web.Request) -> web.Response:
        body = await r.json()
        self.calls.append(f"switch:{body.get('new_role')}")
        if not self.paused or body.get("new_role") not in ("prefill", "decode"):
            out = {"success": False, "message": "instance is not idle", "old_role": self.role, "new_role": ""}
            return web.json_response(out, status=400)
        old, self.role = self.role, body["new_role"]
        self.cache.clear()  # SGLang flushes its prefix cache, host tier included
        self.host_tier.clear()
        if self.storage is not None:  # and calls its storage backend's clear() (role_switch.py)
            self.storage.stats["clears"] += 1
            self.storage.client.clear()
        await self.publish([cleared()])
        return web.json_response({"success": True, "message": "", "old_role": old, "new_role": self.role})

    async def abort(self, r: web.Request) -> web.Response:
        self.aborted.append((await r.json()).get("rid"))
        return web.json_response({})

    async def recorded(self, r: web.Request) -> web.Response:
        l3 = (
            None
            if self.storage is None
            else {**self.storage.stats, "recomputed_pages": self.recomputed_pages}
        )
        body = {"requests": self.requests, "calls": self.calls, "aborted": self.aborted, "l3": l3}
        return web.json_response(body)


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--record", type=Path, required=True)
    p.add_argument("--load-s", type=float, default=0.3)
    p.add_argument("--model-path", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--page-size", type=int, required=True)
    p.add_argument("--disaggregation-mode")
    p.add_argument("--kv-events-config", required=True)
    p.add_argument("--enable-hierarchical-cache", action="store_true")
    p.add_argument("--chunked-prefill-size", type=int, default=8192)
    p.add_argument("--speculative-algorithm")
    p.add_argument("--speculative-num-draft-tokens", type=int, default=4)
    p.add_argument("--standin-prefill-s", default="0.005,0")
    p.add_argument("--standin-check-rooms", action="store_true")
    p.add_argument("--disaggregation-bootstrap-port", type=int)
    p.add_argument("--standin-decode-s", default="0.02,0")
    p.add_argument("--hicache-storage-backend")
    p.add_argument("--hicache-storage-backend-extra-config")
    p.add_argument("--standin-page-bytes", type=int, default=16384)
    p.add_argument("--context-length", type=int)
    p.add_argument("--standin-model-context", type=int, help="the model's own context length")
    args, _ = p.parse_known_args()
    args.record.write_text(json.dumps(sys.argv[1:]))
    s = StandIn(args)
    loop_task = asyncio.create_task(s.scheduler())
    # a request whose client hangs up ends at once (SGLang aborts it), so SIGTERM stops promptly
    runner = web.AppRunner(s.app(), handler_cancellation=True)
    await runner.setup()
    await web.TCPSite(runner, args.host, args.port).start()
    boot = web.AppRunner(s.bootstrap_app())
    await boot.setup()
    if args.standin_check_rooms and args.disaggregation_bootstrap_port:
        await web.TCPSite(boot, args.host, args.disaggregation_bootstrap_port).start()
    print(f"stand-in serving on {args.host}:{args.port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    loop_task.cancel()
    await runner.cleanup()
    await boot.cleanup()
    s.pub.close()
    s.ctx.term()
    print("stand-in stopped", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
