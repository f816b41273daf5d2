"""The cache memory layout: one budget split into attention blocks and SSM state pages.

Every block used to carry a full SSM state slot: Bamba-9B at B = 64 then spent 118 MiB a block
(1 MiB of K/V), the default 1 GiB held 8 blocks and the engine refused to start."""

from __future__ import annotations

import random

import pytest
import torch

from hycache.cache.layout import PAGES_PER_SEQUENCE, split_budget
from hycache.config import CacheConfig, CacheKnobs, GroupKind
from hycache.engine.build import attention_block_bytes, state_bytes
from hycache.engine.engine import LLM
from hycache.model.configs import config_from_hf_dict
from hycache.request import SamplingParams
from tests.helpers import BAMBA_9B

GIB = 2**30



def test_bamba_9b_fits_a_full_request_in_the_default_gigabyte() -> None:
    mc = config_from_hf_dict(BAMBA_9B)
    kv = attention_block_bytes(mc, 64, torch.bfloat16, drafter=True)
    page = state_bytes(mc, torch.bfloat16)
    assert kv == 4 * 2 * 64 * 8 * 128 * 2  # 1 MiB: 3 attention layers + the drafter's
    assert page > 100 * kv  # ~117 MiB of conv + SSM state
    assert GIB // (kv + page) < 9  # the old layout: a handful of blocks
    sizes = split_budget(
        GIB,
        attention_block_bytes=kv,
        state_page_bytes=page,
        max_model_len=8192,
        block_size=64,
        attention_groups=2,  # the target's table and the drafter's
    )
    groups = (GroupKind.ATTENTION, GroupKind.SSM, GroupKind.ATTENTION)
    cfg = CacheConfig(  # validates: one maximal request fits both pools
        CacheKnobs(block_size=64, prefix_match_unit=None),
        num_blocks=sizes.num_blocks,
        num_state_pages=sizes.num_state_pages,
        max_model_len=8192,
        groups=groups,
    )
    used = (cfg.num_blocks - 1) * kv + (cfg.num_state_pages - 1) * page  # type: ignore[operator]
    assert used <= GIB
    assert GIB - used < kv + page  # nothing worth a block or page left over


@pytest.mark.parametrize(("kv", "page"), [(1000, 117_000), (50_000, 3_000), (4096, 4096)])
def test_the_split_follows_one_sequence_and_stays_in_budget(kv: int, page: int) -> None:
    budget, max_len, b = 64 * 2**20, 4096, 16
    s = split_budget(
        budget, attention_block_bytes=kv, state_page_bytes=page, max_model_len=max_len, block_size=b
    )
    assert (s.num_blocks - 1) * kv + (s.num_state_pages - 1) * page <= budget
    blocks_per_seq = max_len // b
    seqs = (s.num_blocks - 1) / blocks_per_seq
    assert abs((s.num_state_pages - 1) / PAGES_PER_SEQUENCE - seqs) < 1.0


def test_models_without_one_kind_of_layer_get_a_token_pool() -> None:
    s = split_budget(
        2**20, attention_block_bytes=0, state_page_bytes=1000, max_model_len=64, block_size=16
    )
    assert s.num_blocks == 2 and s.num_state_pages > 1000
    with pytest.raises(ValueError, match="positive"):
        split_budget(0, attention_block_bytes=1, state_page_bytes=1, max_model_len=1, block_size=1)


def test_the_engine_sizes_two_pools_and_small_state_pools_stay_correct() -> None:
    llm = LLM("tiny", max_model_len=256, cache_memory_gb=0.05)
    cache = llm.scheduler.cache
    assert cache.state_pool is not cache.pool
    assert llm.config.cache.num_state_pages == cache.state_pool.num_blocks
    assert llm.runner.states is not None
    assert llm.runner.states.num_slots == cache.state_pool.num_blocks  # no scratch at k = 0
    # a state pool barely above one request's needs: checkpoints compete among themselves
    rng = random.Random(0)
    head = [rng.randrange(1, 250) for _ in range(60)]
    prompts = [head + [rng.randrange(1, 250) for _ in range(20)] for _ in range(6)]
    sp = SamplingParams(max_tokens=6)
    tight = LLM(
        "tiny",
        block_size=16,
        prefix_match_unit=4,
        max_model_len=256,
        num_blocks=200,
        num_state_pages=8,
        num_speculative_tokens=2,
        max_num_seqs=1,
    )
    got = [tight.generate([p], sp)[0] for p in prompts]
    assert [o.token_ids for o in got] == [
        o.token_ids
        for o in LLM(
            "tiny", max_model_len=256, enable_prefix_caching=False, num_speculative_tokens=2
        ).generate(prompts, sp)
    ]
    assert any(o.hit_tokens for o in got)
    c = tight.scheduler.cache
    c.check_integrity()
    st = c.stats()
    assert st.num_state_pages == 8 and st.free_state_pages == 7  # everything back
    assert st.free_blocks == 199
