"""Cached = uncached on the real model: same greedy tokens, logits within 1e-9 (float64).

Workloads mix the sharing shapes of docs/architecture.md (system prompt + suffix, identical
resend, longer sibling, multi-turn continuation), run several requests at once in a pool
small enough to preempt, and abort one request mid-flight.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
import torch

from hycache.cache.ssm import SSMManager
from hycache.config import POLICY_NAMES
from hycache.engine.engine import LLM
from hycache.request import SamplingParams

B, U = 16, 4


class LogitRecorder:
    """Wraps the model's compute_logits to keep, per request, the logits of sampled rows."""

    def __init__(self, llm: LLM) -> None:
        self.rows: dict[str, list[torch.Tensor]] = {}
        self.llm = llm
        runner = llm.runner
        original = runner.execute

        def execute(out):  # type: ignore[no-untyped-def]
            model = runner.model
            inner = model.compute_logits
            sampling = [s for s in out.scheduled if s.samples]
            calls: list[torch.Tensor] = []

            def spy(hidden: torch.Tensor) -> torch.Tensor:
                logits = inner(hidden)
                calls.append(logits)
                return logits

            model.compute_logits = spy  # type: ignore[method-assign]
            try:
                res = original(out)
            finally:
                model.compute_logits = inner  # type: ignore[method-assign]
            if calls and sampling:
                at = 0
                for s in sampling:
                    n = len(s.draft_token_ids) + 1
                    self.rows.setdefault(s.request.request_id, []).append(calls[0][at])
                    at += n
            return res

        runner.execute = execute  # type: ignore[method-assign]


def make_llm(model: str = "tiny", **kw: object) -> LLM:
    base: dict[str, object] = dict(
        dtype="float64",
        block_size=B,
        prefix_match_unit=U,
        max_model_len=160,
        num_blocks=48,
        max_num_seqs=4,
        max_num_batched_tokens=64,
    )
    base.update(kw)
    return LLM(model, **base)  # type: ignore[arg-type]


def drive(llm: LLM, seed: int, sp: SamplingParams | None = None) -> dict[str, list[int]]:
    """A fixed script of sharing shapes; returns the tokens of every request not aborted."""
    rng = random.Random(seed)

    def toks(n: int) -> list[int]:
        return [rng.randrange(512) for _ in range(n)]

    sp = sp or SamplingParams(max_tokens=6, ignore_eos=True)
    system = toks(37)
    done: dict[str, list[int]] = {}

    def run_all(prompts: dict[str, list[int]], abort: str | None = None) -> None:
        for rid, p in prompts.items():
            llm.add_request(p, sp, request_id=rid)
        steps = 0
        while llm.scheduler.has_unfinished():
            for e in llm.step():
                if e.output is not None and e.output.finish_reason != "abort":
                    done[e.request_id] = e.output.token_ids
            steps += 1
            if abort and steps == 3:
                llm.abort(abort)

    a = system + toks(14)
    run_all({"a": a, "b": system + toks(21)})
    run_all(
        {"resend": list(a), "longer": a + toks(17), "c": system + toks(9), "x": system + toks(30)},
        abort="x",
    )
    run_all({"turn2": a + done["a"] + toks(11), "d": system + toks(25), "e": toks(3) + system})
    return done


def tight_pool(policy: str, k: int, internal: bool) -> dict[str, int]:
    """A pool that preempts on `drive`'s script (internal checkpoints split less, so need
    fewer pages at once; a shorter `max_model_len` lets the pool shrink; admission keeps fewer
    states under pressure: `junction` preempts from 20 pages down; states demoted or refreshed
    when their request lets go keep more hits, so fewer pages are taken at once; `limit`
    holds decode snapshots only while they earn their page)."""
    if k:
        if not internal:
            return {"num_blocks": 28}
        return {"num_blocks": {"junction": 20, "limit": 22}.get(policy, 24), "max_model_len": 96}
    if not internal or policy == "lookahead":
        return {"num_blocks": 16}
    return {"num_blocks": 13 if policy == "limit" else 14, "max_model_len": 96}


