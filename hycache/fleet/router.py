"""hycache's exact router (`hycache fleet router`): per request, every worker's own resume
point, plus load.

A router that scores attention depth overcounts a request that leaves a published path between
two SSM states (DESIGN.md §9). This one asks a worker where *its* engine would resume the
request (`resume_point`, the engine's own lookup, see `hycache.fleet.worker`) and sends the
request to the best score:

    score(w) = resume_point(w) - load_weight * in_flight(w)

`in_flight` is what this router sent to `w` and has not seen finish. Ties go round-robin
(a request no worker holds spreads over the fleet). A worker that does not answer is skipped;
one that fails a request before its first token is dropped for that request and the next best
gets it, so a dead worker costs no request while another is alive.

Whom it asks (`view`): a question waits for the worker's current engine step (the engine
answers between steps), so asking all of them per request costs the slowest one's step.
With `view="events"` (the default) the workers publish `resumable` events and the router keeps
a per-worker view of them (Dynamo's `KvRouter.get_overlap_scores`, fed by the event plane, no
request to a worker): the published depth bounds the resume point from above (it can only
overcount, where a request leaves a path between two states), so a worker with nothing
published on the request's path resumes at 0 and is not asked; only the workers with a
published unit may be (`by_bound`): the one whose bound is highest first, then the others
only where their bound reaches its exact score. A request no worker holds costs no question at
all; one that continues a session held on one worker (beside a system prompt held on all)
costs one. The view lags the engines by the events' delivery: a prefix cached a moment ago may
be scored 0.
`view="ask-all"` asks every worker (no events needed).

Plugged into Dynamo as the model's one registered worker: the frontend (`--router-mode
round-robin --namespace NS`) sends it every request; it forwards with `Client.direct` to the
chosen worker's `generate`. The workers register the model in a namespace of their own
(`worker_namespace`), out of the frontend's sight: Dynamo's `KvRouter` indexes only workers
with a registered model card (the event view needs them registered), and the frontend,
scoped to the router's namespace, never sends them a request past the router. With
`view="ask-all"` they may register nothing (`--served-model-name ''`).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hycache.fleet.card import write_card
from hycache.fleet.worker import dynamo_env_runtime, on_signals

log = logging.getLogger("hycache.fleet")

ASK_TIMEOUT_S = 30.0  # a worker that does not say its resume point in time is skipped


@dataclass(frozen=True)
class RouterSettings:
    namespace: str = "hycache"  # the router's (the frontend discovers the model there)
    worker_namespace: str | None = None  # the workers' (None: the router's)
    worker_component: str = "worker"
    model: str = "tiny"
    model_name: str = "tiny"
    load_weight: float = 1.0
    unit: int = 16
    card_dir: str | None = None
    view: str = "events"  # whom to ask: see the module docstring


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


def by_bound(
    worker_ids: Sequence[int],
    published: Mapping[int, int],
    in_flight: Mapping[int, int],
    load_weight: float,
) -> list[tuple[int, float]]:
    """The workers with a unit published on the request's path (`published`: worker ->
    published depth, from the events), each with the bound on its score (a resume point never
    exceeds the published depth: `published - load_weight * in_flight`), highest first, stable
    among equals. The others resume at 0."""
    bounds = [
        (w, published[w] - load_weight * in_flight.get(w, 0))
        for w in worker_ids
        if published.get(w, 0) > 0
    ]
    return sorted(bounds, key=lambda wb: -wb[1])


# the published depth (tokens) per worker for a request's tokens; None: ask every worker
PublishedView = Callable[[list[int]], Awaitable[Mapping[int, int]]]


class ExactRouter:
    """Chooses a worker per request and streams its answer back."""

    def __init__(
        self,
        resume_client: Any,
        generate_client: Any,
        load_weight: float,
        published: PublishedView | None = None,
    ) -> None:
        self.client = resume_client  # the workers' resume_point endpoint
        self.generate_client = generate_client  # their generate endpoint
        self.load_weight = load_weight
        self.published = published
        self.in_flight: dict[int, int] = {}
        self.questions = 0  # resume points asked, in all (the log's `asked=`)
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

    def _score(self, a: Answer) -> float:
        return a.resume_point - self.load_weight * a.in_flight

    async def _ask_all(self, ids: Sequence[int], token_ids: list[int]) -> list[Answer]:
        asked = [asyncio.wait_for(self._ask(w, token_ids), ASK_TIMEOUT_S) for w in ids]
        got = await asyncio.gather(*asked, return_exceptions=True)
        self.questions += len(ids)
        return [a for a in got if isinstance(a, Answer)]

    async def _view(self, token_ids: list[int]) -> Mapping[int, int] | None:
        if self.published is None:
            return None
        try:
            return await self.published(token_ids)
        except Exception as e:  # no view (yet): ask everyone
            log.warning("no event view: %s", e)
            return None

    async def choose(self, token_ids: list[int]) -> tuple[list[Answer], int]:
        """The workers best first, and how many were asked. With the event view: the worker
        with the highest score bound is asked first; the others only where their bound
        reaches its exact score (they could beat or tie it); a worker not asked is ranked by
        its bound (below the best), one with nothing published at 0."""
        ids = sorted(self.client.instance_ids())
        before = self.questions
        view = await self._view(token_ids)
        if view is None:
            answers = await self._ask_all(ids, token_ids)
        else:
            order = by_bound(ids, view, self.in_flight, self.load_weight)
            asked: list[int] = []
            exact: dict[int, Answer] = {}
            if order:
                asked = [order[0][0]]
                exact = {a.worker_id: a for a in await self._ask_all(asked, token_ids)}
                best = max((self._score(a) for a in exact.values()), default=-math.inf)
                rest = [w for w, bound in order[1:] if bound >= best]
                exact |= {a.worker_id: a for a in await self._ask_all(rest, token_ids)}
                asked += rest
            answers = [exact[w] for w in ids if w in exact]  # one asked and silent is skipped
            answers += [
                Answer(w, view.get(w, 0), self.in_flight.get(w, 0)) for w in ids if w not in asked
            ]
        answers.sort(key=lambda a: ids.index(a.worker_id))  # the stable order `ranked` turns
        return ranked(answers, self.load_weight, next(self._turn)), self.questions - before

    async def generate(self, request: dict[str, Any], context: Any) -> AsyncIterator[dict]:
        token_ids = [int(t) for t in request["token_ids"]]
        t0 = time.perf_counter()
        candidates, asked = await self.choose(token_ids)
        choose_ms = (time.perf_counter() - t0) * 1e3
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
                            "hycache route request_id=%s worker_id=%d resume_point=%d "
                            "asked=%d choose_ms=%.1f",
                            context.id(),
                            wid,
                            answer.resume_point,
                            asked,
                            choose_ms,
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


async def event_view(endpoint: Any, unit: int) -> PublishedView:
    """The workers' published depth per request, from their `resumable` events: Dynamo's
    `KvRouter` on their endpoint indexes the event plane; `get_overlap_scores` reads its index
    (`device_blocks` of `unit` tokens per worker), asking no worker."""
    from dynamo.llm import KvRouter, KvRouterConfig

    index = KvRouter(endpoint, unit, KvRouterConfig())

    async def published(token_ids: list[int]) -> dict[int, int]:
        return overlap_tokens(await index.get_overlap_scores(token_ids), unit)

    return published


def overlap_tokens(scores: Mapping[str, Any], unit: int) -> dict[int, int]:
    """`KvRouter.get_overlap_scores`' answer as worker id -> published depth in tokens."""
    out: dict[int, int] = {}
    for row in scores.get("workers") or []:
        wid = int(row["worker_id"])
        out[wid] = max(out.get(wid, 0), int(row.get("device_blocks") or 0) * unit)
    return out


async def serve_router(settings: RouterSettings) -> None:
    """Register the router as the model's worker and serve it until SIGTERM / SIGINT."""
    from dynamo.llm import ModelInput, ModelType, WorkerType, register_model

    loop = asyncio.get_running_loop()
    runtime = dynamo_env_runtime(loop)
    on_signals(loop, runtime.shutdown)
    ns = settings.namespace
    workers = f"{settings.worker_namespace or ns}.{settings.worker_component}"
    resume_client = await runtime.endpoint(f"{workers}.resume_point").client()
    generate_client = await runtime.endpoint(f"{workers}.generate").client()
    await generate_client.wait_for_instances()
    published = None
    if settings.view == "events":
        published = await event_view(runtime.endpoint(f"{workers}.generate"), settings.unit)
    router = ExactRouter(resume_client, generate_client, settings.load_weight, published)
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
