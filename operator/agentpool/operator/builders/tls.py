"""TLS (and mutual TLS) of the KV directory and the router, from `spec.auth.directoryTls` and
`spec.auth.routerTls` (pure).

The certificates stay in the Secrets the spec names (keys `tls.crt`, `tls.key`, `ca.crt`); each
part gets, as files, only the keys it needs, and its command line or config file names the paths.
For each of the two servers:

- the server: its certificate and key; with mutual TLS the clients' CA (`ca.crt` of the client
  Secret) as `--tls-client-ca-file`;
- its clients: the server's CA (`ca.crt` of the server Secret, never its key); with mutual TLS
  also the client certificate and key. The directory's clients are the router, the planner and
  the engines; the router's (for reports and fitted models) the engines and the planner.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from agentpool.api import AgentServingPoolSpec, DirectoryTlsSpec, RouterTlsSpec

Server = Literal["directory", "router"]

CERT_KEY = "tls.crt"
KEY_KEY = "tls.key"
CA_KEY = "ca.crt"

RUN_DIR = "/var/run/agentpool"


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
    """What a pod needs for one server's TLS: its volumes, a container's mounts, and the paths."""

    volumes: list[dict[str, Any]] = field(default_factory=list)
    mounts: list[dict[str, Any]] = field(default_factory=list)
    paths: dict[str, str] = field(default_factory=dict)
    """`cert`, `key`, `clientCa` (a server's) or `ca`, `clientCert`, `clientKey` (a client's)."""


def _server_files(server: Server, secret: str, client_secret: str | None) -> TlsFiles:
    """``server``'s certificate and key (volume and folder `<server>-tls`) and, with mutual TLS,
    the clients' CA (`<server>-client-ca`)."""
    tls_dir, ca_dir = f"{RUN_DIR}/{server}-tls", f"{RUN_DIR}/{server}-client-ca"
    volumes = [_secret_volume(f"{server}-tls", secret, [CERT_KEY, KEY_KEY])]
    mounts = [_mount(f"{server}-tls", tls_dir)]
    paths = {"cert": f"{tls_dir}/{CERT_KEY}", "key": f"{tls_dir}/{KEY_KEY}"}
    if client_secret is not None:
        volumes.append(_secret_volume(f"{server}-client-ca", client_secret, [CA_KEY]))
        mounts.append(_mount(f"{server}-client-ca", ca_dir))
        paths["clientCa"] = f"{ca_dir}/{CA_KEY}"
    return TlsFiles(volumes, mounts, paths)


def _client_files(server: Server, secret: str, client_secret: str | None) -> TlsFiles:
    """A client of ``server``: its CA (`<server>-ca`) and, with mutual TLS, the client certificate
    and key (`<server>-client-tls`)."""
    ca_dir, tls_dir = f"{RUN_DIR}/{server}-ca", f"{RUN_DIR}/{server}-client-tls"
    volumes = [_secret_volume(f"{server}-ca", secret, [CA_KEY])]
    mounts = [_mount(f"{server}-ca", ca_dir)]
    paths = {"ca": f"{ca_dir}/{CA_KEY}"}
    if client_secret is not None:
        volumes.append(_secret_volume(f"{server}-client-tls", client_secret, [CERT_KEY, KEY_KEY]))
        mounts.append(_mount(f"{server}-client-tls", tls_dir))
        paths |= {"clientCert": f"{tls_dir}/{CERT_KEY}", "clientKey": f"{tls_dir}/{KEY_KEY}"}
    return TlsFiles(volumes, mounts, paths)


def _spec_of(spec: AgentServingPoolSpec, server: Server) -> DirectoryTlsSpec | RouterTlsSpec | None:
    return spec.auth.directory_tls if server == "directory" else spec.auth.router_tls


def server_tls(spec: AgentServingPoolSpec, server: Server) -> TlsFiles:
    """``server``'s own files (the directory's or the router's); empty without its TLS spec."""
    tls = _spec_of(spec, server)
    return TlsFiles() if tls is None else _server_files(server, tls.secret_name, tls.client_secret_name)


def client_tls(spec: AgentServingPoolSpec, server: Server) -> TlsFiles:
    """A client's files for ``server`` (the directory's clients: router, planner, engines; the
    router's: engines, planner); empty without its TLS spec."""
    tls = _spec_of(spec, server)
    return TlsFiles() if tls is None else _client_files(server, tls.secret_name, tls.client_secret_name)


def router_scheme(spec: AgentServingPoolSpec) -> str:
    """How the router is reached: `https` with `routerTls`, else `http`."""
    return "http" if spec.auth.router_tls is None else "https"


def server_args(files: TlsFiles) -> list[str]:
    """A server's flags: `python -m agentpool.directory` and `python -m agentpool.router` name them
    alike."""
    flags = {"cert": "--tls-cert-file", "key": "--tls-key-file", "clientCa": "--tls-client-ca-file"}
    return [f"{flags[k]}={v}" for k, v in files.paths.items()]


def client_args(files: TlsFiles, server: Server) -> list[str]:
    """A client's flags for ``server`` (`directory` or `router`): the router's and the planner's
    `--directory-...` flags, the planner's `--router-...` ones."""
    flags = {"ca": "ca-file", "clientCert": "client-cert-file", "clientKey": "client-key-file"}
    return [f"--{server}-{flags[k]}={v}" for k, v in files.paths.items()]


def client_config(files: TlsFiles) -> dict[str, str]:
    """The engine config's fields for one server (`directory` or a `routers[]` entry): `caFile`,
    `clientCertFile`, `clientKeyFile`."""
    keys = {"ca": "caFile", "clientCert": "clientCertFile", "clientKey": "clientKeyFile"}
    return {keys[k]: v for k, v in files.paths.items()}