@pytest.mark.parametrize("policy", POLICY_NAMES)
@pytest.mark.parametrize("k", [0, 2])
@pytest.mark.parametrize("internal", [False, True])
def test_cached_equals_uncached(policy: str, k: int, internal: bool) -> None:
    """Also with checkpoints written inside the forward (at offsets that are not multiples of
    the model's scan chunk): the states they key equal those a split would have left."""
    tight = {**tight_pool(policy, k, internal), "internal_checkpoints": internal}
    on = make_llm(policy=policy, num_speculative_tokens=k, **tight)
    off = make_llm(policy=policy, num_speculative_tokens=k, enable_prefix_caching=False, **tight)
    written: list[tuple[int, ...]] = []
    plan = on.scheduler.cache.internal_writes

    def recording(req, start, end):  # type: ignore[no-untyped-def]
        out = plan(req, start, end)
        written.extend([out] if out else [])
        return out

    on.scheduler.cache.internal_writes = recording  # type: ignore[method-assign]
    rec_on, rec_off = LogitRecorder(on), LogitRecorder(off)
    got_on, got_off = drive(on, 7), drive(off, 7)
    assert got_on == got_off
    if not internal:
        assert not written
    elif policy != "lookahead":  # lookahead writes only vLLM's export, when a chunk allows it
        assert written
    assert set(got_on) == {"a", "b", "resend", "longer", "c", "turn2", "d", "e"}
    assert on.stats.hit_tokens > 0 and off.stats.hit_tokens == 0
    assert on.scheduler.num_preemptions > 0, "the pool should be small enough to preempt"
    if k == 0:  # one logits row per output token: compare them all
        for rid in got_on:
            a, b = torch.stack(rec_on.rows[rid]), torch.stack(rec_off.rows[rid])
            assert torch.allclose(a, b, rtol=0, atol=1e-9), rid
    on.scheduler.cache.check_integrity()
    assert on.scheduler.cache.pool.num_free == on.config.cache.num_blocks - 1


@pytest.mark.parametrize("k", [1, 3])
def test_speculative_equals_plain(k: int) -> None:
    plain = drive(make_llm(num_speculative_tokens=0), 11)
    spec = drive(make_llm(num_speculative_tokens=k), 11)
    assert spec == plain


def test_resumed_ssm_state_equals_state_from_scratch() -> None:
    llm = make_llm(num_blocks=80, max_num_batched_tokens=160)
    rng = random.Random(3)
    prompt = [rng.randrange(512) for _ in range(45)]
    llm.generate([prompt], SamplingParams(max_tokens=1))
    cache = llm.scheduler.cache
    ssm: SSMManager = cache.ssm[0]
    from hycache.request import Request

    probe = Request.new("p", prompt, SamplingParams(), unit=U, lookahead=cache.bounds.lookahead)
    n, block = ssm.find_hit(probe.hashes, 44)
    assert n > 0 and block is not None
    fresh = make_llm(num_blocks=80, enable_prefix_caching=False)
    states = fresh.runner.states
    from hycache.model.paged import StepBatch

    batch = StepBatch(
        input_ids=torch.tensor(prompt[:n]),
        positions=torch.arange(n),
        query_lens=[n],
        context_lens=[0],
        block_tables=[list(range(1, 1 + -(-n // B)))],
        state_src=[-1],
        state_writes=[[(n, 0)]],
    )
    fresh.model.forward(batch, fresh.runner.kv, states)
    got_conv, got_ssm = llm.runner.states.read(block)
    want_conv, want_ssm = states.read(0)
    assert torch.allclose(got_ssm, want_ssm, rtol=0, atol=1e-9)
    assert torch.allclose(got_conv, want_conv, rtol=0, atol=1e-9)


def test_a_checkpoint_keyed_one_unit_off_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The equality check must fail when the SSM state after n tokens is keyed at n - u (at
    a chunk end, or written inside the forward)."""
    original: Callable = SSMManager.commit

    def off_by_one(self: SSMManager, request_id: str, hashes, num_computed: int) -> None:  # type: ignore[no-untyped-def]
        st = self._states[request_id]
        if st.pending_checkpoint and st.pending_end > U:
            st.pending_end -= U
        st.pending_writes = tuple((p - U if p > U else p, b) for p, b in st.pending_writes)
        original(self, request_id, hashes, num_computed)

    monkeypatch.setattr(SSMManager, "commit", off_by_one)
    on, off = make_llm(), make_llm(enable_prefix_caching=False)
    rec_on, rec_off = LogitRecorder(on), LogitRecorder(off)
    drive(on, 7)
    drive(off, 7)
    worst = max(
        float((torch.stack(rec_on.rows[r]) - torch.stack(rec_off.rows[r])).abs().max())
        for r in rec_on.rows
        if r in rec_off.rows and len(rec_on.rows[r]) == len(rec_off.rows[r])
    )
    assert worst > 1e-6
