"""The router's HTTP front door: OpenAI-compatible endpoints, branch API, health, metrics.

Served by the lean HTTP/1.1 server of :mod:`agentpool.router.http_server` (asyncio protocols and
httptools); :class:`RouterServer` runs it with the service, the work log's sampler and the routes.

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions`` (SSE when ``stream``), ``GET
/v1/models``, ``DELETE /v1/branches/{id}``, ``GET /health``, ``GET /ready``, ``GET /metrics``, and
``POST /agentpool/v1/report`` for engine load reports.

Branch headers: ``x-agentpool-branch`` (an id), ``x-agentpool-parent-branch`` (needs a branch),
``x-agentpool-branch-end: true|false`` (needs a branch; ends it in the directory once the request is
answered). Every error is an OpenAI-style ``{"error": {...}}`` body with a 4xx/5xx status; 429
carries ``Retry-After``.
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar
from urllib.parse import unquote

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ValidationError

from agentpool.errors import (
    AgentpoolError,
    InvalidInputError,
    NotFoundError,
    UnauthenticatedError,
    UnavailableError,
    http_status,
)
from agentpool.kv import InvalidBranchIdError, check_branch_id
from agentpool.router import work_log
from agentpool.router.answer import answer
from agentpool.router.directory_view import DirectoryError
from agentpool.router.fitted_models import mount as mount_fitted_models
from agentpool.router.http_server import HttpServer, Request, Response, Routes, Stream, json_response
from agentpool.router.openai_api import (
    CONTEXT_LENGTH_EXCEEDED,
    BadJson,
    ChatCompletionRequest,
    CompletionRequest,
    error_body,
    parse_json,
    validation_error_body,
)
from agentpool.router.service import RouterService
from agentpool.router.tokenizer import Encoded, TokenizerError
from agentpool.wire.engine import LoadReport

M = TypeVar("M", bound=BaseModel)

BRANCH = "x-agentpool-branch"
PARENT = "x-agentpool-parent-branch"
BRANCH_END = "x-agentpool-branch-end"


class ApiError(AgentpoolError):
    """An error answered in OpenAI's shape (``type``, ``code``, ``param``); its HTTP status is its
    kind's, from the one table (:func:`agentpool.errors.http_status`): raise a subclass below."""

    def __init__(self, message: str, type_: str, code: str | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.message, self.type, self.code, self.param = message, type_, code, param
        self.headers: dict[str, str] = {}

    @property
    def status(self) -> int:
        return http_status(self)

    def with_headers(self, headers: dict[str, str]) -> ApiError:
        self.headers.update(headers)
        return self

    def response(self, headers: dict[str, str] | None = None) -> Response:
        body = orjson.dumps(error_body(self.message, self.type, self.code, self.param))
        return Response(self.status, body, headers={**self.headers, **(headers or {})})


class InvalidRequest(ApiError, InvalidInputError):
    """The client's request is malformed or over a limit (400)."""


class NotFound(ApiError, NotFoundError):
    """The request names a model, branch or engine this router does not have (404)."""


class Unauthorized(ApiError, UnauthenticatedError):
    """A missing or wrong token (401)."""


class DirectoryUnavailable(ApiError, UnavailableError):
    """The KV directory cannot answer now (503)."""


# ---- parsing ------------------------------------------------------------------------------------


def read_json(request: Request, service: RouterService) -> dict[str, Any]:
    """The body as a JSON object (the server read it whole, within the body timeout)."""
    try:
        return parse_json(request.body, service.config.limits.max_json_depth)
    except BadJson as e:
        raise InvalidRequest(str(e), "invalid_request_error", "invalid_json") from e


def parse_body(cls: type[M], body: dict[str, Any]) -> M:
    try:
        return cls.model_validate(body)
    except ValidationError as e:
        err = validation_error_body(e)["error"]
        raise InvalidRequest(err["message"], err["type"], err["code"], err["param"]) from e


def branch_headers(request: Request) -> tuple[str | None, str | None, bool]:
    headers = request.headers
    branch = headers.get(BRANCH)
    parent = headers.get(PARENT)
    end_raw = headers.get(BRANCH_END)
    if branch is None and parent is None and end_raw is None:
        return None, None, False
    try:
        if branch is not None:
            check_branch_id(branch)
        if parent is not None:
            check_branch_id(parent)
    except InvalidBranchIdError as e:
        raise InvalidRequest(str(e), "invalid_request_error", "invalid_header") from e
    if parent is not None and branch is None:
        raise InvalidRequest(f"{PARENT} needs {BRANCH}", "invalid_request_error", "invalid_header")
    end = False
    if end_raw is not None:
        value = end_raw.strip().lower()
        if value not in ("true", "false"):
            raise InvalidRequest(
                f"{BRANCH_END} must be true or false", "invalid_request_error", "invalid_header"
            )
        end = value == "true"
        if end and branch is None:
            raise InvalidRequest(f"{BRANCH_END} needs {BRANCH}", "invalid_request_error", "invalid_header")
    return branch, parent, end


# ---- handlers -----------------------------------------------------------------------------------


async def chat_completions(service: RouterService, request: Request) -> Response | Stream:
    body = read_json(request, service)
    req = parse_body(ChatCompletionRequest, body)
    branch, parent, end = branch_headers(request)
    check_model(service, req.model)
    limits = service.config.limits
    if len(req.messages) > limits.max_messages:
        raise InvalidRequest(
            f"more than {limits.max_messages} messages", "invalid_request_error", "too_many_messages"
        )
    check_output_limit(service, req.output_limit())
    encoded = await encode(service, service.encode_chat(body["messages"]))  # the validated messages
    prep = await service.prepare("chat", body, encoded, req.output_limit(), branch, parent)
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    return await answer(request, service, prep, req.stream, include_usage, req.model, end)


async def completions(service: RouterService, request: Request) -> Response | Stream:
    body = read_json(request, service)
    req = parse_body(CompletionRequest, body)
    branch, parent, end = branch_headers(request)
    check_model(service, req.model)
    check_output_limit(service, req.output_limit())
    encoded = await encode(service, service.encode_completion(req.prompt_text()))
    prep = await service.prepare("completion", body, encoded, req.output_limit(), branch, parent)
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    return await answer(request, service, prep, req.stream, include_usage, req.model, end)


def check_model(service: RouterService, model: str) -> None:
    if model != service.config.model:
        raise NotFound(
            f"The model '{model}' does not exist", "invalid_request_error", "model_not_found", "model"
        )


def check_output_limit(service: RouterService, limit: int | None) -> None:
    cap = service.config.limits.max_output_tokens
    if limit is not None and limit > cap:
        raise InvalidRequest(
            f"max_tokens may be at most {cap}", "invalid_request_error", "invalid_value", "max_tokens"
        )


async def encode(service: RouterService, pending: Awaitable[Encoded]) -> Encoded:
    try:
        encoded = await pending
    except TokenizerError as e:
        raise InvalidRequest(str(e), "invalid_request_error", "invalid_prompt") from e
    if not encoded.token_ids:
        raise InvalidRequest("the prompt has no tokens", "invalid_request_error", "invalid_prompt")
    cap = service.config.prompt_cap
    if len(encoded.token_ids) > cap:
        raise InvalidRequest(
            f"the prompt has {len(encoded.token_ids)} tokens, more than the {cap} allowed",
            "invalid_request_error",
            CONTEXT_LENGTH_EXCEEDED,
        )
    return encoded


async def list_models(service: RouterService, request: Request) -> Response:
    """The served model; with ``max_model_len`` (as SGLang and vLLM name it) where the config gives the
    model's context (``contextLength``, the pool's ``spec.model.contextLength``), so a client can leave
    out what would be refused as ``context_length_exceeded``."""
    config = service.config
    model: dict[str, Any] = {"id": config.model, "object": "model", "created": 0, "owned_by": "agentpool"}
    if config.context_length is not None:
        model["max_model_len"] = config.context_length
    return json_response({"object": "list", "data": [model]})


async def delete_branch(service: RouterService, request: Request) -> Response:
    branch = unquote(request.params)
    try:
        check_branch_id(branch)
    except InvalidBranchIdError as e:
        raise InvalidRequest(str(e), "invalid_request_error", "invalid_branch") from e
    try:
        found = await service.end_branch(branch)
    except (DirectoryError, TimeoutError) as e:
        raise DirectoryUnavailable(
            f"directory unavailable: {e}", "server_error", "directory_unavailable"
        ) from e
    if not found:
        raise NotFound(f"no branch {branch!r}", "invalid_request_error", "branch_not_found")
    return json_response({"id": branch, "object": "branch", "deleted": True})


async def health(service: RouterService, request: Request) -> Response:
    return json_response({"status": "ok"})


async def ready(service: RouterService, request: Request) -> Response:
    ok, checks = await service.ready()
    # the settings generation this replica runs: the operator reads it where no planner reports it
    generation = service.dispatcher.work_log.config_generation
    if ok:
        return json_response({"status": "ready", "checks": checks, "configGeneration": generation})
    body = {"status": "not ready", "checks": checks, "configGeneration": generation}
    return json_response(body, status=503)


async def metrics(service: RouterService, request: Request) -> Response:
    data = generate_latest(service.metrics.registry)
    return Response(200, data, content_type=CONTENT_TYPE_LATEST.encode())


def check_report_auth(service: RouterService, request: Request) -> None:
    """Reports need the report token, or a client certificate the router verified (mutual TLS with
    ``--tls-client-ca-file``, whose CA signs only the pool's engines and planners; fitted models
    likewise, ``fitted_models.py``)."""
    if request.client_certified:
        return
    if not service.report_auth.allows(request.headers.get("authorization")):
        service.metrics.rejected_reports.inc()
        raise Unauthorized(
            "missing or wrong report token",
            "authentication_error",
            "invalid_token",
        ).with_headers({"WWW-Authenticate": "Bearer"})


async def report(service: RouterService, request: Request) -> Response:
    check_report_auth(service, request)
    rep = parse_body(LoadReport, read_json(request, service))
    if not service.apply_report(rep):
        raise NotFound(
            f"unknown node {rep.node_id!r} (a report with the engine's url registers it)",
            "invalid_request_error",
            "unknown_node",
        )
    return Response(200, service.report_ack)


async def deregister(service: RouterService, request: Request) -> Response:
    """An engine leaving cleanly: it is removed from the registry at once (same token as reports)."""
    check_report_auth(service, request)
    node = unquote(request.params)
    if not service.discovery.deregister(node):
        raise NotFound(f"no registered engine {node!r}", "invalid_request_error", "unknown_node")
    return json_response({"id": node, "deleted": True})


Endpoint = Callable[[RouterService, Request], Awaitable[Response | Stream]]


def _bind(service: RouterService, endpoint: Endpoint) -> Callable[[Request], Awaitable[Response | Stream]]:
    async def handle(request: Request) -> Response | Stream:
        try:
            return await endpoint(service, request)
        except ApiError as e:
            return e.response()

    return handle


def build_routes(service: RouterService) -> Routes:
    routes = Routes()
    routes.add("POST", "/v1/chat/completions", _bind(service, chat_completions))
    routes.add("POST", "/v1/completions", _bind(service, completions))
    routes.add("GET", "/v1/models", _bind(service, list_models))
    routes.add_prefix("DELETE", "/v1/branches/", _bind(service, delete_branch))
    routes.add("GET", "/health", _bind(service, health))
    routes.add("GET", "/ready", _bind(service, ready))
    routes.add("GET", "/metrics", _bind(service, metrics))
    routes.add("POST", "/agentpool/v1/report", _bind(service, report))
    routes.add_prefix("DELETE", "/agentpool/v1/engines/", _bind(service, deregister))
    work_log.mount(routes, service.dispatcher.work_log)
    mount_fitted_models(routes, service)
    return routes


class RouterServer:
    """The service behind its HTTP server: :meth:`start` starts both (and the work log's sampler),
    :meth:`stop` gives requests in flight ``shutdown_timeout`` s, then closes everything."""

    def __init__(
        self, service: RouterService, shutdown_timeout: float = 5.0, sample_interval_s: float = 1.0
    ) -> None:
        self.service = service
        self.shutdown_timeout = shutdown_timeout
        self.sample_interval_s = sample_interval_s
        self.http = HttpServer(
            build_routes(service),
            max_body_bytes=lambda: service.config.max_body_bytes,
            body_timeout_s=lambda: service.config.timeouts.body_s,
        )
        self._stack = contextlib.AsyncExitStack()
        self.port = 0

    async def start(self, host: str, port: int, ssl_context: ssl.SSLContext | None = None) -> int:
        """Serve on ``host:port`` (0: a free one), over HTTPS with ``ssl_context``; returns the port."""
        await self.service.start()
        self._stack.push_async_callback(self.service.close)
        log_ = self.service.dispatcher.work_log
        await self._stack.enter_async_context(work_log.sampling(log_, self.sample_interval_s))
        self.port = await self.http.start(host, port, ssl_context)
        self._stack.push_async_callback(self.http.stop, self.shutdown_timeout)
        return self.port

    async def stop(self) -> None:
        await self._stack.aclose()


async def serve(
    service: RouterService,
    host: str,
    port: int,
    shutdown_timeout: float = 5.0,
    ssl_context: ssl.SSLContext | None = None,
) -> RouterServer:
    """A started :class:`RouterServer` (stop it with :meth:`RouterServer.stop`)."""
    server = RouterServer(service, shutdown_timeout)
    try:
        await server.start(host, port, ssl_context)
    except BaseException:
        await server.stop()
        raise
    return server
