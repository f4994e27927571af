"""The planner's fitted per-node models, received at ``PUT /agentpool/v1/models`` (evolving-infra §5.1).

The planner pushes a versioned :class:`agentpool.wire.fits.ModelSet` (each node's Eq. 1/2
coefficients with its window's ``t_bar`` and ``f_n``) to every router replica; the router predicts
each node's TTFT (Eq. 7) with that node's own model from then on, and keeps its configured
``nodeModel`` for nodes the set does not cover. An older or equal version is refused with 409 and
the version in use, so replicas never go back to an older set. ``GET`` answers the version in use
and the nodes it covers. The push is authenticated like the engines' reports (the router's
report token, :mod:`agentpool.router.auth`, as a bearer token).
"""

from __future__ import annotations

import logging

import orjson
from pydantic import ValidationError

from agentpool.errors import InvalidInputError, UnauthenticatedError, http_status
from agentpool.models import NodeModel
from agentpool.router.http_server import Request, Response, Routes, error_response
from agentpool.router.nodes import StaleFitsError
from agentpool.router.openai_api import error_body
from agentpool.router.service import RouterService
from agentpool.wire.fits import MODELS_PATH, ModelSet, ModelSetStatus

log = logging.getLogger(__name__)


def _status(service: RouterService, nodes: list[str] | None = None) -> Response:
    table = service.nodes
    covered = nodes if nodes is not None else [e.node_id for e in table.entries() if table.fitted(e.node_id)]
    status = ModelSetStatus(version=table.fits_version, nodes=sorted(covered))
    return Response(200, status.model_dump_json().encode())


def mount(routes: Routes, service: RouterService) -> None:
    """Serve ``GET``/``PUT /agentpool/v1/models`` for ``service``."""

    async def get_models(_: Request) -> Response:
        return _status(service)

    async def put_models(request: Request) -> Response:
        if not request.client_certified and not service.report_auth.allows(
            request.headers.get("authorization")
        ):
            status = http_status(UnauthenticatedError)
            return error_response(status, "missing or wrong token", "authentication_error", "invalid_token")
        try:
            update = ModelSet.model_validate_json(request.body)
            models: dict[str, NodeModel] = {n: m.node_model() for n, m in update.models.items()}
        except (ValidationError, ValueError) as e:
            return error_response(
                http_status(InvalidInputError), f"invalid model set: {e}", code="invalid_models"
            )
        try:
            applied = service.nodes.apply_fits(update.version, models)
        except StaleFitsError as e:
            body = error_body(str(e), "conflict", "stale_version") | {"version": service.nodes.fits_version}
            return Response(http_status(e), orjson.dumps(body))
        service.dispatcher.work_log.models_version = update.version
        unknown = sorted(set(models) - set(applied))
        log.info(
            "fitted models %d for %d nodes%s",
            update.version,
            len(applied),
            f" (not in the node list: {', '.join(unknown)})" if unknown else "",
        )
        return _status(service, applied)

    routes.add("GET", MODELS_PATH, get_models)
    routes.add("PUT", MODELS_PATH, put_models)
