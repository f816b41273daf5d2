"""vLLM 0.32's real engine with a drafter: the tiny Nemotron-H with one MTP layer (2 speculative
tokens, accepted part of the time), block size 32, in three arms: no prefix caching, prefix
caching (`mamba_cache_mode="align"`, `prefix_match_unit` 16, vLLM's scheduler) and the same
with `hycache.vllm.SyncScheduler` (on: vLLM 0.32's EAGLE drop is its drop mode). Greedy tokens
must be identical in all three on families, hinted families, a prompt that is a prefix of an
earlier one, chat turns, a concurrent chunked batch that preempts (a small KV pool), and beside
an abort; and each request's `num_cached_tokens` must equal the scheduler-only harness's
prediction for the same shape (`predict.py`), and `hycache explain --backend vllm`'s columns for
the explain shape (stock and the plugin, with and without a hint), the plugin's at least
stock's and above it on a family.

This runs every CPU fix: per-chunk SSD states (2), the fused align copies (3) and the
spec-aware decode ops (4). Without fix 4 the MTP arms' tokens differ from greedy decoding."""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

from hycache.bench.vllm.scenario import Turn
from hycache.bench.vllm.tiny_model import write
from tests.vllm_engine.engines import ARMS, arm_options, tiny_llm
from tests.vllm_engine.predict import engine_core, predicted_hits
from tests.vllm_engine.runs import run_with_abort

MAX_TOKENS = 12
SPEC_TOKENS = 2
BLOCK = 32
UNIT = 16  # prefix_match_unit: sub-block hits, so the plugin is on
BUDGET = 256  # max_num_batched_tokens: chunked prefill
POOL = 48  # KV blocks: every sequential scenario fits, a concurrent batch of six preempts
CACHED = ARMS[1:]
FREE = (0.0, 1.0)  # the plugin's (pass, token) price: a free pass


def _llm(model: Path, arm: str) -> Any:
    cache = arm != "nocache"
    return tiny_llm(
        model,
        max_model_len=1024,
        # every stop made: at B = 32 no stop would pay for a GPU-priced pass (the default)
        additional_config={"hycache": {"pass_cost": FREE[0], "token_cost": FREE[1]}},
        block_size=BLOCK,
        num_gpu_blocks_override=POOL,
        prefix_match_unit=UNIT if cache else None,
        speculative_config={"method": "mtp", "num_speculative_tokens": SPEC_TOKENS},
        max_num_batched_tokens=BUDGET,
        disable_log_stats=False,
        **arm_options(arm),
    )


COPIES = {"precopy": 0, "postprocess": 0}  # state blocks the fix-3 stand-ins moved


@contextmanager
def _count_copies() -> Iterator[None]:
    """Count the block copies each fix-3 stand-in makes while the module runs."""
    from vllm.v1.worker import mamba_utils

    from hycache.vllm_cpu import state_copies

    kernels = {
        "precopy": mamba_utils.precopy_mamba_align_fused_kernel,
        "postprocess": mamba_utils.postprocess_mamba_fused_kernel,
    }
    bodies = {k: v.body for k, v in kernels.items()}
    copy_block = state_copies._copy_state_block
    current: list[str] = []

    def counted(*a: Any, **k: Any) -> None:
        COPIES[current[-1]] += 1
        copy_block(*a, **k)

    def wrap(kind: str) -> Any:
        def body(*a: Any, **k: Any) -> None:
            current.append(kind)
            try:
                bodies[kind](*a, **k)
            finally:
                current.pop()

        return body

    state_copies._copy_state_block = counted
    for kind, kernel in kernels.items():
        kernel.body = wrap(kind)
    try:
        yield
    finally:
        state_copies._copy_state_block = copy_block
        for kind, kernel in kernels.items():
            kernel.body = bodies[kind]


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    model = write(tmp_path_factory.mktemp("tiny-nemotron-h-mtp"), mtp=True)
    llms = {arm: _llm(model, arm) for arm in ARMS}  # the plugin's fixes are installed now
    with _count_copies():
        yield llms


def _params(hint: int | None = None) -> Any:
    from vllm import SamplingParams

    extra = {"prefix_hints": [hint]} if hint else None
    return SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True, extra_args=extra)


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(3, 1000) for _ in range(n)]


Result = tuple[int, list[int]]  # (num_cached_tokens, greedy token ids)


