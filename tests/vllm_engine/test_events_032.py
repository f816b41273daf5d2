"""The plugin's KV events (`hycache.vllm.events`) from vLLM 0.32's whole engine (issue 44): the
tiny Nemotron-H, with and without its MTP layer, block size 32, `prefix_match_unit` 16,
`hycache.vllm.SyncScheduler` and `--additional-config '{"hycache": {"kv_events": ...}}'`
(`resumable`, and `full` read through its resumable tail), publishing through vLLM's own ZMQ
publisher (`kv_events_config`, `publisher="zmq"`, bound on an `ipc://` endpoint in the test's
temporary directory) to the test's SUB socket. One request at a time; before each, every batch
published so far (received in sequence, none missing) is replayed into a router's tree
(`EventTree`) and its depth for the prompt set against the `num_cached_tokens` the engine then
reports: never below, and equal for a request that continues a published path (chat turns:
each the previous turn's whole sequence and more, DESIGN §9)."""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

from hycache.bench.vllm.tiny_model import write
from hycache.cache.events import BlockStored, KVEventBatch, decode_batch
from tests.helpers import EventTree
from tests.vllm_engine.engines import arm_options, tiny_llm
from tests.vllm_engine.predict import engine_core

MAX_TOKENS = 8
BLOCK, UNIT, BUDGET = 32, 16, 256
RECV_TIMEOUT_MS = 30_000  # hang bounds: the batches of a finished request are already queued
PROBES, PROBE_WAIT_MS = 100, 200


class Subscriber:
    """The test's end of vLLM's ZMQ publisher: a SUB socket connected to the PUB vLLM binds
    (an `ipc://` endpoint: vLLM binds wildcard and ipc endpoints and connects to the rest), and
    a count of the batches the scheduler hands its publisher, so a drain knows how many frames
    to wait for."""

    def __init__(self, endpoint: str) -> None:
        import zmq

        self.endpoint = endpoint
        self.sub = zmq.Context.instance().socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.setsockopt(zmq.LINGER, 0)
        self.handed = 0
        self.received = 0

    def attach(self, publisher: Any) -> None:
        """Connect to `publisher` (vLLM's, unchanged), wait until a probe batch comes through
        it (a SUB misses what a PUB sends before the subscription reaches it), then count what
        the scheduler hands it."""
        from vllm.distributed.kv_events import KVEventBatch as VllmBatch

        self.sub.connect(self.endpoint)
        for _ in range(PROBES):
            publisher.publish(VllmBatch(ts=0.0, events=[]))
            self.received += 1
            if self.sub.poll(PROBE_WAIT_MS):
                break
        else:
            raise AssertionError("no probe came through vLLM's publisher")
        publish = publisher.publish

        def counted(batch: Any) -> None:
            self.handed += 1
            publish(batch)

        publisher.publish = counted
        self.handed = self.received  # the probes take the first sequence numbers

    def drain(self) -> list[KVEventBatch]:
        """Every batch handed to the publisher since the last drain, in order, none missing,
        as a router decodes it."""
        out = []
        while self.received < self.handed or self.sub.poll(0):
            assert self.sub.poll(RECV_TIMEOUT_MS), (self.received, self.handed)
            _, seq, payload = self.sub.recv_multipart()
            n = int.from_bytes(seq, "big")
            if n < self.received:  # a late probe
                continue
            assert n == self.received, (n, self.received)
            self.received += 1
            out.append(decode_batch(payload))
        return out

    def close(self) -> None:
        self.sub.close(linger=0)


def _llm(model: Path, mtp: bool, mode: str, endpoint: str) -> Any:
    spec = {"speculative_config": {"method": "mtp", "num_speculative_tokens": 2}} if mtp else {}
    return tiny_llm(
        model,
        max_model_len=1024,
        additional_config={"hycache": {"pass_cost": 0.0, "token_cost": 1.0, "kv_events": mode}},
        kv_events_config={
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": endpoint,
        },
        block_size=BLOCK,
        num_gpu_blocks_override=64,
        prefix_match_unit=UNIT,
        max_num_batched_tokens=BUDGET,
        **arm_options("hycache"),
        **spec,
    )


