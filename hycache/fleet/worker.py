"""One hycache engine as an NVIDIA Dynamo token-in worker (`hycache fleet worker`).

The engine runs on `hycache.server.worker.EngineWorker`'s thread, as under `hycache serve`;
this module only translates. Dynamo's request (a `PreprocessedRequest`: `token_ids`,
`stop_conditions`, `sampling_options`) becomes an engine request; the engine's stream events
become Dynamo's `LLMEngineOutput` chunks: `{"token_ids": [...]}`, the last one with
`finish_reason` ("stop", "length") and `completion_usage` whose
`prompt_tokens_details.cached_tokens` is the engine's hit (the tokens it did not compute).

Endpoints, all on the component `NS.COMP` (`NS.COMP.generate` is the one registered with the
frontend, `ModelInput.Tokens`, chat and completions, `kv_cache_block_size` = the engine's
prefix-match unit, so the router's blocks are hycache's units):

    generate      stream one request
    resume_point  {"token_ids": [...]} -> {"resume_point": tokens, "running", "waiting"}:
                  where this engine's own lookup would resume the request, and its load
                  (what `hycache.fleet.router` scores)

KV events (`--events`): the engine's own (`LLM.kv_events`, published over a ZMQ PUB on the
loopback in vLLM's framing by `hycache.engine.kv_events.publish_kv_events`, on the "dynamo"
wire of `hycache.cache.events.encode_batch`: the three fields Dynamo decodes), relayed into
Dynamo's event plane by its `KvEventPublisher`. `resumable`: the router's blocks are the
prefix-match unit `u`, its matched depth the resume point. `full`: vLLM's per-group events
(blocks of `B`); Dynamo indexes the attention group alone, as it does for a vLLM hybrid.

Cancellation: a request whose context is stopped or killed (the client went away) is aborted
in the engine at once. SIGTERM / SIGINT: `runtime.shutdown()`, which takes the instance out of
discovery before the process ends (no stale instance for the router).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from hycache.cache.event_log import EventMode
from hycache.engine.engine import LLM
from hycache.engine.kv_events import ZmqEventPublisher, publish_kv_events, stop_publishing
from hycache.engine.outputs import RequestOutput, StreamEvent
from hycache.fleet.card import write_card
from hycache.fleet.launch import LOOPBACK
from hycache.request import SamplingParams
from hycache.server.worker import Accepted, EngineWorker, Failed, ServerClosed

log = logging.getLogger("hycache.fleet")

# hycache's finish reasons -> Dynamo's (`FinishReason`: eos, length, stop, error, cancelled)
FINISH_REASONS = {"stop": "stop", "length": "length", "abort": "cancelled", "error": "error"}


@dataclass(frozen=True)
class WorkerSettings:
    """Where the worker registers: `namespace.component.generate`, as model `model_name`
    (None: don't register with the frontend; the exact router forwards to it)."""

    namespace: str = "hycache"
    component: str = "worker"
    model_name: str | None = "tiny"
    card_dir: str | None = None  # where a preset's card is written (`card.write_card`)
    events: str = "resumable"  # the KV events published for Dynamo's router (or "none")


def sampling_params(request: dict[str, Any]) -> SamplingParams:
    """The engine's sampling of a Dynamo `PreprocessedRequest` (ValueError when refused)."""
    stop = request.get("stop_conditions") or {}
    sampling = request.get("sampling_options") or {}
    kw: dict[str, Any] = {}
    if stop.get("max_tokens") is not None:
        kw["max_tokens"] = int(stop["max_tokens"])
    if stop.get("ignore_eos"):
        kw["ignore_eos"] = True
    hidden = [*(stop.get("stop_token_ids_hidden") or ()), *(stop.get("stop_token_ids") or ())]
    if hidden:
        kw["stop_token_ids"] = tuple(int(t) for t in hidden)
    for name in ("temperature", "top_p", "seed"):
        if sampling.get(name) is not None:
            kw[name] = sampling[name]
    for name in ("presence_penalty", "frequency_penalty", "repetition_penalty"):
        if sampling.get(name) is not None:
            kw[name] = float(sampling[name])
    return SamplingParams(**kw)


def usage(output: RequestOutput) -> dict[str, Any]:
    """Dynamo's `completion_usage` of a finished request (the frontend's OpenAI `usage`)."""
    prompt, completion = len(output.prompt_token_ids), len(output.token_ids)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": output.hit_tokens},
    }


def last_chunk(event: StreamEvent) -> dict[str, Any]:
    """The final `LLMEngineOutput` of a request: its last tokens, why it ended, its usage,
    and the hit in Dynamo's `engine_data.kv_cache_hit` (what its router observes)."""
    out = event.output
    assert out is not None
    return {
        "token_ids": list(event.new_token_ids),
        "index": 0,
        "finish_reason": FINISH_REASONS.get(out.finish_reason or "", "stop"),
        "completion_usage": usage(out),
        "engine_data": {
            "kv_cache_hit": {
                "prompt_tokens": len(out.prompt_token_ids),
                "reused_tokens": out.hit_tokens,
            }
        },
    }


