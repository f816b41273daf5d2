"""vLLM 0.32's real engine without a drafter (issue 46): the tiny Nemotron-H (no MTP layer), block
size 32, `prefix_match_unit` 16, in three arms: no prefix caching, prefix caching (vLLM's
scheduler) and the same with `hycache.vllm.SyncScheduler` (on: every stop made, a free pass).
Greedy tokens are identical in all three; each request's `num_cached_tokens` equals the
scheduler-only harness's prediction (`predict.py`); on a family whose shared prefix ends inside
a block the plugin's siblings resume at floor(P/u)*u, above stock's floor(P/B)*B, and a prefix
hint moves the first sibling there too."""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

from hycache.bench.vllm.scenario import Turn
from hycache.bench.vllm.tiny_model import write
from tests.vllm_engine.engines import ARMS, arm_options, tiny_llm
from tests.vllm_engine.predict import engine_core, predicted_hits

MAX_TOKENS = 8
BLOCK, UNIT, BUDGET = 32, 16, 256
CACHED = ARMS[1:]


def _llm(model: Path, arm: str) -> Any:
    return tiny_llm(
        model,
        max_model_len=1024,
        additional_config={"hycache": {"pass_cost": 0.0, "token_cost": 1.0}},
        block_size=BLOCK,
        num_gpu_blocks_override=64,
        prefix_match_unit=UNIT if arm != "nocache" else None,
        max_num_batched_tokens=BUDGET,
        **arm_options(arm),
    )


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    model = write(tmp_path_factory.mktemp("tiny-nemotron-h"))
    yield {arm: _llm(model, arm) for arm in ARMS}


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(3, 1000) for _ in range(n)]


def _scenario(engines: dict[str, Any], prompts: list[list[int]], hint: int = 0) -> dict:
    """The prompts one after another in every arm from an empty prefix cache: identical greedy
    tokens, each cached arm's hits as the harness predicts."""
    from vllm import SamplingParams

    extra = {"prefix_hints": [hint]} if hint else None
    sp = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True, extra_args=extra)
    results: dict[str, list[tuple[int, list[int]]]] = {}
    for arm in ARMS:
        assert engines[arm].reset_prefix_cache()
        results[arm] = []
        for p in prompts:
            o = engines[arm].generate([{"prompt_token_ids": p}], sp, use_tqdm=False)[0]
            results[arm].append((o.num_cached_tokens or 0, list(o.outputs[0].token_ids)))
    greedy = [t for _, t in results["nocache"]]
    for arm in CACHED:
        assert [t for _, t in results[arm]] == greedy, arm
        hints = (hint,) if hint else ()
        turns = [Turn(p, t, (), hints) for p, (_, t) in zip(prompts, results[arm], strict=True)]
        assert [h for h, _ in results[arm]] == predicted_hits(engines[arm], turns), arm
    return {arm: [h for h, _ in results[arm]] for arm in ARMS}


def test_the_plugin_is_on(engines: dict[str, Any]) -> None:
    sched = engine_core(engines["hycache"]).scheduler
    assert sched.hycache_inert_reason is None
    assert not sched.hycache_bounds.drafter and sched.hycache_bounds.drop == 0


def test_family_hits_above_stock(engines: dict[str, Any]) -> None:
    """470 shared (inside block 14, [448, 480)): stock siblings resume at 448 at best, the
    plugin's at 464 = floor(470/16)*16 once a sibling has observed the junction."""
    rng = random.Random(21)
    shared = _tokens(rng, 470)
    hits = _scenario(engines, [shared + _tokens(rng, 90) for _ in range(4)])
    assert hits["nocache"] == [0, 0, 0, 0]
    assert hits["cache"][0] == 0 and max(hits["cache"]) <= 448, hits
    assert hits["hycache"] == [0, hits["cache"][1], 464, 464], hits


def test_a_hint_moves_the_first_sibling(engines: dict[str, Any]) -> None:
    rng = random.Random(22)
    shared = _tokens(rng, 470)
    hits = _scenario(engines, [shared + _tokens(rng, 60) for _ in range(3)], hint=470)
    assert hits["hycache"] == [0, 464, 464], hits
    assert hits["cache"][1] < 464
