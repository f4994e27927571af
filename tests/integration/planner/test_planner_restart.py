"""A restarted planner resumes from its saved state (a ConfigMap on KMock) and a failing window
does not end the loop."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np
import pytest
import pytest_asyncio
from kubernetes import client as k8s
from prometheus_client import CollectorRegistry
from test_planner_controller import (
    LONG_CHUNKS,
    NODE,
    NS,
    OSWORLD,
    PODS,
    POOL,
    PUTNAM,
    SHAPE,
    SHORT,
    Harness,
    Published,
    pod_body,
    warmup_records,
)

from agentpool.models import MoeShape, PrefillModel
from agentpool.models.synthetic import decode_records, prefill_records
from agentpool.planner.config import PlannerConfig
from agentpool.planner.controller import PlannerController, PlannerError
from agentpool.planner.core import Outcome
from agentpool.planner.evaluation import Evaluation
from agentpool.planner.inbox import PlannerInbox
from agentpool.planner.kube import PodRoles
from agentpool.planner.metrics import PlannerMetrics
from agentpool.planner.roles import ServedRoles
from agentpool.planner.saved_records import SavedRecordSet
from agentpool.planner.state import ConfigMapStateStore, LoadedGenerations, PlannerState

pytestmark = pytest.mark.integration

STATE = "demo-planner-state"
Build = Callable[..., PlannerController]


@dataclasses.dataclass
class Env:
    h: Harness
    api: k8s.ApiClient
    build: Build
    box: list[Any]

    def state_map(self) -> dict[str, Any] | None:
        key = (self.h.kmock.resource("v1", "configmaps"), NS, STATE)
        if key not in self.h.kmock.objects:
            return None
        return dict(self.h.kmock.objects[key].raw)

    def pod_patches(self) -> list[Any]:
        return [r for r in self.h.patches() if "/pods/" in r.url.path]


@pytest_asyncio.fixture()
async def env(kmock: Any) -> AsyncIterator[Env]:
    for i, name in enumerate(PODS):
        role = "decode" if name == PODS[-1] else ("prefill" if i == 0 else "both")
        kmock.objects[kmock.resource("v1", "pods"), NS, name] = pod_body(name, role, pinned=name == PODS[-1])
    kmock.resources["v1/events"] = {}
    kmock.resources["v1/configmaps"] = {}
    served = ServedRoles()
    api = k8s.ApiClient(k8s.Configuration(host=str(kmock.url).rstrip("/")))
    box: list[Any] = [
        PlannerConfig(window_s=600, slices=10, warmup_s=1800, cooldown_s=120, initial_prefill=2)
    ]
    evaluated = asyncio.Event()

    def config() -> PlannerConfig:
        if isinstance(box[0], Exception):
            raise box[0]
        assert isinstance(box[0], PlannerConfig)
        return box[0]

    def build(
        cls: type[PlannerController] = PlannerController,
        shape: MoeShape = SHAPE,
        inbox: PlannerInbox | None = None,
    ) -> PlannerController:
        return cls(
            pods=PodRoles(api, NS, "agentpool.io/pool=demo", served),
            inbox=PlannerInbox() if inbox is None else inbox,
            config=config,
            pool=POOL,
            metrics=PlannerMetrics(CollectorRegistry()),
            shape=shape,
            on_evaluation=lambda _: evaluated.set(),
            state=ConfigMapStateStore(api, NS, STATE, POOL),
        )

    first = build()
    h = Harness(kmock, first, first._inbox, CollectorRegistry(), box, evaluated, served)
    h.engines_report_observed_roles()
    yield Env(h, api, build, box)
    await asyncio.to_thread(api.close)


async def converge(env: Env) -> Evaluation:
    """The first planner fits, splits 2P7D, and switches to 6P3D on OSWorld-like work; state saved."""
    h, rng = env.h, np.random.default_rng(7)
    warmup_records(h.inbox, 0.0, 1800.0, rng)
    h.controller.fit(0.0, 1800.0)
    await h.controller.start_disaggregation()
    await h.controller.save_state()
    h.engines_report_observed_roles()
    h.route(1800, 2400, OSWORLD, rng)
    ev: Evaluation | None = await h.controller.evaluate_window(1800, 2400)
    assert ev is not None and ev.decision.outcome is Outcome.SWITCH, ev.decision.reason
    h.engines_report_observed_roles()
    return ev


async def test_state_is_a_configmap_owned_by_the_pool_and_holds_models_and_the_last_switch(env: Env) -> None:
    assert env.state_map() is None
    await converge(env)
    cm = env.state_map()
    assert cm is not None
    assert cm["metadata"]["ownerReferences"][0]["uid"] == "pool-uid"
    state = PlannerState.model_validate_json(cm["data"]["state.json"])
    assert state.last_switch_at == 2400 and sorted(state.models) == PODS
    assert state.models["engine-3"].node_model().prefill.c1 == pytest.approx(NODE.prefill.c1, rel=0.05)
    assert json.loads(cm["data"]["state.json"])["version"] == 1
    # the fitted records lie apart, so the operator's status refresh reads a small state.json
    assert "records" not in json.loads(cm["data"]["state.json"]) and state.records == {}
    records = SavedRecordSet.model_validate_json(cm["data"]["records.json"])
    assert sorted(records.nodes) == PODS and all(len(r.decode) == 128 for r in records.nodes.values())
    assert (state.switches.total, state.switches.last_to) == (1, "6P3D")  # what the operator shows
    # which generation each part runs goes beside it, and leaves the state alone
    store = ConfigMapStateStore(env.api, NS, STATE)
    await store.save_loaded(LoadedGenerations(planner=3, routers={"http://10.0.0.1:8000": 2}))
    cm = env.state_map()
    assert cm is not None and PlannerState.model_validate_json(cm["data"]["state.json"]) == state
    loaded = LoadedGenerations.model_validate_json(cm["data"]["loaded.json"])
    assert (loaded.planner, loaded.routers) == (3, {"http://10.0.0.1:8000": 2})


async def test_the_loaded_report_alone_creates_the_config_map_and_is_no_saved_state(env: Env) -> None:
    store = ConfigMapStateStore(env.api, NS, STATE, POOL)
    await store.save_loaded(LoadedGenerations(planner=1))
    cm = env.state_map()
    assert cm is not None and set(cm["data"]) == {"loaded.json"}
    assert cm["metadata"]["ownerReferences"][0]["uid"] == "pool-uid"
    assert await store.load() is None  # the planner still warms up


async def test_a_restarted_planner_resumes_the_split_and_the_cooldown_without_rewarming(env: Env) -> None:
    switched = await converge(env)
    roles = {n: env.h.role(n) for n in PODS}
    patches = len(env.pod_patches())

    restarted = env.build()
    assert await restarted.resume()
    assert len(env.pod_patches()) == patches  # nothing re-colocated, nothing re-split
    assert {n: env.h.role(n) for n in PODS} == roles
    assert env.h.events()[-1]["reason"] == "PlannerResumed"
    assert restarted.switches.total == 1  # the count goes on from the saved one
    assert "6P3D" in env.h.events()[-1]["message"]

    ev = await restarted.evaluate_window(2400, 2460)  # 60 s after the saved switch: cooldown
    assert ev is not None and ev.decision.outcome is Outcome.COOLDOWN and ev.excluded == ()
    assert sorted(ev.decision.prefill) == sorted(switched.decision.prefill)


async def test_a_restarted_planner_refits_on_the_saved_fitted_records_without_a_new_warmup(env: Env) -> None:
    """Fitted on short batches, then restarted; the next window's full 8K chunks, which the
    warmup's models underestimate, leave the saved records' range: the restarted planner refits."""
    h, rng = env.h, np.random.default_rng(7)
    for name in PODS:
        h.inbox.add_iterations(prefill_records(name, NODE, 300, 0.02, rng, SHORT, start=0, spacing=6))
        h.inbox.add_iterations(decode_records(name, NODE, 300, 0.02, rng, start=0, spacing=6))
    await asyncio.to_thread(h.controller.fit, 0.0, 1800.0)
    await h.controller.start_disaggregation()
    await h.controller.save_state()
    h.engines_report_observed_roles()
    warm = {n: f.prefill.model for n, f in h.controller.fits.items()}
    patches = len(env.pod_patches())

    inbox = PlannerInbox()
    restarted = env.build(inbox=inbox)
    sink = restarted.models_out = Published()
    assert await restarted.resume()
    assert len(env.pod_patches()) == patches  # resumed: nothing re-colocated, no warmup
    saved = restarted.fitted_records
    assert sorted(saved) == PODS and all(len(saved[n].prefill) == 128 for n in PODS)  # of 300
    window = [
        r
        for name in ("engine-0", "engine-1")  # the prefill nodes run the new work
        for r in prefill_records(name, LONG_CHUNKS, 100, 0.02, rng, start=1800, spacing=6)
    ]
    inbox.add_iterations(window)
    dataclasses.replace(h, controller=restarted, inbox=inbox).route(1800, 2400, PUTNAM, rng)
    ev = await restarted.evaluate_window(1800, 2400)
    assert ev is not None and restarted.refits == 1

    def error(model: PrefillModel) -> float:
        return float(np.mean([abs(model.iteration_time(r.batch) - r.seconds) / r.seconds for r in window]))

    published, _ = sink.sets[-1]
    for n in PODS:  # every node, the decode nodes on the prefill nodes' records
        assert error(warm[n]) > 0.15 and error(published[n].prefill) < 0.10, n
    # the refit's records are saved in turn: a second restart checks the next window against them
    again = env.build()
    assert await again.resume()
    assert max(r.seconds for r in again.fitted_records["engine-0"].prefill) == pytest.approx(
        max(r.seconds for r in restarted.fitted_records["engine-0"].prefill)
    )


async def test_run_after_a_restart_evaluates_windows_at_once_instead_of_warming_up(env: Env) -> None:
    await converge(env)
    patches = len(env.pod_patches())
    env.box[0] = dataclasses.replace(env.box[0], window_s=0.2)  # warmup stays 1800 s
    env.h.evaluated.clear()
    restarted = env.build()
    stop = asyncio.Event()
    task = asyncio.create_task(restarted.run(stop))
    await asyncio.wait_for(env.h.evaluated.wait(), timeout=5.0)
    stop.set()
    await asyncio.wait_for(task, timeout=5.0)
    assert len(env.pod_patches()) == patches
    assert restarted.last is not None and restarted.last.excluded == ()


async def test_no_state_or_a_state_for_another_model_means_a_warmup(env: Env) -> None:
    assert not await env.build().resume()
    await converge(env)
    assert not await env.build(shape=MoeShape(experts_active=2, experts_total=8)).resume()
    key = (env.h.kmock.resource("v1", "configmaps"), NS, STATE)
    env.h.kmock.objects[key].patch({"data": {"records.json": "{not json"}})
    unreadable_records = env.build()  # the models and split still resume; no refit until a warmup
    assert await unreadable_records.resume() and unreadable_records.fitted_records == {}
    env.h.kmock.objects[key].patch({"data": {"state.json": "{not json"}})
    assert not await env.build().resume()


class Flaky(PlannerController):
    """Its first window fails with a PlannerError, its second with a ValueError."""

    calls = 0

    async def evaluate_window(self, start: float, end: float) -> Evaluation | None:
        self.calls += 1
        if self.calls == 1:
            raise PlannerError("pinned pods contradict the split")
        if self.calls == 2:
            raise ValueError("a slice without requests")
        return await super().evaluate_window(start, end)


async def test_a_window_that_fails_is_logged_and_skipped_and_the_loop_goes_on(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    await converge(env)
    env.box[0] = dataclasses.replace(env.box[0], window_s=0.1)
    env.h.evaluated.clear()
    flaky = env.build(Flaky)
    assert isinstance(flaky, Flaky)
    stop = asyncio.Event()
    caplog.set_level(logging.ERROR, logger="agentpool.planner.controller")
    task = asyncio.create_task(flaky.run(stop))
    await asyncio.wait_for(env.h.evaluated.wait(), timeout=5.0)
    # A configuration that stops validating (a bad reload) keeps the last window length.
    env.box[0] = ValueError("window must be > 0 s")
    for _ in range(1000):  # the next window reads it; a slow machine takes longer to get there
        if any("configuration unreadable" in r.getMessage() for r in caplog.records) or task.done():
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.25)  # and the loop goes on after it
    assert not task.done()
    stop.set()
    await asyncio.wait_for(task, timeout=5.0)  # raises if the loop died
    assert flaky.calls >= 3
    messages = [r.getMessage() for r in caplog.records]
    assert any("skipped: pinned pods contradict" in m for m in messages)
    assert any("skipped: a slice without requests" in m for m in messages)
    assert any("configuration unreadable" in m for m in messages)
