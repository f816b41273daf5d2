"""`hycache serve`: an OpenAI-like HTTP server over one `LLM`.

This file owns the HTTP layer and everything between it and the engine:

- `EngineWorker`: the one thread that touches the `LLM`. Handlers never call the engine; they
  put commands on a thread-safe inbox and get results back on per-request asyncio queues
  (filled with `loop.call_soon_threadsafe`). The worker sleeps on the inbox while nothing is
  unfinished and steps the engine while anything is.
- `create_app`: the FastAPI app (`GET /health`, `POST /v1/completions` and
  `POST /v1/chat/completions` with optional SSE streaming, `GET /v1/models`, `GET /v1/stats`,
  `GET /metrics` in Prometheus text format, see `hycache.metrics`); its lifespan starts the
  worker and, on shutdown, stops it and aborts whatever is still unfinished. With an API key
  every `/v1/*` route wants `Authorization: Bearer KEY` (401 otherwise); `/health` and
  `/metrics` stay open.
- `HycacheServer`: uvicorn's server, which at shutdown first ends in-flight requests (503) so
  that open streams close instead of holding the shutdown up.
- `add_serve_args` / `run_serve`: the `serve` command's flags and entry point.

Bad input answers HTTP 400 `{"error": {"message", "type", "param", "code"}}` and disturbs no
other request. OpenAI fields hycache does not implement (`n`, `best_of`, `logprobs`, `echo`,
`stop` strings, `suffix`, penalties, `logit_bias`; for chat also tools, `response_format`, ...)
are refused with a 400 unless left at their unused value, never answered with other semantics
(the request bodies and these tables live in `hycache.protocol`). A body over
`MAX_BODY_BYTES` is refused (413) before it is read whole. Responses name the served model
(`--served-model-name`, else the model path's last component), never a path.

Extensions to the OpenAI completions body: `token_ids` in each choice, `stop_token_ids`,
`ignore_eos`, and `prefix_hints` (token counts where the prompt's shared prefixes end, e.g. the
end of a system prompt: under the `limit` policy the first request of a family already
checkpoints there, so the next one resumes at its limit). `usage.prompt_tokens_details.
cached_tokens` (and, for older clients, `usage.cached_tokens`) is the request's resume point.

Chat: messages are rendered with the checkpoint's chat template (`hycache.chat`; the
`--chat-template` file overrides it) and tokenized without extra special tokens; a model with no
template or no tokenizer answers 400. The end of the last system message is passed as a prefix
hint, so under `limit` the first chat of a system-prompt family already checkpoints for it.
`max_completion_tokens` (else `max_tokens`, else the room left in `max_model_len`),
`stream_options.include_usage` (a last chunk with empty `choices` and the usage) are honoured.

Tenants: requests with different `cache_salt` strings never share cache entries, so
`cached_tokens` tells a client nothing about another tenant's prompts. Without a salt the cache
is shared by every client.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import logging
import queue
import socket
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from hycache.chat import ChatTemplate, ChatTemplateError, load_chat_template
from hycache.engine.args import add_serve_args, llm_from_args
from hycache.engine.engine import LLM, RequestOutput, StreamEvent
from hycache.metrics import CONTENT_TYPE, RequestTimer, ServerMetrics, engine_snapshot
from hycache.protocol import (
    CHAT_UNSUPPORTED_FIELDS,
    UNSUPPORTED_FIELDS,
    ApiKeyMiddleware,
    ChatBody,
    CompletionBody,
    LoopbackGuardMiddleware,
    error_response,
    is_loopback,
    refuse_unsupported,
    validation_message,
)
from hycache.request import SamplingParams

log = logging.getLogger("hycache.serve")

MAX_BODY_BYTES = 8 * 2**20  # a request body; a 128k-token prompt as JSON ids is about 1 MB


# ---------------------------------------------------------------------------------- worker
@dataclass(frozen=True)
class _Accepted:
    """The engine queued the request."""


@dataclass(frozen=True)
class _Failed:
    """The request was refused (400), the engine failed (500) or is shutting down (503)."""

    status: int
    message: str


_Item = _Accepted | _Failed | StreamEvent


class _Channel:
    """The worker's way back to one handler: an asyncio queue on the handler's event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.queue: asyncio.Queue[_Item] = asyncio.Queue()

    def put(self, item: _Item) -> None:
        """Thread-safe; a no-op once the handler's loop is closed (nobody is listening)."""
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)


