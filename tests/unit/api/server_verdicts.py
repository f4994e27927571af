"""Verdicts of a real kube-apiserver (>= 1.28, CEL on) on manifests where an emulation can go wrong.

Each row says what the server answers when the manifest is created through the resource's main
endpoint (`write="create"`; the status subresource drops `.status` there) or when its status is
written through `/status` (`write="status"`, after a create of the same object without status).
`test_api_server_verdicts.py` checks the emulation (`asp_validators`) against the table in every
run and replays the table against a real server when `AGENTPOOL_TEST_KUBECONFIG` names one.

Sources of the verdicts: kube-apiserver v1.24 with CEL validation on, as reported in issue 14
(the five cases where the emulation disagreed, the accepted negative quantities and the absurd
warmup), and the semantics of Go's `time.ParseDuration` for the duration bounds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from asp_validators import load_example

SIM = load_example("pool-sim.yaml")
SGLANG = load_example("pool-sglang.yaml")


@dataclass(frozen=True)
class Verdict:
    name: str
    manifest: dict[str, Any]
    accepted: bool
    write: Literal["create", "status"] = "create"
    pydantic_accepts: bool | None = None
    """pydantic's verdict where it differs by design (it validates the status on every read)."""

    @property
    def expected_from_pydantic(self) -> bool:
        return self.accepted if self.pydantic_accepts is None else self.pydantic_accepts


def with_spec(**changes: Any) -> dict[str, Any]:
    spec = {**SIM["spec"], **changes}
    return {**SIM, "spec": spec}


def with_engine_resources(resources: dict[str, Any]) -> dict[str, Any]:
    engine = {**SIM["spec"]["engine"], "scheduling": {"resources": resources}}
    return with_spec(engine=engine)


def with_status(status: dict[str, Any]) -> dict[str, Any]:
    return {**SIM, "status": status}


def planner(**fields: str) -> dict[str, Any]:
    return with_spec(planner={**SIM["spec"].get("planner", {}), **fields})


def slo_tpot(tpot: str) -> dict[str, Any]:
    return with_spec(slo={**SIM["spec"]["slo"], "tpot": tpot})


TWO_READY = {
    "conditions": [
        {"type": "Ready", "status": "True", "reason": "AllNodesServing"},
        {"type": "Ready", "status": "False", "reason": "NodesStarting"},
    ]
}
NODE_TWICE = {
    "nodes": [
        {"name": "sim-engine-0", "desiredRole": "prefill"},
        {"name": "sim-engine-0", "desiredRole": "decode"},
    ]
}
REASON_WITH_SPACES = {"conditions": [{"type": "Ready", "status": "True", "reason": "all good"}]}
GOOD_STATUS = {
    "observedGeneration": 1,
    "conditions": [{"type": "Ready", "status": "True", "reason": "AllNodesServing"}],
    "split": {"prefill": 3, "decode": 3, "label": "3P3D"},
}

VERDICTS: tuple[Verdict, ...] = (
    Verdict("the sim example", SIM, accepted=True),
    Verdict("the sglang example", SGLANG, accepted=True),
    # -- the status subresource drops .status on create: status-only errors are not seen there
    Verdict("two Ready conditions on create", with_status(TWO_READY), True, pydantic_accepts=False),
    Verdict("a node listed twice on create", with_status(NODE_TWICE), True, pydantic_accepts=False),
    Verdict("reason with spaces on create", with_status(REASON_WITH_SPACES), True, pydantic_accepts=False),
    # -- ... but a write to /status validates it
    Verdict("two Ready conditions on /status", with_status(TWO_READY), False, "status"),
    Verdict("a node listed twice on /status", with_status(NODE_TWICE), False, "status"),
    Verdict("reason with spaces on /status", with_status(REASON_WITH_SPACES), False, "status"),
    Verdict("a good status on /status", with_status(GOOD_STATUS), True, "status"),
    # -- durations in int64 nanoseconds, as Go parses them
    Verdict("a 400 ns TPOT", slo_tpot("0.0004ms"), accepted=True),
    Verdict("a TPOT below a nanosecond (0 ns)", slo_tpot("0.0000001ms"), accepted=False),
    Verdict("Go's largest duration exceeded", planner(warmup="2562048h"), accepted=False),
    Verdict("a warmup overflowing int64 nanoseconds", planner(warmup="999999999999h"), accepted=False),
    Verdict("a window overflowing int64 nanoseconds", planner(window="999999999999h"), accepted=False),
    Verdict("a warmup of a year", planner(warmup="8760h"), accepted=True),
    Verdict("a cooldown past a year", planner(cooldown="8761h"), accepted=False),
    # -- JSON numbers: a whole-valued float is an integer
    Verdict("nodes: 6.0", with_spec(nodes=6.0), accepted=True),
    Verdict("nodes: 6.5", with_spec(nodes=6.5), accepted=False),
    # -- quantities have no sign
    Verdict("requests.cpu: '-1'", with_engine_resources({"requests": {"cpu": "-1"}}), accepted=False),
    Verdict("limits.memory: '-4Gi'", with_engine_resources({"limits": {"memory": "-4Gi"}}), False),
    Verdict("requests.cpu: -1", with_engine_resources({"requests": {"cpu": -1}}), accepted=False),
    Verdict("requests.cpu: 500m", with_engine_resources({"requests": {"cpu": "500m"}}), accepted=True),
)
