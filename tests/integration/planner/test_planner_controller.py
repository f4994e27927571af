"""The planner controller against a Kubernetes API server (KMock's emulator on loopback).

Engines are played by the test: they report iteration records into the planner's inbox (records
generated from known models with noise) and the role they serve, as the routers' work batches
carry it (:class:`ServedRoles`); the router's work records and decode occupancy go into the same
inbox.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

import numpy as np
import pytest
import pytest_asyncio
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from prometheus_client import CollectorRegistry

from agentpool.models import (
    DecodeModel,
    IterationCoefficients,
    MoeShape,
    NodeModel,
    OccupancySample,
    PrefillModel,
    RequestWorkRecord,
    Work,
)
from agentpool.models.synthetic import SyntheticWorkload, decode_records, prefill_records
from agentpool.planner.config import PlannerConfig
from agentpool.planner.controller import PlannerController
from agentpool.planner.core import Outcome
from agentpool.planner.evaluation import Evaluation
from agentpool.planner.inbox import PlannerInbox
from agentpool.planner.kube import ObjectRef, PodRoles
from agentpool.planner.metrics import PlannerMetrics
from agentpool.planner.roles import ServedRoles

pytestmark = pytest.mark.integration

NS = "agents"
POOL = ObjectRef(
    api_version="agentpool.io/v1alpha1", kind="AgentServingPool", name="demo", namespace=NS, uid="pool-uid"
)
NODE = NodeModel(
    prefill=PrefillModel(c0=0.015, c1=4e-5, c2=2e-10, c3=1e-6),
    decode=DecodeModel(d0=0.012, d1=0.018, d2=2.5e-4, experts_active=8, experts_total=256),
)
SHAPE = MoeShape(experts_active=8, experts_total=256)
PUTNAM = (Work(t_uc=6000, t_c=30000, t_out=2000), 300.0)  # best split 2P7D on 9 nodes
OSWORLD = (Work(t_uc=12000, t_c=80000, t_out=300), 60.0)  # best split 6P3D
PODS = [f"engine-{i}" for i in range(9)]
PINNED = "engine-8"


def pod_body(name: str, role: str, pinned: bool) -> dict[str, Any]:
    notes = {"agentpool.io/role": role, "example.com/keep": "yes"}
    if pinned:
        notes["agentpool.io/role-pinned"] = "true"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NS,
            "labels": {"agentpool.io/pool": "demo"},
            "annotations": notes,
            "uid": f"uid-{name}",
            "resourceVersion": "1",
            "generation": 1,
        },
        "spec": {"containers": [{"name": "engine", "image": "engine:dev"}]},
    }


@dataclasses.dataclass
class Harness:
    kmock: Any
    controller: PlannerController
    inbox: PlannerInbox
    registry: CollectorRegistry
    config: list[PlannerConfig]
    evaluated: asyncio.Event
    served: ServedRoles
    reports: int = 0

    def serves(self, name: str, role: str, kv_capacity_tokens: int | None = None) -> None:
        """``name``'s load report says it serves ``role`` (as a router's work batch carries it),
        with room for ``kv_capacity_tokens`` KV tokens (None: the report does not say)."""
        self.reports += 1
        self.served.update(name, role, float(self.reports), kv_capacity_tokens)

    def pod(self, name: str) -> dict[str, Any]:
        return dict(self.kmock.objects[self.kmock.resource("v1", "pods"), NS, name].raw)

    def role(self, name: str) -> str:
        return str(self.pod(name)["metadata"]["annotations"]["agentpool.io/role"])

    def engines_report_observed_roles(self) -> None:
        for name in PODS:
            self.serves(name, self.role(name))

    def patches(self) -> list[Any]:
        """The planner's desired-role patches."""
        return [
            r
            for r in self.kmock
            if r.method == "PATCH"
            and "/pods/" in r.url.path
            and "agentpool.io/role" in r.data["metadata"]["annotations"]
        ]

    def events(self) -> list[dict[str, Any]]:
        res = self.kmock.resource("v1", "events")
        return [dict(obj.raw) for (r, _, _), obj in self.kmock.objects.items() if r == res]

    def decisions(self, outcome: str) -> float:
        value = self.registry.get_sample_value("agentpool_planner_decisions_total", {"outcome": outcome})
        return 0.0 if value is None else value

    def route(self, start: float, end: float, workload: tuple[Work, float], rng: np.random.Generator) -> None:
        """The router's records for ``[start, end)``: 20 requests and 10 occupancy samples per minute."""
        work, q = workload
        requests, samples = [], []
        for t in np.arange(start, end, 3.0):
            f = 1.0 + 0.1 * rng.standard_normal(3)
            requests.append(
                RequestWorkRecord(
                    float(t), Work(t_uc=work.t_uc * f[0], t_c=work.t_c * f[1], t_out=work.t_out * f[2])
                )
            )
        for t in np.arange(start, end, 6.0):
            samples.append(OccupancySample(float(t), q * (1.0 + 0.1 * rng.standard_normal())))
        self.inbox.add_requests(requests)
        self.inbox.add_occupancy(samples)


