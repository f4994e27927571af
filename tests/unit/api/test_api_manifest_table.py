"""Good and bad AgentServingPool manifests against both validators: pydantic and the CRD.

Every bad manifest breaks one rule of a valid base manifest and must be rejected by BOTH validators,
each blaming the same field with the message a user would read. Where the rule is a CEL rule the
two messages are the same text (it is declared once, in `agentpool.api`); for structural rules
(types, enums, bounds, patterns) each validator words it its own way and the table lists both.
Every good manifest must be accepted by both, and the CRD's defaulting must produce the same object
as pydantic's defaults.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import pytest
from asp_validators import crd_errors, crd_status_errors, defaulted, load_example, pydantic_errors

from agentpool.api import AgentServingPool

DELETE = object()


def changed(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """A copy of `base` with dotted paths set (or removed with `DELETE`)."""
    out = copy.deepcopy(base)
    for dotted, value in changes.items():
        *parents, leaf = dotted.split(".")
        node = out
        for key in parents:
            node = node.setdefault(key, {})
        if value is DELETE:
            del node[leaf]
        else:
            node[leaf] = value
    return out


SIM = load_example("pool-sim.yaml")
SGLANG = load_example("pool-sglang.yaml")
COLOCATED = load_example("pool-sim-colocated.yaml")
MINIMAL: dict[str, Any] = {
    "apiVersion": "agentpool.io/v1alpha1",
    "kind": "AgentServingPool",
    "metadata": {"name": "minimal"},
    "spec": {
        "model": {"name": "Qwen/Qwen3-Coder-30B-A3B-Instruct"},
        "engine": {"backend": "sim", "image": "ghcr.io/agentpool/engine:0.1.0", "hostKvSize": "1Gi"},
        "nodes": 2,
        "initialSplit": {"prefill": 1},
        "slo": {"ttft": {"base": "2s"}, "tpot": "50ms"},
    },
}


@dataclass(frozen=True)
class Bad:
    name: str
    manifest: dict[str, Any]
    field: str
    """The field both validators must blame."""
    pydantic: str
    """Text in pydantic's error."""
    crd: str
    """Text in the CRD's error (kube-apiserver schema or CEL)."""
    status_write: bool = False
    """A status-only error: kube-apiserver sees it only on a write to `/status` (a create or
    update drops `.status`); pydantic, reading the whole object, rejects it either way."""


def cel(name: str, manifest: dict[str, Any], field: str, message: str) -> Bad:
    """A case caught by a cross-field rule: both validators report `message` itself."""
    return Bad(name, manifest, field, message, message)


GPU_OVERLAP = "set GPUs with spec.engine.gpusPerNode, not as nvidia.com/gpu in resources"
POSITIVE = "must be a positive duration such as 250ms, 2s, 10m or 1h30m, at most 8760h"
DURATION = "must be a duration such as 0s, 250ms, 2s, 10m or 1h30m, at most 8760h"
AT_MOST = "spec.initialSplit.prefill must be at most spec.nodes - spec.planner.minNodes.decode"
AT_LEAST = "spec.initialSplit.prefill must be at least spec.planner.minNodes.prefill"

