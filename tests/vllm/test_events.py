"""The plugin's KV events (`hycache.vllm.events`) on vLLM 0.33 / 0.34's real scheduler: the
published `resumable` stream (alone, or as the `full` batch's tail beside vLLM's own per-group
events), replayed into a router's tree, predicts every request's hit: never below the
`num_computed_tokens` vLLM admits it with, equal for a request that continues a published path
(DESIGN §9). What external consumers read of the scheduler is the same with the plugin."""

from __future__ import annotations

import random
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hycache.bench.vllm.reference import ReferenceScheduler, VllmSetup
from hycache.bench.vllm.scenario import Turn
from hycache.cache.events import FULL_ATTENTION, MAMBA, BlockStored, KVEventBatch, decode_batch
from hycache.config import CacheKnobs
from tests.helpers import EventTree
from tests.vllm.shapes import scenario

settings.load_profile("vllm-reference")

PLUGIN = "hycache.vllm.SyncScheduler"


class Capture:
    """vLLM's publisher, replaced: each batch as a subscriber decodes it (msgpack, as vLLM's
    ZMQ publisher encodes the struct it is handed, its rank filled in)."""

    def __init__(self) -> None:
        self.batches: list[KVEventBatch] = []

    def publish(self, batch: Any) -> None:
        if batch.data_parallel_rank is None:
            batch.data_parallel_rank = 0
        self.batches.append(decode_batch(msgspec.msgpack.encode(batch)))

    def shutdown(self) -> None:
        pass


def setup(mode: str | None, k: int, cls: str | None = PLUGIN) -> VllmSetup:
    return VllmSetup(CacheKnobs(64, 16), num_speculative_tokens=k, scheduler_cls=cls,
                     kv_events=mode, pass_price=(0.0, 1.0))  # fmt: skip


def group_metadata(sched: Any) -> list[dict[str, Any]]:
    """What `EngineCore.get_kv_cache_group_metadata` (Dynamo's view of the groups) returns."""
    from vllm.v1.engine.core import EngineCore

    class Core:
        scheduler = sched

    return list(EngineCore.get_kv_cache_group_metadata(Core()))  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", ["resumable", "full"])
def test_consumers_read_the_same_groups_with_the_plugin(mode: str) -> None:
    stock = ReferenceScheduler(setup(None, 1, cls=None)).scheduler
    plugin = ReferenceScheduler(setup(mode, 1)).scheduler
    assert plugin.hycache_events is not None and plugin.hycache_inert_reason is None
    assert group_metadata(plugin) == group_metadata(stock)
    assert [m["kind"] for m in group_metadata(plugin)] == [FULL_ATTENTION, MAMBA]
    assert plugin.kv_cache_config.kv_cache_groups == stock.kv_cache_config.kv_cache_groups
    ours, theirs = (s.kv_cache_manager.coordinator.single_type_managers for s in (plugin, stock))
    assert [(m.block_size, m.kv_cache_group_id, m.kv_cache_spec) for m in ours] == [
        (m.block_size, m.kv_cache_group_id, m.kv_cache_spec) for m in theirs
    ]
    assert all(isinstance(a, type(b)) for a, b in zip(ours, theirs, strict=True))


def test_without_the_setting_vllms_own_events_go_out() -> None:
    ref = ReferenceScheduler(setup(None, 1))
    assert ref.scheduler.hycache_events is None
    with pytest.raises(ValueError, match="kv_events"):
        ReferenceScheduler(setup("everything", 1))


def run_and_replay(mode: str, k: int, seed: int) -> tuple[int, int]:
    """A random sharing scenario, one request after another; before each, the router's depth
    (the tree of every batch so far) against the hit vLLM then admits it with. Returns
    (requests predicted exactly as continuations, requests)."""
    ref = ReferenceScheduler(setup(mode, k))
    sched, capture, tree = ref.scheduler, Capture(), EventTree()
    sched.kv_event_publisher = capture
    log = sched.hycache_events
    turns = scenario(random.Random(seed), 64, 16, k)
    done: list[tuple[str, list[int]]] = []  # (request id, its whole path) in order
    exact = 0
    for i, turn in enumerate(turns):
        for batch in capture.batches:
            if mode == "full":
                assert batch.resumable_events is not None
                tree.apply(KVEventBatch(batch.ts, batch.resumable_events))
            else:
                assert batch.resumable_events is None
                tree.apply(batch)
        capture.batches.clear()
        prompt = list(turn.prompt)
        predicted = tree.depth(prompt)
        continued = [rid for rid, path in done
                     if len(path) < len(prompt) and prompt[: len(path)] == path
                     and log.depth(rid) == predicted]  # fmt: skip
        trace = ref.run(f"r{i}", turn)
        assert predicted >= trace.hit, (i, turn, predicted, trace.hit)
        if continued:
            assert predicted == trace.hit, (i, predicted, trace.hit, continued)
            exact += 1
        done.append((f"r{i}", prompt + trace.output))
    return exact, len(turns)


@pytest.mark.parametrize("mode", ["resumable", "full"])
@pytest.mark.parametrize("k", [0, 1])
@given(seed=st.integers(0, 2**16))
def test_the_router_never_predicts_below_the_hit_and_exactly_on_a_continued_path(
    mode: str, k: int, seed: int
) -> None:
    run_and_replay(mode, k, seed)


@pytest.mark.parametrize("mode", ["resumable", "full"])
def test_a_chat_is_predicted_exactly(mode: str) -> None:
    """Chat turns (each the previous turn, its answer and more): from the second turn on, the
    router's depth is the hit, and it is past the first block."""
    rng = random.Random(7)
    ref = ReferenceScheduler(setup(mode, 1))
    sched, capture, tree = ref.scheduler, Capture(), EventTree()
    sched.kv_event_publisher = capture
    prompt = [rng.randrange(1, 1000) for _ in range(150)]
    hits, predicted = [], []
    for i in range(4):
        for batch in capture.batches:
            tree.apply(KVEventBatch(batch.ts, batch.resumable_events) if mode == "full" else batch)
        if mode == "full" and i == 1:  # vLLM's own per-group events, as it sends them
            groups = {e.group_idx for b in capture.batches for e in b.events
                      if isinstance(e, BlockStored)}  # fmt: skip
            assert groups == {0, 1}
        capture.batches.clear()
        predicted.append(tree.depth(prompt))
        trace = ref.run(f"t{i}", Turn(prompt, [rng.randrange(1, 1000) for _ in range(5)]))
        hits.append(trace.hit)
        prompt = prompt + trace.output + [rng.randrange(1, 1000) for _ in range(40)]
    assert predicted[1:] == hits[1:] and min(hits[1:]) > 64, (predicted, hits)