@pytest_asyncio.fixture()
async def harness(kmock: Any) -> AsyncIterator[Harness]:
    for i, name in enumerate(PODS):
        role = "decode" if name == PINNED else ("prefill" if i == 0 else "both")
        kmock.objects[kmock.resource("v1", "pods"), NS, name] = pod_body(name, role, pinned=name == PINNED)
    served = ServedRoles()
    kmock.resources["v1/events"] = {}
    api = k8s.ApiClient(k8s.Configuration(host=str(kmock.url).rstrip("/")))
    inbox = PlannerInbox()
    registry = CollectorRegistry()
    evaluated = asyncio.Event()
    config = [PlannerConfig(window_s=600, slices=10, warmup_s=1800, cooldown_s=120, initial_prefill=2)]
    controller = PlannerController(
        pods=PodRoles(api, NS, "agentpool.io/pool=demo", served),
        inbox=inbox,
        config=lambda: config[0],
        pool=POOL,
        metrics=PlannerMetrics(registry),
        shape=SHAPE,
        on_evaluation=lambda _: evaluated.set(),
        kv_capacity=served,
    )
    h = Harness(kmock, controller, inbox, registry, config, evaluated, served)
    h.engines_report_observed_roles()
    yield h
    await asyncio.to_thread(api.close)


def warmup_records(
    inbox: PlannerInbox, start: float, seconds: float, rng: np.random.Generator, per_pod: int = 300
) -> None:
    for name in PODS:
        spacing = seconds / per_pod
        inbox.add_iterations(prefill_records(name, NODE, per_pod, 0.02, rng, start=start, spacing=spacing))
        inbox.add_iterations(decode_records(name, NODE, per_pod, 0.02, rng, start=start, spacing=spacing))


