"""TLS contexts from PEM files (mounted Secrets): one builder for every service's server and client side.

A server context holds its certificate chain and key; with a client CA it asks clients for a
certificate signed by that CA, required or optional (an optional one is still verified when a
client presents it: a bad one fails the handshake). A client context trusts a CA (the system's
without one) and, with a certificate and its key, presents them (mutual TLS). Loading reads the files
(blocking: call before serving or in a thread); :class:`TlsFilesError` names what failed.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Literal


class TlsFilesError(ValueError):
    """A TLS file is missing or unusable, or a certificate came without its key."""


def server_context(
    cert_file: Path,
    key_file: Path,
    client_ca_file: Path | None = None,
    client_certs: Literal["required", "optional"] = "required",
    what: str = "TLS",
) -> ssl.SSLContext:
    """A server's context; with ``client_ca_file``, client certificates signed by it are
    ``client_certs`` (and always verified when presented)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(cert_file, key_file)
        if client_ca_file is not None:
            context.load_verify_locations(cafile=client_ca_file)
            context.verify_mode = ssl.CERT_REQUIRED if client_certs == "required" else ssl.CERT_OPTIONAL
    except (OSError, ssl.SSLError) as e:
        raise TlsFilesError(f"cannot load the TLS files for {what}: {e}") from None
    return context


def optional_client_context(
    ca_file: Path | None, cert_file: Path | None, key_file: Path | None, what: str = "TLS"
) -> ssl.SSLContext | None:
    """:func:`client_context` when any of the files is named; None (the client's defaults) when none is."""
    if ca_file is None and cert_file is None and key_file is None:
        return None
    return client_context(ca_file, cert_file, key_file, what)


def client_context(
    ca_file: Path | None,
    cert_file: Path | None = None,
    key_file: Path | None = None,
    what: str = "TLS",
) -> ssl.SSLContext:
    """A client's context trusting ``ca_file`` (the system's CAs without one); with a certificate
    and its key, mutual TLS."""
    if (cert_file is None) != (key_file is None):
        raise TlsFilesError(f"a client certificate file needs its key file, and a key file its cert ({what})")
    try:
        context = ssl.create_default_context(cafile=None if ca_file is None else str(ca_file))
        if cert_file is not None and key_file is not None:
            context.load_cert_chain(cert_file, key_file)
    except (OSError, ssl.SSLError) as e:
        raise TlsFilesError(f"cannot load the TLS files for {what}: {e}") from None
    return context
