"""The engine tests' shared builders: the float64 tiny engine (`make_llm`, B = 16, u = 4), the
sharing script `drive` and its preempting pools, the sampled-row logit recorder, and the
snapshot helpers (where a finished request keeps its state; that state from scratch)."""

from __future__ import annotations

import math
import random

import torch

from hycache.engine.engine import LLM
from hycache.model.paged import StepBatch
from hycache.request import SamplingParams


def snapshot_position(num_tokens: int) -> int:
    """Where a finished request of `num_tokens` prompt + output tokens keeps its state."""
    return (num_tokens - 1) // U * U


def state_from_scratch(llm: LLM, tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(conv, ssm) after running `llm`'s model over `tokens` in one step, in private caches."""
    n = len(tokens)
    blocks = math.ceil(n / B)
    kv = llm.model.make_kv_cache(blocks + 1, B)
    states = llm.model.make_state_cache(1)
    batch = StepBatch(
        input_ids=torch.tensor(tokens),
        positions=torch.arange(n),
        query_lens=[n],
        context_lens=[0],
        block_tables=[list(range(1, 1 + blocks))],
        state_src=[-1],
        state_writes=[[(n, 0)]],
    )
    llm.model.forward(batch, kv, states)
    return states.read(0)


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