async def test_warmup_fit_initial_split_then_a_shift_patches_exactly_the_switched_pods(
    harness: Harness,
) -> None:
    h, rng = harness, np.random.default_rng(42)

    await h.controller.begin_warmup()
    assert [h.role(n) for n in PODS] == ["both"] * 8 + ["decode"]  # pinned pod untouched
    assert len(h.patches()) == 1  # only engine-0 was not colocated yet

    warmup_records(h.inbox, 0.0, 1800.0, rng)
    fits = await asyncio.to_thread(h.controller.fit, 0.0, 1800.0)
    assert sorted(fits) == PODS
    for f in fits.values():
        assert f.prefill.report.mape_held_out < 0.05 and f.decode.report.mape_held_out < 0.05
        assert f.prefill.model.c1 == pytest.approx(4e-5, rel=0.05)

    lists = [r for r in h.kmock if r.method == "GET" and r.url.path == f"/api/v1/namespaces/{NS}/pods"]
    assert lists and all(r.params.get("labelSelector") == "agentpool.io/pool=demo" for r in lists)
    prefill, _ = await h.controller.start_disaggregation()
    assert prefill == ("engine-0", "engine-1")
    assert [h.role(n) for n in PODS] == ["prefill"] * 2 + ["decode"] * 7
    assert [e["reason"] for e in h.events()] == ["PlannerStarted"]
    h.engines_report_observed_roles()

    # Window 1: Putnam-like work, for which 2P7D is best: hold, no write to any pod.
    patches_before = len(h.patches())
    h.route(1800, 2400, PUTNAM, rng)
    ev = await h.controller.evaluate_window(1800, 2400)
    assert ev is not None and ev.decision.outcome is Outcome.HOLD, ev.decision.reason
    assert len(h.patches()) == patches_before
    assert h.decisions("hold") == 1

    # Window 2: a sustained shift to OSWorld-like work: switch to 6P3D.
    h.route(2400, 3000, OSWORLD, rng)
    ev = await h.controller.evaluate_window(2400, 3000)
    assert ev is not None and ev.decision.outcome is Outcome.SWITCH, ev.decision.reason
    new_patches = h.patches()[patches_before:]
    switched = sorted(p.url.path.rsplit("/", 1)[-1] for p in new_patches)
    assert switched == sorted(ev.decision.to_prefill) and len(switched) == 4
    assert PINNED not in switched and not {"engine-0", "engine-1"} & set(switched)
    for p in new_patches:
        assert p.headers["Content-Type"].startswith("application/merge-patch+json")
        assert p.data == {"metadata": {"annotations": {"agentpool.io/role": "prefill"}}}
    roles = {n: h.role(n) for n in PODS}
    assert sorted(n for n, r in roles.items() if r == "prefill") == sorted(
        ["engine-0", "engine-1", *switched]
    )
    assert all(h.pod(n)["metadata"]["annotations"]["example.com/keep"] == "yes" for n in PODS)
    event = h.events()[-1]
    assert event["reason"] == "PhaseSplitChanged" and event["type"] == "Normal"
    assert (
        event["involvedObject"]["kind"] == "AgentServingPool" and event["involvedObject"]["uid"] == "pool-uid"
    )
    assert "2P7D -> 6P3D" in event["message"]
    record = h.controller.switches  # the exact count the operator shows (saved with the state)
    assert (record.total, record.last_from, record.last_to, record.last_at) == (1, "2P7D", "6P3D", 3000)
    assert record.last_reason is not None and record.last_reason in event["message"]
    assert h.registry.get_sample_value("agentpool_planner_prefill_nodes") == 6
    assert h.registry.get_sample_value("agentpool_planner_switched_nodes_total") == 4

    # Window 3: the switched engines have not reported their new role yet: they drain, no evaluation.
    h.route(3000, 3600, OSWORLD, rng)
    ev = await h.controller.evaluate_window(3000, 3600)
    assert ev is not None and ev.decision.outcome is Outcome.DRAINING
    assert len(h.patches()) == patches_before + 4

    # Window 4 ends 100 s after the switch: cooldown (window shortened by a config change).
    h.engines_report_observed_roles()
    ev = await h.controller.evaluate_window(3000, 3100)
    assert ev is not None and ev.decision.outcome is Outcome.COOLDOWN

    # Disabling the planner in the config applies at the next window, without a restart.
    h.config[0] = dataclasses.replace(h.config[0], enabled=False)
    requests_before, patches_before = len(list(h.kmock)), len(h.patches())
    served = h.pod("engine-7")["metadata"]["annotations"]["agentpool.io/observed-role"]
    h.serves("engine-7", "prefill" if served == "decode" else "decode")  # e.g. a user moved it
    assert await h.controller.evaluate_window(3600, 4200) is None
    # no decision, no desired role written; the pods are still listed so the served roles stay shown
    assert len(h.patches()) == patches_before
    new = [(r.method, r.url.path.rsplit("/", 1)[-1]) for r in list(h.kmock)[requests_before:]]
    assert new == [("GET", "pods"), ("PATCH", "engine-7")]
    assert h.pod("engine-7")["metadata"]["annotations"]["agentpool.io/observed-role"] != served