@pytest.fixture(
    scope="module",
    params=[(False, "resumable"), (True, "resumable"), (False, "full"), (True, "full")],
    ids=["no-drafter-resumable", "mtp-resumable", "no-drafter-full", "mtp-full"],
)
def engine(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Any, Subscriber, str]]:
    mtp, mode = request.param
    model = write(tmp_path_factory.mktemp("tiny-nemotron-h"), mtp=mtp)
    sub = Subscriber(f"ipc://{tmp_path_factory.mktemp('events')}/kv-events")
    llm = _llm(model, mtp, mode, sub.endpoint)
    sched = engine_core(llm).scheduler
    assert sched.hycache_inert_reason is None and sched.hycache_events is not None
    assert bool(sched.hycache_bounds.drafter) == mtp
    sub.attach(sched.kv_event_publisher)
    yield llm, sub, mode
    sub.close()


class Router:
    """A router's tree over one mode's batches (a `full` batch read through its resumable
    tail), and the KV cache groups of vLLM's own `BlockStored` events it has seen."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.tree = EventTree()
        self.groups: set[int] = set()

    def apply(self, batches: list[KVEventBatch]) -> None:
        for batch in batches:
            assert (batch.resumable_events is not None) == (self.mode == "full")
            if self.mode == "full":
                self.groups |= {e.group_idx for e in batch.events if isinstance(e, BlockStored)}
                batch = KVEventBatch(batch.ts, batch.resumable_events)
            self.tree.apply(batch)


def _run(llm: Any, sub: Subscriber, router: Router, prompt: list[int]) -> tuple[int, int, list]:
    """(the router's depth for `prompt` before it is sent, the engine's `num_cached_tokens`,
    the answer)."""
    from vllm import SamplingParams

    router.apply(sub.drain())
    predicted = router.tree.depth(prompt)
    sp = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    out = llm.generate([{"prompt_token_ids": prompt}], sp, use_tqdm=False)[0]
    return predicted, out.num_cached_tokens or 0, list(out.outputs[0].token_ids)


def test_a_chat_and_a_family_are_predicted_from_the_events(
    engine: tuple[Any, Subscriber, str],
) -> None:
    """A chat of five turns (exact from the second on, past the first block), then a family
    of four siblings off the chat's last sequence, sharing a prefix that ends inside a block
    (never below the hit; the first continues the chat's path, so exact). In `full` the same
    batches carry vLLM's own events for every KV cache group (attention and Mamba)."""
    llm, sub, mode = engine
    router = Router(mode)
    rng = random.Random(44)
    prompt = [rng.randrange(3, 1000) for _ in range(150)]
    predicted, hits = [], []
    for _ in range(5):
        p, hit, answer = _run(llm, sub, router, prompt)
        assert p >= hit, (p, hit)
        predicted.append(p)
        hits.append(hit)
        prompt = prompt + answer + [rng.randrange(3, 1000) for _ in range(40)]
    assert predicted[1:] == hits[1:] and min(hits[1:]) > BLOCK, (predicted, hits)
    shared = prompt[: len(prompt) - 3]  # the chat's last path, cut inside a block
    family = []
    for _ in range(4):
        p, hit, _ = _run(llm, sub, router, shared + [rng.randrange(3, 1000) for _ in range(50)])
        assert p >= hit, (p, hit)
        family.append((p, hit))
    assert family[0][0] == family[0][1] > 0, family
    router.apply(sub.drain())
    groups = len(engine_core(llm).scheduler.kv_cache_config.kv_cache_groups)
    assert router.groups == (set(range(groups)) if mode == "full" else set()), groups
