"""Host KV across a role switch with ``backend: sglang`` (``keepHostKv``): the agent's host pool in
shared memory behind SGLang's HiCache L3 storage backend. The stand-in (``sglang_standin.py``) gets
the storage arguments the agent builds, writes every computed page through to the agent's pool,
clears its own host tier and calls the backend's ``clear()`` on ``/pd_role_switch`` as SGLang does,
and on a later request reads the pages back (``batch_exists``/``batch_get``) and checks them byte for
byte. Real processes: the agent, the stand-in as its child, a Unix socket, a shared-memory file.

Without ``keepHostKv`` the same run recomputes the prompt after the switches: the check fails
without the adapter."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from engine_processes import (
    PAGE,
    engine_config,
    gen_body,
    generate,
    start_engine,
    state,
    wait_ready,
    wait_until,
)
from process_helpers import free_port

pytestmark = pytest.mark.integration
STANDIN = str(Path(__file__).with_name("sglang_standin.py"))


async def standin_l3(http: aiohttp.ClientSession, sg: str) -> dict[str, Any] | None:
    async with http.get(sg + "/standin/requests") as r:
        out: dict[str, Any] | None = (await r.json())["l3"]
        return out


async def _aliased(http: aiohttp.ClientSession, url: str, n: int) -> bool:
    return bool((await state(http, url))["sglang"]["l3"]["aliased"] == n)


@pytest.mark.parametrize("keep", [True, False], ids=["keepHostKv", "without"])
async def test_pages_written_before_a_switch_are_read_back_byte_exact_after_it(
    tmp_path: Path, keep: bool
) -> None:
    role_file = tmp_path / "role"
    role_file.write_text("prefill")
    port = free_port()
    cfg = engine_config(
        "hk0",
        backend="sglang",
        role="prefill",
        roleFile=str(role_file),
        rolePollS=0.05,
        sglang={
            "model": "stand-in/model",
            "port": port,
            "kvEventsEndpoint": f"tcp://127.0.0.1:{free_port()}",
            "bootstrapPort": free_port(),
            "hostKvGib": 1,
            "keepHostKv": keep,
            "l3Dir": str(tmp_path / "shm"),
            "launcher": [sys.executable, STANDIN, "--record", str(tmp_path / "argv.json"), "--load-s", "0.2"],
            "args": ["--standin-page-bytes", str(engine_config("x")["blockBytes"])],
            "requireGpu": False,
            "loadPollS": 0.1,
        },
    )
    engine = await start_engine(tmp_path, cfg)
    sg = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as http:
            await wait_ready(http, engine, "the agent to be ready")
            argv = json.loads((tmp_path / "argv.json").read_text())
            assert ("--hicache-storage-backend" in argv) is keep
            prompt = list(range(500, 500 + 6 * PAGE))
            events = await generate(http, engine.url, gen_body("c1", prompt, max_tokens=2))
            assert events[0]["cached_tokens"] == 0 and events[-1]["type"] == "done"
            if keep:
                l3 = await standin_l3(http, sg)
                assert l3 is not None and l3["written_pages"] == 6
                l3_state = (await state(http, engine.url))["sglang"]["l3"]
                assert l3_state["pages"] == 6
                # each page takes the directory count of our block its KV event maps it to
                await wait_until(lambda: _aliased(http, engine.url, 6), 10, "the pages mapped to our blocks")

            # prefill -> decode -> prefill: each switch clears SGLang's prefix cache and host tier
            for role in ("decode", "prefill"):
                role_file.write_text(role)

                async def switched(role: str = role) -> bool:
                    st = await state(http, engine.url)
                    return bool(
                        st["role"] == role and st["switches"] and st["switches"][-1].get("to") == role
                    )

                await wait_until(switched, 20, f"the switch to {role}")

            events = await generate(http, engine.url, gen_body("c2", prompt, max_tokens=2))
            assert events[-1]["type"] == "done", events
            st = await state(http, engine.url)
            l3 = await standin_l3(http, sg)
            if keep:
                # read back from the agent's pool, byte for byte; nothing recomputed
                assert events[0]["cached_tokens"] == 6 * PAGE
                assert l3 == {
                    "written_pages": 6,
                    "hit_pages": 6,
                    "mismatched_pages": 0,
                    "clears": 2,
                    "recomputed_pages": 6,  # the first request's, none since
                }
                assert st["sglang"]["l3"]["clears_kept"] == 2 and st["sglang"]["l3"]["clears_dropped"] == 0
                assert st["sglang"]["l3"]["pages"] == 6 and st["sglang"]["l3"]["refused"] == 0
            else:
                # the bytes are gone: SGLang recomputes the prompt
                assert events[0]["cached_tokens"] == 0
                assert l3 is None and st["sglang"]["l3"] is None
        assert not list((tmp_path / "shm").glob("*/hostpool")) or keep  # created only with keepHostKv
    finally:
        await engine.stop()
    assert not list((tmp_path / "shm").glob("*/*")), "the agent removes its shared memory and socket"