async def test_reported_kv_capacity_keeps_a_split_whose_decode_nodes_could_not_hold_the_contexts(
    harness: Harness,
) -> None:
    """Engines report 1M KV tokens each: OSWorld-like work keeps ~60 requests of ~92k tokens
    running (5.5M), which three decode nodes (6P3D, the best split without a KV limit) cannot hold."""
    h, rng = harness, np.random.default_rng(42)
    await h.controller.begin_warmup()
    warmup_records(h.inbox, 0.0, 1800.0, rng)
    await asyncio.to_thread(h.controller.fit, 0.0, 1800.0)
    await h.controller.start_disaggregation()
    for name in PODS:
        h.serves(name, h.role(name), kv_capacity_tokens=1_000_000)
    h.route(1800, 2400, OSWORLD, rng)
    ev = await h.controller.evaluate_window(1800, 2400)
    assert ev is not None
    assert len(ev.decision.decode) >= 6, ev.decision.reason  # from 2P7D, at most 3P6D
    six_p = [c for c in ev.decision.candidates if c.prefill_count == 6]
    assert six_p and all(c.kv_short_slices > 0 and not c.qualifies for c in six_p)


async def split_by_hand_and_evaluate(h: Harness, rng: np.random.Generator) -> Evaluation:
    """Move every pod out of colocation by hand (prefill for the first three), route a Putnam
    window and evaluate it."""
    h.engines_report_observed_roles()
    for name in PODS:
        key = (h.kmock.resource("v1", "pods"), NS, name)
        role = "prefill" if name in PODS[:3] else "decode"
        h.kmock.objects[key].patch({"metadata": {"annotations": {"agentpool.io/role": role}}})
        h.serves(name, role)
    h.route(200, 800, PUTNAM, rng)
    ev = await h.controller.evaluate_window(200, 800)
    assert ev is not None
    return ev


async def test_pods_short_of_warmup_records_get_the_pools_models_and_are_planned(harness: Harness) -> None:
    h, rng = harness, np.random.default_rng(1)
    for name in PODS[:-2]:
        h.inbox.add_iterations(prefill_records(name, NODE, 100, 0.02, rng, start=0, spacing=1))
        h.inbox.add_iterations(decode_records(name, NODE, 100, 0.02, rng, start=0, spacing=1))
    # engine-7 reported only prefill iterations in the warmup, engine-8 none at all (a loaded machine,
    # a late start): they get the models fitted on every node's records of the phases they lack
    h.inbox.add_iterations(prefill_records("engine-7", NODE, 100, 0.02, rng, start=0, spacing=1))
    fits = h.controller.fit_records(h.inbox.iterations(0, 100), PODS)
    assert sorted(fits) == PODS
    assert (fits["engine-7"].prefill_own, fits["engine-7"].decode_own) == (True, False)
    assert (fits["engine-8"].prefill_own, fits["engine-8"].decode_own) == (False, False)
    assert len(h.controller.fitted_records["engine-8"].decode) == 700  # the range its refit checks
    ev = await split_by_hand_and_evaluate(h, rng)
    assert ev.excluded == ()
    assert len(ev.decision.prefill) + len(ev.decision.decode) == 9


async def test_pods_without_a_fitted_model_are_left_out_and_reported(harness: Harness) -> None:
    h, rng = harness, np.random.default_rng(1)
    for name in PODS[:-2]:
        h.inbox.add_iterations(prefill_records(name, NODE, 100, 0.02, rng, start=0, spacing=1))
        h.inbox.add_iterations(decode_records(name, NODE, 100, 0.02, rng, start=0, spacing=1))
    # fitted on the records alone: pods that sent none (engine-7, engine-8) have no model
    assert sorted(h.controller.fit(0, 100)) == PODS[:-2]
    ev = await split_by_hand_and_evaluate(h, rng)
    assert ev.excluded == ("engine-7 (no fitted model)", "engine-8 (no fitted model)")
    assert len(ev.decision.prefill) + len(ev.decision.decode) == 7


