"""A seeded sampling request's tokens depend on its seed alone (issue 34): speculative decoding,
preemption (which drops a request's drafts) and the batch it runs in change nothing (the same
tokens as plain decoding), because the token at output position j is drawn from a generator
keyed by (seed, j)."""

from __future__ import annotations

import random

from hycache.engine.engine import LLM
from hycache.request import SamplingParams

KW = {"block_size": 16, "prefix_match_unit": 4, "max_model_len": 128, "max_num_seqs": 16}


def prompts(n: int = 6) -> list[list[int]]:
    rng = random.Random(3)
    return [[rng.randrange(1, 500) for _ in range(40 + 6 * i)] for i in range(n)]


def seeded(n: int = 6) -> list[SamplingParams]:
    return [
        SamplingParams(max_tokens=16, temperature=1.0, top_p=0.95, seed=100 + i, ignore_eos=True)
        for i in range(n)
    ]


def test_seeded_tokens_survive_preemption_and_speculation() -> None:
    ps, params = prompts(), seeded()
    tight = LLM("tiny", num_speculative_tokens=2, num_blocks=24, **KW)
    under_load = [o.token_ids for o in tight.generate(ps, params)]
    assert tight.scheduler.num_preemptions > 0  # the pool is small enough to preempt
    plain = LLM("tiny", num_speculative_tokens=0, num_blocks=400, **KW)  # no drafter, no preemption
    no_spec = [o.token_ids for o in plain.generate(ps, params)]
    assert plain.scheduler.num_preemptions == 0
    assert under_load == no_spec
    assert len({tuple(t) for t in under_load}) == len(ps)  # and the seeds differ
