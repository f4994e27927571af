"""gRPC method handlers that parse requests themselves, so a malformed message is answered with
INVALID_ARGUMENT and a reason (the generated handlers would answer INTERNAL)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError, Message

from agentpool.directory.convert import InvalidRequestError
from agentpool.directory.resync_wire import PackedResync, parse_batch
from agentpool.directory.route import serve_route
from agentpool.directory.service import DirectoryService, grpc_status
from agentpool.v1 import directory_pb2 as pb

SERVICE_NAME = "agentpool.v1.Directory"

_UNARY: dict[str, type[Message]] = {
    "Resolve": pb.ResolveRequest,
    "Place": pb.PlaceRequest,
    "EndBranch": pb.EndBranchRequest,
    "SwitchPhase": pb.SwitchPhaseRequest,
    "DropNode": pb.DropNodeRequest,
    "EvictionOrder": pb.EvictionOrderRequest,
    "Health": pb.HealthRequest,
}


def _serialize(message: Message | bytes) -> bytes:
    """A message, or one the service encoded itself (Resolve: see ``ResolveEncoder``)."""
    if isinstance(message, bytes):
        return message
    data: bytes = message.SerializeToString()
    return data


async def _parse(raw: bytes, kind: type[Message], context: grpc.aio.ServicerContext[Any, Any]) -> Any:
    try:
        return kind.FromString(raw)
    except DecodeError as e:
        await context.abort(grpc_status(InvalidRequestError()), f"malformed {kind.__name__}: {e}")


def _unary(method: Callable[[Any, Any], Awaitable[Message | bytes]], kind: type[Message]) -> Any:
    async def handle(raw: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> Message | bytes:
        return await method(await _parse(raw, kind, context), context)

    return handle


def directory_handler(service: DirectoryService) -> grpc.GenericRpcHandler[Any, Any]:
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {
        name: grpc.unary_unary_rpc_method_handler(
            _unary(getattr(service, name), kind), response_serializer=_serialize
        )
        for name, kind in _UNARY.items()
    }

    async def watch(raw: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Message]:
        request = await _parse(raw, pb.WatchCountsRequest, context)
        async for update in service.WatchCounts(request, context):
            yield update

    async def publish(
        raw_batches: AsyncIterator[bytes], context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Message]:
        async def batches() -> AsyncIterator[tuple[pb.KvEventBatch, PackedResync | None]]:
            async for raw in raw_batches:
                try:
                    yield parse_batch(raw)  # a big resync's block lists stay in ``raw``
                except DecodeError as e:
                    await context.abort(grpc_status(InvalidRequestError()), f"malformed KvEventBatch: {e}")

        async for ack in service.PublishEvents(batches(), context):
            yield ack

    async def route(raw_batches: AsyncIterator[bytes], context: grpc.aio.ServicerContext[Any, Any]) -> None:
        await serve_route(service, raw_batches, context)

    handlers["Route"] = grpc.stream_stream_rpc_method_handler(route)  # bytes both ways (see route.py)
    handlers["WatchCounts"] = grpc.unary_stream_rpc_method_handler(watch, response_serializer=_serialize)
    handlers["PublishEvents"] = grpc.stream_stream_rpc_method_handler(publish, response_serializer=_serialize)
    return grpc.method_handlers_generic_handler(SERVICE_NAME, handlers)