def _one_by_one(llm: Any, prompts: list[list[int]], hint: int | None = None) -> list[Result]:
    out = []
    for p in prompts:
        o = llm.generate([{"prompt_token_ids": p}], _params(hint), use_tqdm=False)[0]
        out.append((o.num_cached_tokens or 0, list(o.outputs[0].token_ids)))
    return out


def _scenario(engines: dict[str, Any], prompts: list[list[int]], hint: int | None = None) -> dict:
    """The prompts one after another in every arm, from an empty prefix cache; the cached
    arms' hits are checked against the harness's prediction for the same turns."""
    results = {}
    for arm in ARMS:
        assert engines[arm].reset_prefix_cache()
        results[arm] = _one_by_one(engines[arm], prompts, hint)
    _same_tokens(results)
    hints = (hint,) if hint else ()
    for arm in CACHED:
        turns = [Turn(p, t, (1, 0), hints) for p, (_, t) in zip(prompts, results[arm], strict=True)]
        assert [h for h, _ in results[arm]] == predicted_hits(engines[arm], turns), arm
    return results


def _same_tokens(results: dict[str, list[Result]]) -> None:
    ref = [t for _, t in results["nocache"]]
    for arm in CACHED:
        assert [t for _, t in results[arm]] == ref, arm
    assert all(h == 0 for h, _ in results["nocache"])


def _hits(results: dict[str, list[Result]], arm: str) -> list[int]:
    return [h for h, _ in results[arm]]


def test_the_plugin_is_on(engines: dict[str, Any]) -> None:
    sched = engine_core(engines["hycache"]).scheduler
    assert sched.hycache_inert_reason is None
    assert sched.hycache_bounds.drop == UNIT  # the EAGLE drop: drop mode


def _resume_limit(shared: int) -> int:
    from hycache.cache.boundaries import Boundaries
    from hycache.config import Policy

    return Boundaries(BLOCK, UNIT, True, Policy.LIMIT, lookahead_keys=False).resume_limit(shared)


def test_family_hits_as_predicted(engines: dict[str, Any]) -> None:
    """400 shared: stock siblings resume on the block grid under the drop (0 / 0 / 368 / 368),
    the plugin at the drop's resume limit 384 once a sibling has observed the junction."""
    rng = random.Random(11)
    shared = _tokens(rng, 400)
    results = _scenario(engines, [shared + _tokens(rng, 50) for _ in range(4)])
    stock, plugin = _hits(results, "cache"), _hits(results, "hycache")
    assert stock[0] == 0 and 0 < stock[-1] < _resume_limit(400), stock
    assert plugin == [0, 0, _resume_limit(400), _resume_limit(400)], plugin


def test_hinted_family_hits_as_predicted(engines: dict[str, Any]) -> None:
    """The hint stops the producer at the resume limit: the first sibling resumes there too."""
    rng = random.Random(12)
    shared = _tokens(rng, 330)
    results = _scenario(engines, [shared + _tokens(rng, 40) for _ in range(3)], hint=len(shared))
    assert _hits(results, "hycache") == [0, _resume_limit(330), _resume_limit(330)]
    stock, plugin = _hits(results, "cache"), _hits(results, "hycache")
    assert all(s <= p for s, p in zip(stock, plugin, strict=True)), (stock, plugin)


EXPLAIN_T, EXPLAIN_P = 600, 450  # the explain shape: prompt tokens, shared prefix


def _explain_prompts() -> list[list[int]]:
    """Producer, three siblings, then the producer again (explain's identical resend)."""
    rng = random.Random(16)
    shared = _tokens(rng, EXPLAIN_P)
    producer = shared + _tokens(rng, EXPLAIN_T - EXPLAIN_P)
    return [producer, *(shared + _tokens(rng, EXPLAIN_T - EXPLAIN_P) for _ in range(3)), producer]


