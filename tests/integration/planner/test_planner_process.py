"""``python -m agentpool.planner`` as a real process against KMock and a real router work log."""

from __future__ import annotations

import asyncio
import itertools
import re
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from planner_link_harness import router_config, start_router
from process_helpers import Proc, kubeconfig, launch
from test_planner_controller import NODE, NS, PODS, SHAPE, pod_body

from agentpool.models import Work
from agentpool.planner.process import parser, run
from agentpool.planner.state import PlannerState
from agentpool.router.http_server import HttpServer, Request, Response, Routes, Stream
from agentpool.router.work_log import WorkLog, sampling, work_handler
from agentpool.wire.work import WORK_PATH

pytestmark = pytest.mark.integration


@pytest.fixture()
async def router() -> AsyncIterator[tuple[str, list[str], WorkLog]]:
    """A router stand-in that serves a real work log and remembers the queries it got."""
    seen: list[str] = []

    log = WorkLog("router-0")
    serve_work = work_handler(log)

    async def remember(request: Request) -> Response | Stream:
        seen.append(request.path + (f"?{request.query}" if request.query else ""))
        return await serve_work(request)

    routes = Routes()
    routes.add("GET", WORK_PATH, remember)
    server = HttpServer(routes, max_body_bytes=lambda: 1 << 20, body_timeout_s=lambda: 30.0)
    async with sampling(log, 0.05):
        port = await server.start("127.0.0.1", 0)
        yield f"http://127.0.0.1:{port}", seen, log
        await server.stop(0.1)


def add_pods(kmock: Any, roles: dict[str, str]) -> None:
    for name in PODS:
        kmock.objects[kmock.resource("v1", "pods"), NS, name] = pod_body(name, roles[name], name == PODS[-1])
    kmock.resources["v1/events"] = {}
    kmock.resources["v1/configmaps"] = {}


def role(kmock: Any, name: str) -> str:
    return str(
        kmock.objects[kmock.resource("v1", "pods"), NS, name].raw["metadata"]["annotations"][
            "agentpool.io/role"
        ]
    )


def events(kmock: Any) -> list[dict[str, Any]]:
    res = kmock.resource("v1", "events")
    return [dict(obj.raw) for (r, _, _), obj in kmock.objects.items() if r == res]


async def start(tmp_path: Path, kmock: Any, router_url: str, *extra: str) -> Proc:
    """The planner, its output read all along (:func:`process_helpers.launch`): a pipe nobody reads
    fills at 64 KiB and blocks the planner's next log line."""
    return await launch(
        "planner", "agentpool.planner",
        "--namespace", NS, "--pool", "demo", "--router", router_url,
        "--kubeconfig", str(kubeconfig(tmp_path / "kubeconfig", str(kmock.url))),
        "--poll-interval-s", "0.2", "--initial-prefill", "2",
        "--experts-active", "8", "--experts-total", "256",
        *extra,
    )  # fmt: skip


async def until(check: Callable[[], bool], within_s: float, proc: Proc) -> None:
    deadline = time.monotonic() + within_s
    while not check():
        if proc.proc.returncode is not None or time.monotonic() > deadline:
            await proc.stop()
            raise AssertionError(f"condition not met; planner output:\n{proc.text()}")
        await asyncio.sleep(0.1)


async def stop(proc: Proc) -> str:
    """SIGTERM (SIGKILL after 15 s): a clean stop exits 0."""
    code = await proc.stop()
    assert code == 0, proc.text()
    return proc.text()


async def test_process_warms_up_polls_the_router_and_stops_cleanly_on_sigterm(
    kmock: Any, router: tuple[str, list[str], WorkLog], tmp_path: Path
) -> None:
    url, seen, _ = router
    add_pods(kmock, {n: ("decode" if n == PODS[-1] else "prefill") for n in PODS})
    proc = await start(tmp_path, kmock, url, "--warmup-s", "3600")
    try:
        await until(lambda: all(role(kmock, n) == "both" for n in PODS[:-1]), 20, proc)
        await until(lambda: sum(p.startswith("/agentpool/v1/work") for p in seen) >= 2, 10, proc)
        assert role(kmock, PODS[-1]) == "decode"  # pinned
        assert any("since=" in p for p in seen)  # the second poll sends the first one's cursor
        out = await stop(proc)
    finally:
        await proc.stop()  # a failed check leaves no planner running
    assert "planner stopped" in out


