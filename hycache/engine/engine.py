"""The engine: a hybrid model served through hycache's scheduler and cache.

    llm = LLM("tiny", num_speculative_tokens=3, block_size=64, prefix_match_unit=16)
    outs = llm.generate([[1, 2, 3], "text (needs a tokenizer)"], SamplingParams(max_tokens=8))
    for event in llm.stream(prompts, params): ...

One step is schedule -> run -> update. Requests the model cannot take are refused at
`add_request` with a ValueError, before anything is queued.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from hycache.cache import layout
from hycache.config import (
    DEFAULT_EVICTION_ALPHA,
    CacheConfig,
    GroupKind,
    HycacheConfig,
    Policy,
    RecomputeCost,
    SchedulerConfig,
    SpeculativeConfig,
)
from hycache.engine.host_memory import keep_freed_memory
from hycache.engine.outputs import EngineSnapshot, EngineStats, RequestOutput, StreamEvent
from hycache.engine.runner import ModelRunner
from hycache.engine.tier import attach_store, engine_fingerprint
from hycache.hashing import extra_key_bytes
from hycache.model.configs.base import HybridConfig
from hycache.model.configs.qwen3_next import Qwen3NextConfig
from hycache.model.eagle import EagleHead
from hycache.model.loader import load_model
from hycache.model.mtp import MtpHead, checkpoint_mtp_tensors
from hycache.request import Request, RequestStatus, SamplingParams
from hycache.sched.scheduler import Scheduler, SchedulerOutput
from hycache.store import KVStore

DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def state_bytes(mc: HybridConfig, dtype: torch.dtype) -> int:
    """Bytes of one conv + SSM state slot over every Mamba layer (`layout.state_page_bytes`)."""
    return layout.state_page_bytes(mc, dtype.itemsize)


def attention_block_bytes(
    mc: HybridConfig, block_size: int, dtype: torch.dtype, drafter: bool
) -> int:
    """Bytes behind one attention block id: its K/V rows in every attention cache (the
    drafter's too). SSM states have a pool of their own (`state_bytes` a page)."""
    layers = mc.num_attention_layers + (1 if drafter else 0)
    return layout.attention_block_bytes(
        layers, block_size, mc.num_key_value_heads, mc.head_dim, dtype.itemsize
    )


def recompute_cost(model: torch.nn.Module, mc: HybridConfig, drafter: bool) -> RecomputeCost:
    """The prefill FLOPs `flop-aware` eviction prices entries with, from the model's own
    layers (the simulator's `CostModel.recompute_cost` terms): 2 FLOPs per weight of every
    decoder layer and token (MLP-only layers split over the mixer kinds by count), attention
    `4 * heads * head_dim` per (query, key) pair per attention layer (+ the drafter's)."""
    layers = list(getattr(model, "decoder_layers", ()))
    ssm = attn = other = 0
    for i, layer in enumerate(layers):
        n = sum(p.numel() for p in layer.parameters())
        if mc.is_mamba_layer(i):
            ssm += n
        elif mc.is_attention_layer(i):
            attn += n
        else:
            other += n
    mixers = mc.num_mamba_layers + mc.num_attention_layers
    ssm_params = ssm + (other * mc.num_mamba_layers / mixers if mixers else 0)
    token = 2.0 * (ssm + attn + other)
    pair = 4.0 * mc.num_attention_heads * mc.head_dim * (mc.num_attention_layers + drafter)
    if token == 0 and pair == 0:
        return RecomputeCost()
    return RecomputeCost(token, pair, 2.0 * ssm_params / token if token else 0.0)


def make_drafter(
    model: str,
    mc: HybridConfig,
    draft_model: str | None,
    draft_seed: int,
    dtype: torch.dtype,
    device: torch.device | str,
) -> EagleHead | MtpHead:
    """The drafter: the EAGLE head at `draft_model`; else the MTP layer a Qwen3-Next / Qwen3.5
    checkpoint carries (`mtp.*`; a random one for a GDN preset); else a random EAGLE head."""
    if draft_model:
        return EagleHead.load(draft_model, mc, dtype, device)
    if isinstance(mc, Qwen3NextConfig):
        if Path(model).is_dir():
            tensors = checkpoint_mtp_tensors(model)
            if tensors:
                return MtpHead.from_tensors(tensors, mc, dtype, device, what=f"{model} mtp.*")
        else:
            return MtpHead.random(mc, draft_seed, dtype, device)
    return EagleHead.random(mc, draft_seed, dtype, device)


def scratch_bytes(mc: HybridConfig, dtype: torch.dtype, max_num_seqs: int, k: int) -> int:
    """Speculative scratch: one state slot per verified position of every sequence."""
    return max_num_seqs * (k + 1) * state_bytes(mc, dtype) if k else 0


def eos_token_ids(model: str) -> tuple[int, ...]:
    """Every end-of-sequence id the checkpoint names: `eos_token_id` in `config.json` and in
    `generation_config.json`, each an int or a list (presets have none)."""
    ids: set[int] = set()
    for name in ("config.json", "generation_config.json"):
        path = Path(model) / name
        if not path.is_file():
            continue
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # a broken file is the loader's to report; it names no EOS here
        eos = doc.get("eos_token_id") if isinstance(doc, dict) else None
        for t in eos if isinstance(eos, list) else [eos]:
            if isinstance(t, int) and not isinstance(t, bool) and t >= 0:
                ids.add(t)
    return tuple(sorted(ids))


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


class LLM:
    def __init__(
        self,
        model: str = "tiny",
        *,
        dtype: str | torch.dtype = "float32",
        device: str | None = None,
        block_size: int = 64,
        prefix_match_unit: int | None = 16,
        num_blocks: int | None = None,
        num_state_pages: int | None = None,
        max_model_len: int | None = None,
        policy: str | Policy = "limit",
        retention: str | int = "semantic",
        enable_prefix_caching: bool = True,
        num_speculative_tokens: int = 0,
        draft_model: str | None = None,
        draft_seed: int = 0,
        max_num_batched_tokens: int = 8192,
        max_num_seqs: int = 64,
        hash_seed: int = 0,
        seed: int = 0,
        cache_memory_gb: float = 1.0,
        kv_store: str | KVStore | None = None,
        kv_store_gb: float = 1.0,
        eviction: str = "lru",
        eviction_alpha: float = DEFAULT_EVICTION_ALPHA,
        internal_checkpoints: bool = True,
        prebuilt: tuple[torch.nn.Module, HybridConfig] | None = None,
        warmup: bool = False,
    ) -> None:
        """Cache memory: by default `cache_memory_gb` (speculative scratch included) is split
        into attention blocks and SSM state pages (`hycache.cache.layout`); `num_blocks` alone
        sizes one pool shared by both kinds, as the simulator does; both set two pools.

        `kv_store`: a second cache tier behind the device pool, "host" (this process's RAM,
        `kv_store_gb` GiB, LRU) or "mooncake://HOST:PORT" (a Mooncake master shared with other
        processes; this one contributes `kv_store_gb` GiB), or a `KVStore`.

        `eviction`: `lru` or `flop-aware` (entries valued by the FLOPs a hit saves, priced from
        this model's layers: `recompute_cost`), weighed by `eviction_alpha`.

        `internal_checkpoints`: SSM checkpoints written inside a forward, not by splitting the
        prefill at each (`CacheConfig.internal_checkpoints`).

        `prebuilt`: a (model, config) built by the caller (e.g. random weights made on the
        device for a model too large to initialise on the host); `model` then only names it.

        `warmup`: run one forward of `max_num_batched_tokens` positions before the first
        request (`ModelRunner.warmup`), as a server does before it listens: the first
        request's step then runs as fast as the ones after it."""
        torch_dtype = DTYPES[dtype] if isinstance(dtype, str) else dtype
        dev = device or ("cuda" if torch.cuda.is_available() else "cpu")
        if torch.device(dev).type == "cpu":
            keep_freed_memory()  # the forward's temporaries stop faulting in fresh pages
        if prebuilt is not None:
            self.model, self.model_config = prebuilt  # type: ignore[assignment]
            self.tokenizer = None
        else:
            self.model, self.model_config, self.tokenizer = load_model(model, torch_dtype, dev)
        mc = self.model_config
        max_len = max_model_len or min(mc.max_position_embeddings, 8192)
        drafter = None
        if num_speculative_tokens:
            drafter = make_drafter(model, mc, draft_model, draft_seed, torch_dtype, dev)
        groups: list[GroupKind] = []
        if mc.num_attention_layers:
            groups.append(GroupKind.ATTENTION)
        if mc.num_mamba_layers:
            groups.append(GroupKind.SSM)
        if drafter is not None:
            groups.append(GroupKind.ATTENTION)
        budget = int(cache_memory_gb * 2**30)
        scratch = scratch_bytes(mc, torch_dtype, max_num_seqs, num_speculative_tokens)
        if scratch >= budget:
            raise ValueError(
                f"cache_memory_gb: {cache_memory_gb} GiB cannot hold the speculative scratch "
                f"states ({max_num_seqs} sequences x {num_speculative_tokens + 1} positions = "
                f"{scratch / 2**30:.2f} GiB); lower num_speculative_tokens or max_num_seqs, or "
                "raise cache_memory_gb"
            )
        if num_blocks is None:  # two pools from what the scratch states leave of the budget
            sizes = layout.split_budget(
                budget - scratch,
                attention_block_bytes=attention_block_bytes(
                    mc, block_size, torch_dtype, drafter is not None
                ),
                state_page_bytes=state_bytes(mc, torch_dtype),
                max_model_len=max_len,
                block_size=block_size,
                attention_groups=groups.count(GroupKind.ATTENTION),
            )
            num_blocks = sizes.num_blocks
            if mc.num_mamba_layers and num_state_pages is None:
                num_state_pages = sizes.num_state_pages
        self.config = HycacheConfig(
            CacheConfig(
                block_size=block_size,
                prefix_match_unit=prefix_match_unit,
                num_blocks=num_blocks,
                num_state_pages=num_state_pages if mc.num_mamba_layers else None,
                max_model_len=max_len,
                policy=policy,
                retention=retention,
                enable_prefix_caching=enable_prefix_caching,
                hash_seed=hash_seed,
                groups=tuple(groups),
                eviction=eviction,
                eviction_alpha=eviction_alpha,
                recompute_cost=recompute_cost(self.model, mc, drafter is not None),
                internal_checkpoints=internal_checkpoints,
            ),
            SpeculativeConfig(num_speculative_tokens=num_speculative_tokens),
            SchedulerConfig(max_num_batched_tokens, max_num_seqs),
        )
        self.scheduler = Scheduler(self.config, keep_finished=0)  # `step` reports each finish
        self.runner = ModelRunner(self.model, self.config, drafter=drafter, seed=seed)
        if warmup:
            self.runner.warmup(min(max_num_batched_tokens, max_len))
        self.store: KVStore | None = None
        if kv_store is not None:
            seed_id = None if draft_model else draft_seed
            fp = engine_fingerprint(model, mc, torch_dtype, self.config, draft_model, seed_id)
            mirror = attach_store(kv_store, kv_store_gb, self.scheduler.cache, self.runner, fp)
            self.store = mirror.store
        self.stats = EngineStats()
        # the last step's schedule (`hycache.bench.calibrate` reads the work each timed step did)
        self.last_schedule: SchedulerOutput | None = None
        self._ids = itertools.count()
        self._streamed: dict[str, int] = {}  # output tokens already streamed, per request
        self.eos_token_ids = eos_token_ids(model)

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
        out = self.last_schedule = self.scheduler.schedule()
        results = self.runner.execute(out)
        finished = self.scheduler.update(out, results)
        self.stats.steps += 1
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
