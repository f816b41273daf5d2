"""Speculative decoding with drafts that are accepted (issue #11, "Test gap").

The random EAGLE head never proposes a token the target accepts, so elsewhere "speculative =
plain" only covers steps that verify a single position. Here an oracle
(`tests.helpers.OracleDrafter`) proposes the target's own greedy continuation with drafts
corrupted on a schedule, so that each verification accepts 0..k drafts, for k in 1, 3, 8, 9
(u = 4: one step may cross two unit boundaries). Per k, one workload (a system-prompt family, a
resend, a chat turn after an answer) runs in two stages on a caching `limit` engine and all at
once on an engine with caching off; an engine without a drafter gives the reference.

* Tokens equal plain greedy decoding, cached and uncached.
* Every verification accepts exactly the drafts the oracle got right; the counts cover 0, k
  and values between.
* The second stage hits the cache (resend, sibling, chat turn) and keeps the same tokens,
  under `limit` for every k and under every other policy for k = 3.
* `limit` decode snapshots: each snapshot copy lands on the last unit boundary among the
  positions the step keeps and holds the state computed from scratch over those tokens, also
  when it comes from an accepted draft's scratch slot; the answer's snapshot at
  floor((L-1)/u)*u serves the next turn.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
import torch

from hycache.config import POLICY_NAMES
from hycache.engine.engine import LLM
from hycache.engine.outputs import RequestOutput
from hycache.request import SamplingParams
from hycache.sched.scheduler import ScheduledRequest
from tests.engine.conftest import U, make_llm, snapshot_position, state_from_scratch
from tests.helpers import OracleDrafter, oracle_schedule

VOCAB = 512  # the tiny preset
KS = [1, 3, 8, 9]
SYSTEM = 37  # shared prefix of the family


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread() -> Iterator[None]:
    """Small float64 steps: one intra-op thread (see test_limit_engine). Afterwards, let the
    module's engines go."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
    run.cache_clear()


def max_tokens(k: int) -> int:
    """Long enough for several verifications of every planned count."""
    return 2 * k + 6


@dataclass
class Copy:
    """A snapshot copy the runner made (or, with `position` 0, a sampling step that made none)."""

    request_id: str
    prompt: tuple[int, ...]
    end: int  # the step's chunk end: its first verified position
    last: int  # the last verified position the request keeps (computed here)
    position: int  # where the copied state stands (0: no copy)
    offset: int  # position - end: 0 the step's own token, i >= 1 its i-th accepted draft
    state: tuple[torch.Tensor, torch.Tensor] | None


class SnapshotSpy:
    """Wraps `ModelRunner._keep_states` and the state cache's `copy_slot` to record, for every
    sampling step, the snapshot copy it made (read off the scratch slot the copy takes)."""

    def __init__(self, llm: LLM, limit: int) -> None:
        self.copies: list[Copy] = []
        runner = llm.runner
        states = runner.states
        assert states is not None
        original = runner._keep_states

        def keep(r: int, s: ScheduledRequest, accepted: int, last: int) -> None:
            req = s.request
            snapshot = s.alloc.states[0].snapshot
            base = runner.scratch_base + r * (runner.k + 1)
            room = limit - req.num_output_tokens  # ignore_eos, no stop ids: only max_tokens
            kept_last = s.end + min(accepted + 1, room) - 1
            copy = states.copy_slot
            seen: list[int] = []

            def spy(src: int, dst: int) -> None:
                copy(src, dst)
                if dst == snapshot:
                    seen.append(src - base if s.draft_token_ids else 0)

            states.copy_slot = spy  # type: ignore[method-assign]
            try:
                original(r, s, accepted, last)
            finally:
                states.copy_slot = copy  # type: ignore[method-assign]
            assert len(seen) <= 1
            offset = seen[0] if seen else 0
            self.copies.append(
                Copy(
                    req.request_id,
                    tuple(req.prompt_token_ids),
                    s.end,
                    kept_last,
                    s.end + offset if seen else 0,
                    offset,
                    states.read(snapshot) if seen and snapshot is not None else None,
                )
            )

        runner._keep_states = keep  # type: ignore[method-assign]


