"""The `limit` policy on the real engine (tiny model, float64, B = 16, u = 4).

* Cached = uncached: system-prompt families, hinted families and 4-turn chats give the same
  tokens as the same prompts with prefix caching off, and sampled-row logits within 1e-9.
* Resume points: siblings 2+ of a family resume at exactly the limit, `floor((P-1)/u)*u` with an
  EAGLE drafter and `floor(P/u)*u` without; with a prefix hint the first sibling too; a chat
  turn resumes at or past `floor((L-1)/u)*u` of the previous turn's prompt + answer.
* Decode snapshots are exact under speculative decoding: the state keyed at `floor((L-1)/u)*u`
  equals the state computed from scratch over those tokens, also when the position was reached
  through accepted drafts; a snapshot copied from a neighbouring scratch slot is caught.

Families and chats run one request at a time, so every resume point is deterministic. The
snapshot tests replace the random EAGLE head's proposals with an oracle (the target's own greedy
continuation, partly corrupted on purpose) so that verification accepts 0, 1 or 2 drafts on a
known schedule; drafts never change greedy tokens, only how many positions one step verifies.

The last tests pin three bugs found while writing these (each failed before its fix): the
lookahead key at L - 1 of a finished answer, a last step verified past max_tokens, and hinted
siblings arriving together.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest
import torch

from hycache.engine.engine import LLM
from hycache.engine.outputs import RequestOutput
from hycache.request import SamplingParams
from hycache.sched.scheduler import ScheduledRequest, SchedulerOutput, StepResult
from tests.engine.conftest import (
    B,
    LogitRecorder,
    U,
    make_llm,
    snapshot_position,
    state_from_scratch,
)

VOCAB = 512  # the tiny preset
K = 2  # speculative tokens wherever a drafter is on
MAX_TOKENS = 4
PLAIN_FAMILIES = (36, 41)  # shared prefix lengths P, none on the block grid (limits 32, 40)
HINTED_FAMILIES = (40, 51)  # limits 36 (k = 2) or 40 (k = 0); 48, on the block grid
SIBLINGS = 3  # per family, after its producer
CHATS, TURNS = 2, 4


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread() -> Iterator[None]:
    """Run this module's small float64 steps on one intra-op thread: they gain nothing from
    two, and when other processes load the CPU, torch's spinning worker threads slow them down
    by up to 100x (float64 depthwise conv1d above all)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def limit(p: int, k: int) -> int:
    """Where a sibling sharing p tokens can resume at best (the limit, architecture §4.5),
    written out here rather than taken from the code under test."""
    return (p - 1) // U * U if k else p // U * U


def limit_llm(k: int, **kw: object) -> LLM:
    """The existing tests' float64 engine (B = 16, u = 4) under `limit`, with k drafts."""
    return make_llm(**{"policy": "limit", "num_speculative_tokens": k, "num_blocks": 64, **kw})


def run_one(llm: LLM, prompt: list[int], hints: list[int] | None = None) -> RequestOutput:
    sp = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    (out,) = llm.generate([prompt], sp, prefix_hints=hints)
    return out


def distinct_suffixes(rng: random.Random, n: int) -> list[list[int]]:
    """n suffixes of different lengths, the longest first (the producer's: its tail
    checkpoints then sit well past the shared prefix), whose first tokens all differ, so that
    the family's prompts share exactly their prefix."""
    firsts = rng.sample(range(VOCAB), n)
    return [
        [f] + [rng.randrange(VOCAB) for _ in range(3 + 2 * (n - 1 - i))]
        for i, f in enumerate(firsts)
    ]


# ---------------------------------------------------------------------- the workload, run once
@dataclass
class Family:
    shared: int  # P
    hinted: bool
    requests: list[int]  # indices into Workload.outputs: producer, then siblings


