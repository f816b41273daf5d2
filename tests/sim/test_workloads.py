"""Workloads: seeded, deterministic, and shaped as asked."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pytest

from hycache.sim.workloads import (
    ChatShape,
    FamilyShape,
    RequestSpec,
    SessionSpec,
    SystemPromptShape,
    family_workload,
    multi_turn_workload,
    parse_int_or_range,
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


# -- ranges, family workload, system prompts that end mid-block ------------------------------


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(a.size, b.size)
    diff = np.nonzero(a[:n] != b[:n])[0]
    return int(diff[0]) if diff.size else n


@pytest.mark.parametrize("text,value", [("7", 7), (" 3:9 ", (3, 9)), ("5:5", (5, 5)), ("-1", -1)])
def test_parse_int_or_range(text: str, value: int | tuple[int, int]) -> None:
    assert parse_int_or_range(text) == value


@pytest.mark.parametrize("text", ["", "x", "1:2:3", "9:3", "1.5", "2:"])
def test_parse_int_or_range_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="LO"):
        parse_int_or_range(text)


def family_of(reqs: list[RequestSpec]) -> list[int]:
    """Family index of each request, recovered from the shared first token."""
    heads: dict[int, int] = {}
    return [heads.setdefault(int(r.prompt_token_ids[0]), len(heads)) for r in reqs]


def test_family_workload_shares_exactly_the_family_prefix() -> None:
    reqs = family_workload(
        6, (3, 5), (40, 400), (5, 30), (2, 9), seed=3, vocab=1000, prefix_hint=True
    )
    fam = family_of(reqs)
    assert len(set(fam)) == 6
    assert [r.request_id for r in reqs] == list(range(len(reqs)))
    sizes = [fam.count(f) for f in range(6)]
    assert all(3 <= n <= 5 for n in sizes)
    for i, a in enumerate(reqs):
        (p,) = a.prefix_hints  # the family's shared length, as the hint
        assert 40 <= p <= 400 and 5 <= a.prompt_len - p <= 30 and 2 <= a.max_tokens <= 9
        assert a.arrival_s is None
        for b in reqs[i + 1 :]:
            if fam[b.request_id] == fam[i]:
                assert b.prefix_hints == (p,)
                assert common_prefix(a.prompt_token_ids, b.prompt_token_ids) == p
            else:
                assert common_prefix(a.prompt_token_ids, b.prompt_token_ids) == 0
    # interleaved: the arrival order is not family by family
    runs = 1 + sum(1 for x, y in pairwise(fam) if x != y)
    assert runs > 6
    assert len({r.prefix_hints for r in reqs}) > 1  # prefix lengths are drawn per family


def test_family_sharing_ends_mid_block_at_the_default_shape() -> None:
    shape = FamilyShape()
    reqs = family_workload(
        shape.families,
        (2, 2),
        shape.shared_prefix_tokens,
        (1, 1),
        1,
        seed=0,
        prefix_hint=True,
    )
    lengths = {r.prefix_hints[0] for r in reqs}
    assert len(lengths) == shape.families
    assert all(p % 4416 for p in lengths)  # never on the bamba-9b block grid
    assert len({p // 4416 for p in lengths}) > 4  # spread over many blocks


def test_family_workload_is_seeded_and_hints_are_optional() -> None:
    a = family_workload(4, 3, (10, 90), 5, 2, seed=11)
    b = family_workload(4, 3, (10, 90), 5, 2, seed=11)
    c = family_workload(4, 3, (10, 90), 5, 2, seed=12)
    assert all(np.array_equal(x, y) for x, y in zip(prompts(a), prompts(b), strict=True))
    assert any(not np.array_equal(x, y) for x, y in zip(prompts(a), prompts(c), strict=False))
    assert all(r.prefix_hints == () for r in a)
    assert len(a) == 12


def test_family_workload_bad_arguments() -> None:
    with pytest.raises(ValueError, match="num_families"):
        family_workload(-1, 2, 10, 2, 1, seed=0)
    with pytest.raises(ValueError, match="requests_per_family"):
        family_workload(2, 0, 10, 2, 1, seed=0)
    with pytest.raises(ValueError, match="suffix_tokens"):
        family_workload(2, 2, 10, 0, 1, seed=0)  # a suffix is what ends the sharing
    with pytest.raises(ValueError, match="shared_prefix_tokens"):
        family_workload(2, 2, (20, 10), 2, 1, seed=0)
    assert family_workload(0, 2, 10, 2, 1, seed=0) == []


def test_system_prompt_hint() -> None:
    reqs = system_prompt_workload(3, 50, 8, 2, seed=0, prefix_hint=True)
    assert all(r.prefix_hints == (50,) for r in reqs)
    assert all(r.prefix_hints == () for r in system_prompt_workload(3, 50, 8, 2, seed=0))


def test_multi_turn_sessions_share_exactly_the_system_prompt() -> None:
    sessions = multi_turn_workload(
        20, (2, 4), (1, 30), (3, 7), seed=5, system_prompt_tokens=77, vocab=50, prefix_hint=True
    )
    firsts = [s.user_messages[0] for s in sessions]
    for i, a in enumerate(firsts):
        for b in firsts[i + 1 :]:
            assert common_prefix(a, b) == 77  # distinct first user tokens, even in 50 tokens
    assert all(s.prefix_hints == (77,) for s in sessions)
    turns = {s.num_turns for s in sessions}
    assert turns <= {2, 3, 4} and len(turns) > 1
    assert {n for s in sessions for n in s.output_tokens} <= set(range(3, 8))
    plain = multi_turn_workload(2, 2, 5, 5, seed=5, prefix_hint=True)
    assert all(s.prefix_hints == () for s in plain)  # no system prompt, nothing to hint


def test_shape_defaults_are_valid_workloads() -> None:
    sp, fam, chat = SystemPromptShape(), FamilyShape(), ChatShape()
    assert (sp.shared_prefix_tokens, sp.suffix_tokens) == (57_600, 6_416)  # architecture §4
    assert family_workload(2, fam.requests_per_family, 100, 5, fam.output_tokens, seed=0)
    s = multi_turn_workload(2, chat.turns, chat.user_tokens, chat.output_tokens, seed=0)
    assert all(2 <= x.num_turns <= 10 for x in s)
    assert chat.system_prompt_tokens % 64  # sharing ends mid-unit as well as mid-block
