"""vLLM 0.32's whole engine on CPU with a tiny random Nemotron-H (`tiny_model`): greedy tokens
with prefix caching (`mamba_cache_mode="align"`, hycache's CPU fixes loaded as a vLLM general
plugin), with `hycache.vllm.SyncScheduler` as the scheduler class, and without prefix caching
are identical, on families, a prompt that is a prefix of an earlier one, chat turns and a
concurrent batch with chunked prefill. One engine per configuration, shared by the module."""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# the engine core in this process (the plugin's fixes apply here), a small KV space
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

from hycache.bench.vllm.tiny_model import write
from tests.vllm_engine.engines import ARMS, arm_options, tiny_llm
from tests.vllm_engine.runs import run_with_abort

MAX_TOKENS = 8


def _llm(model: Path, arm: str) -> Any:
    return tiny_llm(
        model,
        max_model_len=4096,
        max_num_batched_tokens=256,  # chunked prefill: prompts below run in 2-3 chunks
        **arm_options(arm),
    )


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    model = write(tmp_path_factory.mktemp("tiny-nemotron-h"))
    yield {arm: _llm(model, arm) for arm in ARMS}


def _generate(llm: Any, prompts: list[list[int]]) -> list[tuple[int, list[int]]]:
    from vllm import SamplingParams

    sp = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], sp, use_tqdm=False)
    return [(o.num_cached_tokens or 0, list(o.outputs[0].token_ids)) for o in outs]


def _one_by_one(llm: Any, prompts: list[list[int]]) -> list[tuple[int, list[int]]]:
    return [_generate(llm, [p])[0] for p in prompts]


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(3, 1000) for _ in range(n)]


def _same_tokens(results: dict[str, list[tuple[int, list[int]]]]) -> None:
    ref = [t for _, t in results["nocache"]]
    for arm in ARMS[1:]:
        assert [t for _, t in results[arm]] == ref, arm
    assert all(h == 0 for h, _ in results["nocache"])


def test_family_hits_and_identical_tokens(engines: dict[str, Any]) -> None:
    rng = random.Random(1)
    shared = _tokens(rng, 400)
    prompts = [shared + _tokens(rng, 50) for _ in range(3)]
    results = {arm: _one_by_one(engines[arm], prompts) for arm in ARMS}
    _same_tokens(results)
    for arm in ("cache", "hycache"):
        hits = [h for h, _ in results[arm]]
        assert hits[0] == 0 and hits[-1] > 0, (arm, hits)


def test_prefix_of_an_earlier_prompt_and_chat_turns(engines: dict[str, Any]) -> None:
    rng = random.Random(2)
    first = _tokens(rng, 600)
    turn1 = _tokens(rng, 300)
    prompts = [first, first[:450], turn1]
    results = {arm: _one_by_one(engines[arm], prompts) for arm in ARMS}
    # a chat turn: the previous prompt, its answer, a new user message
    for arm in ARMS:
        answer = results[arm][2][1]
        results[arm].append(_one_by_one(engines[arm], [turn1 + answer + _tokens(
            random.Random(3), 40)])[0])  # fmt: skip
    _same_tokens(results)


def test_concurrent_batch_with_chunked_prefill(engines: dict[str, Any]) -> None:
    rng = random.Random(4)
    shared = _tokens(rng, 350)
    prompts = [shared + _tokens(rng, rng.randint(10, 200)) for _ in range(6)]
    results = {arm: _generate(engines[arm], prompts) for arm in ARMS}
    _same_tokens(results)


def _with_abort(llm: Any, prompts: list[list[int]]) -> list[list[int]]:
    """prompts[0] is aborted after its first step (mid-prefill); the others run beside it."""
    from vllm import SamplingParams

    sp = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    return run_with_abort(llm, prompts, sp, MAX_TOKENS, "abort")


def test_abort_leaves_the_others_identical(engines: dict[str, Any]) -> None:
    rng = random.Random(5)
    shared = _tokens(rng, 500)
    prompts = [shared + _tokens(rng, 30) for _ in range(4)]
    results = {arm: _with_abort(engines[arm], prompts) for arm in ARMS}
    assert results["cache"] == results["nocache"] == results["hycache"]
    # after the abort, the cache still serves the family
    after = {arm: _generate(engines[arm], [shared + _tokens(random.Random(6), 30)]) for arm in ARMS}
    assert after["cache"][0][1] == after["nocache"][0][1] == after["hycache"][0][1]
    assert after["cache"][0][0] > 0