async def test_run_loop_warms_up_fits_and_evaluates_windows(harness: Harness) -> None:
    h, rng = harness, np.random.default_rng(3)
    h.config[0] = PlannerConfig(window_s=0.4, slices=4, warmup_s=1.0, cooldown_s=0, initial_prefill=2)
    for name in PODS:  # engines report "decode" whatever they are told
        h.serves(name, "decode")

    async def engines_and_router_report() -> None:
        """Records stamped with the wall clock as they come, whenever the warmup and windows fall
        (a slow machine starts them later than a fast one)."""
        while True:
            now = time.time()
            warmup_records(h.inbox, now, 0.05, rng, per_pod=15)
            h.route(now, now + 0.05, OSWORLD, rng)  # one request and one occupancy sample
            await asyncio.sleep(0.05)

    feeding = asyncio.create_task(engines_and_router_report())
    stop = asyncio.Event()
    task = asyncio.create_task(h.controller.run(stop))
    evaluated = asyncio.create_task(h.evaluated.wait())
    done, _ = await asyncio.wait({task, evaluated}, timeout=30.0, return_when=asyncio.FIRST_COMPLETED)
    stop.set()
    feeding.cancel()
    assert evaluated in done, "no window evaluated within 10 s"
    await asyncio.wait_for(task, timeout=5.0)  # raises if the loop failed
    assert sorted(h.controller.fits) == PODS
    assert h.events()[0]["reason"] == "PlannerStarted"
    assert h.controller.last is not None
    # Engines 0 and 1 still report "decode" after the initial split made them prefill: draining.
    assert h.controller.last.decision.outcome is Outcome.DRAINING
    assert "engine-0, engine-1" in h.controller.last.decision.reason


async def test_a_failed_patch_still_starts_the_cooldown(harness: Harness) -> None:
    h, rng = harness, np.random.default_rng(5)
    warmup_records(h.inbox, 0.0, 1800.0, rng)
    h.controller.fit(0.0, 1800.0)
    await h.controller.start_disaggregation()
    h.engines_report_observed_roles()
    h.kmock["patch"] << 500 << {"kind": "Status", "code": 500, "message": "etcd is down"}
    h.route(1800, 2400, OSWORLD, rng)
    with pytest.raises(ApiException) as failed:
        await h.controller.evaluate_window(1800, 2400)
    assert failed.value.status == 500
    h.route(2400, 2460, OSWORLD, rng)
    h.engines_report_observed_roles()  # KMock stored the patch it answered 500 to: engines follow it
    ev = await h.controller.evaluate_window(2400, 2460)
    assert ev is not None and ev.decision.outcome is Outcome.COOLDOWN


class Published:
    """The routers (a ``ModelSink``): every model set the planner publishes."""

    def __init__(self) -> None:
        self.sets: list[tuple[dict[str, NodeModel], float]] = []

    async def publish(self, models: Mapping[str, NodeModel], fitted_at: float) -> None:
        self.sets.append((dict(models), fitted_at))


# The warmup sees short batches (up to 1K tokens at up to 8K cached); on full 8K chunks at long
# contexts the engines turn out slower per token than those batches showed.
SHORT = SyntheticWorkload(chunk_tokens=1024, max_requests=2, max_cached=8192)
LONG_CHUNKS = NodeModel(prefill=dataclasses.replace(NODE.prefill, c1=6e-5), decode=NODE.decode)


