"""Base URLs of pods and endpoints reached by address (no I/O)."""

from __future__ import annotations


def base_url(scheme: str, address: str, port: int | str) -> str:
    """``scheme://address:port``, an IPv6 address in brackets (``http://[fd00::1]:8000``)."""
    host = f"[{address}]" if ":" in address else address
    return f"{scheme}://{host}:{port}"