@dataclass(frozen=True)
class _Add:
    request_id: str
    prompt: str | list[int]
    params: SamplingParams
    channel: _Channel
    prefix_hints: tuple[int, ...] = ()
    cache_salt: str | None = None


@dataclass(frozen=True)
class _Abort:
    request_id: str


@dataclass(frozen=True)
class _Call:
    """Run `fn(llm)` on the worker thread (between steps) and resolve `future` with it."""

    fn: Callable[[LLM], Any]
    future: Future[Any]


_STOP = object()
_DRAIN = object()
SHUTTING_DOWN = "the server is shutting down"


class ServerClosed(RuntimeError):
    """The worker is stopped (or not started): no new work is taken."""


class EngineWorker:
    """The single thread that owns an `LLM`; everything else talks to it through `submit`,
    `abort` and `call`, which are safe from any thread."""

    def __init__(self, llm: LLM) -> None:
        self.llm = llm
        self._inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._lock = threading.Lock()  # orders `_open` against commands entering the inbox
        self._open = False
        self._thread: threading.Thread | None = None
        self._channels: dict[str, _Channel] = {}  # worker thread only
        self._broken: str | None = None  # worker thread only: why the engine is unusable
        self._draining = False  # worker thread only: refusing new requests

    # -- any thread ----------------------------------------------------------------------------

    @property
    def thread(self) -> threading.Thread | None:
        return self._thread

    def start(self) -> None:
        with self._lock:
            if self._thread is not None:
                raise RuntimeError("EngineWorker: already started")
            self._open = True
            self._thread = threading.Thread(target=self._run, name="hycache-engine", daemon=True)
            self._thread.start()

    def stop(self, timeout: float | None = 60.0) -> bool:
        """Stop taking work, abort what is unfinished, end the thread; True once it has ended.

        Handlers still waiting get a 503 failure instead of hanging."""
        with self._lock:
            if self._open:
                self._open = False
                self._inbox.put(_STOP)
        if self._thread is None:
            return True
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("engine thread did not stop within %ss", timeout)
            return False
        return True

    def drain(self) -> None:
        """Begin shutting down without waiting: abort every unfinished request (its handler
        gets a 503) and refuse new ones; `stop` still ends the thread."""
        with contextlib.suppress(ServerClosed):
            self._put(_DRAIN)

    def _put(self, cmd: Any) -> None:
        with self._lock:
            if not self._open:
                raise ServerClosed("the server is not running or is shutting down")
            self._inbox.put(cmd)

    def submit(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams,
        prefix_hints: Sequence[int] = (),
        cache_salt: str | None = None,
    ) -> asyncio.Queue[_Item]:
        """Queue a request; call from a running event loop. The returned queue gets
        `_Accepted` or `_Failed` first, then `StreamEvent`s until one is `finished`.
        `prefix_hints` and `cache_salt` go to `LLM.add_request`."""
        channel = _Channel(asyncio.get_running_loop())
        self._put(_Add(request_id, prompt, params, channel, tuple(prefix_hints), cache_salt))
        return channel.queue

    def abort(self, request_id: str) -> None:
        """Abort a request (a no-op if it already finished or the worker is stopped)."""
        with contextlib.suppress(ServerClosed):
            self._put(_Abort(request_id))

    def call(self, fn: Callable[[LLM], Any]) -> Future[Any]:
        """Run `fn(llm)` on the worker thread between steps."""
        future: Future[Any] = Future()
        self._put(_Call(fn, future))
        return future

    # -- worker thread -------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                busy = self._broken is None and self.llm.scheduler.has_unfinished()
                try:
                    cmd = self._inbox.get(block=not busy)  # sleeps while idle
                except queue.Empty:
                    cmd = None
                while cmd is not None:  # take every pending command before the next step
                    if cmd is _STOP:
                        return
                    if cmd is _DRAIN:
                        self._draining = True
                        self._fail_all(503, SHUTTING_DOWN)
                    else:
                        self._handle(cmd)
                    try:
                        cmd = self._inbox.get_nowait()
                    except queue.Empty:
                        cmd = None
                if self._broken is None and self.llm.scheduler.has_unfinished():
                    self._step()
        except BaseException:  # pragma: no cover - a bug in the loop itself
            log.exception("engine worker crashed")
            raise
        finally:
            self._shutdown()

    def _handle(self, cmd: Any) -> None:
        if isinstance(cmd, _Add):
            if self._broken is not None:
                cmd.channel.put(_Failed(500, self._broken))
                return
            if self._draining:
                cmd.channel.put(_Failed(503, SHUTTING_DOWN))
                return
            try:
                self.llm.add_request(
                    cmd.prompt,
                    cmd.params,
                    request_id=cmd.request_id,
                    cache_salt=cmd.cache_salt,
                    prefix_hints=cmd.prefix_hints,
                )
            except ValueError as e:  # refused; the engine queued nothing
                cmd.channel.put(_Failed(400, str(e)))
            except Exception as e:
                log.exception("add_request failed")
                cmd.channel.put(_Failed(500, f"engine error: {e}"))
            else:
                self._channels[cmd.request_id] = cmd.channel
                cmd.channel.put(_Accepted())
        elif isinstance(cmd, _Abort):
            if self._channels.pop(cmd.request_id, None) is not None:
                self._abort(cmd.request_id)
        elif isinstance(cmd, _Call):
            if not cmd.future.set_running_or_notify_cancel():
                return
            try:
                cmd.future.set_result(cmd.fn(self.llm))
            except Exception as e:
                cmd.future.set_exception(e)

    def _abort(self, request_id: str) -> None:
        try:
            self.llm.abort(request_id)
        except Exception:
            log.exception("abort(%s) failed", request_id)
        self.llm.scheduler.finished.clear()  # see _step

    def _step(self) -> None:
        try:
            events = self.llm.step()
        except Exception as e:
            # The engine's state is unknown: fail every live request rather than hang them.
            log.exception("engine step failed")
            self._fail_all(500, f"engine error: {e}")
            if self.llm.scheduler.has_unfinished():  # could not even abort: stop stepping
                self._broken = f"engine unusable after an error: {e}"
            return
        finally:
            # The scheduler keeps every finished request; a long-running server must not.
            self.llm.scheduler.finished.clear()
        for event in events:
            channel = self._channels.get(event.request_id)
            if channel is None:  # aborted by its handler in the meantime
                continue
            channel.put(event)
            if event.finished:
                del self._channels[event.request_id]

    def _fail_all(self, status: int, message: str) -> None:
        sched = self.llm.scheduler
        ids = [*self._channels, *(r.request_id for r in [*sched.running, *sched.waiting])]
        for rid in dict.fromkeys(ids):
            self._abort(rid)
        for channel in self._channels.values():
            channel.put(_Failed(status, message))
        self._channels.clear()

    def _shutdown(self) -> None:
        self._fail_all(503, SHUTTING_DOWN)
        with self._lock:
            self._open = False
        while True:  # nothing is put after _STOP, but answer anything left regardless
            try:
                cmd = self._inbox.get_nowait()
            except queue.Empty:
                break
            if isinstance(cmd, _Add):
                cmd.channel.put(_Failed(503, SHUTTING_DOWN))
            elif isinstance(cmd, _Call) and cmd.future.set_running_or_notify_cancel():
                cmd.future.set_exception(ServerClosed(SHUTTING_DOWN))


