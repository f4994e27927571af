"""TLS (and mutual TLS) of the KV directory from `spec.auth.directoryTls` (pure).

The certificates stay in the Secrets the spec names (keys `tls.crt`, `tls.key`, `ca.crt`); each
part gets, as files, only the keys it needs, and its command line or config file names the paths:

- directory: its certificate and key; with mutual TLS the clients' CA (`ca.crt` of the client
  Secret) as `--tls-client-ca-file`;
- router, planner, engines: the directory's CA (`ca.crt` of the server Secret, never its key);
  with mutual TLS also the client certificate and key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agentpool.api import AgentServingPoolSpec

CERT_KEY = "tls.crt"
KEY_KEY = "tls.key"
CA_KEY = "ca.crt"

SERVER_TLS_DIR = "/var/run/agentpool/directory-tls"
CLIENT_CA_DIR = "/var/run/agentpool/directory-client-ca"
DIRECTORY_CA_DIR = "/var/run/agentpool/directory-ca"
CLIENT_TLS_DIR = "/var/run/agentpool/directory-client-tls"


def _secret_volume(volume: str, secret: str, keys: list[str]) -> dict[str, Any]:
    return {
        "name": volume,
        "secret": {
            "secretName": secret,
            "items": [{"key": k, "path": k} for k in keys],
            "defaultMode": 0o400,
        },
    }


def _mount(volume: str, path: str) -> dict[str, Any]:
    return {"name": volume, "mountPath": path, "readOnly": True}


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """What a pod needs for the directory's TLS: its volumes, a container's mounts, and the paths."""

    volumes: list[dict[str, Any]] = field(default_factory=list)
    mounts: list[dict[str, Any]] = field(default_factory=list)
    paths: dict[str, str] = field(default_factory=dict)
    """`cert`, `key`, `clientCa` (the directory's) or `ca`, `clientCert`, `clientKey` (a client's)."""


def directory_server_tls(spec: AgentServingPoolSpec) -> TlsFiles:
    """The directory's files; empty without `directoryTls`."""
    tls = spec.auth.directory_tls
    if tls is None:
        return TlsFiles()
    volumes = [_secret_volume("directory-tls", tls.secret_name, [CERT_KEY, KEY_KEY])]
    mounts = [_mount("directory-tls", SERVER_TLS_DIR)]
    paths = {"cert": f"{SERVER_TLS_DIR}/{CERT_KEY}", "key": f"{SERVER_TLS_DIR}/{KEY_KEY}"}
    if tls.client_secret_name is not None:
        volumes.append(_secret_volume("directory-client-ca", tls.client_secret_name, [CA_KEY]))
        mounts.append(_mount("directory-client-ca", CLIENT_CA_DIR))
        paths["clientCa"] = f"{CLIENT_CA_DIR}/{CA_KEY}"
    return TlsFiles(volumes, mounts, paths)


def directory_client_tls(spec: AgentServingPoolSpec) -> TlsFiles:
    """A directory client's files (router, planner, engines); empty without `directoryTls`."""
    tls = spec.auth.directory_tls
    if tls is None:
        return TlsFiles()
    volumes = [_secret_volume("directory-ca", tls.secret_name, [CA_KEY])]
    mounts = [_mount("directory-ca", DIRECTORY_CA_DIR)]
    paths = {"ca": f"{DIRECTORY_CA_DIR}/{CA_KEY}"}
    if tls.client_secret_name is not None:
        volumes.append(_secret_volume("directory-client-tls", tls.client_secret_name, [CERT_KEY, KEY_KEY]))
        mounts.append(_mount("directory-client-tls", CLIENT_TLS_DIR))
        paths |= {"clientCert": f"{CLIENT_TLS_DIR}/{CERT_KEY}", "clientKey": f"{CLIENT_TLS_DIR}/{KEY_KEY}"}
    return TlsFiles(volumes, mounts, paths)


def server_args(files: TlsFiles) -> list[str]:
    """`python -m agentpool.directory` flags."""
    flags = {"cert": "--tls-cert-file", "key": "--tls-key-file", "clientCa": "--tls-client-ca-file"}
    return [f"{flags[k]}={v}" for k, v in files.paths.items()]


def client_args(files: TlsFiles) -> list[str]:
    """The router's and the planner's flags (the same names in both)."""
    flags = {
        "ca": "--directory-ca-file",
        "clientCert": "--directory-client-cert-file",
        "clientKey": "--directory-client-key-file",
    }
    return [f"{flags[k]}={v}" for k, v in files.paths.items()]


def client_config(files: TlsFiles) -> dict[str, str]:
    """The engine config's `directory` fields (`caFile`, `clientCertFile`, `clientKeyFile`)."""
    keys = {"ca": "caFile", "clientCert": "clientCertFile", "clientKey": "clientKeyFile"}
    return {keys[k]: v for k, v in files.paths.items()}
