"""Sharing scenarios run one request after another, on hycache's scheduler or on vLLM's.

A scenario is a list of `Turn`s: a prompt, the answer the fake model gives, and how many of
each step's drafts verify. Both drivers sample the same answers and propose the same drafts,
so the only difference between them is the scheduler and the cache:

    run_hycache(config, turns)          hycache's Scheduler + CacheManager
    reference.run_reference(setup, ..)  vLLM's Scheduler + KVCacheManager (0.33/0.34)

Each returns one `RequestTrace` per turn: where it resumed and where its prefill chunks ended.
A follow-up chat turn is a turn whose prompt contains the previous prompt and its answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from hycache.config import HycacheConfig
from hycache.request import SamplingParams
from hycache.sched.executor import run_to_completion
from hycache.sched.scheduler import Scheduler, SchedulerOutput, StepResult

VOCAB = 32000  # drafts are corrupted modulo this (below every model's vocabulary)


@dataclass(frozen=True)
class Turn:
    """One request: its prompt, the answer the fake model samples (its length is max_tokens),
    and the number of correct drafts in each proposal, cycled (empty: no drafts proposed)."""

    prompt: Sequence[int]
    answer: Sequence[int]
    accept: Sequence[int] = ()
    prefix_hints: Sequence[int] = ()


@dataclass
class RequestTrace:
    """What one request did: where it resumed and where its prefill chunks ended."""

    request_id: str
    hit: int = -1  # computed tokens when first scheduled
    chunk_ends: list[int] = field(default_factory=list)  # prompt chunk ends, ascending
    output: list[int] = field(default_factory=list)


def propose(answer: Sequence[int], at: int, k: int, good: int) -> list[int]:
    """k drafts for output index `at` on: the first `good` equal the answer, the others are
    wrong, so a verification accepts exactly min(good, drafts verified)."""
    want = list(answer[at : at + k])
    want += [0] * (k - len(want))
    return [t if i < good else (t + 1) % VOCAB for i, t in enumerate(want)]


def verify(answer: Sequence[int], at: int, drafts: Sequence[int]) -> list[int]:
    """What a verification samples at output index `at`: the drafts that match the answer,
    then one more token."""
    n = 0
    while n < len(drafts) and at + n < len(answer) and drafts[n] == answer[at + n]:
        n += 1
    return list(answer[at : at + n + 1])


class ScriptedExecutor:
    """hycache's executor for scripted answers: samples each request's answer and proposes
    drafts with a known number of correct ones (the same as the vLLM driver's)."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.turns: dict[str, Turn] = {}
        self.traces: dict[str, RequestTrace] = {}
        self._proposals = 0

    def add(self, request_id: str, turn: Turn) -> RequestTrace:
        self.turns[request_id] = turn
        tr = self.traces[request_id] = RequestTrace(request_id)
        return tr

    def execute(self, out: SchedulerOutput) -> dict[str, StepResult]:
        results: dict[str, StepResult] = {}
        for s in out.scheduled:
            req = s.request
            rid = req.request_id
            tr, turn = self.traces[rid], self.turns[rid]
            if tr.hit < 0:
                tr.hit = s.start
            if s.end <= req.num_prompt_tokens:
                tr.chunk_ends.append(s.end)
            if not s.samples:
                results[rid] = StepResult([])
                continue
            answer = list(turn.answer) or [1]
            at = req.num_output_tokens
            sampled = verify(answer, at, s.draft_token_ids)
            tr.output.extend(sampled)
            drafts: list[int] = []
            if turn.accept and self.k:
                good = turn.accept[self._proposals % len(turn.accept)]
                self._proposals += 1
                drafts = propose(answer, at + len(sampled), self.k, good)
            results[rid] = StepResult(sampled, len(sampled) - 1, drafts)
        return results


def run_hycache(config: HycacheConfig, turns: Sequence[Turn]) -> list[RequestTrace]:
    """Each turn runs to completion before the next arrives, on one fresh hycache scheduler;
    the cache's integrity is checked after every step."""
    sched = Scheduler(config)
    ex = ScriptedExecutor(config.speculative.num_speculative_tokens)
    out: list[RequestTrace] = []
    for i, turn in enumerate(turns):
        rid = f"r{i}"
        sp = SamplingParams(max_tokens=max(len(turn.answer), 1), ignore_eos=True)
        sched.add_request(
            sched.new_request(rid, list(turn.prompt), sp, prefix_hints=turn.prefix_hints)
        )
        out.append(ex.add(rid, turn))
        run_to_completion(sched, ex, check=True)
    return out