@dataclass
class Run:
    k: int
    limit: int  # max_tokens
    stages: list[dict[str, list[int]]] = field(default_factory=list)  # run one after the other
    prompts: dict[str, list[int]] = field(default_factory=dict)
    plain: dict[str, list[int]] = field(default_factory=dict)  # greedy, no drafter
    cached: dict[str, RequestOutput] = field(default_factory=dict)
    uncached: dict[str, RequestOutput] = field(default_factory=dict)
    oracles: dict[str, OracleDrafter] = field(default_factory=dict)  # "cached", "uncached"
    spy: SnapshotSpy | None = None
    llm: LLM | None = None  # the caching engine


def generate(
    llm: LLM, prompts: dict[str, list[int]], sp: SamplingParams
) -> dict[str, RequestOutput]:
    return dict(zip(prompts, llm.generate(list(prompts.values()), sp), strict=True))


@functools.cache
def run(k: int) -> Run:
    rng = random.Random(k)

    def toks(n: int) -> list[int]:
        return [rng.randrange(VOCAB) for _ in range(n)]

    w = Run(k, max_tokens(k))
    sp = SamplingParams(max_tokens=w.limit, ignore_eos=True)
    plain = make_llm(num_speculative_tokens=0, enable_prefix_caching=False, num_blocks=96)
    cached = make_llm(policy="limit", num_speculative_tokens=k, num_blocks=96)
    uncached = make_llm(
        policy="limit", num_speculative_tokens=k, enable_prefix_caching=False, num_blocks=96
    )
    w.llm = cached
    w.oracles = {
        "cached": OracleDrafter(cached, oracle_schedule(k), VOCAB),
        "uncached": OracleDrafter(uncached, oracle_schedule(k), VOCAB),
    }
    w.spy = SnapshotSpy(cached, w.limit)

    def learn(prompts: dict[str, list[int]]) -> None:
        for oracle in w.oracles.values():
            oracle.learn(plain, list(prompts.values()), w.limit)
        answers = w.oracles["cached"].answers
        w.plain.update({n: answers[tuple(p)][: w.limit] for n, p in prompts.items()})

    system = toks(SYSTEM)
    first = {"a": system + toks(14), "b": system + toks(21)}
    learn(first)
    a = first["a"]
    second = {"resend": list(a), "sib": system + toks(9), "turn2": a + w.plain["a"] + toks(11)}
    learn(second)
    w.stages = [first, second]
    w.prompts = {**first, **second}
    for stage in w.stages:
        w.cached.update(generate(cached, stage, sp))
    w.uncached = generate(uncached, w.prompts, sp)
    cached.scheduler.cache.check_integrity()
    return w


@pytest.fixture(scope="module", params=KS, ids=[f"k{k}" for k in KS])
def workload(request: pytest.FixtureRequest) -> Run:
    return run(request.param)


def test_tokens_equal_plain_decoding(workload: Run) -> None:
    w = workload
    assert set(w.cached) == set(w.uncached) == set(w.plain) == set(w.prompts)
    for name, want in w.plain.items():
        assert len(want) == w.limit
        assert w.cached[name].token_ids == want, name
        assert w.uncached[name].token_ids == want, name


def test_accepted_drafts_cover_zero_to_k(workload: Run) -> None:
    k = workload.k
    for which, oracle in workload.oracles.items():
        assert oracle.steps, which
        for step in oracle.steps:
            # a correct engine accepts exactly the correct drafts it verified
            assert step.accepted == min(step.planned, step.verified), (which, step)
        seen = oracle.accepted_values()
        assert {0, k} <= seen, (which, sorted(seen))
        if k > 1:
            assert seen & set(range(1, k)), (which, sorted(seen))
        # full steps, not only ones the scheduler shortened
        assert any(s.verified == s.accepted == k for s in oracle.steps), which