async def test_process_resumes_from_the_saved_state_and_plans_from_the_routers_records(
    kmock: Any, router: tuple[str, list[str], WorkLog], tmp_path: Path
) -> None:
    url, _, work_log = router
    roles = {n: ("prefill" if n in PODS[:3] else "decode") for n in PODS}
    add_pods(kmock, roles)
    state = PlannerState.of(SHAPE, dict.fromkeys(PODS, NODE), fitted_at=1.0, last_switch_at=2.0)
    kmock.objects[kmock.resource("v1", "configmaps"), NS, "demo-planner-state"] = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "demo-planner-state", "namespace": NS, "resourceVersion": "1"},
        "data": {"state.json": state.model_dump_json()},
    }
    for name, served in roles.items():  # the engines' load reports: the role each serves
        work_log.served_role(name, served)
    for i in range(300):  # Putnam-like load: 300 requests in flight, one finishing every 20 ms
        work_log.routed(f"long-{i}", Work(t_uc=6000, t_c=30000, t_out=4096))

    async def traffic() -> None:
        for i in itertools.count():
            work_log.routed(f"r{i}", Work(t_uc=6000, t_c=30000, t_out=4096))
            work_log.finished(f"r{i}", 2001)
            await asyncio.sleep(0.02)

    feeding = asyncio.create_task(traffic())
    proc = await start(tmp_path, kmock, url, "--warmup-s", "3600", "--window-s", "1", "--slices", "2")
    try:
        await until(lambda: any(e["reason"] == "PlannerResumed" for e in events(kmock)), 20, proc)
        await asyncio.sleep(2.5)  # two windows
        out = await stop(proc)
    finally:
        feeding.cancel()
        await proc.stop()
    assert "3P6D" in next(e["message"] for e in events(kmock) if e["reason"] == "PlannerResumed")
    outcomes = re.findall(r"planner window \d+-\d+: ([a-z-]+):", out)
    assert outcomes and outcomes[0] in {"hold", "switch"}, out  # a window with data, no warmup
    assert "both" not in {role(kmock, n) for n in PODS}
    # the served roles came from the router's batches; the planner shows them on the pods
    pods = kmock.resource("v1", "pods")
    shown = {
        n: kmock.objects[pods, NS, n].raw["metadata"]["annotations"]["agentpool.io/observed-role"]
        for n in PODS
    }
    assert shown == roles
    if "switch" in outcomes:  # Putnam-like work: 2P7D is better than 3P6D; the switch is saved
        cm = kmock.objects[kmock.resource("v1", "configmaps"), NS, "demo-planner-state"].raw
        saved = PlannerState.model_validate_json(cm["data"]["state.json"])
        assert saved.last_switch_at is not None and saved.last_switch_at > time.time() - 60
        assert sum(role(kmock, n) == "prefill" for n in PODS) == 2
    else:
        assert {n: role(kmock, n) for n in PODS} == roles


async def test_bad_settings_or_kubeconfig_fail_the_start(tmp_path: Path) -> None:
    common = ["--namespace", NS, "--pool", "demo", "--router", "http://127.0.0.1:9"]
    args = parser().parse_args([*common, "--slices", "1", "--kubeconfig", str(tmp_path / "none")])
    assert await run(args, asyncio.Event()) == 1
    args = parser().parse_args([*common, "--kubeconfig", str(tmp_path / "none")])
    assert await run(args, asyncio.Event()) == 1
    settings = tmp_path / "planner.yaml"
    settings.write_text("window_s: 60\nbogus: 1\n")
    args = parser().parse_args([*common, "--settings", str(settings)])
    assert await run(args, asyncio.Event()) == 1


async def test_process_pushes_the_saved_fits_to_a_real_router_with_its_token(
    kmock: Any, tmp_path: Path
) -> None:
    """Started as users start it: the resumed models reach the router (authenticated), which then
    routes each node with its own model."""
    token = "router-token-from-a-secret"
    (tmp_path / "token").write_text(token + "\n")
    config = router_config([(n, f"http://127.0.0.1:9/{n}", "both") for n in PODS])
    real = await start_router(config, token)
    add_pods(kmock, {n: ("prefill" if n in PODS[:3] else "decode") for n in PODS})
    state = PlannerState.of(SHAPE, dict.fromkeys(PODS, NODE), fitted_at=1.0, last_switch_at=2.0)
    kmock.objects[kmock.resource("v1", "configmaps"), NS, "demo-planner-state"] = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "demo-planner-state", "namespace": NS, "resourceVersion": "1"},
        "data": {"state.json": state.model_dump_json()},
    }
    proc = await start(
        tmp_path, kmock, real.url, "--warmup-s", "3600", "--router-token-file", str(tmp_path / "token")
    )
    try:
        nodes = real.service.nodes
        await until(lambda: nodes.fits_version is not None, 20, proc)
        assert all(nodes.fitted(n) for n in PODS)
        assert nodes.get(PODS[0]).model.prefill == NODE.prefill
        await stop(proc)
    finally:
        await proc.stop()
        await real.stop()


async def test_an_empty_token_file_fails_the_start(tmp_path: Path) -> None:
    (tmp_path / "empty").write_text("\n")
    common = ["--namespace", NS, "--pool", "demo", "--router", "http://127.0.0.1:9"]
    args = parser().parse_args([*common, "--router-token-file", str(tmp_path / "empty")])
    assert await run(args, asyncio.Event()) == 1
    args = parser().parse_args([*common, "--directory-token-file", str(tmp_path / "missing")])
    assert await run(args, asyncio.Event()) == 1
