"""The engine's KV events: `LLM.kv_events`, `LLM.resume_point`, and the ZMQ publisher read by a
SUB socket on 127.0.0.1, replayed the way a depth-scoring router does."""

from __future__ import annotations

import random

import zmq

from hycache.cache.events import decode_batch
from hycache.config import CacheKnobs
from hycache.engine.engine import LLM
from hycache.engine.kv_events import publish_kv_events
from hycache.request import SamplingParams
from tests.helpers import EventTree

SMALL = {"max_model_len": 256, "num_blocks": 96, "num_speculative_tokens": 2}
PARAMS = SamplingParams(max_tokens=4, ignore_eos=True)


def family(seed: int, n: int = 5) -> list[list[int]]:
    """Siblings over a shared prefix, and one continuing the first turn."""
    rng = random.Random(seed)
    root = [rng.randrange(1, 200) for _ in range(60)]
    out = [root[: rng.randrange(20, 60)] + [rng.randrange(1, 200) for _ in range(15)]
           for _ in range(n)]  # fmt: skip
    return [*out, out[0] + [7] * 9]


def test_the_events_predict_each_requests_hit() -> None:
    """One request at a time: before it runs, `resume_point` is where the router's tree says
    it resumes or below (equal when the request follows a published path), and it is the hit
    the engine then reports (`hit_tokens`, vLLM's `cached_tokens`)."""
    llm = LLM("tiny", knobs=CacheKnobs(16, 4, policy="limit"), **SMALL)  # type: ignore[arg-type]
    log = llm.kv_events()
    assert llm.kv_events() is log and llm.kv_events("full") is not log
    tree = EventTree()
    hits = []
    for prompt in family(1):
        batch = log.drain()
        if batch is not None:
            tree.apply(batch)
        predicted = llm.resume_point(prompt)
        assert predicted <= tree.depth(prompt)
        (out,) = llm.generate([prompt], PARAMS)
        assert out.hit_tokens == predicted
        hits.append(predicted)
    assert hits[0] == 0 and sum(hits) > 0
    assert llm.resume_point(family(1)[-1]) > hits[-1]  # the continuation's own turn is cached


def test_zmq_publisher_sends_vllm_framed_batches_to_a_subscriber() -> None:
    llm = LLM("tiny", knobs=CacheKnobs(16, 4, policy="limit"), **SMALL)  # type: ignore[arg-type]
    pub = publish_kv_events(llm, "tcp://127.0.0.1:*", topic="kv")
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    try:
        assert pub.bound_endpoint.startswith("tcp://127.0.0.1:")
        sub.connect(pub.bound_endpoint)
        sub.setsockopt(zmq.SUBSCRIBE, b"kv")
        # a PUB drops what it sends before the subscription arrives: probe until one lands
        probe = llm.kv_events().drain()
        assert probe is not None  # the opening AllBlocksCleared
        for _ in range(200):
            pub.publish(probe)
            if sub.poll(50):
                break
        else:
            raise AssertionError("the subscriber never received a probe")
        frames = []
        while sub.poll(200):
            frames.append(sub.recv_multipart())
        first = pub.num_published
        prompts = family(2)
        outs = llm.generate(prompts[:3], PARAMS) + llm.generate(prompts[3:], PARAMS)
        tree, seqs = EventTree(), []
        while sub.poll(2000) and len(seqs) < pub.num_published - first:
            topic, seq, payload = sub.recv_multipart()
            assert topic == b"kv" and len(seq) == 8
            seqs.append(int.from_bytes(seq, "big"))
            tree.apply(decode_batch(payload))
        assert seqs == list(range(first, pub.num_published)) and seqs
        for p in prompts:
            assert tree.depth(p) >= llm.resume_point(p)
        # the next turn of the last conversation: the router's depth is its hit
        turn = [*prompts[-1], *outs[-1].token_ids, 5, 6]
        assert tree.depth(turn) == llm.resume_point(turn) > 0
    finally:
        llm.remove_step_observer(pub.observer)  # type: ignore[arg-type]
        pub.close()
        sub.close()
        ctx.term()
