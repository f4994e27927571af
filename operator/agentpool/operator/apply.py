"""Idempotent apply: write a child only when the cluster's copy differs from what the pool needs.

`contains(existing, desired)` says whether every field the operator sets already has that value
(fields the server or other controllers added are ignored; quantities compare by value, so the
server's `3Gi` equals the builder's `3072Mi`). Only then is nothing written: a second reconcile of
an unchanged pool makes no write. Otherwise the child is created, or server-side applied with the
operator's field manager, which leaves other managers' fields (e.g. the planner's role
annotations on pods) alone.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from agentpool.operator.kube import KubeApi
from agentpool.operator.quantity import quantity_value

APPLIED_ANNOTATION = "agentpool.io/applied-digest"
"""On every child the operator applies: a digest of the object it wrote (without this annotation)."""


class Outcome(StrEnum):
    CREATED = "created"
    UPDATED = "updated"
    UNCHANGED = "unchanged"
    DELETED = "deleted"


def _same_scalar(existing: Any, desired: Any) -> bool:
    if existing == desired:
        return True
    if isinstance(desired, str) and isinstance(existing, str | int):
        try:
            return quantity_value(existing) == quantity_value(desired)
        except ValueError:
            return False
    return False


def contains(existing: Any, desired: Any) -> bool:
    """Whether `existing` holds every value of `desired` (maps: a superset; lists: same length,
    item by item; scalars: equal, quantities by value)."""
    if isinstance(desired, Mapping):
        return isinstance(existing, Mapping) and all(
            key in existing and contains(existing[key], value) for key, value in desired.items()
        )
    if isinstance(desired, list):
        return (
            isinstance(existing, list)
            and len(existing) == len(desired)
            and all(contains(e, d) for e, d in zip(existing, desired, strict=True))
        )
    return _same_scalar(existing, desired)


@dataclass
class ApplyReport:
    """What one reconcile did to the children."""

    outcomes: dict[str, Outcome] = field(default_factory=dict)

    @property
    def changed(self) -> list[str]:
        return [name for name, outcome in self.outcomes.items() if outcome is not Outcome.UNCHANGED]


def merge_patch_between(old: Any, new: Any) -> Any:
    """The JSON merge patch (RFC 7396) that turns `old` into `new`: keys `new` lacks become null
    at every depth (a field that became unknown must not keep its stale value), lists and scalars
    are replaced whole."""
    if not isinstance(old, Mapping) or not isinstance(new, Mapping):
        return new
    patch: dict[str, Any] = {k: None for k in old if k not in new}
    for key, value in new.items():
        patch[key] = merge_patch_between(old[key], value) if key in old else value
    return patch


def child_key(obj: Mapping[str, Any]) -> str:
    return f"{obj['kind']}/{obj['metadata']['name']}"


def with_applied_digest(desired: Mapping[str, Any]) -> dict[str, Any]:
    """`desired` with `APPLIED_ANNOTATION` set to a digest of the rest of it (keys sorted, so the
    builders' dict order does not matter)."""
    meta = dict(desired["metadata"])
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k != APPLIED_ANNOTATION}
    meta["annotations"] = annotations
    body = {**desired, "metadata": meta}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)
    meta["annotations"] = {
        **annotations,
        APPLIED_ANNOTATION: hashlib.sha256(canonical.encode()).hexdigest()[:16],
    }
    return body


async def apply_child(api: KubeApi, desired: Mapping[str, Any]) -> Outcome:
    """Create the child, leave it, or server-side apply it (see the module's docstring)."""
    desired = with_applied_digest(desired)
    meta = desired["metadata"]
    existing = await api.get(desired["kind"], meta["namespace"], meta["name"])
    if existing is None:
        await api.create(desired)
        return Outcome.CREATED
    if contains(existing, desired):
        return Outcome.UNCHANGED
    await api.apply(desired)
    return Outcome.UPDATED


async def delete_if_owned(api: KubeApi, kind: str, namespace: str, name: str, owner_uid: str) -> bool:
    """Delete a child the pool no longer needs, only if the pool owns it (never an object of the
    same name that someone else made); True if it was deleted."""
    existing = await api.get(kind, namespace, name)
    if existing is None:
        return False
    owners = existing.get("metadata", {}).get("ownerReferences") or []
    if not any(o.get("uid") == owner_uid for o in owners):
        return False
    return await api.delete(kind, namespace, name)


async def create_if_missing(api: KubeApi, desired: Mapping[str, Any]) -> Outcome:
    """For generated Secrets: made once, never rewritten (a restart rotates nothing)."""
    meta = desired["metadata"]
    if await api.get(desired["kind"], meta["namespace"], meta["name"]) is not None:
        return Outcome.UNCHANGED
    await api.create(desired)
    return Outcome.CREATED
