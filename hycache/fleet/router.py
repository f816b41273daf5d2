"""hycache's exact router (`hycache fleet router`): per request, every worker's own resume
point, plus load.

A router that scores attention depth overcounts a request that leaves a published path between
two SSM states (DESIGN.md §9). This one asks each worker where *its* engine would resume the
request (`resume_point`, the engine's own lookup, see `hycache.fleet.worker`) and sends the
request to the best score:

    score(w) = resume_point(w) - load_weight * in_flight(w)

`in_flight` is what this router sent to `w` and has not seen finish. Ties go round-robin
(a request no worker holds spreads over the fleet). A worker that does not answer is skipped;
one that fails a request before its first token is dropped for that request and the next best
gets it, so a dead worker costs no request while another is alive.

Plugged into Dynamo as the model's one registered worker: the frontend (`--router-mode
round-robin`) sends it every request; it forwards with `Client.direct` to the chosen worker's
`generate`, whose instances register no model of their own (`--served-model-name ''`).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hycache.fleet.card import write_card
from hycache.fleet.worker import dynamo_env_runtime, on_signals

log = logging.getLogger("hycache.fleet")

ASK_TIMEOUT_S = 30.0  # a worker that does not say its resume point in time is skipped


@dataclass(frozen=True)
class RouterSettings:
    namespace: str = "hycache"
    worker_component: str = "worker"
    model: str = "tiny"
    model_name: str = "tiny"
    load_weight: float = 1.0
    unit: int = 16
    card_dir: str | None = None


@dataclass(frozen=True)
class Answer:
    """One worker's answer: where it would resume the request, and this router's in-flight
    count there."""

    worker_id: int
    resume_point: int
    in_flight: int


def ranked(answers: Sequence[Answer], load_weight: float, turn: int) -> list[Answer]:
    """`answers` best first: highest score, then fewest in flight, then round-robin from
    `turn` (answers in the workers' stable order)."""
    n = len(answers)
    order = {a.worker_id: (i - turn) % n for i, a in enumerate(answers)} if n else {}
    return sorted(
        answers,
        key=lambda a: (
            -(a.resume_point - load_weight * a.in_flight),
            a.in_flight,
            order[a.worker_id],
        ),
    )


class ExactRouter:
    """Chooses a worker per request and streams its answer back."""

    def __init__(self, resume_client: Any, generate_client: Any, load_weight: float) -> None:
        self.client = resume_client  # the workers' resume_point endpoint
        self.generate_client = generate_client  # their generate endpoint
        self.load_weight = load_weight
        self.in_flight: dict[int, int] = {}
        self._turn = itertools.count()

    async def _ask(self, worker_id: int, token_ids: list[int]) -> Answer | None:
        try:
            stream = await self.client.direct({"token_ids": token_ids}, worker_id)
            async for item in stream:
                data = item.data() if hasattr(item, "data") else item
                load = self.in_flight.get(worker_id, 0)
                return Answer(worker_id, int(data["resume_point"]), load)
        except Exception as e:  # a dead or stopping worker: skip it for this request
            log.warning("worker %x did not answer: %s", worker_id, e)
        return None

    async def choose(self, token_ids: list[int]) -> list[Answer]:
        """Every answering worker, best first."""
        ids = sorted(self.client.instance_ids())
        asked = [asyncio.wait_for(self._ask(w, token_ids), ASK_TIMEOUT_S) for w in ids]
        got = await asyncio.gather(*asked, return_exceptions=True)
        answers = [a for a in got if isinstance(a, Answer)]
        return ranked(answers, self.load_weight, next(self._turn))

    async def generate(self, request: dict[str, Any], context: Any) -> AsyncIterator[dict]:
        token_ids = [int(t) for t in request["token_ids"]]
        candidates = await self.choose(token_ids)
        if not candidates:
            raise RuntimeError("hycache router: no worker answered")
        for answer in candidates:
            wid = answer.worker_id
            started = False
            self.in_flight[wid] = self.in_flight.get(wid, 0) + 1
            try:
                stream = await self.generate_client.direct(request, wid, context=context)
                async for item in stream:
                    data = item.data() if hasattr(item, "data") else item
                    if not started:
                        started = True
                        log.warning(
                            "hycache route request_id=%s worker_id=%d resume_point=%d",
                            context.id(),
                            wid,
                            answer.resume_point,
                        )
                    yield data
                return
            except Exception as e:
                if started:  # tokens went out already: the frontend's migration takes over
                    raise
                log.warning("worker %x failed before its first token: %s", wid, e)
            finally:
                self.in_flight[wid] -= 1
        raise RuntimeError("hycache router: every worker failed this request")


async def serve_router(settings: RouterSettings) -> None:
    """Register the router as the model's worker and serve it until SIGTERM / SIGINT."""
    from dynamo.llm import ModelInput, ModelType, WorkerType, register_model

    loop = asyncio.get_running_loop()
    runtime = dynamo_env_runtime(loop)
    on_signals(loop, runtime.shutdown)
    ns = settings.namespace
    workers = f"{ns}.{settings.worker_component}"
    resume_client = await runtime.endpoint(f"{workers}.resume_point").client()
    generate_client = await runtime.endpoint(f"{workers}.generate").client()
    await generate_client.wait_for_instances()
    router = ExactRouter(resume_client, generate_client, settings.load_weight)
    endpoint = runtime.endpoint(f"{ns}.router.generate")
    card = write_card(settings.model, Path(settings.card_dir) if settings.card_dir else None)
    await register_model(
        ModelInput.Tokens,
        ModelType.Chat | ModelType.Completions,
        endpoint,
        str(card),
        settings.model_name,
        worker_type=WorkerType.Aggregated,
        kv_cache_block_size=settings.unit,
    )
    log.warning("hycache fleet router ready: %s.router, workers %s", ns, workers)
    await endpoint.serve_endpoint(router.generate, graceful_shutdown=False)
    log.warning("hycache fleet router stopped")
