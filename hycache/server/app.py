"""`create_app`: the FastAPI app of `hycache serve` over one `LLM`, its middleware, lifespan
and routers (the routes live in `completions`, `chat`, `tokenize` and `info`; see the
package docstring for the map)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from hycache.engine.engine import LLM
from hycache.server import chat, completions, info, tokenize
from hycache.server.chat_template import ChatTemplate
from hycache.server.metrics import ServerMetrics
from hycache.server.prompts import PromptPrep
from hycache.server.protocol import error_response
from hycache.server.security import (
    ApiKeyMiddleware,
    JsonBodyMiddleware,
    LoopbackGuardMiddleware,
    StrictHttpMiddleware,
)
from hycache.server.serving import ServerContext
from hycache.server.worker import EngineWorker


def create_app(
    llm: LLM,
    *,
    model_name: str = "hycache",
    chat_template: ChatTemplate | None = None,
    api_key: str | None = None,
    loopback_only: bool = False,
) -> FastAPI:
    """The HTTP app over `llm`. Its lifespan runs the engine worker (`app.state.worker`):
    the worker starts with the app and, at shutdown, is stopped with unfinished requests
    aborted. Only the worker touches `llm` while the app runs. (Under Starlette's TestClient,
    use it as a context manager so that the lifespan runs; otherwise requests get 503.)
    `chat_template` renders `/v1/chat/completions` prompts (none: that route answers 400);
    with `api_key`, every `/v1/*` route wants `Authorization: Bearer <api_key>`; with
    `loopback_only` (serving on 127.0.0.1), a foreign `Host` or `Origin` is refused (403)."""
    worker = EngineWorker(llm)
    prep = PromptPrep(llm.tokenizer, llm.config.cache.max_model_len, chat_template)
    ctx = ServerContext(llm, worker, ServerMetrics(model_name), prep, model_name)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        worker.start()
        try:
            yield
        finally:
            prep.close()
            stopped = await asyncio.to_thread(worker.stop)
            if stopped and llm.store is not None:  # only the worker thread used it
                await asyncio.to_thread(llm.store.close)

    app = FastAPI(title="hycache", lifespan=lifespan)
    app.state.ctx = ctx
    app.state.worker = worker
    app.state.llm = llm
    app.state.metrics = ctx.metrics
    app.state.completions = completions.CompletionServing(ctx)
    app.state.chat = chat.ChatServing(ctx)
    app.add_middleware(JsonBodyMiddleware)  # innermost: after the host and key checks
    if api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=api_key)
    if loopback_only:
        app.add_middleware(LoopbackGuardMiddleware)
    app.add_middleware(StrictHttpMiddleware)  # outermost: framing and duplicate headers
    app.add_exception_handler(StarletteHTTPException, _http_error)  # type: ignore[arg-type]
    for module in (info, tokenize, completions, chat):
        app.include_router(module.router)
    return app


async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    return error_response(exc.status_code, str(exc.detail))