# ---------------------------------------------------------------------------------- HTTP API
def _sse(payload: Any) -> str:
    return f"data: {json.dumps(payload)}\n\n"


class _TextDelta:
    """Incremental detokenisation: decode everything so far, emit what is new, and hold back
    a trailing replacement character (a multi-byte character cut in half)."""

    def __init__(self, llm: LLM) -> None:
        self.llm = llm
        self.ids: list[int] = []
        self.sent = ""

    def push(self, new_ids: list[int], final: bool) -> str | None:
        if self.llm.tokenizer is None:
            return None
        self.ids.extend(new_ids)
        text = self.llm.decode(self.ids) or ""
        if not final and text.endswith("\ufffd"):
            return ""
        delta = text[len(self.sent) :] if text.startswith(self.sent) else text
        self.sent = text
        return delta


def _stats(llm: LLM) -> dict[str, Any]:
    """A snapshot of the scheduler, cache and engine counters (run on the worker thread)."""
    sched = llm.scheduler
    cs = sched.cache.stats()
    es = llm.stats
    return {
        "running": len(sched.running),
        "waiting": len(sched.waiting),
        "cache": {
            "num_blocks": cs.num_blocks,
            "free_blocks": cs.free_blocks,
            "used_blocks": cs.used_blocks,
            "cached_blocks": cs.cached_blocks,
            "admissions": cs.admissions,
            "query_tokens": cs.query_tokens,
            "hit_tokens": cs.hit_tokens,
            "lost_reuse_tokens": cs.lost_reuse_tokens,
            "token_hit_rate": cs.token_hit_rate,
        },
        "engine": {
            "steps": es.steps,
            "prompt_tokens": es.prompt_tokens,
            "hit_tokens": es.hit_tokens,
            "output_tokens": es.output_tokens,
        },
    }