BAD = [
    # ---- cross-field (CEL) rules
    cel(
        "disaggregated pool without initialSplit",
        changed(SIM, {"spec.initialSplit": DELETE}),
        "spec.initialSplit",
        "a disaggregated pool needs spec.initialSplit.prefill (nodes that start as prefill)",
    ),
    cel(
        "colocated pool with an initialSplit",
        changed(SIM, {"spec.mode": "colocated", "spec.planner.enabled": False}),
        "spec.initialSplit",
        "a colocated pool has no prefill/decode split: remove spec.initialSplit",
    ),
    cel(
        "colocated pool with the planner on (its default)",
        changed(SIM, {"spec.mode": "colocated", "spec.initialSplit": DELETE}),
        "spec.planner.enabled",
        "a colocated pool has no split to plan: set spec.planner.enabled to false",
    ),
    cel(
        "initial prefill below the planner's minimum",
        changed(SGLANG, {"spec.initialSplit.prefill": 1}),
        "spec.initialSplit.prefill",
        AT_LEAST,
    ),
    cel(
        "initial prefill of zero",
        changed(SIM, {"spec.initialSplit.prefill": 0}),
        "spec.initialSplit.prefill",
        AT_LEAST,
    ),
    cel(
        "initial prefill leaves too few decode nodes",
        changed(SGLANG, {"spec.initialSplit.prefill": 8}),
        "spec.initialSplit.prefill",
        AT_MOST,
    ),
    cel(
        "initial prefill takes every node",
        changed(SIM, {"spec.initialSplit.prefill": 6}),
        "spec.initialSplit.prefill",
        AT_MOST,
    ),
    cel(
        "fewer nodes than the planner's minima",
        changed(SGLANG, {"spec.nodes": 3, "spec.initialSplit.prefill": 2}),
        "spec.nodes",
        "spec.nodes must be at least spec.planner.minNodes.prefill + spec.planner.minNodes.decode",
    ),
    cel(
        "sglang without GPUs",
        changed(SGLANG, {"spec.engine.gpusPerNode": DELETE}),
        "spec.engine.gpusPerNode",
        "the sglang backend needs spec.engine.gpusPerNode of at least 1",
    ),
    cel(
        "sim with GPUs",
        changed(SIM, {"spec.engine.gpusPerNode": 4}),
        "spec.engine.gpusPerNode",
        "the sim backend uses no GPUs: set spec.engine.gpusPerNode to 0",
    ),
    cel(
        "GPUs in resource limits",
        changed(
            SGLANG, {"spec.engine.scheduling.resources.limits": {"memory": "900Gi", "nvidia.com/gpu": 4}}
        ),
        "spec.engine.scheduling.resources",
        GPU_OVERLAP,
    ),
    cel(
        "GPUs in resource requests",
        changed(SIM, {"spec.engine.scheduling.resources.requests": {"nvidia.com/gpu": "1"}}),
        "spec.engine.scheduling.resources",
        GPU_OVERLAP,
    ),
    cel(
        "both a Redis URL and a managed Redis",
        changed(SIM, {"spec.redis": {"existing": {"secretName": "redis"}, "managed": {}}}),
        "spec.redis",
        "set exactly one of spec.redis.managed and spec.redis.existing",
    ),
    cel(
        "neither a Redis URL nor a managed Redis",
        changed(SIM, {"spec.redis": {}}),
        "spec.redis",
        "set exactly one of spec.redis.managed and spec.redis.existing",
    ),
    cel(
        "smetric knobs under another policy",
        changed(SIM, {"spec.router.smetric": {"slack": 1.2}}),
        "spec.router.smetric",
        "spec.router.smetric configures the smetric policy, but spec.router.policy is not smetric",
    ),
    cel(
        "cache-aware knobs under smetric",
        changed(SIM, {"spec.router.policy": "smetric", "spec.router.cacheAware": {"cacheThreshold": 0.5}}),
        "spec.router.cacheAware",
        "spec.router.cacheAware configures the cache-aware policy, but spec.router.policy is not cache-aware",
    ),
    cel(
        "more active experts than experts",
        changed(SGLANG, {"spec.model.experts.active": 256}),
        "spec.model.experts.active",
        "experts.active cannot exceed experts.total",
    ),
    cel(
        "toleration Exists with a value",
        changed(
            SGLANG,
            {"spec.engine.scheduling.tolerations": [{"key": "gpu", "operator": "Exists", "value": "yes"}]},
        ),
        "spec.engine.scheduling.tolerations[0].value",
        "a toleration with operator Exists cannot have a value",
    ),
    # ---- durations (CEL, so both validators say the same)
    cel("zero TPOT budget", changed(SIM, {"spec.slo.tpot": "0ms"}), "spec.slo.tpot", POSITIVE),
    cel("zero TTFT base budget", changed(SIM, {"spec.slo.ttft.base": "0s"}), "spec.slo.ttft.base", POSITIVE),
    cel("negative TTFT base", changed(SIM, {"spec.slo.ttft.base": "-2s"}), "spec.slo.ttft.base", POSITIVE),
    cel(
        "duration written out in words",
        changed(SGLANG, {"spec.planner.window": "10 minutes"}),
        "spec.planner.window",
        POSITIVE,
    ),
    cel(
        "duration without a unit",
        changed(SIM, {"spec.planner.cooldown": "120"}),
        "spec.planner.cooldown",
        DURATION,
    ),
    cel(
        "duration in microseconds",
        changed(SIM, {"spec.router.fetch.perKiloToken": "1000us"}),
        "spec.router.fetch.perKiloToken",
        DURATION,
    ),
    # ---- structural rules (types, enums, bounds, patterns, required, unknown fields)
    Bad(
        "unknown router policy",
        changed(SIM, {"spec.router.policy": "fastest"}),
        "spec.router.policy",
        "Input should be 'evolving', 'smetric', 'round-robin', 'least-loaded', 'cache-aware', 'dynamo', "
        "'lmetric', 'linear' or 'session-id'",
        "'fastest' is not one of ['evolving', 'smetric'",
    ),
    Bad(
        "unknown backend",
        changed(SIM, {"spec.engine.backend": "vllm"}),
        "spec.engine.backend",
        "Input should be 'sglang' or 'sim'",
        "'vllm' is not one of ['sglang', 'sim']",
    ),
    Bad(
        "unknown pool mode",
        changed(SIM, {"spec.mode": "hybrid"}),
        "spec.mode",
        "Input should be 'disaggregated' or 'colocated'",
        "'hybrid' is not one of",
    ),
    Bad(
        "zero nodes",
        changed(SIM, {"spec.nodes": 0}),
        "spec.nodes",
        "Input should be greater than or equal to 1",
        "0 is less than the minimum of 1",
    ),
    Bad(
        "nodes as a word",
        changed(SIM, {"spec.nodes": "six"}),
        "spec.nodes",
        "Input should be a valid integer",
        "'six' is not of type 'integer'",
    ),
    Bad(
        "negative GPUs",
        changed(SGLANG, {"spec.engine.gpusPerNode": -1}),
        "spec.engine.gpusPerNode",
        "Input should be greater than or equal to 0",
        "-1 is less than the minimum of 0",
    ),
    Bad(
        "one slice per window",
        changed(SIM, {"spec.planner.slices": 1}),
        "spec.planner.slices",
        "Input should be greater than or equal to 2",
        "1 is less than the minimum of 2",
    ),
    Bad(
        "refit range margin below 1",
        changed(SIM, {"spec.planner.refit": {"margin": 0.5}}),
        "spec.planner.refit.margin",
        "Input should be greater than or equal to 1",
        "0.5 is less than the minimum of 1",
    ),
    Bad(
        "refit on in the old boolean form",
        changed(SIM, {"spec.planner.refit": True}),
        "spec.planner.refit",
        "Input should be a valid dictionary or instance of RefitSpec",
        "is not of type 'object'",
    ),
    cel(
        "refit fits on fewer records than twice those it needs",
        changed(SIM, {"spec.planner.refit": {"minRecords": 100, "maxRecords": 150}}),
        "spec.planner.refit.maxRecords",
        "refit.maxRecords must be at least 2 x refit.minRecords",
    ),
    Bad(
        "smetric hit ratio above 1",
        changed(SIM, {"spec.router.policy": "smetric", "spec.router.smetric": {"hitRatio": 1.5}}),
        "spec.router.smetric.hitRatio",
        "Input should be less than or equal to 1",
        "1.5 is greater than the maximum of 1",
    ),
    Bad(
        "zero smetric slack",
        changed(SIM, {"spec.router.policy": "smetric", "spec.router.smetric": {"slack": 0}}),
        "spec.router.smetric.slack",
        "Input should be greater than 0",
        "0 is less than or equal to the minimum of 0",
    ),
    Bad(
        "host KV size in words",
        changed(SIM, {"spec.engine.hostKvSize": "lots"}),
        "spec.engine.hostKvSize",
        "must be a byte quantity such as 512Mi, 64Gi or 500G, or an integer of bytes",
        "'lots' does not match",
    ),
    Bad(
        "negative host KV size",
        changed(SIM, {"spec.engine.hostKvSize": -1}),
        "spec.engine.hostKvSize",
        "must be a byte quantity",
        "-1 is less than the minimum of 0",
    ),
    Bad(
        "resource quantity in words",
        changed(SIM, {"spec.engine.scheduling.resources.requests": {"cpu": "many"}}),
        "spec.engine.scheduling.resources.requests.cpu",
        "must be a Kubernetes quantity",
        "'many' does not match",
    ),
    Bad(
        "negative CPU request as a string",
        changed(SIM, {"spec.engine.scheduling.resources.requests": {"cpu": "-1"}}),
        "spec.engine.scheduling.resources.requests.cpu",
        "must be a Kubernetes quantity",
        "'-1' does not match",
    ),
    Bad(
        "negative memory limit as a string",
        changed(SIM, {"spec.engine.scheduling.resources.limits": {"memory": "-4Gi"}}),
        "spec.engine.scheduling.resources.limits.memory",
        "must be a Kubernetes quantity",
        "'-4Gi' does not match",
    ),
    Bad(
        "negative CPU request as an integer",
        changed(SIM, {"spec.engine.scheduling.resources.requests": {"cpu": -1}}),
        "spec.engine.scheduling.resources.requests.cpu",
        "must be a Kubernetes quantity",
        "-1 is less than the minimum of 0",
    ),
    cel(
        "warmup past int64 nanoseconds",
        changed(SIM, {"spec.planner.warmup": "999999999999h"}),
        "spec.planner.warmup",
        DURATION,
    ),
    cel(
        "warmup just past Go's largest duration",
        changed(SIM, {"spec.planner.warmup": "2562048h"}),
        "spec.planner.warmup",
        DURATION,
    ),
    cel(
        "cooldown longer than a year",
        changed(SIM, {"spec.planner.cooldown": "8761h"}),
        "spec.planner.cooldown",
        DURATION,
    ),
    cel(
        "window past int64 nanoseconds",
        changed(SIM, {"spec.planner.window": "999999999999h"}),
        "spec.planner.window",
        POSITIVE,
    ),
    Bad(
        "a Redis URL in the pool itself",
        changed(SIM, {"spec.redis": {"url": "redis://:secret@redis:6379"}}),
        "spec.redis.url",
        "Extra inputs are not permitted",
        'unknown field "spec.redis.url"',
    ),
    Bad(
        "Redis Secret name that is not a Kubernetes name",
        changed(SIM, {"spec.redis": {"existing": {"secretName": "My Redis"}}}),
        "spec.redis.existing.secretName",
        "String should match pattern",
        "'My Redis' does not match",
    ),
    Bad(
        "report token without a key",
        changed(SIM, {"spec.auth": {"reportToken": {"name": "tokens"}}}),
        "spec.auth.reportToken.key",
        "Field required",
        "'key' is a required property",
    ),
    Bad(
        "network policy switch that is not a boolean",
        changed(SIM, {"spec.network": {"policy": "sometimes"}}),
        "spec.network.policy",
        "Input should be a valid boolean",
        "'sometimes' is not of type 'boolean'",
    ),
    Bad(
        "more than 32 metrics sources",
        changed(SIM, {"spec.network": {"metricsFrom": [{"podSelector": {}}] * 33}}),
        "spec.network.metricsFrom",
        "List should have at most 32 items",
        "is too long",
    ),
    Bad(
        "a metrics source that is not an object",
        changed(SIM, {"spec.network": {"metricsFrom": ["prometheus"]}}),
        "spec.network.metricsFrom.0",
        "Input should be a valid dictionary",
        "'prometheus' is not of type 'object'",
    ),
    Bad(
        "unknown eviction policy",
        changed(SIM, {"spec.kvPool.evictionPolicy": "fifo"}),
        "spec.kvPool.evictionPolicy",
        "Input should be 'branch-count' or 'lru'",
        "'fifo' is not one of",
    ),
    Bad(
        "unknown toleration effect",
        changed(SGLANG, {"spec.engine.scheduling.tolerations": [{"key": "gpu", "effect": "Sometimes"}]}),
        "spec.engine.scheduling.tolerations.0.effect",
        "Input should be 'NoSchedule'",
        "'Sometimes' is not one of",
    ),
    Bad(
        "empty image",
        changed(SIM, {"spec.engine.image": ""}),
        "spec.engine.image",
        "String should have at least 1 character",
        "'' should be non-empty",
    ),
    Bad(
        "args as one string",
        changed(SGLANG, {"spec.engine.args": "--tp-size 4"}),
        "spec.engine.args",
        "Input should be a valid list",
        "'--tp-size 4' is not of type 'array'",
    ),
    Bad(
        "model without a name",
        changed(SIM, {"spec.model": {"servedName": "coder"}}),
        "spec.model.name",
        "Field required",
        "'name' is a required property",
    ),
    Bad(
        "no SLO",
        changed(SIM, {"spec.slo": DELETE}),
        "spec.slo",
        "Field required",
        "'slo' is a required property",
    ),
    Bad(
        "nodes as a numeric string",
        changed(SIM, {"spec.nodes": "6"}),
        "spec.nodes",
        "Input should be a valid integer",
        "'6' is not of type 'integer'",
    ),
    Bad(
        "fractional nodes",
        changed(SIM, {"spec.nodes": 6.5}),
        "spec.nodes",
        "Input should be a valid integer",
        "6.5 is not of type 'integer'",
    ),
    Bad(
        "planner switch as a string",
        changed(SIM, {"spec.planner.enabled": "yes"}),
        "spec.planner.enabled",
        "Input should be a valid boolean",
        "'yes' is not of type 'boolean'",
    ),
    Bad(
        "required field set to null",
        changed(SIM, {"spec.slo.tpot": None}),
        "spec.slo.tpot",
        "Field required",
        "'tpot' is a required property",
    ),
    Bad(
        "two Ready conditions",
        changed(
            SIM,
            {
                "status": {
                    "conditions": [
                        {"type": "Ready", "status": "True", "reason": "AllNodesServing"},
                        {"type": "Ready", "status": "False", "reason": "NodesStarting"},
                    ]
                }
            },
        ),
        "status.conditions[1]",
        "duplicate condition type: Ready",
        "Duplicate value: {'type': 'Ready'}",
        status_write=True,
    ),
    Bad(
        "a node listed twice",
        changed(
            SIM,
            {
                "status": {
                    "nodes": [
                        {"name": "sim-engine-0", "desiredRole": "prefill"},
                        {"name": "sim-engine-0", "desiredRole": "decode"},
                    ]
                }
            },
        ),
        "status.nodes[1]",
        "duplicate node name: sim-engine-0",
        "Duplicate value: {'name': 'sim-engine-0'}",
        status_write=True,
    ),
    Bad(
        "condition reason with spaces",
        changed(SIM, {"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "all good"}]}}),
        "status.conditions[0].reason",
        "String should match pattern",
        "'all good' does not match",
        status_write=True,
    ),
    Bad(
        "misspelled field",
        changed(SIM, {"spec.engine.gpus": 0}),
        "spec.engine.gpus",
        "Extra inputs are not permitted",
        'unknown field "spec.engine.gpus"',
    ),
    Bad(
        "planner field at the wrong level",
        changed(SIM, {"spec.window": "10m"}),
        "spec.window",
        "Extra inputs are not permitted",
        'unknown field "spec.window"',
    ),
]


def _normal(path: str) -> str:
    return path.replace("[", ".").replace("]", "")


def blames(error: str, field: str, text: str) -> bool:
    """Whether `error` says `text` about `field`: at the field itself, at an enclosing object (where
    object-level rules and `required` report), or naming it (unknown fields)."""
    if text not in error:
        return False
    path, wanted = _normal(error.split(": ", 1)[0]), _normal(field)
    return path == wanted or wanted.startswith(path + ".") or f'"{field}"' in error


def test_the_table_is_big_enough() -> None:
    assert len(BAD) >= 15
    assert len({case.name for case in BAD}) == len(BAD)


@pytest.mark.parametrize("case", BAD, ids=lambda c: c.name)
def test_pydantic_rejects(case: Bad) -> None:
    errors = pydantic_errors(case.manifest)
    assert errors, "pydantic accepted a bad manifest"
    assert any(blames(err, case.field, case.pydantic) for err in errors), errors


@pytest.mark.parametrize("case", BAD, ids=lambda c: c.name)
def test_crd_rejects(case: Bad) -> None:
    errors = (crd_status_errors if case.status_write else crd_errors)(case.manifest)
    assert errors, "the CRD accepted a bad manifest"
    assert any(blames(err, case.field, case.crd) for err in errors), errors


GOOD = {
    "pool-sglang.yaml": SGLANG,
    "pool-sim.yaml": SIM,
    "pool-sim-colocated.yaml": COLOCATED,
    "minimal": MINIMAL,
    "colocated": changed(
        MINIMAL, {"spec.mode": "colocated", "spec.initialSplit": DELETE, "spec.planner": {"enabled": False}}
    ),
    "smetric with knobs": changed(
        SIM, {"spec.router": {"policy": "smetric", "smetric": {"slack": 1.5, "hitRatio": 0.5}}}
    ),
    "cache-aware with knobs": changed(
        SIM,
        {
            "spec.router": {
                "policy": "cache-aware",
                "cacheAware": {"cacheThreshold": 0.5, "balanceAbs": 32, "balanceRel": 1.2},
            }
        },
    ),
    "dynamo with knobs": changed(SIM, {"spec.router": {"policy": "dynamo", "dynamo": {"hostCredit": 0.5}}}),
    "linear with knobs": changed(SIM, {"spec.router": {"policy": "linear", "linear": {"lambda": 0.25}}}),
    "baseline policies without knobs": changed(SIM, {"spec.router.policy": "lmetric"}),
    "existing Redis": changed(
        SIM, {"spec.redis": {"existing": {"secretName": "redis-cache", "passwordKey": "password"}}}
    ),
    "existing tokens": changed(
        SIM,
        {
            "spec.auth": {
                "reportToken": {"name": "engine-tokens", "key": "report"},
                "directoryToken": {"name": "dir.tokens", "key": "token"},
            }
        },
    ),
    "network policies off": changed(SIM, {"spec.network": {"policy": False}}),
    "metrics from a monitoring namespace": changed(
        SIM,
        {"spec.network.metricsFrom": [{"namespaceSelector": {"matchLabels": {"team": "monitoring"}}}]},
    ),
    "metrics from nobody outside the pool": changed(SIM, {"spec.network.metricsFrom": []}),
    "host KV size in bytes": changed(SIM, {"spec.engine.hostKvSize": 1073741824}),
    "zero host KV": changed(SIM, {"spec.engine.hostKvSize": "0"}),
    "a 400 ns TPOT": changed(SIM, {"spec.slo.tpot": "0.0004ms"}),
    "the longest warmup": changed(SIM, {"spec.planner.warmup": "8760h"}),
    "whole-valued float node count": changed(SIM, {"spec.nodes": 6.0}),
    "tiny positive quantity with an exponent": changed(
        SIM, {"spec.engine.scheduling.resources.requests": {"cpu": "1e-3", "memory": "2.0"}}
    ),
    "compound and fractional durations": changed(
        SIM, {"spec.planner.window": "1h30m", "spec.slo.tpot": "12.5ms", "spec.planner.cooldown": "0s"}
    ),
    "planner disabled, split at the minimum": changed(
        SGLANG, {"spec.planner.enabled": False, "spec.initialSplit.prefill": 2}
    ),
    "split at the maximum": changed(SGLANG, {"spec.initialSplit.prefill": 7}),
    "refit off": changed(SIM, {"spec.planner.refit": {"enabled": False}}),
    "refit thresholds at their bounds": changed(
        SIM,
        {
            "spec.planner.refit": {
                "margin": 1,
                "minRecords": 500,
                "minShare": 1.0,
                "maxError": 0,
                "maxRecords": 1000,
            }
        },
    ),
    "dense model on one GPU": changed(
        SGLANG, {"spec.model": {"name": "/models/dense-8b"}, "spec.engine.gpusPerNode": 1}
    ),
    "toleration Exists without key": changed(
        SGLANG, {"spec.engine.scheduling.tolerations": [{"operator": "Exists"}]}
    ),
    "affinity passed through": changed(
        SGLANG,
        {
            "spec.engine.scheduling.affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
                        ]
                    }
                }
            }
        },
    ),
    "nulls count as absent": changed(
        MINIMAL, {"spec.planner": None, "spec.router": {"policy": None, "smetric": None}, "spec.redis": None}
    ),
    "with a status": changed(
        SIM,
        {
            "status": {
                "observedGeneration": 3,
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "AllNodesServing",
                        "lastTransitionTime": "2026-01-01T00:00:00Z",
                    }
                ],
                "split": {"prefill": 3, "decode": 3, "label": "3P3D"},
                "nodes": [{"name": "sim-engine-0", "desiredRole": "prefill", "observedRole": "decode"}],
                "switches": {"total": 1, "lastFrom": "4P2D", "lastTo": "3P3D"},
                "modelFit": {
                    "state": "Fitted",
                    "records": 1200,
                    "prefill": {"c0": 0.01, "c1": 1e-5, "c2": 1e-9, "c3": 1e-6},
                    "decode": {"d0": 0.005, "d1": 0.01, "d2": 1e-4},
                },
            }
        },
    ),
}


@pytest.mark.parametrize("case", [c for c in BAD if c.status_write], ids=lambda c: c.name)
def test_a_create_drops_the_status(case: Bad) -> None:
    """kube-apiserver ignores `.status` on a create or update: only `/status` can be rejected for it."""
    assert crd_errors(case.manifest) == []


@pytest.mark.parametrize("manifest", GOOD.values(), ids=list(GOOD))
def test_good_manifests_pass_both(manifest: dict[str, Any]) -> None:
    assert pydantic_errors(manifest) == []
    assert crd_errors(manifest) == []


@pytest.mark.parametrize("manifest", GOOD.values(), ids=list(GOOD))
def test_crd_defaults_equal_pydantic_defaults(manifest: dict[str, Any]) -> None:
    """What kube-apiserver stores after defaulting is what the operator reads back with pydantic."""
    stored = defaulted(manifest)
    parsed = AgentServingPool.model_validate(manifest)
    assert stored["spec"] == parsed.spec.to_wire()
    assert AgentServingPool.model_validate(stored) == parsed
