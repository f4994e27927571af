"""One error root: every service's error is temporary (retry) or permanent (report), and its kind
gives the HTTP status and the gRPC code at every edge, from the one table in agentpool.errors."""

from __future__ import annotations

import grpc
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from agentpool.directory.client import DirectoryRpcError
from agentpool.directory.convert import InvalidRequestError, QuotaExceededError
from agentpool.directory.service import grpc_status
from agentpool.directory.store import StoreUnavailableError
from agentpool.engine import errors as engine
from agentpool.engine.config import ConfigError
from agentpool.engine.http_errors import error_middleware
from agentpool.engine.sglang.control import SglangError
from agentpool.engine.sglang.process import SglangExited
from agentpool.errors import (
    AgentpoolError,
    PermanentError,
    TemporaryError,
    grpc_code_name,
    http_status,
)
from agentpool.kv import InvalidBranchIdError, InvalidEventError, UnknownBranchError, UnknownNodeError
from agentpool.operator.errors import InvalidPool, NotYet
from agentpool.operator.kube import KubeConflict, KubeError, KubeInvalid, KubeNotFound, KubeUnavailable
from agentpool.planner.controller import PlannerError
from agentpool.router.answer import flow_error
from agentpool.router.directory_view import DirectoryError
from agentpool.router.discovery import DiscoveryError
from agentpool.router.engine_client import EngineBusy, EngineFailure, EngineRejected
from agentpool.router.flow_types import BadRequest, NoCapacity, Overloaded, RequestFailed, StreamBroken
from agentpool.router.nodes import StaleFitsError
from agentpool.router.server import (
    DirectoryUnavailable,
    InvalidRequest,
    NotFound,
    Unauthorized,
)

T, P = TemporaryError, PermanentError
# error class -> kind, HTTP status, gRPC code
TABLE: list[tuple[type[AgentpoolError], type[AgentpoolError] | None, int, str]] = [
    (engine.EngineError, None, 500, "INTERNAL"),
    (engine.BadRequestError, P, 400, "INVALID_ARGUMENT"),
    (engine.UnknownTransferError, P, 404, "NOT_FOUND"),
    (engine.NotServingError, T, 503, "UNAVAILABLE"),
    (engine.PoolFullError, T, 503, "UNAVAILABLE"),
    (engine.FetchError, T, 502, "UNAVAILABLE"),
    (engine.SwitchFailed, T, 502, "UNAVAILABLE"),
    (engine.BackendUnavailable, T, 503, "UNAVAILABLE"),
    (engine.Unauthenticated, P, 401, "UNAUTHENTICATED"),
    (ConfigError, P, 400, "INVALID_ARGUMENT"),
    (SglangError, T, 502, "UNAVAILABLE"),
    (SglangExited, T, 503, "UNAVAILABLE"),
    (InvalidRequestError, P, 400, "INVALID_ARGUMENT"),
    (QuotaExceededError, T, 429, "RESOURCE_EXHAUSTED"),
    (StoreUnavailableError, T, 503, "UNAVAILABLE"),
    (UnknownNodeError, P, 404, "NOT_FOUND"),
    (UnknownBranchError, P, 404, "NOT_FOUND"),
    (InvalidEventError, P, 400, "INVALID_ARGUMENT"),
    (InvalidBranchIdError, P, 400, "INVALID_ARGUMENT"),
    (Overloaded, T, 429, "RESOURCE_EXHAUSTED"),
    (NoCapacity, T, 503, "UNAVAILABLE"),
    (RequestFailed, T, 502, "UNAVAILABLE"),
    (StreamBroken, T, 502, "UNAVAILABLE"),
    (BadRequest, P, 400, "INVALID_ARGUMENT"),
    (InvalidPool, P, 500, "FAILED_PRECONDITION"),
    (NotYet, T, 503, "UNAVAILABLE"),
    (KubeError, None, 500, "INTERNAL"),
    (KubeNotFound, P, 404, "NOT_FOUND"),
    (KubeConflict, T, 409, "ABORTED"),
    (KubeInvalid, P, 400, "INVALID_ARGUMENT"),
    (KubeUnavailable, T, 503, "UNAVAILABLE"),
    (PlannerError, T, 503, "UNAVAILABLE"),
    (DirectoryRpcError, T, 502, "UNAVAILABLE"),
    (DirectoryError, T, 503, "UNAVAILABLE"),
    (DiscoveryError, T, 502, "UNAVAILABLE"),
    (EngineFailure, T, 502, "UNAVAILABLE"),
    (EngineRejected, P, 400, "INVALID_ARGUMENT"),
    (EngineBusy, T, 503, "UNAVAILABLE"),
    (StaleFitsError, T, 409, "ABORTED"),
    (InvalidRequest, P, 400, "INVALID_ARGUMENT"),
    (NotFound, P, 404, "NOT_FOUND"),
    (Unauthorized, P, 401, "UNAUTHENTICATED"),
    (DirectoryUnavailable, T, 503, "UNAVAILABLE"),
]