@pytest.mark.parametrize("hint", [False, True])
def test_hits_as_hycache_explain_predicts(engines: dict[str, Any], hint: bool) -> None:
    """`hycache explain --backend vllm` (the scheduler-only harness on vLLM 0.32) for this
    engine's shape, B=32, u=16, MTP k=2, budget 256, 600 tokens with 450 shared: the engine's
    siblings' `num_cached_tokens` equal its columns, stock (0 / 416 / 416) and the plugin
    (0 / 432 / 432; hinted 432 / 432 / 432)."""
    from hycache.bench.vllm.explain import explain_vllm
    from hycache.config import CacheKnobs
    from hycache.sim.explain import ExplainInputs

    hints = (EXPLAIN_P,) if hint else ()
    knobs = CacheKnobs(BLOCK, UNIT)
    inputs = ExplainInputs(
        knobs, True, EXPLAIN_T, EXPLAIN_P, SPEC_TOKENS, BUDGET, prefix_hints=hints
    )
    cols = explain_vllm(inputs, pass_price=FREE)["policies"]
    results = _scenario(engines, _explain_prompts()[:4], hint=EXPLAIN_P if hint else None)
    for arm, col in (("cache", "vllm"), ("hycache", "hycache.vllm.Scheduler")):
        assert _hits(results, arm)[1:] == cols[col]["siblings"], (arm, _hits(results, arm))
    stock, plugin = cols["vllm"]["siblings"], cols["hycache.vllm.Scheduler"]["siblings"]
    assert stock == [0, 416, 416], stock
    assert plugin == ([_resume_limit(EXPLAIN_P)] * 3 if hint else [0, 432, 432]), plugin


def test_a_resend_resuming_at_a_sub_block_junction_state(engines: dict[str, Any]) -> None:
    """The resend's own tail state was evicted from the small pool, so it resumes at 432, the
    junction state its first sibling kept, inside block 13 of the attention group too. That
    hit's partial attention block is copied on write; before fix 6 vLLM copied only the Mamba
    view of the shared allocation and the resend read stale KV for [416, 432): its tokens
    differed from the 7th on (stock vLLM with its junction flag the same)."""
    results = {}
    for arm in ARMS:
        assert engines[arm].reset_prefix_cache()
        results[arm] = _one_by_one(engines[arm], _explain_prompts())
    assert _hits(results, "hycache")[4] == 432  # the producer's tail (576) was evicted
    _same_tokens(results)


def test_prefix_of_an_earlier_prompt_and_a_chat_turn(engines: dict[str, Any]) -> None:
    rng = random.Random(13)
    first = _tokens(rng, 500)
    answer = _one_by_one(engines["nocache"], [first])[0][1]  # identical in every arm
    # a chat turn: the previous prompt, its answer, a new user message
    _scenario(engines, [first, first[:420], first + answer + _tokens(rng, 40)])


def test_concurrent_chunked_batch_under_preemption(engines: dict[str, Any]) -> None:
    rng = random.Random(14)
    shared = _tokens(rng, 350)
    prompts = [shared + _tokens(rng, rng.randint(20, 200)) for _ in range(6)]
    results, preempted = {}, {}
    for arm in ARMS:
        sched = engine_core(engines[arm]).scheduler
        base = sched._preempt_request
        count = [0]

        def counting(*a: Any, _base: Any = base, _count: list[int] = count, **k: Any) -> Any:
            _count[0] += 1
            return _base(*a, **k)

        sched._preempt_request = counting
        try:
            outs = engines[arm].generate(
                [{"prompt_token_ids": p} for p in prompts], _params(), use_tqdm=False
            )
        finally:
            del sched._preempt_request
        results[arm] = [(o.num_cached_tokens or 0, list(o.outputs[0].token_ids)) for o in outs]
        preempted[arm] = count[0]
    _same_tokens(results)
    # the cached arms hold a Mamba block per 32 tokens and preempt; `none` holds one per request
    assert preempted["cache"] > 0 and preempted["hycache"] > 0, preempted


def test_abort_leaves_the_others_identical(engines: dict[str, Any]) -> None:
    rng = random.Random(15)
    shared = _tokens(rng, 450)
    prompts = [shared + _tokens(rng, 30) for _ in range(4)]
    results = {
        arm: run_with_abort(engines[arm], prompts, _params(), MAX_TOKENS, "mtp-abort")
        for arm in ARMS
    }
    assert results["cache"] == results["nocache"] == results["hycache"]


def test_the_drafter_is_accepted_part_of_the_time(engines: dict[str, Any]) -> None:
    for arm in ARMS:
        counts = {m.name: getattr(m, "value", 0) for m in engines[arm].get_metrics()}
        drafted = counts["vllm:spec_decode_num_draft_tokens"]
        accepted = counts["vllm:spec_decode_num_accepted_tokens"]
        assert 0 < accepted < drafted, (arm, accepted, drafted)


def test_the_align_copies_ran(engines: dict[str, Any]) -> None:
    """The runs above moved states across block boundaries before forwards and saved
    accepted states after them, through fix 3's stand-ins (then matched greedy decoding)."""
    assert COPIES["precopy"] > 0 and COPIES["postprocess"] > 0, COPIES