@pytest.mark.parametrize(
    "settings",
    [{}, {"refit": False}, {"refit_max_error": 0.9}],
    ids=["refit", "opted-out", "tolerant-threshold"],
)
async def test_a_window_beyond_the_warmups_range_refits_and_the_routers_get_the_new_models(
    harness: Harness, settings: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    """The refit and its thresholds as the planner's settings say (read at every window)."""
    h, rng = harness, np.random.default_rng(7)
    h.config[0] = dataclasses.replace(h.config[0], **settings)
    sink = Published()
    h.controller.models_out = sink
    for name in PODS:
        h.inbox.add_iterations(prefill_records(name, NODE, 300, 0.02, rng, SHORT, start=0, spacing=6))
        h.inbox.add_iterations(decode_records(name, NODE, 300, 0.02, rng, start=0, spacing=6))
    await asyncio.to_thread(h.controller.fit, 0.0, 1800.0)
    await h.controller.start_disaggregation()
    h.engines_report_observed_roles()
    warm = {n: f.prefill.model for n, f in h.controller.fits.items()}
    window = []
    for name in ("engine-0", "engine-1"):  # the prefill nodes run the new work
        window += prefill_records(name, LONG_CHUNKS, 100, 0.02, rng, start=1800, spacing=6)
    h.inbox.add_iterations(window)
    h.route(1800, 2400, PUTNAM, rng)

    def error(model: PrefillModel) -> float:
        return float(np.mean([abs(model.iteration_time(r.batch) - r.seconds) / r.seconds for r in window]))

    with caplog.at_level(logging.INFO, logger="agentpool.planner.controller"):
        ev = await h.controller.evaluate_window(1800, 2400)
    assert ev is not None
    published, _ = sink.sets[-1]
    assert all(error(warm[n]) > 0.15 for n in PODS)  # the warmup's fit underestimates the new work
    if settings:  # opted out, or mispredicted within the threshold: the warmup's models stay
        assert h.controller.refits == 0 and "refitted" not in caplog.text
        assert all(published[n].prefill == warm[n] for n in PODS)
        assert all(error(warm[n]) < 0.9 for n in PODS)
        return
    assert h.controller.refits == 1
    for n in PODS:  # every node, the decode nodes on the prefill nodes' records
        new = published[n].prefill
        # one Eq. 1 for two regimes that no single one fits: within the refit's 10%, half of before
        assert error(new) < min(0.10, error(warm[n]) / 2) and new.c1 > 5e-5, (n, new, error(new))
        assert h.controller.fits[n].prefill.model == new
        assert published[n].decode == h.controller.fits[n].decode.model  # no decode records: kept
        assert f"refitted {n}: prefill refitted (" in caplog.text
    assert "beyond the fitted range (uncached tokens, query-key pairs, restored tokens)" in caplog.text
    # the next window of the same work is in the new range: no second refit
    more = prefill_records("engine-0", LONG_CHUNKS, 100, 0.02, rng, start=2400, spacing=6)
    h.inbox.add_iterations(more)
    h.route(2400, 3000, PUTNAM, rng)
    await h.controller.evaluate_window(2400, 3000)
    assert h.controller.refits == 1


async def test_a_second_fit_keeps_the_models_in_use_for_decode_terms_its_records_cannot_tell(
    harness: Harness,
) -> None:
    """The models in use are the prior of the next fit: a warmup that decoded one or two requests at
    a time cannot tell Eq. 2's batch terms from its constant, and keeps the first fit's there."""
    h, rng = harness, np.random.default_rng(3)
    warmup_records(h.inbox, 0, 100, rng)
    first = h.controller.fit_records(h.inbox.iterations(0, 100), PODS)
    light = SyntheticWorkload(max_running=2)
    for name in PODS:
        h.inbox.add_iterations(prefill_records(name, NODE, 100, 0.02, rng, start=200, spacing=1))
        h.inbox.add_iterations(
            decode_records(name, NODE, 100, 0.02, rng, workload=light, start=200, spacing=1)
        )
    second = h.controller.fit_records(h.inbox.iterations(200, 300), PODS)
    for name in PODS:
        d, before = second[name].decode, first[name].decode.model
        assert d.report.terms_from_prior == 2, name
        assert (d.model.d1, d.model.d2) == (before.d1, before.d2)


@pytest.mark.parametrize("configured", [True, False], ids=["iteration-model", "none"])
async def test_a_first_warmup_at_light_load_keeps_the_configured_models_batch_terms(
    harness: Harness, configured: bool
) -> None:
    """`spec.model.iterationModel` is every node's prior at the first warmup: decoding one or two
    requests at a time tells Eq. 2's batch terms nothing, so they stay the configured ones (d0 is
    fitted); without it the fit has only its records to go by."""
    h, rng = harness, np.random.default_rng(5)
    given = IterationCoefficients(0.012, 4e-5, 2e-10, 1e-7, 0.009, 0.004, 2e-4)
    if configured:
        h.config[0] = dataclasses.replace(h.config[0], prior_model=given)
    light = SyntheticWorkload(max_running=2)
    for name in PODS:
        h.inbox.add_iterations(prefill_records(name, NODE, 100, 0.02, rng, start=0, spacing=1))
        h.inbox.add_iterations(decode_records(name, NODE, 100, 0.02, rng, workload=light, start=0, spacing=1))
    fits = h.controller.fit_records(h.inbox.iterations(0, 100), PODS)
    for name in PODS:
        d = fits[name].decode
        if configured:
            assert d.report.terms_from_prior == 2, name
            assert (d.model.d1, d.model.d2) == (given.d1, given.d2)
        else:
            assert d.report.terms_from_prior == 0, name
            assert (d.model.d1, d.model.d2) != (given.d1, given.d2)