class DynamoHandlers:
    """The endpoint handlers over one `EngineWorker` (which owns the engine's thread)."""

    def __init__(self, worker: EngineWorker, resume_point: Callable[[LLM, list[int]], int]):
        self.worker = worker
        self.resume_point_of = resume_point

    async def generate(self, request: dict[str, Any], context: Any) -> AsyncIterator[dict]:
        token_ids = [int(t) for t in request["token_ids"]]
        params = sampling_params(request)
        rid = f"{context.id() or 'req'}-{uuid.uuid4().hex[:8]}"
        try:
            q = self.worker.submit(rid, token_ids, params)
        except ServerClosed as e:
            raise RuntimeError(f"hycache worker: {e}") from e
        first = await q.get()
        if isinstance(first, Failed):
            raise RuntimeError(f"hycache worker: {first.message}")
        assert isinstance(first, Accepted)
        stopped = asyncio.ensure_future(context.async_killed_or_stopped())
        finished = False
        try:
            while True:
                get = asyncio.ensure_future(q.get())
                await asyncio.wait({get, stopped}, return_when=asyncio.FIRST_COMPLETED)
                if not get.done():  # the client went away: end it in the engine
                    get.cancel()
                    log.warning("hycache fleet worker: %s aborted, client gone", rid)
                    return
                item = get.result()
                if isinstance(item, Failed):
                    raise RuntimeError(f"hycache worker: {item.message}")
                if item.finished:
                    finished = True
                    yield last_chunk(item)
                    return
                if item.new_token_ids:
                    yield {"token_ids": list(item.new_token_ids), "index": 0}
        finally:
            stopped.cancel()
            if not finished:
                self.worker.abort(rid)

    async def resume_point(self, request: dict[str, Any], context: Any) -> AsyncIterator[dict]:
        ids = [int(t) for t in request["token_ids"]]

        def ask(llm: LLM) -> dict[str, int]:
            return {
                "resume_point": self.resume_point_of(llm, ids),
                "running": len(llm.scheduler.running),
                "waiting": len(llm.scheduler.waiting),
            }

        yield await asyncio.wrap_future(self.worker.call(ask))


def router_block_size(llm: LLM, events: str) -> int:
    """The block size the router must use for this worker: the unit its `resumable` events
    publish (`u`), or the attention block `B` of vLLM-style `full` events."""
    cache = llm.config.cache
    return cache.block_size if events == "full" else cache.unit


def start_events(worker: EngineWorker, endpoint: Any, mode: str, block_size: int) -> Any:
    """Publish the engine's KV events in `mode` on a loopback ZMQ PUB, encoded for Dynamo's
    decoder (`publish_kv_events(..., wire="dynamo")`), and relay them into Dynamo's event plane;
    (the publisher, the relay), or None for mode "none"."""
    if mode == "none":
        return None
    from dynamo.llm import KvEventPublisher

    def publish(llm: LLM) -> ZmqEventPublisher:
        return publish_kv_events(llm, f"tcp://{LOOPBACK}:*", cast(EventMode, mode), wire="dynamo")

    publisher = worker.call(publish).result()
    relay = KvEventPublisher(
        endpoint, kv_block_size=block_size, zmq_endpoint=publisher.bound_endpoint, zmq_topic=""
    )
    return publisher, relay


def stop_events(worker: EngineWorker, events: Any) -> None:
    if events is None:
        return
    publisher, relay = events
    relay.shutdown()
    with contextlib.suppress(ServerClosed):
        worker.call(lambda llm: stop_publishing(llm, publisher)).result(timeout=30)


def engine_resume_point(llm: LLM, token_ids: list[int]) -> int:
    """Where `llm` would resume `token_ids` now: the engine's own lookup
    (`LLM.resume_point`), nothing recomputed here."""
    return int(llm.resume_point(token_ids))


def dynamo_env_runtime(loop: asyncio.AbstractEventLoop) -> Any:
    """A `DistributedRuntime` configured from the environment (`DYN_DISCOVERY_BACKEND`,
    `DYN_REQUEST_PLANE`, `DYN_EVENT_PLANE`; see `hycache.fleet.launch.dynamo_env`)."""
    import os

    from dynamo.runtime import DistributedRuntime

    return DistributedRuntime(
        loop,
        os.environ.get("DYN_DISCOVERY_BACKEND", "file"),
        os.environ.get("DYN_REQUEST_PLANE", "tcp"),
        event_plane=os.environ.get("DYN_EVENT_PLANE", "nats"),
    )


def on_signals(loop: asyncio.AbstractEventLoop, stop: Callable[[], None]) -> None:
    """SIGTERM and SIGINT call `stop` once (the runtime's shutdown: discovery forgets us)."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop)


async def serve_worker(llm: LLM, model: str, settings: WorkerSettings) -> None:
    """Register `llm` with Dynamo and serve it until SIGTERM / SIGINT."""
    from dynamo.llm import ModelInput, ModelType, WorkerType, register_model

    loop = asyncio.get_running_loop()
    runtime = dynamo_env_runtime(loop)
    on_signals(loop, runtime.shutdown)
    worker = EngineWorker(llm)
    worker.start()
    handlers = DynamoHandlers(worker, engine_resume_point)
    ns, comp = settings.namespace, settings.component
    generate = runtime.endpoint(f"{ns}.{comp}.generate")
    resume = runtime.endpoint(f"{ns}.{comp}.resume_point")
    unit = router_block_size(llm, settings.events)
    events = start_events(worker, generate, settings.events, unit)
    if settings.model_name is not None:
        card = write_card(model, Path(settings.card_dir) if settings.card_dir else None)
        await register_model(
            ModelInput.Tokens,
            ModelType.Chat | ModelType.Completions,
            generate,
            str(card),
            settings.model_name,
            worker_type=WorkerType.Aggregated,
            kv_cache_block_size=unit,
        )
    log.warning(
        "hycache fleet worker ready: %s.%s instance %x, block %d, events %s",
        ns,
        comp,
        generate.connection_id(),
        unit,
        settings.events,
    )
    try:
        await asyncio.gather(
            generate.serve_endpoint(handlers.generate, graceful_shutdown=False),
            resume.serve_endpoint(handlers.resume_point, graceful_shutdown=False),
        )
    finally:
        with contextlib.suppress(Exception):
            stop_events(worker, events)
            worker.stop()
    log.warning("hycache fleet worker stopped")
