"""Wire formats of scalar spec values: durations and byte quantities, with their parsers.

Durations are strings of one or more `<number><unit>` parts with units `h`, `m`, `s` and
`ms` (`600s`, `10m`, `1h30m`, `0.45ms`): a subset of Go's `time.ParseDuration` and
therefore of Kubernetes CEL's `duration()`, so the CRD can compare them in validation rules.
Integers of seconds are not accepted: a bare number would hide its unit. Every duration is at
most :data:`MAX_DURATION` (`8760h`, a year): kube-apiserver's CEL parses durations into int64
nanoseconds (Go's `time.ParseDuration`), so a longer one would overflow there (`2562048h`) or be
absurd. Validation counts in nanoseconds the way Go does (:func:`duration_nanoseconds`), so a
`400ns` budget written `0.0004ms` is positive here as it is on the server.

Byte quantities (`hostKvSize`) follow Kubernetes resource quantities without sign or milli
units: an integer of bytes or a string such as `64Gi`, `500M` or `1.5Ti`. Resource quantities
(`requests`, `limits`) follow Kubernetes' quantity syntax without a sign: a negative request is an
error, also when written as a string (`"-1"`, `"-4Gi"`).
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Annotated, Any

from pydantic import AfterValidator, Field, WithJsonSchema

DURATION_PATTERN = r"^([0-9]+([.][0-9]+)?(ms|h|m|s))+$"
DURATION_MAX_LENGTH = 32
_DURATION_PART = re.compile(r"([0-9]+(?:[.][0-9]+)?)(ms|h|m|s)")
_UNIT_SECONDS = {"h": Decimal(3600), "m": Decimal(60), "s": Decimal(1), "ms": Decimal("0.001")}

BYTES_PATTERN = r"^[0-9]+([.][0-9]+)?([KMGTPE]i|[kMGTPE])?$"
_BYTES_PARTS = re.compile(r"^([0-9]+(?:[.][0-9]+)?)([KMGTPE]i|[kMGTPE])?$")
_BYTE_UNITS = {
    "": 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}

# Kubernetes' own resource.Quantity pattern without its leading sign (requests and limits may use
# milli units, e.g. `500m`; a negative exponent is a small positive number).
QUANTITY_PATTERN = (
    r"^(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|"
    r"([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)

MAX_DURATION = "8760h"
_NS = {"h": 3_600_000_000_000, "m": 60_000_000_000, "s": 1_000_000_000, "ms": 1_000_000}
_MAX_INT64 = 2**63 - 1
MAX_DURATION_NS = 8760 * _NS["h"]
DURATION_MESSAGE = f"must be a duration such as 0s, 250ms, 2s, 10m or 1h30m, at most {MAX_DURATION}"
DURATION_RULE = f"self.matches('{DURATION_PATTERN}') && duration(self) <= duration('{MAX_DURATION}')"
POSITIVE_DURATION_MESSAGE = (
    f"must be a positive duration such as 250ms, 2s, 10m or 1h30m, at most {MAX_DURATION}"
)
POSITIVE_DURATION_RULE = f"{DURATION_RULE} && duration(self) > duration('0s')"
BYTES_MESSAGE = "must be a byte quantity such as 512Mi, 64Gi or 500G, or an integer of bytes"
QUANTITY_MESSAGE = "must be a Kubernetes quantity such as 500m, 2, 16Gi"


def duration_seconds(text: str, per: int = 1) -> float:
    """Seconds of a duration string (`"1h30m"` -> 5400.0), divided by `per` (1000 turns a
    per-kilo-token duration into seconds per token); `ValueError` if it is malformed."""
    if not re.fullmatch(DURATION_PATTERN, text):
        raise ValueError(f"not a duration (use e.g. 250ms, 2s, 10m, 1h30m): {text!r}")
    parts = (Decimal(num) * _UNIT_SECONDS[unit] for num, unit in _DURATION_PART.findall(text))
    return float(sum(parts, Decimal(0)) / per)


def duration_nanoseconds(text: str) -> int:
    """Nanoseconds of a duration string as Go's `time.ParseDuration` (and so kube-apiserver's CEL
    `duration()`) computes them: integer parts exact, each fraction scaled in float64 and
    truncated; `ValueError` if it is malformed or overflows int64."""
    if not re.fullmatch(DURATION_PATTERN, text):
        raise ValueError(f"not a duration (use e.g. 250ms, 2s, 10m, 1h30m): {text!r}")
    total = 0
    for number, unit in _DURATION_PART.findall(text):
        whole, _, fraction = number.partition(".")
        part = int(whole) * _NS[unit]
        if fraction:
            part += int(int(fraction) * (float(_NS[unit]) / 10 ** len(fraction)))
        total += part
        if total > _MAX_INT64:
            raise ValueError(f"duration out of range: {text!r}")
    return total


def byte_quantity(value: int | str) -> int:
    """Bytes of a byte quantity (`"64Gi"` -> 68719476736); `ValueError` if it is malformed."""
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"a byte quantity cannot be negative: {value}")
        return value
    match = _BYTES_PARTS.match(value)
    if match is None:
        raise ValueError(f"not a byte quantity (use e.g. 64Gi, 500M or an integer of bytes): {value!r}")
    return int(float(match.group(1)) * _BYTE_UNITS[match.group(2) or ""])


def _bounded_nanoseconds(text: str) -> int | None:
    try:
        ns = duration_nanoseconds(text)
    except ValueError:
        return None
    return ns if ns <= MAX_DURATION_NS else None


def _check_duration(text: str) -> str:
    if _bounded_nanoseconds(text) is None:
        raise ValueError(DURATION_MESSAGE)
    return text


def _check_positive_duration(text: str) -> str:
    ns = _bounded_nanoseconds(text)
    if ns is None or ns <= 0:
        raise ValueError(POSITIVE_DURATION_MESSAGE)
    return text


def _non_negative_or_matches(value: int | str, pattern: str) -> bool:
    return value >= 0 if isinstance(value, int) else re.fullmatch(pattern, value) is not None


def _check_bytes(value: int | str) -> int | str:
    if not _non_negative_or_matches(value, BYTES_PATTERN):
        raise ValueError(BYTES_MESSAGE)
    return value


def _check_quantity(value: int | str) -> int | str:
    if not _non_negative_or_matches(value, QUANTITY_PATTERN):
        raise ValueError(QUANTITY_MESSAGE)
    return value


def _cel(rule: str, message: str) -> dict[str, Any]:
    return {"x-kubernetes-validations": [{"rule": rule, "message": message}]}


def _int_or_string(pattern: str) -> dict[str, Any]:
    return {"anyOf": [{"type": "integer", "minimum": 0}, {"type": "string", "pattern": pattern}]}


Duration = Annotated[
    str,
    Field(max_length=DURATION_MAX_LENGTH, json_schema_extra=_cel(DURATION_RULE, DURATION_MESSAGE)),
    AfterValidator(_check_duration),
]
"""A non-negative duration string such as `0s`, `250ms`, `10m`."""

PositiveDuration = Annotated[
    str,
    Field(
        max_length=DURATION_MAX_LENGTH,
        json_schema_extra=_cel(POSITIVE_DURATION_RULE, POSITIVE_DURATION_MESSAGE),
    ),
    AfterValidator(_check_positive_duration),
]
"""A duration string greater than zero."""

ByteQuantity = Annotated[
    int | str, AfterValidator(_check_bytes), WithJsonSchema(_int_or_string(BYTES_PATTERN))
]
"""Bytes: an integer or a string with a binary (`Gi`) or decimal (`G`) suffix."""

Quantity = Annotated[
    int | str, AfterValidator(_check_quantity), WithJsonSchema(_int_or_string(QUANTITY_PATTERN))
]
"""A Kubernetes resource quantity (`500m`, `2`, `16Gi`), passed through to the pod spec."""