@dataclass
class Workload:
    k: int
    outputs: list[RequestOutput] = field(default_factory=list)  # caching on, in run order
    hints: list[list[int] | None] = field(default_factory=list)
    reference: list[RequestOutput] = field(default_factory=list)  # the same prompts, caching off
    rows: list[torch.Tensor] = field(default_factory=list)  # sampled-row logits, caching on
    ref_rows: list[torch.Tensor] = field(default_factory=list)
    families: list[Family] = field(default_factory=list)
    chats: list[list[int]] = field(default_factory=list)  # indices, turn by turn


def run_workload(k: int) -> Workload:
    """Families and chats one request at a time on a caching engine; then every prompt again on
    an engine with caching off (batched: nothing is shared there, so order does not matter)."""
    rng = random.Random(100 + k)
    # a pool that holds the whole script: under pressure admission may refuse a snapshot, and
    # `test_chat_turn_resumes_past_the_previous_answer` checks what a kept one gives
    on = limit_llm(k, num_blocks=512)
    # the reference runs every prompt in a few wide batches: nothing is shared without caching
    off = limit_llm(
        k, enable_prefix_caching=False, num_blocks=512, max_num_seqs=32, max_num_batched_tokens=512
    )
    rec_on, rec_off = LogitRecorder(on), LogitRecorder(off)
    w = Workload(k)

    def one(prompt: list[int], hints: list[int] | None = None) -> int:
        w.outputs.append(run_one(on, prompt, hints))
        w.hints.append(hints)
        return len(w.outputs) - 1

    for shared, hinted in [(p, False) for p in PLAIN_FAMILIES] + [
        (p, True) for p in HINTED_FAMILIES
    ]:
        system = [rng.randrange(VOCAB) for _ in range(shared)]
        hints = [shared] if hinted else None
        ids = [one(system + s, hints) for s in distinct_suffixes(rng, 1 + SIBLINGS)]
        w.families.append(Family(shared, hinted, ids))
    for _ in range(CHATS):
        prompt = [rng.randrange(VOCAB) for _ in range(17)]
        turns: list[int] = []
        for _ in range(TURNS):
            turns.append(one(prompt))
            out = w.outputs[turns[-1]]
            user = [rng.randrange(VOCAB) for _ in range(5)]
            prompt = prompt + out.token_ids + user
        w.chats.append(turns)

    sp = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    prompts = [o.prompt_token_ids for o in w.outputs]
    w.reference = off.generate(prompts, sp, prefix_hints=[h or [] for h in w.hints])
    w.rows = [torch.stack(rec_on.rows[o.request_id]) for o in w.outputs]
    w.ref_rows = [torch.stack(rec_off.rows[o.request_id]) for o in w.reference]
    assert off.stats.hit_tokens == 0
    on.scheduler.cache.check_integrity()
    return w


@pytest.fixture(scope="module", params=[0, K], ids=["k0", "k2"])
def workload(request: pytest.FixtureRequest) -> Workload:
    return run_workload(request.param)


def test_tokens_equal_uncached(workload: Workload) -> None:
    assert len(workload.outputs) == len(workload.reference) > 0
    for got, want in zip(workload.outputs, workload.reference, strict=True):
        assert got.token_ids == want.token_ids, got.request_id
        assert len(got.token_ids) == MAX_TOKENS
    assert sum(o.hit_tokens for o in workload.outputs) > 0


def test_sampled_logits_equal_uncached(workload: Workload) -> None:
    """One row per verification step. Greedy drafts come from the same drafter over the same
    context in both runs, so with k = 2 the steps, and so the rows, line up as well."""
    for i, (got, want) in enumerate(zip(workload.rows, workload.ref_rows, strict=True)):
        assert got.shape == want.shape, workload.outputs[i].request_id
        assert torch.allclose(got, want, rtol=0, atol=1e-9), workload.outputs[i].request_id


