"""The HTTP side of running one request of `hycache serve`: reading its body (capped),
submitting its choices to the engine worker, and answering with their outputs, whole or
streamed as server-sent events.

`RequestRunner` ties a handler to the `EngineWorker`: whenever the client goes away first
(a hang-up while waiting, a closed stream, a cancelled handler), the unfinished engine
requests are aborted so that no work is done for nobody.

`PromptPrep` turns text into token ids before anything reaches the engine: text longer than
could ever fit `max_model_len` is refused by its length alone, before any work, and rendering
and tokenizing run on a small thread pool of their own, never on the event loop (which would
freeze every other client) nor on the engine thread (which would freeze every stream).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from hycache.chat import ChatEncoder, ChatTemplate
from hycache.engine.engine import RequestOutput, StreamEvent
from hycache.metrics import RequestTimer, ServerMetrics
from hycache.protocol import error_response
from hycache.request import SamplingParams
from hycache.responses import Tail, sse
from hycache.server_engine import EngineWorker, Failed, Item, ServerClosed

# the chunks to stream for one engine event of the choice with this index
Chunks = Callable[[int, StreamEvent], list[dict[str, Any]]]


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


def longest_token_chars(tokenizer: Any) -> int:
    """The most characters one token of `tokenizer` stands for (at least 1), from its vocabulary
    (byte-level and metaspace vocabularies spell each byte or space as one character)."""
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    return max((len(t) for t in vocab), default=1) or 1


def text_chars(value: Any) -> int:
    """The characters in every string inside `value` (chat messages: contents, names, ...)."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(text_chars(v) for v in value.values())
    if isinstance(value, list):
        return sum(text_chars(v) for v in value)
    return 0


class PromptPrep:
    """Text prompts and chat messages -> token ids, off the event loop and the engine thread.

    `max_chars` = `max_model_len` x the longest token's characters: a text over it tokenizes
    to more than `max_model_len` tokens whatever it holds, so it is refused (ValueError) at
    once. `workers` threads render and tokenize (the tokenizer releases the GIL while it
    encodes)."""

    def __init__(
        self,
        tokenizer: Any,
        max_model_len: int,
        template: ChatTemplate | None = None,
        workers: int = 2,
    ) -> None:
        self.tokenizer = tokenizer
        self.max_chars = max_model_len * longest_token_chars(tokenizer) if tokenizer else 0
        self.max_model_len = max_model_len
        self.encoder = ChatEncoder(template, tokenizer) if template and tokenizer else None
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="hycache-prompt")

    def check_length(self, chars: int, what: str) -> None:
        if chars > self.max_chars:
            raise ValueError(
                f"{what}: {chars:,} characters cannot fit max_model_len {self.max_model_len} "
                f"(at most {self.max_chars:,} characters)"
            )

    async def _run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    async def text(self, prompt: str, add_special_tokens: bool = True) -> list[int]:
        """The token ids of a text prompt (ValueError: no tokenizer, or too long)."""
        if self.tokenizer is None:
            raise ValueError("prompt: this model has no tokenizer.json; pass token ids instead")
        self.check_length(len(prompt), "prompt")

        def encode() -> list[int]:
            return list(self.tokenizer.encode(prompt, add_special_tokens=add_special_tokens).ids)

        ids: list[int] = await self._run(encode)
        return ids

    async def chat(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True
    ) -> tuple[list[int], int]:
        """(token ids, prefix hint) of chat messages (ValueError: too long, or the template
        refused them)."""
        assert self.encoder is not None
        self.check_length(text_chars(messages), "messages")
        encode = self.encoder.encode
        result: tuple[list[int], int] = await self._run(encode, messages, add_generation_prompt)
        return result

    async def decode(self, ids: list[int]) -> str:
        assert self.tokenizer is not None
        text: str = await self._run(self.tokenizer.decode, ids)
        return text

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


__all__ = ["Chunks", "PromptPrep", "RequestRunner", "read_body", "text_chars"]
