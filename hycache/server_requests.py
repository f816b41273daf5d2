"""The HTTP side of running one request of `hycache serve`: reading its body (capped),
submitting its choices to the engine worker, and answering with their outputs, whole or
streamed as server-sent events.

`RequestRunner` ties a handler to the `EngineWorker`: whenever the client goes away first
(a hang-up while waiting, a closed stream, a cancelled handler), the unfinished engine
requests are aborted so that no work is done for nobody.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

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


__all__ = ["Chunks", "RequestRunner", "read_body"]