def test_siblings_resume_at_the_limit(workload: Workload) -> None:
    """Sibling 1 observes the junction; from sibling 2 on, every sibling resumes at the limit.
    With a prefix hint the producer already stops there, so sibling 1 does too."""
    k = workload.k
    assert limit(36, 0) != limit(36, K)  # the families tell the two formulas apart
    for fam in workload.families:
        hits = [workload.outputs[i].hit_tokens for i in fam.requests]
        want = limit(fam.shared, k)
        assert hits[0] == 0, (fam, hits)
        assert hits[2:] == [want] * (SIBLINGS - 1), (fam, hits, want)
        if fam.hinted:
            assert hits[1] == want, (fam, hits, want)
        else:
            assert hits[1] <= want, (fam, hits, want)
    assert any(
        workload.outputs[f.requests[1]].hit_tokens < limit(f.shared, k)
        for f in workload.families
        if not f.hinted
    ), "without a hint some first sibling should miss the limit (else hints prove nothing)"


def test_chat_turn_resumes_past_the_previous_answer(workload: Workload) -> None:
    for turns in workload.chats:
        for prev, cur in itertools.pairwise(turns):
            p, c = workload.outputs[prev], workload.outputs[cur]
            done = len(p.prompt_token_ids) + len(p.token_ids)  # L_k
            assert c.prompt_token_ids[:done] == p.prompt_token_ids + p.token_ids
            # at or past the prompt's end: only a snapshot of the sampling steps can serve it
            assert snapshot_position(done) >= len(p.prompt_token_ids)
            assert snapshot_position(done) <= c.hit_tokens < len(c.prompt_token_ids)


# ---------------------------------------------------------------------- decode snapshots
class OracleDrafts:
    """Replaces the drafter's proposals with the target's own greedy continuation (`answers`,
    per request id), corrupting draft i >= schedule[n] at a request's n-th decode step, so that
    exactly schedule[n] drafts are accepted there (cycling through `schedule`)."""

    def __init__(self, llm: LLM, schedule: list[int]) -> None:
        self.answers: dict[str, list[int]] = {}
        self.schedule = schedule
        self._steps: dict[str, int] = {}
        runner = llm.runner
        original = runner.execute

        def execute(out: SchedulerOutput) -> dict[str, StepResult]:
            results = original(out)
            for s in out.scheduled:
                rid = s.request.request_id
                res = results[rid]
                if not res.next_draft_token_ids:
                    continue
                n = self._steps.get(rid, 0)
                self._steps[rid] = n + 1
                good = self.schedule[n % len(self.schedule)]
                at = s.request.num_output_tokens + len(res.sampled_token_ids)
                drafts = self.answers[rid][at : at + K]
                drafts = [d if i < good else (d + 1) % VOCAB for i, d in enumerate(drafts)]
                results[rid] = StepResult(res.sampled_token_ids, res.num_accepted_drafts, drafts)
            return results

        runner.execute = execute  # type: ignore[method-assign]


KeepStates = Callable[[int, ScheduledRequest, int, int], None]


class SnapshotLog:
    """Records every snapshot copy the runner makes: (request id, position, offset of the
    position in the step's verified range: 0 is the step's own last token, 1 and 2 accepted
    drafts), read off the scratch slot the copy takes."""

    def __init__(self, llm: LLM) -> None:
        self.copies: list[tuple[str, int, int]] = []
        runner = llm.runner
        assert runner.states is not None
        states = runner.states
        original: KeepStates = runner._keep_states

        def keep(r: int, s: ScheduledRequest, accepted: int, last: int) -> None:
            snapshot = s.alloc.states[0].snapshot
            base = runner.scratch_base + r * (runner.k + 1)
            copy = states.copy_slot  # whatever is installed now (a test may patch it too)

            def spy(src: int, dst: int) -> None:
                if dst == snapshot:
                    offset = src - base if s.draft_token_ids else 0
                    self.copies.append((s.request.request_id, s.end + offset, offset))
                copy(src, dst)

            states.copy_slot = spy  # type: ignore[method-assign]
            try:
                original(r, s, accepted, last)
            finally:
                states.copy_slot = copy  # type: ignore[method-assign]

        runner._keep_states = keep  # type: ignore[method-assign]

    def offset(self, request_id: str, pos: int) -> int:
        """The offset of the last copy of `pos` for that request (the one that was kept)."""
        return [o for rid, p, o in self.copies if rid == request_id and p == pos][-1]


