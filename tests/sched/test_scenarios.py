"""The seed's five scenarios, named as in the seed (EAGLE on unless said)."""

from __future__ import annotations

import random

import pytest

from hycache.cache.boundaries import Boundaries
from hycache.config import Policy
from hycache.sched.chunking import chunk_end
from hycache.sched.scheduler import Scheduler
from tests.helpers import make_config, new_request, run_sequential, tokens


def family(seed: int, shared: int, private: int, n: int) -> list[list[int]]:
    rng = random.Random(seed)
    prefix = tokens(rng, shared)
    return [prefix + tokens(rng, private) for _ in range(n)]


@pytest.mark.parametrize("policy,expected", [("junction", 12), ("replay", 0)])
def test_shared_prefix_shorter_than_the_prompt_resumes_below_a_block(
    policy: str, expected: int
) -> None:
    cfg = make_config(block_size=16, unit=4, policy=policy)
    _, (owner, f1, f2) = run_sequential(cfg, family(0, 24, 16, 3))
    assert owner.first_hit_tokens == 0 and f1.first_hit_tokens == 0
    assert f1.outcome.junction == 12  # the first follower observes the junction
    assert f2.first_hit_tokens == expected


@pytest.mark.parametrize("policy", ["junction", "replay"])
def test_without_eagle_the_second_follower_resumes_at_the_block(policy: str) -> None:
    cfg = make_config(block_size=16, unit=4, policy=policy, eagle=False)
    _, (_, f1, f2) = run_sequential(cfg, family(0, 24, 16, 3))
    assert f1.first_hit_tokens == 0
    assert f2.first_hit_tokens == 16


def test_mamba_align_split_stops_at_the_eagle_resume_point() -> None:
    big_t = 40 * 16
    eagle = Boundaries(16, 4, True, Policy.JUNCTION)

    def ends(b: Boundaries, junction: int, start: int = 0) -> list[int]:
        """The first chunk ends from `start` with a budget of 200."""
        stops = b.junction_stops(junction, start, big_t)
        out = []
        while start < 200:
            start = chunk_end(start, big_t, 200, b.prefill_stops(start, big_t, stops), 16)
            out.append(start)
        return out

    assert ends(eagle, 0)[0] == 192  # no junction: grid end within the budget, no extra stop
    # vLLM's block-floored stop, then the hash grid one unit below the boundary at 112, then 112
    assert ends(eagle, 108)[:3] == [96, 108, 112]
    assert eagle.is_block_grid_resume_point(108)
    for inert in (
        Boundaries(16, 4, False, Policy.JUNCTION),
        Boundaries(16, 16, True, Policy.JUNCTION),
    ):
        assert ends(inert, 108)[:2] == [96, 96 + 192]  # block-floored only
    assert ends(Boundaries(16, 4, True, Policy.REPLAY), 108)[:2] == [96, 288]


@pytest.mark.parametrize("junction,expected", [(2_208, None), (992, 992)])
def test_junction_past_the_prompt_adds_no_stop(junction: int, expected: int | None) -> None:
    """Splitting at checkpoints (a Mamba layer that cannot export)."""
    cfg = make_config(
        block_size=512, unit=32, budget=8192, max_model_len=8192, internal_checkpoints=False
    )
    sched = Scheduler(cfg)
    rng = random.Random(5)
    req = new_request(cfg, "resumed", tokens(rng, 2_000))
    req.append_output(tokens(rng, 2_000))  # a preempted request replays its outputs
    b = sched.bounds
    req.junction_stops = b.junction_stops(junction, 0, req.num_prompt_tokens)
    ends, start = [], 0
    while start < req.num_tokens:
        start = sched._chunk_end(req, start, 8192)
        ends.append(start)
    first = ends[0]
    if expected is None:
        assert 2_208 not in ends
        assert 2_048 in ends  # the block-floored stop still applies
        other = b.prefill_stops(0, req.num_prompt_tokens)
        assert first == min([2_048, *other])
        assert not sched.cache.will_checkpoint(req, 2_048)  # nothing kept past the prompt
    else:
        assert ends[:2] == [512, expected]  # vLLM's block-floored stop, then the junction


@pytest.mark.parametrize("policy,sibling_resume", [("junction", 7_168), ("replay", 6_624)])
def test_eagle_reaches_the_resume_point_instead_of_flooring_a_block(
    policy: str, sibling_resume: int
) -> None:
    cfg = make_config(block_size=552, unit=8, policy=policy, max_model_len=8_200)
    prompts = family(1, 7_200, 802, 4)
    _, reqs = run_sequential(cfg, [*prompts, prompts[0]])
    _producer, s1, s2, s3, resend = reqs
    assert s1.first_hit_tokens == 0
    assert s2.first_hit_tokens == s3.first_hit_tokens == sibling_resume
    assert resend.first_hit_tokens == 7_992


def test_junction_check_point_is_what_a_sibling_resumes_from() -> None:
    cfg = make_config(block_size=1024, unit=64, max_model_len=4096)
    rng = random.Random(2)
    a = tokens(rng, 1_600)
    _, (_, sibling) = run_sequential(cfg, [a, a + tokens(rng, 500)])
    assert sibling.first_hit_tokens == 1_536
