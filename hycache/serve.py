"""`hycache serve`: an OpenAI-like HTTP server over one `LLM`.

This file owns the HTTP app, its routes and the `serve` command. The engine thread lives in
`hycache.server_engine`, submitting, awaiting and streaming a request's choices in
`hycache.server_requests`, request bodies in `hycache.protocol`, and response pieces (usage,
streamed text, logprobs) in `hycache.responses`.

- `create_app`: the FastAPI app (`GET /health`, `POST /v1/completions` and
  `POST /v1/chat/completions` with optional SSE streaming, `GET /v1/models`, `GET /v1/stats`,
  `GET /metrics` in Prometheus text format, see `hycache.metrics`); its lifespan starts the
  engine worker and, on shutdown, stops it and aborts whatever is still unfinished. With an API
  key every `/v1/*` route, vLLM's `/tokenize` and `/detokenize` and the API docs want
  `Authorization: Bearer KEY` (401 otherwise); `/health` and `/metrics` stay open. Every POST
  must be `application/json` (415); on loopback, foreign Hosts and Origins (`null` too) get 403.
- `POST /tokenize` / `POST /detokenize`: vLLM's bodies and answers (a text prompt or chat
  messages -> `{count, max_model_len, tokens, token_strs}`; token ids -> `{prompt}`).
- Text is bounded by length before any work and rendered and tokenized on a thread pool
  (`server_requests.PromptPrep`), never on the event loop or the engine thread; slow clients
  are timed out and connections capped (`server_http`, `--header-timeout`, `--body-timeout`,
  `--max-connections`).
- `HycacheServer`: uvicorn's server, which at shutdown first ends in-flight requests (503) so
  that open streams close instead of holding the shutdown up.
- `add_serve_args` / `run_serve`: the `serve` command's flags and entry point.

Bad input answers HTTP 400 `{"error": {"message", "type", "param", "code"}}` and disturbs no
other request. OpenAI fields hycache does not implement (`echo`, `suffix`, `best_of` other than
`n`; for chat also tools, `response_format`, ...) are refused
with a 400 unless left at their unused value, never answered with other semantics. A body over
`MAX_BODY_BYTES` is refused (413) before it is read whole. Responses name the served model
(`--served-model-name`, else the model path's last component), never a path.

Both generation routes take, as OpenAI and vLLM do:
- `stop`: a string or up to 4; the text ends before the first one (which is not included),
  finish reason "stop", and the engine request is aborted right there. A stream never sends
  text past a stop string. Needs a tokenizer; `stop_token_ids` works without one.
- `n` (up to `protocol.MAX_N`): independent choices, each its own engine request (with a
  `seed`, choice i uses seed + i); usage counts the prompt once and sums the choices'
  completion tokens; streamed chunks carry their choice's `index`.
- `frequency_penalty`, `presence_penalty`, `repetition_penalty`, `logit_bias`, with vLLM's
  semantics (`hycache.engine.sampling.adjust_logits`).
- logprobs (completions: `logprobs: k`; chat: `logprobs: true`, `top_logprobs: k`; k <= 20):
  each output token's log-probability and the k most likely alternatives, computed as
  log_softmax of the model's raw logits (vLLM's default: before temperature and top-p).
- `stream_options.include_usage`: a last chunk with empty `choices` and the usage of all
  choices (completions also put each choice's usage on its last chunk).

Extensions to the OpenAI completions body: `token_ids` in each choice, `stop_token_ids`,
`ignore_eos`, and `prefix_hints` (token counts where the prompt's shared prefixes end, e.g. the
end of a system prompt: under the `limit` policy the first request of a family already
checkpoints there, so the next one resumes at its limit). `usage.prompt_tokens_details.
cached_tokens` (and, for older clients, `usage.cached_tokens`) is the request's resume point.

Second cache tier (`--kv-store host|mooncake://HOST:PORT`, `--kv-store-gb`): the blocks and SSM
checkpoints the device cache keeps are also written to the store, where they outlive device
eviction (and, on Mooncake, are shared with other servers); a lookup continues there. Then
`usage.prompt_tokens_details.store_cached_tokens` says how many of the cached tokens were loaded
from the store, `/v1/stats` splits `cache.hit_tokens` into `device_hit_tokens` and
`store_hit_tokens` and adds a `store` section (backend, capacity and used bytes, the store's and
the mirror's counters), and `/metrics` adds the `hycache:store_*` counters. A store that fails
(an unreachable Mooncake master) costs hits, never requests: its calls become misses, counted
in `store.stats.errors`. The store is closed when the server shuts down.

Chat: messages are rendered with the checkpoint's chat template (`hycache.chat`; the
`--chat-template` file overrides it) and tokenized without extra special tokens, the message
text as plain text (a special token's string in a message never becomes that token: no forged
turns), the template's markup with its special tokens; a model with no template or no
tokenizer answers 400. The end of the last system message is passed as a prefix
hint, so under `limit` the first chat of a system-prompt family already checkpoints for it.
`max_completion_tokens` (else `max_tokens`, else the room left in `max_model_len`).

Tenants: requests with different `cache_salt` strings never share cache entries, so
`cached_tokens` tells a client nothing about another tenant's prompts. Without a salt the cache
is shared by every client.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import socket
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from hycache.chat import ChatTemplate, ChatTemplateError, load_chat_template
from hycache.cli import args as engine_args
from hycache.cli.args import add_store_args
from hycache.cli.args import build_llm as cli_build_llm
from hycache.engine.engine import LLM, StreamEvent
from hycache.metrics import CONTENT_TYPE, ServerMetrics, engine_snapshot
from hycache.protocol import (
    CHAT_UNSUPPORTED_FIELDS,
    TOKENIZE_CHAT_UNSUPPORTED_FIELDS,
    UNSUPPORTED_FIELDS,
    ApiKeyMiddleware,
    ChatBody,
    CompletionBody,
    DetokenizeBody,
    JsonBodyMiddleware,
    LoopbackGuardMiddleware,
    TokenizeBody,
    TokenizeChatBody,
    error_response,
    has_field,
    is_loopback,
    refuse_unsupported,
    validation_message,
)
from hycache.responses import LogprobFormatter, TextDelta, usage, usage_tail
from hycache.server_engine import EngineWorker, ServerClosed, engine_stats, fan_out
from hycache.server_http import limited_protocol
from hycache.server_requests import PromptPrep, RequestRunner, read_body

MAX_BODY_BYTES = 8 * 2**20  # a request body; a 128k-token prompt as JSON ids is about 1 MB


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
    runner = RequestRunner(worker, metrics)
    decode = llm.decode if llm.tokenizer is not None else None
    prep = PromptPrep(llm.tokenizer, llm.config.cache.max_model_len, chat_template)
    tiered = llm.store is not None  # usage carries `store_cached_tokens`

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
    app.state.worker = worker
    app.state.llm = llm
    app.state.metrics = metrics
    app.add_middleware(JsonBodyMiddleware)  # innermost: after the host and key checks
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
            snapshot = await asyncio.wrap_future(worker.call(engine_stats))
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

    async def _read(request: Request) -> bytes | Response:
        """The raw body, or an error response."""
        try:
            raw = await read_body(request, MAX_BODY_BYTES)
        except ClientDisconnect:  # gone mid-body (or closed for sending it too slowly)
            return Response(status_code=499)
        if raw is None:
            return error_response(413, f"request body over {MAX_BODY_BYTES:,} bytes")
        return raw

    async def _parse(
        request: Request, fields: dict[str, Any], model: type[Any], raw: bytes | None = None
    ) -> Any:
        """The validated body (of `raw`, else read now), or an error response."""
        if raw is None:
            read = await _read(request)
            if isinstance(read, Response):
                return read
            raw = read
        try:
            refuse_unsupported(raw, fields)
            return model.model_validate_json(raw)
        except ValidationError as e:
            return error_response(400, validation_message(e))
        except ValueError as e:
            return error_response(400, str(e))

    def _no_tokenizer() -> JSONResponse:
        return error_response(400, "this model has no tokenizer (tokenizer.json)")

    @app.post("/tokenize", response_model=None)
    async def tokenize(request: Request) -> Response:
        """vLLM's `/tokenize`: a text `prompt`, or chat `messages` rendered and tokenized as
        `/v1/chat/completions` does; `{count, max_model_len, tokens, token_strs}`."""
        raw = await _read(request)
        if isinstance(raw, Response):
            return raw
        chat = has_field(raw, "messages")
        fields = TOKENIZE_CHAT_UNSUPPORTED_FIELDS if chat else {}
        body = await _parse(request, fields, TokenizeChatBody if chat else TokenizeBody, raw)
        if isinstance(body, Response):
            return body
        if llm.tokenizer is None or (chat and prep.encoder is None):
            return (
                _no_tokenizer()
                if llm.tokenizer is None
                else error_response(
                    400, "this model has no chat template; pass --chat-template FILE"
                )
            )
        try:
            if isinstance(body, TokenizeChatBody):
                messages = [m.as_template_input() for m in body.messages]
                ids, _ = await prep.chat(messages, body.add_generation_prompt)
            else:
                ids = await prep.text(body.prompt, body.add_special_tokens)
        except ValueError as e:
            return error_response(400, str(e))
        strs = [llm.tokenizer.id_to_token(t) for t in ids] if body.return_token_strs else None
        return JSONResponse(
            {
                "count": len(ids),
                "max_model_len": llm.config.cache.max_model_len,
                "tokens": ids,
                "token_strs": strs,
            }
        )

    @app.post("/detokenize", response_model=None)
    async def detokenize(request: Request) -> Response:
        """vLLM's `/detokenize`: `{"tokens": [...]}` -> `{"prompt": text}`."""
        body = await _parse(request, {}, DetokenizeBody)
        if isinstance(body, Response):
            return body
        if llm.tokenizer is None:
            return _no_tokenizer()
        vocab = llm.model_config.vocab_size
        bad = next((t for t in body.tokens if not 0 <= t < vocab), None)
        if bad is not None:
            return error_response(400, f"tokens: {bad} is outside the vocabulary [0, {vocab})")
        return JSONResponse({"prompt": await prep.decode(body.tokens)})

    @app.post("/v1/completions", response_model=None)
    async def completions(request: Request) -> Response:
        arrival = time.monotonic()
        body = await _parse(request, UNSUPPORTED_FIELDS, CompletionBody)
        if isinstance(body, Response):
            return body
        try:
            params = body.sampling_params()
            ids_or_text = body.prompt
            if isinstance(ids_or_text, str):  # bounded, then tokenized off the loop and engine
                ids_or_text = await prep.text(ids_or_text)
        except ValueError as e:
            return error_response(400, str(e))
        request_id = f"cmpl-{uuid.uuid4().hex[:16]}-{next(counter)}"
        created = int(time.time())
        requests = fan_out(request_id, params, body.n)
        ids = [rid for rid, _ in requests]
        stop = body.stop_strings
        items = await runner.submit(requests, ids_or_text, body.prefix_hints, body.cache_salt, stop)
        if isinstance(items, Response):
            return items
        timer = metrics.timer(arrival)
        fmt = LogprobFormatter(decode)

        def envelope(choices: list[dict[str, Any]] | None = None) -> dict[str, Any]:
            return {
                "id": request_id,
                "object": "text_completion",
                "created": created,
                "model": model_name,
                "choices": choices or [],
            }

        if body.stream:
            texts = [TextDelta(decode, stop) for _ in ids]
            offsets = [0] * len(ids)  # text offset of each choice's next token

            def chunks(i: int, event: StreamEvent) -> list[dict[str, Any]]:
                out = event.output if event.finished else None
                logprobs = None
                if event.new_logprobs is not None:
                    logprobs = fmt.completion(event.new_logprobs, offsets[i])
                    offsets[i] += sum(len(t) for t in logprobs["tokens"])
                choice = {
                    "index": i,
                    "text": texts[i].push(event.new_token_ids, out.text if out else None),
                    "token_ids": event.new_token_ids,
                    "logprobs": logprobs,
                    "finish_reason": out.finish_reason if out is not None else None,
                }
                chunk = envelope([choice])
                if out is not None:  # this choice's usage (an extension older clients read)
                    chunk["usage"] = usage([out], tiered)
                return [chunk]

            tail = usage_tail(body.include_usage, envelope, tiered)
            return runner.stream(ids, items, timer, chunks, tail=tail)

        results = await runner.results(request, ids, items, timer)
        if isinstance(results, Response):
            return results
        choices = [
            {
                "index": i,
                "text": out.text,
                "token_ids": out.token_ids,
                "logprobs": fmt.completion(out.logprobs) if out.logprobs is not None else None,
                "finish_reason": out.finish_reason,
            }
            for i, out in enumerate(results)
        ]
        return JSONResponse({**envelope(choices), "usage": usage(results, tiered)})

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
            ids, hint = await prep.chat(messages)  # bounded, then off the loop and engine
            default_max = max(llm.config.cache.max_model_len - len(ids), 1)
            params = body.sampling_params(default_max)
        except ValueError as e:  # ChatTemplateError included
            return error_response(400, str(e))
        hints = [hint] if 0 < hint < len(ids) else []
        request_id = f"chatcmpl-{uuid.uuid4().hex[:16]}-{next(counter)}"
        created = int(time.time())
        requests = fan_out(request_id, params, body.n)
        rids = [rid for rid, _ in requests]
        stop = body.stop_strings
        items = await runner.submit(requests, ids, hints, body.cache_salt, stop)
        if isinstance(items, Response):
            return items
        timer = metrics.timer(arrival)
        fmt = LogprobFormatter(decode)

        def envelope(
            choices: list[dict[str, Any]] | None = None, obj: str = "chat.completion.chunk"
        ) -> dict[str, Any]:
            return {
                "id": request_id,
                "object": obj,
                "created": created,
                "model": model_name,
                "choices": choices or [],
            }

        if body.stream:
            deltas = [TextDelta(decode, stop) for _ in rids]
            head = [
                envelope(
                    [
                        {
                            "index": i,
                            "delta": {"role": "assistant", "content": ""},
                            "logprobs": None,
                            "finish_reason": None,
                        }
                    ]
                )
                for i in range(len(rids))
            ]

            def chunks(i: int, event: StreamEvent) -> list[dict[str, Any]]:
                out = event.output if event.finished else None
                lps = event.new_logprobs
                choice = {
                    "index": i,
                    "delta": {
                        "content": deltas[i].push(event.new_token_ids, out.text if out else None)
                    },
                    "token_ids": event.new_token_ids,
                    "logprobs": fmt.chat(lps) if lps is not None else None,
                    "finish_reason": out.finish_reason if out is not None else None,
                }
                return [envelope([choice])]

            tail = usage_tail(body.include_usage, envelope, tiered)
            return runner.stream(rids, items, timer, chunks, head, tail)

        results = await runner.results(request, rids, items, timer)
        if isinstance(results, Response):
            return results
        choices = [
            {
                "index": i,
                "message": {"role": "assistant", "content": out.text},
                "token_ids": out.token_ids,
                "logprobs": fmt.chat(out.logprobs) if out.logprobs is not None else None,
                "finish_reason": out.finish_reason,
            }
            for i, out in enumerate(results)
        ]
        usage_ = usage(results, tiered)
        return JSONResponse({**envelope(choices, "chat.completion"), "usage": usage_})

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


# ---------------------------------------------------------------------------------- command
def served_model_name(args: argparse.Namespace) -> str:
    """`--served-model-name`, else the model's last path component (never a full path)."""
    return args.served_model_name or Path(str(args.model).rstrip("/")).name or str(args.model)


def add_serve_args(p: argparse.ArgumentParser) -> None:
    """The flags of `hycache serve`: the engine's, where to listen, and the second tier."""
    engine_args.add_serve_args(p)
    add_store_args(p)


def build_llm(args: argparse.Namespace) -> LLM:
    """The engine of `args`, with the second tier of `--kv-store` / `--kv-store-gb` (when
    `args` has them)."""
    return cli_build_llm(args)


def server_config(app: FastAPI, args: argparse.Namespace) -> uvicorn.Config:
    """uvicorn's config for `app`: where to listen, and the slow-client limits of
    `--header-timeout`, `--body-timeout` and `--max-connections` (`hycache.server_http`)."""
    protocol = limited_protocol(args.header_timeout, args.body_timeout, args.max_connections)
    return uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level="info",
        timeout_graceful_shutdown=5,
        http=protocol,
    )


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
    config = server_config(app, args)
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
    "MAX_BODY_BYTES",
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
    "served_model_name",
    "server_config",
]
