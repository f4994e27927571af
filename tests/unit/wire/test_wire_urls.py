"""Base URLs from addresses: IPv6 in brackets, everything else as given."""

from __future__ import annotations

import pytest

from agentpool.wire.urls import base_url


@pytest.mark.parametrize(
    ("scheme", "address", "port", "url"),
    [
        ("http", "10.0.0.7", 8000, "http://10.0.0.7:8000"),
        ("https", "fd00::1", 8443, "https://[fd00::1]:8443"),
        ("http", "router.agents.svc", "8000", "http://router.agents.svc:8000"),
    ],
)
def test_base_url(scheme: str, address: str, port: int | str, url: str) -> None:
    assert base_url(scheme, address, port) == url
