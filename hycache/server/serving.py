"""The path every generation request of `hycache serve` takes: parse the body -> engine
requests -> a streamed or a whole response.

- `ServerContext`: what the routes share (the engine worker, prompt preparation, metrics, the
  served name), kept on `app.state.ctx`.
- `read_body` / `parse_body`: the body, capped at `ServerContext.max_body_bytes` (what a request
  that fits `max_model_len` needs, at most `MAX_BODY_BYTES`; 413) and validated against
  its pydantic model and the OpenAI fields hycache refuses (400).
- `RequestRunner` ties a handler to the `EngineWorker`: whenever the client goes away first
  (a hang-up while waiting, a closed stream, a cancelled handler), the unfinished engine
  requests are aborted so that no work is done for nobody.
- `OpenAIServing`: the template method both generation routes run (in the manner of SGLang's
  `serving_base` and vLLM's `OpenAIServing`). A subclass names its `Route` (body, refused
  fields, id prefix, object names) and says only how a body becomes engine requests
  (`prepare`) and how a choice is shaped (`content`, `format_logprobs`, `head`); ids,
  envelopes (`Reply`), fan-out, streaming, usage and errors are shared.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.requests import ClientDisconnect

from hycache.engine.engine import LLM
from hycache.engine.outputs import EngineSnapshot, RequestOutput, StreamEvent
from hycache.request import SamplingParams, TokenLogprob
from hycache.server.metrics import RequestTimer, ServerMetrics
from hycache.server.prompts import PromptPrep
from hycache.server.protocol import (
    GenerationBody,
    error_response,
    refuse_unsupported,
    validation_message,
)
from hycache.server.responses import (
    Decode,
    LogprobFormatter,
    Tail,
    TextDelta,
    TokenBytes,
    sse,
    usage,
)
from hycache.server.worker import EngineWorker, Failed, Item, ServerClosed, fan_out

MAX_BODY_BYTES = 8 * 2**20  # a request body; a 128k-token prompt as JSON ids is about 1 MB
# beyond what the prompt needs, what a body may hold: sampling fields, 256 stop ids, 300
# logit_bias entries, chat message framing
BODY_BASE_BYTES = 256 * 2**10
PARSE_OFF_LOOP_BYTES = 256 * 2**10  # a body this large is parsed on a worker thread

# the chunks to stream for one engine event of the choice with this index
Chunks = Callable[[int, StreamEvent], list[dict[str, Any]]]


@dataclass
class ServerContext:
    """What every route shares; only `worker` touches `llm` while the app runs (the others
    read its configuration and tokenizer)."""

    llm: LLM
    worker: EngineWorker
    metrics: ServerMetrics
    prep: PromptPrep
    model_name: str
    started: int = field(default_factory=lambda: int(time.time()))
    counter: itertools.count[int] = field(default_factory=itertools.count)
    runner: RequestRunner = field(init=False)

    def __post_init__(self) -> None:
        self.runner = RequestRunner(self.worker, self.metrics)

    @property
    def decode(self) -> Decode | None:
        return self.llm.decode if self.llm.tokenizer is not None else None

    @functools.cached_property
    def token_bytes(self) -> TokenBytes | None:
        return TokenBytes(self.llm.tokenizer) if self.llm.tokenizer is not None else None

    @property
    def tiered(self) -> bool:
        """Usage carries `store_cached_tokens` (the engine has a second tier)."""
        return self.llm.store is not None

    @property
    def max_model_len(self) -> int:
        return self.llm.config.cache.max_model_len

    @functools.cached_property
    def max_body_bytes(self) -> int:
        """The largest body any request that fits `max_model_len` needs: `BODY_BASE_BYTES` plus
        the prompt written as JSON (16 bytes an id, or 6 bytes a character of the longest text
        that could fit: a `\\uXXXX` escape), at most `MAX_BODY_BYTES`. Anything larger is
        refused (413) by its `Content-Length`, before it is read or parsed: parsing megabytes
        of ids holds the interpreter lock, which the engine thread needs too."""
        prompt = max(16 * self.max_model_len, 6 * self.prep.max_chars)
        return min(MAX_BODY_BYTES, BODY_BASE_BYTES + prompt)

    def check_request(self, prompt: Sequence[int], params: SamplingParams) -> None:
        """What the engine would refuse, refused here, in the handler (ValueError): a prompt
        that cannot fit `max_model_len` with its `max_tokens` (checked by its length first, so a
        huge one costs nothing more), ids outside the vocabulary (prompt, stop_token_ids,
        logit_bias). The engine thread then never spends a moment on a refused request."""
        max_len = self.max_model_len
        vocab = self.llm.model_config.vocab_size
        if not prompt:
            raise ValueError("prompt: empty prompt")
        if len(prompt) + params.max_tokens > max_len:
            raise ValueError(
                f"prompt: {len(prompt)} prompt tokens + max_tokens {params.max_tokens} exceed "
                f"max_model_len {max_len}"
            )
        for what, ids in (
            ("prompt", prompt),
            ("stop_token_ids", params.stop_token_ids),
            ("logit_bias", [t for t, _ in params.logit_bias]),
        ):
            if ids and not (min(ids) >= 0 and max(ids) < vocab):
                bad = next(t for t in ids if not 0 <= t < vocab)
                raise ValueError(f"{what}: token id {bad} is outside the vocabulary [0, {vocab})")


def context(request: Request) -> ServerContext:
    """The app's `ServerContext` (`create_app` puts it on `app.state.ctx`)."""
    ctx: ServerContext = request.app.state.ctx
    return ctx


