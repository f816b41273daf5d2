"""The read-only routes of `hycache serve`: `GET /health`, `GET /v1/models` (and one model by
name), and the engine's counters, read on the engine worker's thread as one `EngineSnapshot`:
`GET /v1/stats` (`EngineSnapshot.as_stats`) and `GET /metrics` (Prometheus text,
`hycache.server.metrics`).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from hycache.engine.outputs import EngineSnapshot
from hycache.server.metrics import CONTENT_TYPE
from hycache.server.protocol import error_response
from hycache.server.serving import ServerContext, context, snapshot

router = APIRouter()


@router.get("/health")
async def health() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/v1/stats", response_model=None)
async def stats(request: Request) -> dict[str, Any] | JSONResponse:
    ctx = context(request)
    taken = await snapshot(ctx)
    if not isinstance(taken, EngineSnapshot):
        return taken
    return {"model": ctx.model_name, **taken.as_stats()}


def _model_card(ctx: ServerContext) -> dict[str, Any]:
    return {
        "id": ctx.model_name,
        "object": "model",
        "created": ctx.started,
        "owned_by": "hycache",
        "max_model_len": ctx.max_model_len,
    }


@router.get("/v1/models")
async def models(request: Request) -> dict[str, Any]:
    return {"object": "list", "data": [_model_card(context(request))]}


@router.get("/v1/models/{name:path}", response_model=None)
async def model(request: Request, name: str) -> dict[str, Any] | JSONResponse:
    ctx = context(request)
    if name != ctx.model_name:
        return error_response(404, f"model {name!r} not found", "model_not_found")
    return _model_card(ctx)


@router.get("/metrics")
async def prometheus_metrics(request: Request) -> Response:
    ctx = context(request)
    taken = await snapshot(ctx)
    if not isinstance(taken, EngineSnapshot):
        return taken
    return Response(ctx.metrics.render(taken), media_type=CONTENT_TYPE)