async def _read_body(request: Request, limit: int) -> bytes | None:
    """The request body, or None once it is known to exceed `limit` bytes (read no further:
    one huge body must not stall every other client)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        return None
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


async def _wait_for_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def _collect(
    items: asyncio.Queue[_Item], timer: RequestTimer | None = None
) -> RequestOutput | _Failed:
    while True:
        item = await items.get()
        if isinstance(item, _Failed):
            return item
        if isinstance(item, StreamEvent):
            if timer is not None:
                timer.tokens(len(item.new_token_ids))
            if item.finished and item.output is not None:
                return item.output


def _prefix_hint(offsets: Sequence[tuple[int, int]], end: int) -> int:
    """How many of the prompt's tokens lie wholly within its first `end` characters (0 when
    `end` is 0: no system message)."""
    return sum(1 for _, stop in offsets if stop <= end) if end > 0 else 0


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
    counter = itertools.count()
    metrics = ServerMetrics(model_name)
    started = int(time.time())

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        worker.start()
        try:
            yield
        finally:
            await asyncio.to_thread(worker.stop)

    app = FastAPI(title="hycache", lifespan=lifespan)
    app.state.worker = worker
    app.state.llm = llm
    app.state.metrics = metrics
    if api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=api_key)
    if loopback_only:
        app.add_middleware(LoopbackGuardMiddleware)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(exc.status_code, str(exc.detail))

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/stats", response_model=None)
    async def stats() -> dict[str, Any] | JSONResponse:
        try:
            snapshot = await asyncio.wrap_future(worker.call(_stats))
        except ServerClosed as e:
            return error_response(503, str(e))
        return {"model": model_name, **snapshot}

    def _model_card() -> dict[str, Any]:
        return {
            "id": model_name,
            "object": "model",
            "created": started,
            "owned_by": "hycache",
            "max_model_len": llm.config.cache.max_model_len,
        }

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [_model_card()]}

    @app.get("/v1/models/{name:path}", response_model=None)
    async def model(name: str) -> dict[str, Any] | JSONResponse:
        if name != model_name:
            return error_response(404, f"model {name!r} not found", "model_not_found")
        return _model_card()

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        try:
            snapshot = await asyncio.wrap_future(worker.call(engine_snapshot))
        except ServerClosed as e:
            return error_response(503, str(e))
        return Response(metrics.render(snapshot), media_type=CONTENT_TYPE)

    async def _parse(request: Request, fields: dict[str, Any], model: type[Any]) -> Any:
        """The validated body, or an error response."""
        raw = await _read_body(request, MAX_BODY_BYTES)
        if raw is None:
            return error_response(413, f"request body over {MAX_BODY_BYTES:,} bytes")
        try:
            refuse_unsupported(raw, fields)
            return model.model_validate_json(raw)
        except ValidationError as e:
            return error_response(400, validation_message(e))
        except ValueError as e:
            return error_response(400, str(e))

    async def _submit(
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams,
        hints: Sequence[int],
        salt: str | None,
    ) -> asyncio.Queue[_Item] | Response:
        """Queue the request; its item queue once the engine accepted it, else the error."""
        try:
            items = worker.submit(request_id, prompt, params, hints, salt)
        except ServerClosed as e:
            return error_response(503, str(e))
        try:
            first = await items.get()
        except BaseException:  # cancelled before the engine answered
            worker.abort(request_id)
            raise
        if isinstance(first, _Failed):
            return error_response(first.status, first.message)
        return items

    async def _result(
        request: Request, request_id: str, items: asyncio.Queue[_Item], timer: RequestTimer
    ) -> RequestOutput | Response:
        """Wait for the whole output; abort the request if the client hangs up first."""
        collect = asyncio.ensure_future(_collect(items, timer))
        disconnect = asyncio.ensure_future(_wait_for_disconnect(request))
        try:
            await asyncio.wait({collect, disconnect}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            disconnect.cancel()
            if not collect.done():  # client gone (or we were cancelled): free the engine
                collect.cancel()
                worker.abort(request_id)
        if not collect.done() or collect.cancelled():
            return Response(status_code=499)  # nobody is left to read it
        result = collect.result()
        if isinstance(result, _Failed):
            return error_response(result.status, result.message)
        metrics.finished(result)
        return result

    def _streaming(body: AsyncIterator[str]) -> StreamingResponse:
        return StreamingResponse(
            body,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    @app.post("/v1/completions", response_model=None)
    async def completions(request: Request) -> Response:
        arrival = time.monotonic()
        body = await _parse(request, UNSUPPORTED_FIELDS, CompletionBody)
        if isinstance(body, Response):
            return body
        try:
            params = body.sampling_params()
        except ValueError as e:
            return error_response(400, str(e))
        request_id = f"cmpl-{uuid.uuid4().hex[:16]}-{next(counter)}"
        created = int(time.time())
        items = await _submit(request_id, body.prompt, params, body.prefix_hints, body.cache_salt)
        if isinstance(items, Response):
            return items
        timer = metrics.timer(arrival)
        if body.stream:
            text = _TextDelta(llm)

            def chunks(event: StreamEvent) -> list[dict[str, Any]]:
                out = event.output if event.finished else None
                chunk: dict[str, Any] = {
                    "id": request_id,
                    "object": "text_completion",
                    "created": created,
                    "model": model_name,
                    "choices": [
                        {
                            "index": 0,
                            "text": text.push(event.new_token_ids, event.finished),
                            "token_ids": event.new_token_ids,
                            "finish_reason": out.finish_reason if out is not None else None,
                        }
                    ],
                }
                if out is not None:
                    chunk["usage"] = _usage(out)
                return [chunk]

            return _streaming(_stream(request_id, items, timer, chunks))

        result = await _result(request, request_id, items, timer)
        if isinstance(result, Response):
            return result
        return JSONResponse(
            {
                "id": request_id,
                "object": "text_completion",
                "created": created,
                "model": model_name,
                "choices": [
                    {
                        "index": 0,
                        "text": result.text,
                        "token_ids": result.token_ids,
                        "finish_reason": result.finish_reason,
                    }
                ],
                "usage": _usage(result),
            }
        )

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(request: Request) -> Response:
        arrival = time.monotonic()
        body = await _parse(request, CHAT_UNSUPPORTED_FIELDS, ChatBody)
        if isinstance(body, Response):
            return body
        if chat_template is None or llm.tokenizer is None:
            missing = "tokenizer (tokenizer.json)" if llm.tokenizer is None else "chat template"
            return error_response(
                400,
                f"this model has no {missing}, so chat is unavailable; pass --chat-template FILE "
                "(and a checkpoint with a tokenizer) or use /v1/completions with token ids",
            )
        try:
            messages = [m.as_template_input() for m in body.messages]
            text, system_end = chat_template.render(messages)
            encoding = llm.tokenizer.encode(text, add_special_tokens=False)
            ids = list(encoding.ids)
            hint = _prefix_hint(encoding.offsets, system_end)
            default_max = max(llm.config.cache.max_model_len - len(ids), 1)
            params = body.sampling_params(default_max)
        except ValueError as e:  # ChatTemplateError included
            return error_response(400, str(e))
        hints = [hint] if 0 < hint < len(ids) else []
        request_id = f"chatcmpl-{uuid.uuid4().hex[:16]}-{next(counter)}"
        created = int(time.time())
        items = await _submit(request_id, ids, params, hints, body.cache_salt)
        if isinstance(items, Response):
            return items
        timer = metrics.timer(arrival)

        def envelope(choices: list[dict[str, Any]], obj: str) -> dict[str, Any]:
            return {
                "id": request_id,
                "object": obj,
                "created": created,
                "model": model_name,
                "choices": choices,
            }

        if body.stream:
            include_usage = body.stream_options is not None and body.stream_options.include_usage
            delta = _TextDelta(llm)
            head = envelope(
                [
                    {
                        "index": 0,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                ],
                "chat.completion.chunk",
            )

            def chunks(event: StreamEvent) -> list[dict[str, Any]]:
                out = event.output if event.finished else None
                choice = {
                    "index": 0,
                    "delta": {"content": delta.push(event.new_token_ids, event.finished)},
                    "token_ids": event.new_token_ids,
                    "logprobs": None,
                    "finish_reason": out.finish_reason if out is not None else None,
                }
                chunk = envelope([choice], "chat.completion.chunk")
                if out is None or not include_usage:
                    return [chunk]
                return [chunk, {**envelope([], "chat.completion.chunk"), "usage": _usage(out)}]

            return _streaming(_stream(request_id, items, timer, chunks, head))

        result = await _result(request, request_id, items, timer)
        if isinstance(result, Response):
            return result
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": result.text},
            "token_ids": result.token_ids,
            "logprobs": None,
            "finish_reason": result.finish_reason,
        }
        return JSONResponse({**envelope([choice], "chat.completion"), "usage": _usage(result)})

    async def _stream(
        request_id: str,
        items: asyncio.Queue[_Item],
        timer: RequestTimer,
        chunks: Callable[[StreamEvent], list[dict[str, Any]]],
        head: dict[str, Any] | None = None,
    ) -> AsyncIterator[str]:
        """SSE: `head`, then `chunks(event)` per engine event, then `[DONE]`; if the client goes
        away (the generator is cancelled or closed before the last token), the request is
        aborted in the engine."""
        done = False
        try:
            if head is not None:
                yield _sse(head)
            while True:
                item = await items.get()
                if isinstance(item, _Failed):
                    yield _sse({"error": {"message": item.message, "code": item.status}})
                    done = True
                    break
                if not isinstance(item, StreamEvent):
                    continue
                timer.tokens(len(item.new_token_ids))
                for chunk in chunks(item):
                    yield _sse(chunk)
                if item.finished:
                    done = True
                    if item.output is not None:
                        metrics.finished(item.output)
                    break
            yield "data: [DONE]\n\n"
        finally:
            if not done:
                worker.abort(request_id)

    return app


class HycacheServer(uvicorn.Server):
    """uvicorn's server that, when shutdown begins, drains the engine worker: in-flight
    requests end at once with a 503 (a stream with an error event and `[DONE]`) instead of
    running to max_tokens while uvicorn waits for their connections to close."""

    def __init__(self, config: uvicorn.Config, worker: EngineWorker | None = None) -> None:
        super().__init__(config)
        self.worker = worker

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self.worker is not None:
            self.worker.drain()
        await super().shutdown(sockets)


def _usage(out: RequestOutput) -> dict[str, Any]:
    """OpenAI's usage block; cached tokens are the request's resume point (prompt tokens it
    took from the prefix cache instead of computing them)."""
    return {
        "prompt_tokens": len(out.prompt_token_ids),
        "completion_tokens": len(out.token_ids),
        "total_tokens": len(out.prompt_token_ids) + len(out.token_ids),
        "prompt_tokens_details": {"cached_tokens": out.hit_tokens},
        "cached_tokens": out.hit_tokens,
    }


# ---------------------------------------------------------------------------------- command
def served_model_name(args: argparse.Namespace) -> str:
    """`--served-model-name`, else the model's last path component (never a full path)."""
    return args.served_model_name or Path(str(args.model).rstrip("/")).name or str(args.model)