async def snapshot(ctx: ServerContext) -> EngineSnapshot | JSONResponse:
    """The engine's counters, read on the worker thread (503 once it has stopped)."""
    try:
        taken: EngineSnapshot = await asyncio.wrap_future(ctx.worker.call(LLM.snapshot))
    except ServerClosed as e:
        return error_response(503, str(e))
    return taken


async def read_request(request: Request) -> bytes | Response:
    """The raw body, or an error response (499: the client left; 413: larger than
    `ServerContext.max_body_bytes`)."""
    ctx = context(request)
    limit = ctx.max_body_bytes
    try:
        raw = await read_body(request, limit)
    except ClientDisconnect:  # gone mid-body (or closed for sending it too slowly)
        return Response(status_code=499)
    if raw is None:
        response = error_response(
            413,
            f"request body over {limit:,} bytes, more than any request that fits "
            f"max_model_len {ctx.max_model_len} needs",
        )
        response.headers["connection"] = "close"  # the rest of the body is never read
        return response
    return raw


M = TypeVar("M")


async def parse_body(
    request: Request, fields: dict[str, Any], model: type[M], raw: bytes | None = None
) -> M | Response:
    """The validated body (of `raw`, else read now), or an error response. The JSON is parsed
    once, by pydantic (which refuses nesting deeper than 200 and invalid UTF-8); a large body
    is parsed on a worker thread."""
    if raw is None:
        read = await read_request(request)
        if isinstance(read, Response):
            return read
        raw = read
    try:
        if len(raw) > PARSE_OFF_LOOP_BYTES:
            body = await asyncio.to_thread(model.model_validate_json, raw)  # type: ignore[attr-defined]
        else:
            body = model.model_validate_json(raw)  # type: ignore[attr-defined]
        refuse_unsupported(body.model_extra or {}, fields)
        return body  # type: ignore[no-any-return]
    except ValidationError as e:
        return error_response(400, validation_message(e))
    except (ValueError, RecursionError) as e:
        return error_response(400, str(e) if isinstance(e, ValueError) else "JSON nested too deep")


async def read_body(request: Request, limit: int) -> bytes | None:
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
    items: asyncio.Queue[Item], count: int, timer: RequestTimer
) -> dict[str, RequestOutput] | Failed:
    """The final output of each of `count` engine requests, by request id (or the failure)."""
    outputs: dict[str, RequestOutput] = {}
    while len(outputs) < count:
        item = await items.get()
        if isinstance(item, Failed):
            return item
        if isinstance(item, StreamEvent):
            timer.tokens(len(item.new_token_ids))
            if item.finished and item.output is not None:
                outputs[item.request_id] = item.output
    return outputs