@dataclass
class Snapshot:
    request_id: str
    num_tokens: int  # L
    position: int  # where the cache keyed a state (0: nowhere at or below floor((L-1)/u)*u)
    error: float  # max |cached - from scratch| over conv and SSM states


# (prompt tokens, max_tokens): with SCHEDULE, their kept snapshots come from offsets 1, 0, 2
SNAPSHOT_CASES = [(17, 12), (21, 9), (30, 7)]
SCHEDULE = [2, 2, 1, 0, 2, 1]


def run_snapshots(
    cases: list[tuple[int, int]], schedule: list[int], patch: Callable[[LLM], None] | None = None
) -> tuple[list[Snapshot], SnapshotLog]:
    """Each case on a fresh request with oracle drafts (k = 2); then, per request, the state
    keyed at its snapshot position against the state from scratch."""
    rng = random.Random(9)
    plain = limit_llm(0, enable_prefix_caching=False)
    llm = limit_llm(K)
    oracle, log = OracleDrafts(llm, schedule), SnapshotLog(llm)
    if patch is not None:
        patch(llm)
    ssm = llm.scheduler.cache.ssm[0]
    snaps: list[Snapshot] = []
    for i, (t, max_tokens) in enumerate(cases):
        prompt = [rng.randrange(VOCAB) for _ in range(t)]
        rid = f"snap-{i}"
        longer = SamplingParams(max_tokens=max_tokens + K + 1, ignore_eos=True)
        oracle.answers[rid] = plain.generate([prompt], longer)[0].token_ids
        out = finish(llm, prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True), rid)
        assert out.token_ids == oracle.answers[rid][:max_tokens]
        full = prompt + out.token_ids
        probe = llm.scheduler.new_request("probe", full, SamplingParams())
        pos, block = ssm.find_hit(probe.hashes, snapshot_position(len(full)))
        error = math.inf
        if block is not None:
            assert llm.runner.states is not None
            got_conv, got_ssm = llm.runner.states.read(block)
            want_conv, want_ssm = state_from_scratch(llm, full[:pos])
            error = max(
                float((got_conv - want_conv).abs().max()), float((got_ssm - want_ssm).abs().max())
            )
        snaps.append(Snapshot(rid, len(full), pos, error))
    llm.scheduler.cache.check_integrity()
    return snaps, log


def finish(llm: LLM, prompt: list[int], params: SamplingParams, request_id: str) -> RequestOutput:
    """Run one request, named by the caller, to completion."""
    llm.add_request(prompt, params, request_id=request_id)
    while True:
        for event in llm.step():
            if event.request_id == request_id and event.output is not None:
                return event.output


