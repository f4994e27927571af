"""Kubernetes resource quantities as numbers (pure): `"4Gi"` -> 4294967296, `"500m"` -> 0.5."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

_SUFFIX = {
    "": Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15,
    "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
}
_QUANTITY = re.compile(
    r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))((?:[KMGTPE]i)|[numkMGTPE]|[eE][+-]?[0-9]+)?$"
)


def quantity_value(value: int | str) -> Decimal:
    """The number a quantity stands for; `ValueError` if it is not one."""
    if isinstance(value, int):
        return Decimal(value)
    match = _QUANTITY.match(value)
    if match is None:
        raise ValueError(f"not a Kubernetes quantity: {value!r}")
    number, suffix = match.group(1), match.group(2) or ""
    try:
        if suffix[:1] in ("e", "E"):
            return Decimal(number) * (Decimal(10) ** int(suffix[1:]))
        return Decimal(number) * _SUFFIX[suffix]
    except InvalidOperation as exc:
        raise ValueError(f"not a Kubernetes quantity: {value!r}") from exc


def mebibytes(n_bytes: int) -> str:
    """A byte count as a quantity string, in whole Mi (rounded up) for readability."""
    mib = -(-n_bytes // 2**20)
    return f"{mib}Mi"