@pytest.mark.parametrize(("cls", "kind", "status", "code"), TABLE, ids=[c[0].__qualname__ for c in TABLE])
def test_every_service_error_has_one_kind_and_its_codes(
    cls: type[AgentpoolError], kind: type[AgentpoolError] | None, status: int, code: str
) -> None:
    assert issubclass(cls, AgentpoolError)
    assert issubclass(cls, TemporaryError) == (kind is TemporaryError)
    assert issubclass(cls, PermanentError) == (kind is PermanentError)
    assert http_status(cls) == status
    assert grpc_code_name(cls) == code
    assert grpc.StatusCode[code].name == code  # a real gRPC code


def test_a_temporary_error_carries_when_to_retry() -> None:
    assert NotYet("draining", 7.5).retry_after_s == 7.5
    assert engine.NotServingError("draining").retry_after_s is None
    with pytest.raises(ValueError, match="retry_after_s"):
        TemporaryError("x", retry_after_s=-1.0)


def test_the_directory_aborts_with_the_kind_s_grpc_code() -> None:
    assert grpc_status(QuotaExceededError("cap")) is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert grpc_status(InvalidRequestError("bad")) is grpc.StatusCode.INVALID_ARGUMENT
    assert grpc_status(StoreUnavailableError("redis")) is grpc.StatusCode.UNAVAILABLE
    assert grpc_status(UnknownNodeError("x")) is grpc.StatusCode.NOT_FOUND
    assert grpc_status(UnknownBranchError("x")) is grpc.StatusCode.NOT_FOUND


def test_errors_that_were_value_errors_still_are() -> None:
    """Callers that caught ValueError (a bad config, a refused request) still catch them."""
    for cls in (ConfigError, EngineRejected, KubeInvalid, InvalidRequest):
        assert issubclass(cls, ValueError), cls


def test_the_router_s_api_errors_answer_their_kind_s_status() -> None:
    assert InvalidRequest("bad", "invalid_request_error", "invalid_json").response().status == 400
    assert NotFound("no branch", "invalid_request_error").response().status == 404
    unauthorized = Unauthorized("no token", "authentication_error").with_headers(
        {"WWW-Authenticate": "Bearer"}
    )
    assert (unauthorized.response().status, unauthorized.response().headers["WWW-Authenticate"]) == (
        401,
        "Bearer",
    )
    assert DirectoryUnavailable("down", "server_error").response().status == 503
    # a request that lost its capacity after the first token: 503 with Retry-After (was 502)
    late = flow_error(NoCapacity("no decode node"), retry_after=2)
    assert (late.status, late.headers["Retry-After"]) == (503, "2")


def test_the_router_answers_the_kind_s_status() -> None:
    overloaded = flow_error(Overloaded("queues full"), retry_after=3)
    assert (overloaded.status, overloaded.headers["Retry-After"]) == (429, "3")
    assert flow_error(NoCapacity("none"), retry_after=1).status == 503
    assert flow_error(BadRequest("refused"), retry_after=1).status == 400
    assert flow_error(RequestFailed("engines failed"), retry_after=1).status == 502


@pytest.mark.parametrize(
    ("error", "status"),
    [(engine.NotServingError("draining"), 503), (engine.UnknownTransferError("t1"), 404)],
)
async def test_the_engine_answers_the_kind_s_status_over_http(error: engine.EngineError, status: int) -> None:
    async def fail(_: web.Request) -> web.Response:
        raise error

    app = web.Application(middlewares=[error_middleware])
    app.router.add_get("/x", fail)
    async with TestClient(TestServer(app)) as client:
        resp = await client.get("/x")
        assert resp.status == status
        assert (await resp.json())["error"] == {"type": type(error).__name__, "message": str(error)}