def test_second_stage_hits_the_cache(workload: Run) -> None:
    w = workload
    for name in ("resend", "sib", "turn2"):
        assert w.cached[name].hit_tokens > 0, name
        assert w.cached[name].token_ids == w.uncached[name].token_ids, name
    # `limit` with a drafter: a prompt sharing p tokens resumes at floor((p-1)/u)*u
    assert w.cached["resend"].hit_tokens == (len(w.prompts["a"]) - 1) // U * U
    assert w.cached["sib"].hit_tokens == (SYSTEM - 1) // U * U
    assert all(o.hit_tokens == 0 for o in w.uncached.values())
    assert w.cached["a"].hit_tokens == 0
    # b arrives with a: it may wait for a's prefix in flight and reuse what a keeps of it
    assert w.cached["b"].hit_tokens <= SYSTEM


def test_limit_snapshots_sit_on_unit_boundaries(workload: Run) -> None:
    w = workload
    assert w.spy is not None and w.llm is not None
    copies = [c for c in w.spy.copies if c.position]
    for c in w.spy.copies:
        boundary = c.last // U * U
        want = boundary if boundary >= c.end and boundary > 0 else 0
        assert c.position == want, c
    # several drafts accepted in one step: the snapshot comes from a draft's scratch slot ...
    assert max(c.offset for c in copies) >= min(w.k, 2)
    if w.k >= 8:  # ... and may skip a boundary the step crossed earlier
        assert any(c.position - c.end >= U for c in copies)
    full = {c.prompt: list(c.prompt) + w.plain[n] for n, c in _names(w, copies)}
    for c in copies:
        assert c.state is not None
        want_conv, want_ssm = state_from_scratch(w.llm, full[c.prompt][: c.position])
        got_conv, got_ssm = c.state
        assert torch.allclose(got_conv, want_conv, rtol=0, atol=1e-9), c.position
        assert torch.allclose(got_ssm, want_ssm, rtol=0, atol=1e-9), c.position


def test_answer_snapshot_serves_the_next_turn(workload: Run) -> None:
    w = workload
    done = len(w.prompts["a"]) + w.limit
    pos = snapshot_position(done)
    assert pos >= len(w.prompts["a"])  # only a decode snapshot can hold it
    turn2 = w.cached["turn2"]
    assert pos <= turn2.hit_tokens < len(w.prompts["turn2"]), (pos, turn2.hit_tokens)
    assert turn2.token_ids == w.plain["turn2"]


@pytest.mark.parametrize("policy", [p for p in POLICY_NAMES if p != "limit"])
def test_every_policy_keeps_plain_tokens_with_accepted_drafts(policy: str) -> None:
    """The workload of k = 3 again, cached, under the other policies (whose checkpoints and
    keys a step accepting several drafts may skip past)."""
    w = run(3)
    llm = make_llm(policy=policy, num_speculative_tokens=w.k, num_blocks=96)
    oracle = OracleDrafter(llm, oracle_schedule(w.k), VOCAB)
    oracle.answers = w.oracles["cached"].answers
    sp = SamplingParams(max_tokens=w.limit, ignore_eos=True)
    got: dict[str, RequestOutput] = {}
    for stage in w.stages:
        got.update(generate(llm, stage, sp))
    assert {n: o.token_ids for n, o in got.items()} == w.plain
    assert all(s.accepted == min(s.planned, s.verified) for s in oracle.steps)
    assert {0, w.k} <= oracle.accepted_values()
    assert all(got[n].hit_tokens > 0 for n in w.stages[1])
    llm.scheduler.cache.check_integrity()


def _names(w: Run, copies: list[Copy]) -> Iterator[tuple[str, Copy]]:
    """(workload name, copy) for each copy, by the copy's prompt."""
    by_prompt = {tuple(p): n for n, p in w.prompts.items()}
    for c in copies:
        yield by_prompt[c.prompt], c