def off_by_one_slot(llm: LLM, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the snapshot copy take the scratch slot one position off (the one before, or after
    for the known token's slot) instead of the slot of the snapshot position."""
    runner = llm.runner
    assert runner.states is not None
    states = runner.states
    copy = states.copy_slot
    original: KeepStates = runner._keep_states

    def keep(r: int, s: ScheduledRequest, accepted: int, last: int) -> None:
        snapshot = s.alloc.states[0].snapshot
        base = runner.scratch_base + r * (runner.k + 1)

        def shifted(src: int, dst: int) -> None:
            if dst == snapshot and base <= src <= base + runner.k:
                src = src - 1 if src > base else src + 1
            copy(src, dst)

        with monkeypatch.context() as m:
            m.setattr(states, "copy_slot", shifted)
            original(r, s, accepted, last)

    monkeypatch.setattr(runner, "_keep_states", keep)


def test_decode_snapshot_equals_state_from_scratch() -> None:
    snaps, log = run_snapshots(SNAPSHOT_CASES, SCHEDULE)
    for snap in snaps:
        assert snap.position == snapshot_position(snap.num_tokens), snap
        assert snap.error <= 1e-9, snap
    # the kept states came from a step's own token's slot and from both accepted drafts' slots
    assert {log.offset(s.request_id, s.position) for s in snaps} == {0, 1, 2}


def test_snapshot_from_a_neighbouring_scratch_slot_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    snaps, _ = run_snapshots(
        SNAPSHOT_CASES, SCHEDULE, patch=lambda llm: off_by_one_slot(llm, monkeypatch)
    )
    for snap in snaps:
        assert snap.position == snapshot_position(snap.num_tokens), snap  # still keyed there
        assert snap.error > 1e-6, snap  # but holding the wrong state


# ---------------------------------------------------------------------- found bugs, pinned
def test_answer_ending_on_the_unit_grid_is_resumed() -> None:
    """Under lookahead keys (k > 0), key(n) needs token n. `Scheduler.update` used to commit
    before appending the step's new tokens, and a finished request is freed right after, so
    key(L - 1) was never published on the attention groups when L - 1 is a multiple of u, while
    the SSM snapshot was keyed there. The next turn's joint hit fell below the snapshot (16
    instead of 24). Keys are now published after the append."""
    rng = random.Random(4)
    llm = limit_llm(K)
    t = next(t for t in range(17, 17 + U) if (t + MAX_TOKENS - 1) % U == 0)
    prompt = [rng.randrange(VOCAB) for _ in range(t)]
    first = run_one(llm, prompt)
    done = prompt + first.token_ids
    pos = snapshot_position(len(done))
    assert pos == len(done) - 1  # the answer ends one token past the unit grid
    nxt = done + [rng.randrange(VOCAB) for _ in range(5)]
    probe = llm.scheduler.new_request("probe", nxt, SamplingParams())
    cache = llm.scheduler.cache
    assert cache.ssm[0].find_hit(probe.hashes, pos)[0] == pos  # the snapshot itself is kept
    attention = [m.find_hit(probe.hashes, pos)[0] for m in cache.attention]
    second = run_one(llm, nxt)
    assert second.hit_tokens >= pos, f"resumed at {second.hit_tokens}; attention {attention}"


def test_snapshot_survives_a_last_step_verified_past_max_tokens() -> None:
    """The last decode step may accept drafts beyond max_tokens (or past a stop token). Here
    (17-token prompt, 11 outputs, every draft accepted) the last step verifies positions
    26..28, the second draft past max_tokens; the snapshot used to be taken at 28, which the
    request never reaches (L = 28), overwriting the one at 24 = floor((L-1)/u)*u. The runner and
    the SSM manager now snapshot only positions the request keeps (`Request.accept_tokens`)."""
    (snap,), _ = run_snapshots([(17, 11)], [K])
    assert snap.position == snapshot_position(snap.num_tokens) == 24, snap


def test_hinted_family_arriving_together_resumes_at_the_limit() -> None:
    """A hinted family submitted at once (P = 45, no drafter, limit 44). Step 2: the producer
    computes [32, 44), promising the hint checkpoint at 44; the siblings see attention 32 and
    no junction. They used to be admitted at 32 and recompute [32, 44); a waiting request now
    also waits for the checkpoints its own hints name (architecture §4.7), and resumes at 44."""
    rng = random.Random(6)
    shared = 45
    system = [rng.randrange(VOCAB) for _ in range(shared)]
    prompts = [system + s for s in distinct_suffixes(rng, 1 + SIBLINGS)]
    llm = limit_llm(0)
    sp = SamplingParams(max_tokens=2, ignore_eos=True)
    hits = [o.hit_tokens for o in llm.generate(prompts, sp, prefix_hints=[shared])]
    assert hits == [0] + [limit(shared, 0)] * SIBLINGS, hits


def test_short_answer_to_a_prompt_on_the_unit_grid_is_snapshotted() -> None:
    """T = 36 (a multiple of u), 4 answer tokens: L = 40, the snapshot belongs at
    floor((L-1)/u)*u = 36 = T, the state the prefill's last chunk ends on. No prompt checkpoint
    can hold it (under lookahead keys key(T) needs token T), so the sampling step that ends the
    prefill must snapshot it; the next turn then resumes there, not at the tail checkpoint 32."""
    rng = random.Random(8)
    llm = limit_llm(K)
    prompt = [rng.randrange(VOCAB) for _ in range(36)]
    first = run_one(llm, prompt)
    done = prompt + first.token_ids
    pos = snapshot_position(len(done))
    assert pos == len(prompt)
    nxt = done + [rng.randrange(VOCAB) for _ in range(5)]
    probe = llm.scheduler.new_request("probe", nxt, SamplingParams())
    kept = llm.scheduler.cache.ssm[0].find_hit(probe.hashes, pos)[0]
    second = run_one(llm, nxt)
    assert second.hit_tokens >= pos, f"resumed at {second.hit_tokens}; SSM keeps {kept}"


def _budget_passes(start: int, num_tokens: int, budget: int) -> int:
    """Prefill passes from `start` when only the budget (and the block grid it is floored to)
    ends chunks: no checkpoint stop at all."""
    from hycache.sched.chunking import chunk_end

    passes = 0
    while start < num_tokens:
        start = chunk_end(start, num_tokens, budget, [], B)
        passes += 1
    return passes


@pytest.mark.parametrize("k", [0, K])
def test_checkpoints_written_inside_the_forward_cost_no_pass(k: int) -> None:
    """`limit` with internal checkpoints (the default): a producer with a prefix hint runs as
    many forward passes as with prefix caching off, at the same budget, and a sibling that
    observes a junction only the passes its budget needs from where it resumed; both
    checkpoints are kept (the next requests resume at their limits, mid-block, off the scan
    chunk grid) and the tokens equal an uncached engine's."""
    rng = random.Random(3)
    shared = [rng.randrange(VOCAB) for _ in range(45)]
    private = [rng.randrange(VOCAB) for _ in range(40)]
    producer = shared + private  # 85 tokens: two passes at budget 64
    hinted = shared + [rng.randrange(VOCAB) for _ in range(30)]
    sibling = producer[:58] + [rng.randrange(VOCAB) for _ in range(33)]  # shares 58
    third = producer[:58] + [rng.randrange(VOCAB) for _ in range(20)]
    sp = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    runs = ((producer, [45]), (hinted, []), (sibling, []), (third, []))
    outs: dict[bool, list[RequestOutput]] = {}
    for on in (True, False):
        llm = make_llm(policy="limit", num_speculative_tokens=k, enable_prefix_caching=on)
        outs[on] = [llm.generate([p], sp, prefix_hints=[h])[0] for p, h in runs]
    assert [o.token_ids for o in outs[True]] == [o.token_ids for o in outs[False]]
    (p_on, h_on, s_on, t_on), (p_off, *_) = outs[True], outs[False]
    assert p_on.prefill_steps == p_off.prefill_steps == 2
    assert h_on.hit_tokens == limit(45, k)  # the producer's hint checkpoint
    assert s_on.junction == 56 and s_on.hit_tokens < limit(58, k)  # observed, on the unit grid
    assert t_on.hit_tokens == limit(58, k)  # the sibling's junction checkpoint
    for o, prompt in ((h_on, hinted), (s_on, sibling), (t_on, third)):
        assert o.prefill_steps == _budget_passes(o.hit_tokens, len(prompt), 64)
