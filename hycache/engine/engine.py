"""The engine: a hybrid model served through hycache's scheduler and cache.

    llm = LLM("tiny", num_speculative_tokens=3, block_size=64, prefix_match_unit=16)
    outs = llm.generate([[1, 2, 3], "text (needs a tokenizer)"], SamplingParams(max_tokens=8))
    for event in llm.stream(prompts, params): ...

One step is schedule -> run -> update (`step`; a step observer sees each step's schedule).
Requests the model cannot take are refused at `add_request` with a ValueError, before anything
is queued. Building the engine (loading, the drafter, sizing the pools, the config, the store)
is `hycache.engine.build`'s.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from hycache.cache.event_log import EventMode, KVEventLog
from hycache.config import CacheKnobs, HycacheConfig
from hycache.engine.build import build_engine
from hycache.engine.options import EngineOptions, resolve
from hycache.engine.outputs import (
    EngineSnapshot,
    EngineStats,
    RequestOutput,
    RequestProgress,
    StreamEvent,
)
from hycache.hashing import extra_key_bytes
from hycache.model.configs.base import HybridConfig
from hycache.request import Request, RequestStatus, SamplingParams
from hycache.sched.scheduler import SchedulerOutput
from hycache.store import KVStore

PrefixHints = Sequence[int] | Sequence[Sequence[int]] | None


def _hints_list(hints: PrefixHints, n: int) -> list[tuple[int, ...]]:
    """Per-prompt hint tuples from one shared list or a list per prompt."""
    if not hints:
        return [()] * n
    if all(isinstance(h, int) for h in hints):
        return [tuple(hints)] * n  # type: ignore[arg-type]
    if len(hints) != n or not all(isinstance(h, Sequence) for h in hints):
        raise ValueError(
            f"prefix_hints: give one list of token counts, or one list per prompt ({n})"
        )
    return [tuple(int(x) for x in h) for h in hints]  # type: ignore[union-attr]


StepObserver = Callable[[SchedulerOutput], None]


class LLM:
    def __init__(
        self,
        model: str = "tiny",
        *,
        knobs: CacheKnobs | None = None,
        options: EngineOptions | None = None,
        prebuilt: tuple[torch.nn.Module, HybridConfig] | None = None,
        **overrides: Any,
    ) -> None:
        """The engine of `model` (a preset name or a checkpoint directory).

        `knobs`: the cache's choices (`hycache.config.CacheKnobs`: block size, unit, policy,
        retention, eviction, admission, ...); `options`: everything else it is built with
        (`hycache.engine.options.EngineOptions`: dtype, device, drafter, memory, scheduler
        budget, second tier, warm-up). `overrides`: any field of either by name, applied
        over them (`LLM("tiny", block_size=64, num_speculative_tokens=2)`); a name neither
        declares is a TypeError.

        `prebuilt`: a (model, config) built by the caller (e.g. random weights made on the
        device for a model too large to initialise on the host); `model` then only names it.

        `add_step_observer` registers a callback that sees every step's `SchedulerOutput`."""
        knobs, options = resolve(knobs, options, overrides)
        parts = build_engine(model, knobs, options, prebuilt)
        self.model, self.model_config = parts.model, parts.model_config
        self.tokenizer = parts.tokenizer
        self.config: HycacheConfig = parts.config
        self.scheduler, self.runner = parts.scheduler, parts.runner
        self.store: KVStore | None = parts.store
        self.eos_token_ids = parts.eos_token_ids
        self.stats = EngineStats()
        self._observers: list[StepObserver] = []
        self._ids = itertools.count()
        self._streamed: dict[str, int] = {}  # output tokens already streamed, per request
        self._event_logs: dict[str, KVEventLog] = {}  # `kv_events`, per mode

    def add_step_observer(self, observer: StepObserver) -> None:
        """Call `observer(schedule)` after every step has run and been applied, with the
        step's `SchedulerOutput` (what ran: each request's tokens, drafts and context; what
        `hycache.bench` prices a timed step by)."""
        self._observers.append(observer)

    def remove_step_observer(self, observer: StepObserver) -> None:
        self._observers.remove(observer)

    def kv_events(self, mode: EventMode = "resumable") -> KVEventLog:
        """The cache's KV event log in `mode` (docs/events.md): created, and subscribed to the
        cache, on the first call for that mode; the same log after. Drain it after steps
        (`hycache.engine.kv_events.publish_kv_events` does, over ZMQ)."""
        if mode not in self._event_logs:
            self._event_logs[mode] = KVEventLog(self.scheduler.cache, mode)
        return self._event_logs[mode]

    def resume_point(self, prompt: str | Sequence[int], cache_salt: str | None = None) -> int:
        """Where a request for `prompt` would resume now: the cache's lookup (the joint hit,
        the drafter's rule), the depth the `resumable` events publish on its path. Changes
        nothing; a second tier attached may supply more at admission (`CacheManager.fetch`)."""
        req = self.scheduler.new_request(
            "resume-point", self.encode(prompt), SamplingParams(),
            extra_keys=extra_key_bytes(cache_salt),
        )  # fmt: skip
        return self.scheduler.cache.lookup(req).resume_point

    # -- requests --------------------------------------------------------------------------------

    def encode(self, prompt: str | Sequence[int]) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError(
                    "prompt: this model has no tokenizer.json; pass token ids instead of text"
                )
            return list(self.tokenizer.encode(prompt).ids)
        return [int(t) for t in prompt]

    def decode(self, token_ids: Sequence[int]) -> str | None:
        return self.tokenizer.decode(list(token_ids)) if self.tokenizer is not None else None

    def _validate(self, ids: list[int], params: SamplingParams) -> None:
        vocab = self.model_config.vocab_size
        max_len = self.config.cache.max_model_len
        if not ids:
            raise ValueError("prompt: empty prompt")
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompt: token id {bad[0]} is outside the vocabulary [0, {vocab})")
        bad_bias = [t for t, _ in params.logit_bias if not t < vocab]
        if bad_bias:
            raise ValueError(
                f"logit_bias: token id {bad_bias[0]} is outside the vocabulary [0, {vocab})"
            )
        bad_stop = [t for t in params.stop_token_ids if not t < vocab]
        if bad_stop:
            raise ValueError(
                f"stop_token_ids: token id {bad_stop[0]} is outside the vocabulary [0, {vocab})"
            )
        if len(ids) + params.max_tokens > max_len:
            raise ValueError(
                f"prompt: {len(ids)} prompt tokens + max_tokens {params.max_tokens} exceed "
                f"max_model_len {max_len}"
            )

    def add_request(
        self,
        prompt: str | Sequence[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
        cache_salt: str | None = None,
        prefix_hints: Sequence[int] = (),
    ) -> str:
        """Validate and queue one request; raises ValueError, changing nothing, if refused.
        Requests with different `cache_salt`s never share cache entries. `prefix_hints`: token
        counts where this prompt's shared prefixes end (e.g. the end of a system prompt); under
        `limit` the first request of a family already checkpoints there."""
        params = params or SamplingParams()
        ids = self.encode(prompt)
        self._validate(ids, params)
        rid = request_id or f"req-{next(self._ids)}"
        req = self.scheduler.new_request(
            rid,
            ids,
            params,
            extra_keys=extra_key_bytes(cache_salt),
            eos_token_ids=self.eos_token_ids,
            prefix_hints=prefix_hints,
        )
        self.scheduler.add_request(req)
        return rid

    def add_requests(
        self,
        prompts: Sequence[str | Sequence[int]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        prefix_hints: PrefixHints = None,
    ) -> list[str]:
        """Validate every prompt first, then queue them all (all or nothing)."""
        plist = self._params_list(prompts, params)
        hints = _hints_list(prefix_hints, len(prompts))
        encoded = [self.encode(p) for p in prompts]
        for ids, sp in zip(encoded, plist, strict=True):
            self._validate(ids, sp)
        return [
            self.add_request(ids, sp, prefix_hints=h)
            for ids, sp, h in zip(encoded, plist, hints, strict=True)
        ]

    def abort(self, request_id: str) -> bool:
        self._forget(request_id)
        return self.scheduler.abort(request_id)

    def finish(
        self,
        request_id: str,
        status: RequestStatus = RequestStatus.FINISHED_STOPPED,
        num_output_tokens: int | None = None,
    ) -> RequestOutput:
        """End an unfinished request here (a stop string the caller found in its text):
        everything it holds is freed, and its output (the first `num_output_tokens` tokens,
        default all) is counted in `stats` like any finished request's and returned. KeyError
        if no unfinished request has this id."""
        req = self.scheduler.finish(request_id, status)
        self._forget(request_id)
        output = self.request_output(req, num_output_tokens)
        self.stats.count(output)
        return output

    def _forget(self, request_id: str) -> None:
        self.runner.release(request_id)
        self._streamed.pop(request_id, None)

    # -- stepping --------------------------------------------------------------------------------

    def step(self) -> list[StreamEvent]:
        """One engine step; returns the new tokens of every request that produced some."""
        out = self.scheduler.schedule()
        results = self.runner.execute(out)
        finished = self.scheduler.update(out, results)
        self.stats.steps += 1
        for observe in self._observers:
            observe(out)
        events: list[StreamEvent] = []
        before: dict[str, int] = {}  # output tokens streamed before this step
        done = {r.request_id for r in finished}
        for s in out.scheduled:
            req = s.request
            rid = req.request_id
            # a request re-admitted after a preemption replays its outputs: stream each once
            n0 = before[rid] = self._streamed.get(rid, 0)
            new = req.output_token_ids[n0:]
            self._streamed[rid] = req.num_output_tokens
            if new and n0 == 0:
                self.stats.prefilled_prompt_tokens += req.num_prompt_tokens
            self.stats.generated_tokens += len(new)
            if new or rid in done:
                lps = req.output_logprobs[n0:] if req.sampling.logprobs is not None else None
                events.append(StreamEvent(rid, list(new), rid in done, new_logprobs=lps))
            if rid in done:
                del self._streamed[rid]
        for req in finished:
            self.runner.release(req.request_id)
            output = self.request_output(req)
            self.stats.count(output)
            for e in events:
                if e.request_id == req.request_id:
                    e.output = output
        failed = self.runner.take_failed()
        if failed:
            reqs = {
                s.request.request_id: (s.request, before[s.request.request_id])
                for s in out.scheduled
            }
            events = [e for e in events if e.request_id not in failed]
            for rid, why in failed.items():
                req, n0 = reqs[rid]
                events.append(self._fail(req, n0, why, counted=rid in done))
        return events

    def _fail(self, req: Request, n0: int, why: str, counted: bool) -> StreamEvent:
        """End `req`, whose sampling failed in this step, alone: its last event carries no new
        token (the runner's stand-in is dropped; `n0` output tokens were streamed before) and
        `error`; its output's finish reason is "error"."""
        rid = req.request_id
        self.stats.generated_tokens -= req.num_output_tokens - n0  # the stand-in
        if not req.status.finished:
            self.scheduler.finish(rid, RequestStatus.FINISHED_ABORTED)
        self._forget(rid)
        output = dataclasses.replace(self.request_output(req, n0), finish_reason="error")
        if not counted:
            self.stats.count(output)
        return StreamEvent(rid, [], True, output, error=why)

    # -- what the bench and the server read (never the scheduler itself) -------------------------

    def has_unfinished(self) -> bool:
        """Whether any request is waiting or running (a `step` would do work)."""
        return self.scheduler.has_unfinished()

    def unfinished_ids(self) -> list[str]:
        """The ids of every request not finished yet: running ones first, then waiting ones,
        each in arrival order."""
        return self.scheduler.unfinished_ids()

    def running(self) -> list[RequestProgress]:
        """The running requests' progress now (copies), in the scheduler's order."""
        return [
            RequestProgress(r.request_id, r.num_prompt_tokens, r.num_computed_tokens)
            for r in self.scheduler.running
        ]

    @property
    def num_preemptions(self) -> int:
        """Preemptions since the engine was built (a request may count more than once)."""
        return self.scheduler.num_preemptions

    @property
    def used_blocks(self) -> int:
        """Device cache blocks in use now (held by a request; the null block not counted):
        a cheap reading for every step, where `snapshot` reads every counter."""
        pool = self.scheduler.cache.pool
        return pool.num_blocks - 1 - pool.num_free

    def synchronize(self) -> None:
        """Wait until the device has run all the work queued on it (a no-op on a CPU): what a
        timer around `step` needs on a GPU."""
        if str(self.model.device).startswith("cuda"):
            torch.cuda.synchronize()

    def copy_blocks(self, pairs: Sequence[tuple[int, int]]) -> None:
        """Copy each (src, dst) cache block's K/V, the target's and the drafter's, as a cache
        hit's copy-on-write does; nothing else changes (the cache's books do not see it: for
        timing the copies alone, `hycache calibrate`)."""
        for kv in (self.runner.kv, self.runner.draft_kv):
            if kv is not None:
                for src, dst in pairs:
                    kv.copy_block(src, dst)

    def copy_state_slots(self, pairs: Sequence[tuple[int, int]]) -> None:
        """Copy each (src, dst) SSM state slot, as a state write does; like `copy_blocks`,
        outside the cache's books."""
        states = self.runner.states
        if states is not None:
            for src, dst in pairs:
                states.copy_slot(src, dst)

    def snapshot(self) -> EngineSnapshot:
        """The scheduler, cache, store and engine counters now (`/v1/stats`, `/metrics`)."""
        return EngineSnapshot.of(self.scheduler, self.stats, self.store)

    def request_output(self, req: Request, num_output_tokens: int | None = None) -> RequestOutput:
        """What `req` has produced so far (its first `num_output_tokens`, default all), as a
        `RequestOutput` (its text decoded)."""
        ids = req.output_token_ids[:num_output_tokens]
        reason = {
            RequestStatus.FINISHED_STOPPED: "stop",
            RequestStatus.FINISHED_LENGTH: "length",
            RequestStatus.FINISHED_ABORTED: "abort",
        }.get(req.status)
        return RequestOutput(
            req.request_id,
            list(req.prompt_token_ids),
            ids,
            self.decode(ids),
            req.first_hit_tokens or 0,
            reason,
            req.num_preemptions,
            req.prefill_tokens_computed,
            req.first_outcome.junction if req.first_outcome else 0,
            req.num_prefill_steps,
            req.first_outcome.lost_reuse if req.first_outcome else 0,
            req.output_logprobs[:num_output_tokens] if req.sampling.logprobs is not None else None,
            store_hit_tokens=req.first_outcome.store_hit_tokens if req.first_outcome else 0,
            checkpoint_splits=req.num_checkpoint_splits,
        )

    def stream(
        self,
        prompts: Sequence[str | Sequence[int]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        prefix_hints: PrefixHints = None,
    ) -> Iterator[StreamEvent]:
        """Queue every prompt (all validated first), then yield new tokens as they come."""
        pending = set(self.add_requests(prompts, params, prefix_hints))
        while pending:
            for event in self.step():
                if event.request_id in pending:
                    if event.finished:
                        pending.discard(event.request_id)
                    yield event

    def generate(
        self,
        prompts: Sequence[str | Sequence[int]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        prefix_hints: PrefixHints = None,
    ) -> list[RequestOutput]:
        """Run every prompt to completion; outputs in prompt order. `prefix_hints`: one list of
        token counts for every prompt, or one list per prompt."""
        ids = self.add_requests(prompts, params, prefix_hints)
        outputs: dict[str, RequestOutput] = {}
        while len(outputs) < len(ids):
            for event in self.step():
                if event.output is not None:
                    outputs[event.request_id] = event.output
        return [outputs[r] for r in ids]

    @staticmethod
    def _params_list(
        prompts: Sequence[Any], params: SamplingParams | Sequence[SamplingParams] | None
    ) -> list[SamplingParams]:
        if params is None or isinstance(params, SamplingParams):
            return [params or SamplingParams()] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"params: {len(params)} sampling params for {len(prompts)} prompts")
        return list(params)