def build_llm(args: argparse.Namespace) -> LLM:
    return llm_from_args(args)


def run_serve(args: argparse.Namespace) -> int:
    """Build the engine and serve it until interrupted; 2 if the engine cannot be built."""
    try:
        llm = build_llm(args)
    except (ValueError, FileNotFoundError, KeyError) as e:
        print(f"hycache serve: {e}", file=sys.stderr)
        return 2
    try:
        template = None
        if args.chat_template is not None or Path(args.model).is_dir():
            template = load_chat_template(args.model, args.chat_template)
    except ChatTemplateError as e:
        print(f"hycache serve: {e}", file=sys.stderr)
        return 2
    app = create_app(
        llm,
        model_name=served_model_name(args),
        chat_template=template,
        api_key=args.api_key,
        loopback_only=is_loopback(args.host),  # the default: guard against DNS rebinding
    )
    # At shutdown the worker is drained first; a handler still busy after the grace period is
    # cancelled (aborting its request), then the lifespan stops the worker thread.
    config = uvicorn.Config(
        app, host=args.host, port=args.port, log_level="info", timeout_graceful_shutdown=5
    )
    server = HycacheServer(config, app.state.worker)
    with contextlib.suppress(KeyboardInterrupt):
        server.run()
    return 0 if server.started else 1


if __name__ == "__main__":  # pragma: no cover
    parser = argparse.ArgumentParser(prog="hycache serve")
    add_serve_args(parser)
    sys.exit(run_serve(parser.parse_args()))


__all__ = [
    "CHAT_UNSUPPORTED_FIELDS",
    "UNSUPPORTED_FIELDS",
    "ApiKeyMiddleware",
    "ChatBody",
    "CompletionBody",
    "EngineWorker",
    "HycacheServer",
    "ServerClosed",
    "add_serve_args",
    "build_llm",
    "create_app",
    "error_response",
    "run_serve",
]
