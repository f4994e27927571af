"""The planner's file role board: desired roles in files, observed roles from the engines' state."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from agentpool.local.file_roles import FileRoleBoard
from agentpool.planner.roles import ObjectRef

pytestmark = pytest.mark.integration


@pytest.fixture
async def engine_state() -> AsyncIterator[tuple[dict[str, str], str]]:
    """An HTTP server answering ``GET /agentpool/v1/state`` with the role in ``served``."""
    served = {"role": "decode"}

    async def state(request: web.Request) -> web.Response:
        return web.json_response({"node_id": "e0", **served})

    app = web.Application()
    app.router.add_get("/agentpool/v1/state", state)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield served, f"http://127.0.0.1:{port}"
    await runner.cleanup()


async def test_board_reads_files_and_engines(
    engine_state: tuple[dict[str, str], str], tmp_path: Path
) -> None:
    served, url = engine_state
    roles = tmp_path / "roles"
    roles.mkdir()
    (roles / "e0").write_text("prefill\n")
    async with aiohttp.ClientSession() as session:
        board = FileRoleBoard(roles, {"e0": url, "gone": "http://127.0.0.1:9"}, session)
        pods = await board.pods()
        assert [(p.name, p.desired_role, p.observed_role, p.pinned) for p in pods] == [
            ("e0", "prefill", "decode", False)
        ]  # the engine that does not answer is left out, as a deleted pod is
        assert pods[0].draining
        served["role"] = "prefill"
        assert not (await board.pods())[0].draining
        await board.set_role("e0", "decode")
        assert (roles / "e0").read_text() == "decode\n"
        assert [p.name for p in roles.iterdir()] == ["e0"]  # no temporary file left
        (roles / "e0.pinned").write_text("true")
        assert (await board.pods())[0].pinned
        with pytest.raises(ValueError, match="not a role"):
            await board.set_role("e0", "prefil")
        with pytest.raises(ValueError, match="no engine"):
            await board.set_role("e9", "decode")
        await board.record_event(ObjectRef("v", "K", "demo", "local"), "PhaseSplitChanged", "2P2D -> 1P3D")
    event = json.loads((tmp_path / "events.log").read_text())
    assert event["reason"] == "PhaseSplitChanged" and event["about"] == "demo"