class RequestRunner:
    """Submits requests to `worker` and turns what comes back into HTTP answers, recording
    finished outputs in `metrics`."""

    def __init__(self, worker: EngineWorker, metrics: ServerMetrics) -> None:
        self.worker = worker
        self.metrics = metrics

    async def submit(
        self,
        requests: list[tuple[str, SamplingParams]],
        prompt: str | list[int],
        hints: Sequence[int],
        salt: str | None,
        stop: Sequence[str],
    ) -> asyncio.Queue[Item] | Response:
        """Queue the choices' engine requests; their item queue once the engine accepted them,
        else the error response."""
        if stop and self.worker.llm.tokenizer is None:
            return error_response(
                400, "stop: stop strings need a tokenizer (tokenizer.json); use stop_token_ids"
            )
        try:
            items = self.worker.submit_many(requests, prompt, hints, salt, stop)
        except ServerClosed as e:
            return error_response(503, str(e))
        try:
            first = await items.get()
        except BaseException:  # cancelled before the engine answered
            self.worker.abort(*(rid for rid, _ in requests))
            raise
        if isinstance(first, Failed):
            return error_response(first.status, first.message)
        return items

    async def results(
        self, request: Request, ids: list[str], items: asyncio.Queue[Item], timer: RequestTimer
    ) -> list[RequestOutput] | Response:
        """Every choice's whole output, in `ids` order; they are aborted if the client hangs
        up first (499)."""
        collect = asyncio.ensure_future(_collect(items, len(ids), timer))
        disconnect = asyncio.ensure_future(_wait_for_disconnect(request))
        try:
            await asyncio.wait({collect, disconnect}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            disconnect.cancel()
            if not collect.done():  # client gone (or we were cancelled): free the engine
                collect.cancel()
                self.worker.abort(*ids)
        if not collect.done() or collect.cancelled():
            return Response(status_code=499)  # nobody is left to read it
        result = collect.result()
        if isinstance(result, Failed):
            return error_response(result.status, result.message)
        for out in result.values():
            self.metrics.finished(out)
        return [result[rid] for rid in ids]

    def stream(
        self,
        ids: list[str],
        items: asyncio.Queue[Item],
        timer: RequestTimer,
        chunks: Chunks,
        head: Sequence[dict[str, Any]] = (),
        tail: Tail | None = None,
    ) -> StreamingResponse:
        """An SSE response: `head`, then `chunks(choice index, event)` per engine event, then,
        once every choice has finished, `tail(outputs)` and `[DONE]`."""
        return StreamingResponse(
            self._events(ids, items, timer, chunks, head, tail),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    async def _events(
        self,
        ids: list[str],
        items: asyncio.Queue[Item],
        timer: RequestTimer,
        chunks: Chunks,
        head: Sequence[dict[str, Any]],
        tail: Tail | None,
    ) -> AsyncIterator[str]:
        """If the client goes away (the generator is cancelled or closed early), the unfinished
        choices are aborted in the engine."""
        index = {rid: i for i, rid in enumerate(ids)}
        outputs: dict[str, RequestOutput] = {}
        failed = False
        try:
            for chunk in head:
                yield sse(chunk)
            while len(outputs) < len(ids):
                item = await items.get()
                if isinstance(item, Failed):
                    failed = True  # the worker already ended every choice
                    yield sse({"error": {"message": item.message, "code": item.status}})
                    break
                if not isinstance(item, StreamEvent):
                    continue
                timer.tokens(len(item.new_token_ids))
                for chunk in chunks(index[item.request_id], item):
                    yield sse(chunk)
                if item.finished and item.output is not None:
                    outputs[item.request_id] = item.output
                    self.metrics.finished(item.output)
            if not failed and tail is not None:
                for chunk in tail([outputs[rid] for rid in ids]):
                    yield sse(chunk)
            yield "data: [DONE]\n\n"
        finally:
            unfinished = [rid for rid in ids if rid not in outputs]
            if unfinished and not failed:
                self.worker.abort(*unfinished)


@dataclass(frozen=True)
class Prepared:
    """A body turned into what the engine takes: the prompt, its prefix hints and the sampling
    parameters of every choice."""

    prompt: str | list[int]
    hints: Sequence[int]
    params: SamplingParams


@dataclass(frozen=True)
class Route:
    """What names one generation route: its body, the OpenAI fields it refuses, its ids'
    prefix, the `object` of a whole response and of a streamed chunk, and whether each
    choice's last chunk carries that choice's usage."""

    body: type[GenerationBody]
    unsupported: dict[str, Any]
    id_prefix: str
    whole_object: str
    chunk_object: str
    choice_usage: bool = False


B = TypeVar("B", bound=GenerationBody)


class OpenAIServing(ABC, Generic[B]):
    """One generation route: `handle` parses the body, fans its choices out to the engine and
    answers whole or streamed; subclasses name their `route` and fill in the hooks."""

    route: ClassVar[Route]

    def __init__(self, ctx: ServerContext) -> None:
        self.ctx = ctx

    # -- hooks ---------------------------------------------------------------------------------

    def unavailable(self) -> Response | None:
        """An error response when this route cannot serve at all (checked after parsing)."""
        return None

    @abstractmethod
    async def prepare(self, body: B) -> Prepared:
        """The engine's inputs of `body` (ValueError: a 400)."""

    @abstractmethod
    def content(self, text: str | None, streamed: bool) -> dict[str, Any]:
        """A choice's text, as this route's choices carry it."""

    @abstractmethod
    def format_logprobs(self, reply: Reply, i: int, logprobs: list[TokenLogprob]) -> Any:
        """Choice `i`'s logprobs (of a chunk while `reply.streamed`, else of its whole output)."""

    def head(self, reply: Reply, n: int) -> list[dict[str, Any]]:
        """Chunks a stream begins with."""
        return []

    # -- the template --------------------------------------------------------------------------

    async def handle(self, request: Request) -> Response:
        arrival = time.monotonic()
        route = self.route
        body: Any = await parse_body(request, route.unsupported, route.body)
        if isinstance(body, Response):
            return body
        refused = self.unavailable()
        if refused is not None:
            return refused
        ctx = self.ctx
        try:
            prepared = await self.prepare(body)
            if not isinstance(prepared.prompt, str):
                ctx.check_request(prepared.prompt, prepared.params)
        except ValueError as e:  # ChatTemplateError included
            return error_response(400, str(e))
        request_id = f"{route.id_prefix}-{uuid.uuid4().hex[:16]}-{next(ctx.counter)}"
        created = int(time.time())
        requests = fan_out(request_id, prepared.params, body.n)
        ids = [rid for rid, _ in requests]
        stop = body.stop_strings
        runner = ctx.runner
        items = await runner.submit(
            requests, prepared.prompt, prepared.hints, body.cache_salt, stop
        )
        if isinstance(items, Response):
            return items
        timer = ctx.metrics.timer(arrival)
        reply = Reply(self, request_id, created, LogprobFormatter(ctx.decode, ctx.token_bytes))
        if body.stream:
            reply.start_stream(len(ids), stop)
            tail = reply.usage_tail if body.include_usage else None
            return runner.stream(ids, items, timer, reply.chunks, self.head(reply, len(ids)), tail)
        results = await runner.results(request, ids, items, timer)
        if isinstance(results, Response):
            return results
        return JSONResponse(reply.whole(results))


class Reply:
    """The response to one request of `serving`: its envelope, and per choice the text and
    logprob offsets streamed so far."""

    def __init__(
        self, serving: OpenAIServing[Any], request_id: str, created: int, fmt: LogprobFormatter
    ) -> None:
        self.serving = serving
        self.request_id = request_id
        self.created = created
        self.fmt = fmt
        self.streamed = False
        self.texts: list[TextDelta] = []
        self.offsets: list[int] = []  # text offset of each choice's next token

    def start_stream(self, n: int, stop: Sequence[str]) -> None:
        self.streamed = True
        self.texts = [TextDelta(self.serving.ctx.decode, stop) for _ in range(n)]
        self.offsets = [0] * n

    def envelope(self, choices: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        route = self.serving.route
        return {
            "id": self.request_id,
            "object": route.chunk_object if self.streamed else route.whole_object,
            "created": self.created,
            "model": self.serving.ctx.model_name,
            "choices": choices or [],
        }

    def choice(
        self,
        i: int,
        text: str | None,
        token_ids: list[int],
        logprobs: list[TokenLogprob] | None,
        finish_reason: str | None,
    ) -> dict[str, Any]:
        return {
            "index": i,
            **self.serving.content(text, self.streamed),
            "token_ids": token_ids,
            "logprobs": (
                self.serving.format_logprobs(self, i, logprobs) if logprobs is not None else None
            ),
            "finish_reason": finish_reason,
        }

    def chunks(self, i: int, event: StreamEvent) -> list[dict[str, Any]]:
        """The chunk of one engine event of choice `i`."""
        out = event.output if event.finished else None
        text = self.texts[i].push(event.new_token_ids, out.text if out else None)
        reason = out.finish_reason if out is not None else None
        chunk = self.envelope(
            [self.choice(i, text, event.new_token_ids, event.new_logprobs, reason)]
        )
        if out is not None and self.serving.route.choice_usage:
            chunk["usage"] = usage([out], self.serving.ctx.tiered)
        return [chunk]

    def usage_tail(self, outputs: list[RequestOutput]) -> list[dict[str, Any]]:
        """`stream_options.include_usage`: a last chunk with no choices and every choice's
        usage."""
        return [
            {**self.envelope(), "choices": [], "usage": usage(outputs, self.serving.ctx.tiered)}
        ]

    def whole(self, results: list[RequestOutput]) -> dict[str, Any]:
        choices = [
            self.choice(i, out.text, out.token_ids, out.logprobs, out.finish_reason)
            for i, out in enumerate(results)
        ]
        return {**self.envelope(choices), "usage": usage(results, self.serving.ctx.tiered)}
