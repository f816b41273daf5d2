"""Workloads: seeded, deterministic, and shaped as asked."""

from __future__ import annotations

import numpy as np
import pytest

from hycache.sim.workloads import (
    RequestSpec,
    SessionSpec,
    multi_turn_workload,
    poisson_arrivals,
    system_prompt_workload,
)


def prompts(reqs: list[RequestSpec]) -> list[np.ndarray]:
    return [r.prompt_token_ids for r in reqs]


def test_system_prompt_workload_shape() -> None:
    reqs = system_prompt_workload(
        16, shared_prefix_tokens=300, suffix_tokens=40, output_tokens=25, seed=7, vocab=1000
    )
    assert [r.request_id for r in reqs] == list(range(16))
    prefix = reqs[0].prompt_token_ids[:300]
    suffixes = set()
    for r in reqs:
        assert r.prompt_len == 340
        assert r.max_tokens == 25
        assert r.arrival_s is None
        assert np.array_equal(r.prompt_token_ids[:300], prefix)  # shared prefix identical
        assert r.prompt_token_ids.min() >= 0 and r.prompt_token_ids.max() < 1000
        suffixes.add(r.prompt_token_ids[300:].tobytes())
    assert len(suffixes) == 16  # every suffix differs


def test_system_prompt_workload_is_deterministic_by_seed() -> None:
    a = system_prompt_workload(8, 64, 16, 4, seed=1)
    b = system_prompt_workload(8, 64, 16, 4, seed=1)
    c = system_prompt_workload(8, 64, 16, 4, seed=2)
    assert all(np.array_equal(x, y) for x, y in zip(prompts(a), prompts(b), strict=True))
    assert not np.array_equal(a[0].prompt_token_ids, c[0].prompt_token_ids)


def test_tiny_suffix_space_still_gives_distinct_prompts() -> None:
    reqs = system_prompt_workload(30, 8, 1, 1, seed=0, vocab=40)
    assert len({r.prompt_token_ids.tobytes() for r in reqs}) == 30


def test_ranges_are_drawn_per_request() -> None:
    reqs = system_prompt_workload(50, 10, (1, 20), (5, 9), seed=3)
    lens = {r.prompt_len for r in reqs}
    outs = {r.max_tokens for r in reqs}
    assert len(lens) > 5 and min(lens) >= 11 and max(lens) <= 30
    assert outs <= set(range(5, 10)) and len(outs) > 1


def test_identical_resends_are_allowed() -> None:
    reqs = system_prompt_workload(3, 32, 0, 4, seed=0)
    assert len({r.prompt_token_ids.tobytes() for r in reqs}) == 1


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        system_prompt_workload(2, 0, 0, 4, seed=0)  # empty prompts
    with pytest.raises(ValueError):
        system_prompt_workload(2, 4, 4, 0, seed=0)  # no output
    with pytest.raises(ValueError):
        system_prompt_workload(2, 4, 4, 1, seed=0, vocab=0)
    with pytest.raises(ValueError):
        multi_turn_workload(2, 0, 4, 4, seed=0)


def test_prompts_are_read_only() -> None:
    r = system_prompt_workload(1, 4, 4, 4, seed=0)[0]
    with pytest.raises(ValueError):
        r.prompt_token_ids[0] = 1


def test_multi_turn_workload_shape_and_system_prompt() -> None:
    sessions = multi_turn_workload(
        5, turns=3, user_tokens=20, output_tokens=7, seed=4, system_prompt_tokens=50, vocab=500
    )
    assert [s.session_id for s in sessions] == list(range(5))
    system = sessions[0].user_messages[0][:50]
    for s in sessions:
        assert s.num_turns == 3
        assert s.output_tokens == (7, 7, 7)
        assert len(s.user_messages[0]) == 70
        assert np.array_equal(s.user_messages[0][:50], system)
        assert [len(m) for m in s.user_messages[1:]] == [20, 20]
    assert not np.array_equal(sessions[0].user_messages[0][50:], sessions[1].user_messages[0][50:])


def test_multi_turn_is_deterministic_by_seed() -> None:
    a = multi_turn_workload(3, (1, 4), (5, 50), (1, 9), seed=11)
    b = multi_turn_workload(3, (1, 4), (5, 50), (1, 9), seed=11)
    for x, y in zip(a, b, strict=True):
        assert x.output_tokens == y.output_tokens
        assert all(
            np.array_equal(m, n) for m, n in zip(x.user_messages, y.user_messages, strict=True)
        )


def test_prompt_for_turn_extends_the_previous_turn() -> None:
    s = multi_turn_workload(1, 3, 4, 2, seed=0, vocab=100)[0]
    outs = [np.array([1, 2]), np.array([3, 4])]
    p0 = s.prompt_for_turn(0, [])
    p1 = s.prompt_for_turn(1, outs)
    p2 = s.prompt_for_turn(2, outs)
    assert np.array_equal(p0, s.user_messages[0])
    assert np.array_equal(p1, np.concatenate([p0, outs[0], s.user_messages[1]]))
    assert np.array_equal(p2, np.concatenate([p1, outs[1], s.user_messages[2]]))
    with pytest.raises(ValueError):
        s.prompt_for_turn(2, outs[:1])
    with pytest.raises(ValueError):
        SessionSpec(0, (np.array([1]),), (1, 2))


def test_poisson_arrivals() -> None:
    reqs = system_prompt_workload(2000, 4, 4, 1, seed=0)
    timed = poisson_arrivals(reqs, rate_per_s=5.0, seed=1)
    t = np.array([r.arrival_s for r in timed])
    assert t[0] == 0.0 and np.all(np.diff(t) >= 0)
    assert (len(t) - 1) / t[-1] == pytest.approx(5.0, rel=0.1)
    assert np.array_equal(timed[3].prompt_token_ids, reqs[3].prompt_token_ids)
