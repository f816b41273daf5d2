"""vLLM's real scheduler (0.33 or 0.34), driven on a sharing scenario: the reference hycache is
held to.

No model runs. vLLM's own `Scheduler` (its `KVCacheManager`, hybrid coordinator, Mamba manager
and chunk split) schedules the requests; a scripted model-runner output samples each request's
answer when its prefill completes, and proposes drafts that verify a known number of tokens.
Requests are hashed as `EngineCore` hashes them (`get_request_block_hasher` with vLLM's own
lookahead count), so a hit here is a hit the engine gives.

    scenario (prompts, answers, drafts) ──▶ vllm.Scheduler.schedule / update_from_output
                                            update_draft_token_ids (scripted MTP proposals)
                                        ◀── per request: hit, chunk ends

Two hybrids (`model`), each with two Mamba specs (`exporting`):

    nemotron-h-8b        one attention group and one Mamba2 group (small states: the
                         scheduler never reads a page's bytes)
      exporting True     vLLM's `MambaMixer2.get_kv_cache_spec` (every Mamba2 model:
                         Nemotron-H, Granite-4.0-H, Bamba): one checkpoint per forward exported
                         from inside the pass (`num_prefill_checkpoint_blocks=1,
                         prefill_checkpoint_alignment=1`)
      exporting False    a Mamba layer that cannot export: the scheduler splits prefill at its
                         checkpoints
    qwen3-next-80b-a3b   the KV cache config vLLM builds for Qwen3-Next-80B-A3B with its MTP
                         layer: `QwenGatedDeltaNetAttention.get_kv_cache_spec` for the 36 GDN
                         layers (states from `MambaStateShapeCalculator.gated_delta_net_state_
                         shape` / `..._dtype`, `mamba_type=GDN_ATTN`, the page padded to the
                         attention page), 12 + 1 (MTP) gated-attention layers, grouped by vLLM's
                         `get_kv_cache_groups` (one attention group, three GDN groups)
      exporting True     FlashInfer's GDN prefill (Hopper; `gdn_prefill_backend` auto): one
                         checkpoint per forward on the grid lcm(u, 64)
      exporting False    the Triton/FLA prefill (every other GPU): vLLM splits the prefill
    `vllm_block_size` gives the block size vLLM picks for each (`_align_hybrid_block_size`).

Two drafter setups (`lookahead`): vLLM's default hashes that cover the token after each unit,
or the EAGLE block drop (`disable_lookahead_block_hashes=True`), optionally with the junction
checkpoint flag `enable_mamba_shared_prefix_checkpoint`.

The scheduler class is vLLM's `Scheduler` unless `scheduler_cls` names another (hycache's own
`hycache.vllm.SyncScheduler`, say), resolved the way `vllm serve --scheduler-cls` resolves it.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import cache
from importlib import resources
from math import lcm
from typing import Any

from hycache.bench.vllm.scenario import RequestTrace, Turn, propose, verify
from hycache.config import CacheKnobs
from hycache.vllm import compat

# the model vLLM inspects, for either hybrid: the packaged Nemotron-H-8B config.json (vLLM 0.33
# refuses Bamba; Qwen3-Next's model module imports `compressed_tensors`, which the --no-deps
# wheel lacks), with one MTP layer and a context long enough for any scenario. The scheduler
# reads nothing model-specific from it (max_model_len, M-RoPE, runner type): the hybrid it
# schedules is the KV cache config's (`VllmSetup.model`).
NEMOTRON_H_PRESET = "nemotron-h-8b.json"
MAX_MODEL_LEN = 1 << 20

NEMOTRON_H = "nemotron-h-8b"
QWEN3_NEXT = "qwen3-next-80b-a3b"
MODELS = (NEMOTRON_H, QWEN3_NEXT)
# FlashAttention's kernel block on Hopper (`FlashAttentionBackend.get_supported_kernel_block_
# sizes`: MultipleOf(16)), the attention backend vLLM picks for Qwen3-Next's head dim 256
ATTENTION_KERNEL_BLOCK = 16


def available() -> bool:
    """Whether vLLM's scheduler can be imported here (vllm installed)."""
    try:
        import vllm.v1.core.sched.scheduler  # noqa: F401
    except ImportError:
        return False
    return True


@cache
def _model_dir() -> str:
    preset = resources.files("hycache.sim").joinpath("presets", "models", NEMOTRON_H_PRESET)
    config = json.loads(preset.read_text())
    config.update(num_nextn_predict_layers=1, max_position_embeddings=MAX_MODEL_LEN)
    path = os.path.join(tempfile.mkdtemp(prefix="hycache-vllm-model-"), "config.json")
    with open(path, "w") as f:
        json.dump(config, f)
    return os.path.dirname(path)


@cache
def _preset(name: str) -> dict[str, Any]:
    text = resources.files("hycache.sim").joinpath("presets", "models", f"{name}.json")
    return dict(json.loads(text.read_text()))


def _qwen3_next_attention(block_size: int) -> Any:
    """Qwen3-Next's gated full attention as vLLM specs it (bfloat16, tensor parallel 1)."""
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    c = _preset(QWEN3_NEXT)
    return FullAttentionSpec(
        block_size=block_size,
        num_kv_heads=c["num_key_value_heads"],
        head_size=c["head_dim"],
        dtype=torch.bfloat16,
    )


def _qwen3_next_gdn(block_size: int, num_speculative_tokens: int) -> Any:
    """One GDN layer's state spec as `MambaBase.get_kv_cache_spec` builds it, before padding
    and export: conv (d_conv - 1 + k rows) and recurrent state, both in the model dtype
    (`mamba_ssm_cache_dtype` auto), `mamba_type` GDN_ATTN."""
    import torch
    from vllm.model_executor.layers.mamba.mamba_utils import (
        MambaStateDtypeCalculator,
        MambaStateShapeCalculator,
    )
    from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum
    from vllm.v1.kv_cache_interface import MambaSpec

    c = _preset(QWEN3_NEXT)
    shapes = MambaStateShapeCalculator.gated_delta_net_state_shape(
        1,
        c["linear_num_key_heads"],
        c["linear_num_value_heads"],
        c["linear_key_head_dim"],
        c["linear_value_head_dim"],
        c["linear_conv_kernel_dim"],
        num_speculative_tokens,
    )
    dtypes = MambaStateDtypeCalculator.gated_delta_net_state_dtype(torch.bfloat16, "auto", "auto")
    return MambaSpec(
        block_size=block_size,
        shapes=shapes,
        dtypes=dtypes,
        mamba_type=MambaAttentionBackendEnum.GDN_ATTN,
        mamba_cache_mode="align",
        num_speculative_blocks=num_speculative_tokens,
    )


def _gdn_checkpoint_alignment(exporting: bool) -> int:
    """The GDN layers' `get_prefill_checkpoint_alignment`: FlashInfer's 64, else none (1)."""
    from vllm.v1.attention.backends.gdn_attn import FLASHINFER_GDN_CHECKPOINT_ALIGNMENT

    return FLASHINFER_GDN_CHECKPOINT_ALIGNMENT if exporting else 1


def vllm_block_size(
    model: str = QWEN3_NEXT, num_speculative_tokens: int = 1, exporting: bool = True
) -> int:
    """The block size vLLM picks for Qwen3-Next-80B-A3B in `mamba_cache_mode="align"`
    (`Platform._align_hybrid_block_size`): the smallest multiple of the kernel block (lcm
    with the GDN checkpoint alignment) whose attention page holds one GDN state page. 576 on
    Hopper with MTP (FlashInfer exports, alignment 64), 544 where the GDN prefill cannot
    export."""
    if model != QWEN3_NEXT:
        raise ValueError(f"vllm_block_size: {model!r} (only {QWEN3_NEXT} is sized here)")
    align = lcm(ATTENTION_KERNEL_BLOCK, _gdn_checkpoint_alignment(exporting))
    per_token = _qwen3_next_attention(1).page_size_bytes
    state = _qwen3_next_gdn(-1, num_speculative_tokens).page_size_bytes
    return align * -(-state // (align * per_token))


def qwen3_next_kv_cache_groups(vllm_config: Any, unit: int, exporting: bool) -> list[Any]:
    """Qwen3-Next-80B-A3B's KV cache groups as vLLM builds them: every layer's spec (36 GDN,
    12 gated attention, the MTP layer's attention when a drafter runs), the GDN page padded
    to the attention page, grouped by vLLM's `get_kv_cache_groups`."""
    from vllm.v1.core.kv_cache_planning import get_kv_cache_groups

    b = vllm_config.cache_config.block_size
    k = vllm_config.num_speculative_tokens or 0
    align = lcm(ATTENTION_KERNEL_BLOCK, _gdn_checkpoint_alignment(exporting))
    least = vllm_block_size(QWEN3_NEXT, k, exporting)
    if b % align or b < least:
        raise ValueError(
            f"block_size {b}: vLLM runs Qwen3-Next at a multiple of {align} of at least "
            f"{least} tokens (k={k}, GDN export {'on' if exporting else 'off'})"
        )
    attn = _qwen3_next_attention(b)
    gdn = _qwen3_next_gdn(b, k)
    gdn = replace(
        gdn,
        page_size_padded=attn.page_size_bytes,
        num_prefill_checkpoint_blocks=1 if exporting else 0,
        # `get_mamba_prefill_checkpoint_grid`: the unit, made a multiple of the alignment
        prefill_checkpoint_alignment=lcm(unit, _gdn_checkpoint_alignment(True))
        if exporting
        else None,
    )
    c = _preset(QWEN3_NEXT)
    specs: dict[str, Any] = {}
    for i in range(c["num_hidden_layers"]):
        if (i + 1) % c["full_attention_interval"]:
            specs[f"model.layers.{i}.linear_attn"] = gdn
        else:
            specs[f"model.layers.{i}.self_attn.attn"] = attn
    if k:
        specs["mtp.layers.0.self_attn.attn"] = attn
    # grouped as on a GPU: the hybrid KV cache manager on (vLLM turns it off on a platform
    # without one, this process's) and FlashAttention's default layer-outer layout (which the
    # engine core resolves at startup; with one page size it does not change the groups)
    sched_cfg, cache_cfg = vllm_config.scheduler_config, vllm_config.cache_config
    saved = sched_cfg.disable_hybrid_kv_cache_manager, cache_cfg.kv_cache_layout
    sched_cfg.disable_hybrid_kv_cache_manager = False
    cache_cfg.kv_cache_layout = saved[1] or "LBNHC"
    try:
        return list(get_kv_cache_groups(vllm_config, specs))
    finally:
        sched_cfg.disable_hybrid_kv_cache_manager, cache_cfg.kv_cache_layout = saved


@cache
def _quiet_vllm() -> None:
    for name in ("vllm", "vllm.config", "vllm.platforms"):
        logging.getLogger(name).setLevel(logging.ERROR)


@dataclass(frozen=True)
class VllmSetup:
    """One vLLM deployment: the cache knobs it shares with hycache (block size, unit,
    retention, and `internal_checkpoints`: the Mamba2 spec that exports a checkpoint from
    inside the forward, or a non-exporting one), budget, drafter and vLLM's own flags."""

    knobs: CacheKnobs
    budget: int = 8192
    num_speculative_tokens: int = 1
    lookahead: bool = True  # False: `disable_lookahead_block_hashes` (the EAGLE block drop)
    shared_prefix_checkpoint: bool = False  # `enable_mamba_shared_prefix_checkpoint`
    num_blocks: int = 0  # 0: enough for the scenario, never evicting
    max_num_seqs: int = 64
    scheduler_cls: str | None = None  # qualified name; None: vLLM's `Scheduler`
    # vLLM 0.34's cache-aware admission (`SchedulerConfig.cache_aware_admission_window`,
    # `..._threshold`): 0 is its default (arrival order); > 0 needs a vLLM that has it
    cache_aware_window: int = 0
    cache_aware_threshold: float = 0.5
    model: str = NEMOTRON_H  # the hybrid whose KV cache config vLLM schedules (`MODELS`)
    # the plugin's price of a pass and a token (`--additional-config '{"hycache": {...}}'`,
    # `hycache.vllm.scheduler.pass_price`): (pass_cost, token_cost); None: its default.
    # (0, 1): every stop pays, the plugin's stops as before pricing
    pass_price: tuple[float, float] | None = None
    # the plugin's KV events (`hycache.vllm.events`): "resumable" or "full" with vLLM's
    # `--kv-events-config` on (its "null" publisher: a test reads `scheduler.
    # kv_event_publisher`'s batches by replacing it); None: no KV events
    kv_events: str | None = None

    @property
    def block_size(self) -> int:
        return self.knobs.block_size

    @property
    def unit(self) -> int:
        return self.knobs.unit

    @property
    def exporting(self) -> bool:
        """vLLM's Mamba2 spec (in-forward checkpoint) or a non-exporting one."""
        return self.knobs.internal_checkpoints

    @property
    def retention(self) -> int | None:
        """The knobs' retention as vLLM's `prefix_cache_retention_interval`: 0 (`semantic`,
        vLLM's default: replay boundaries, junctions), None (`dense`: every block-grid
        state), N (also one per N tokens)."""
        r = self.knobs.retention
        return {"semantic": 0, "dense": None}[r] if isinstance(r, str) else r


class ReferenceScheduler:
    """vLLM's real scheduler for one `VllmSetup`; requests run one after another."""

    def __init__(
        self, setup: VllmSetup, num_blocks: int = 0, vllm_config: Any | None = None
    ) -> None:
        """`vllm_config`: a config vLLM built itself (from `vllm serve` flags, say) instead of
        the one `setup` describes; its cache block size is set to `setup`'s, as vLLM does at
        engine start once it has sized the Mamba state page."""
        _quiet_vllm()
        self.setup = setup
        if vllm_config is not None:
            vllm_config.cache_config.block_size = setup.block_size
        self.vllm_config = vllm_config if vllm_config is not None else self._make_vllm_config()
        self.num_blocks = num_blocks or setup.num_blocks or 4096
        self.scheduler = self._build()
        self._proposals = 0  # drafts proposed so far: the index into each turn's accept cycle

    def _make_vllm_config(self) -> Any:
        from vllm.config import (
            CacheConfig,
            DeviceConfig,
            ModelConfig,
            ParallelConfig,
            SchedulerConfig,
            SpeculativeConfig,
            VllmConfig,
        )

        setup = self.setup
        b, k = setup.block_size, setup.num_speculative_tokens
        model = ModelConfig(
            model=_model_dir(), skip_tokenizer_init=True, max_model_len=MAX_MODEL_LEN
        )
        cache_cfg = CacheConfig(
            block_size=b,
            prefix_match_unit=setup.unit,
            mamba_cache_mode="align",
            enable_prefix_caching=True,
            enable_mamba_shared_prefix_checkpoint=setup.shared_prefix_checkpoint,
            prefix_cache_retention_interval=setup.retention,
        )
        sched_cfg = SchedulerConfig(
            max_num_batched_tokens=setup.budget,
            max_num_seqs=min(setup.max_num_seqs, setup.budget),
            max_model_len=MAX_MODEL_LEN,
            enable_chunked_prefill=True,
            is_encoder_decoder=False,
            **({"scheduler_cls": setup.scheduler_cls} if setup.scheduler_cls else {}),
            **(
                {
                    "cache_aware_admission_window": setup.cache_aware_window,
                    "cache_aware_admission_threshold": setup.cache_aware_threshold,
                }
                if setup.cache_aware_window
                else {}
            ),
        )
        parallel = ParallelConfig()
        spec = (
            SpeculativeConfig(
                method="mtp",
                num_speculative_tokens=k,
                target_model_config=model,
                target_parallel_config=parallel,
                **compat.drafter_hashing(setup.lookahead),
            )
            if k
            else None
        )
        price = (
            {"hycache": {"pass_cost": setup.pass_price[0], "token_cost": setup.pass_price[1]}}
            if setup.pass_price is not None
            else {}
        )
        events: dict[str, Any] = {}
        if setup.kv_events is not None:
            from vllm.config import KVEventsConfig

            price = {"hycache": {**price.get("hycache", {}), "kv_events": setup.kv_events}}
            events["kv_events_config"] = KVEventsConfig(
                enable_kv_cache_events=True, publisher="null"
            )
        return VllmConfig(
            **events,
            additional_config=price,
            model_config=model,
            cache_config=cache_cfg,
            scheduler_config=sched_cfg,
            speculative_config=spec,
            device_config=DeviceConfig(device="cpu"),
            parallel_config=parallel,
        )

    def _kv_cache_config(self) -> Any:
        from vllm.v1.kv_cache_interface import KVCacheConfig

        s = self.setup
        if s.model == QWEN3_NEXT:
            groups = qwen3_next_kv_cache_groups(self.vllm_config, s.unit, s.exporting)
        elif s.model == NEMOTRON_H:
            groups = self._nemotron_h_groups()
        else:
            raise ValueError(f"VllmSetup.model: {s.model!r} is not one of {MODELS}")
        return KVCacheConfig(
            num_blocks=self.num_blocks,
            kv_cache_tensors=[],
            kv_cache_groups=groups,
            prefix_cache_retention_interval=(
                self.vllm_config.cache_config.prefix_cache_retention_interval
            ),
        )

    def _nemotron_h_groups(self) -> list[Any]:
        import torch
        from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheGroupSpec, MambaSpec

        s = self.setup
        attn = FullAttentionSpec(
            block_size=s.block_size, num_kv_heads=2, head_size=64, dtype=torch.bfloat16
        )
        mamba = MambaSpec(
            block_size=s.block_size,
            shapes=((3, 576), (8, 32, 16)),
            dtypes=(torch.bfloat16, torch.float32),
            mamba_cache_mode="align",
            num_speculative_blocks=s.num_speculative_tokens,
            num_prefill_checkpoint_blocks=1 if s.exporting else 0,
            prefill_checkpoint_alignment=1 if s.exporting else None,
        )
        return [
            KVCacheGroupSpec(["model.layers.1.mixer"], attn),
            KVCacheGroupSpec(["model.layers.0.mixer"], mamba),
        ]

    @property
    def mamba_group_ids(self) -> list[int]:
        """The KV cache groups holding Mamba / GDN states (one for Nemotron-H, three for
        Qwen3-Next)."""
        from vllm.v1.kv_cache_interface import MambaSpec

        groups = self.scheduler.kv_cache_config.kv_cache_groups
        return [i for i, g in enumerate(groups) if isinstance(g.kv_cache_spec, MambaSpec)]

    def _build(self) -> Any:
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core.kv_cache_utils import (
            init_none_hash,
            resolve_cache_hit_alignment_tokens,
            resolve_kv_cache_block_sizes,
        )
        from vllm.v1.structured_output import StructuredOutputManager

        vc = self.vllm_config
        kv = self._kv_cache_config()
        vc.cache_config.num_gpu_blocks = self.num_blocks
        block_size, hash_block_size = resolve_kv_cache_block_sizes(kv, vc)
        kv.hash_block_size = hash_block_size
        kv.cache_hit_alignment_tokens = resolve_cache_hit_alignment_tokens(
            kv, vc, block_size, hash_block_size
        )
        cls = vc.scheduler_config.get_scheduler_cls()
        sched = cls(
            vllm_config=vc,
            kv_cache_config=kv,
            structured_output_manager=StructuredOutputManager(vc),
            block_size=block_size,
            hash_block_size=hash_block_size,
        )
        hash_fn = get_hash_fn_by_name(vc.cache_config.prefix_caching_hash_algo)
        init_none_hash(hash_fn)
        self.hasher: Callable[[Any], Any] = compat.request_block_hasher(
            hash_block_size, hash_fn, vc
        )
        return sched

    # -- running requests ----------------------------------------------------------------------

    def num_free_blocks(self) -> int:
        return int(self.scheduler.kv_cache_manager.block_pool.get_num_free_blocks())

    def run(self, request_id: str, turn: Turn) -> RequestTrace:
        """Add one request and step the scheduler until nothing is left."""
        from vllm.sampling_params import SamplingParams
        from vllm.v1.outputs import DraftTokenIds
        from vllm.v1.request import Request

        from hycache.vllm.compat import model_runner_output

        extra = {"prefix_hints": list(turn.prefix_hints)} if turn.prefix_hints else None
        sp = SamplingParams(max_tokens=max(len(turn.answer), 1), ignore_eos=True, extra_args=extra)
        req = Request(request_id, list(turn.prompt), sp, None, block_hasher=self.hasher)
        trace = RequestTrace(request_id)
        answer, accept, k = (
            list(turn.answer) or [1],
            list(turn.accept),
            self.setup.num_speculative_tokens,
        )
        s = self.scheduler
        s.add_request(req)
        while s.has_requests():
            out = s.schedule()
            if not out.num_scheduled_tokens:
                continue
            if out.scheduled_new_reqs:
                trace.hit = out.scheduled_new_reqs[0].num_computed_tokens
            # num_computed_tokens already counts this step and can pass the prompt in its last
            # chunk: record chunk ends, capped at the prompt, until the prompt is covered
            t = req.num_prompt_tokens
            if not trace.chunk_ends or trace.chunk_ends[-1] < t:
                trace.chunk_ends.append(min(req.num_computed_tokens, t))
            drafts = out.scheduled_spec_decode_tokens.get(request_id, [])
            prefilling = req.num_computed_tokens - len(drafts) < req.num_tokens
            sampled = [] if prefilling else verify(answer, req.num_output_tokens, drafts)
            trace.output.extend(sampled)
            s.update_from_output(out, model_runner_output([request_id], [sampled]))
            if sampled and accept and not req.is_finished():
                good = accept[self._proposals % len(accept)]
                self._proposals += 1
                drafts = propose(answer, req.num_output_tokens, k, good)
                s.update_draft_token_ids(DraftTokenIds([request_id], [drafts]))
        return trace

    def run_all(self, turns: Sequence[Turn]) -> list[RequestTrace]:
        return [self.run(f"r{i}", t) for i, t in enumerate(turns)]

    def run_concurrent(self, turns: Sequence[Turn], max_steps: int = 100_000) -> Concurrent:
        """All turns arrive together, in this order; each step samples one token (its
        answer's next) for every request past its prompt, no drafts. A request's hit is its
        computed tokens when first scheduled; a preempted request's recompute counts as
        prefill."""
        from vllm.sampling_params import SamplingParams
        from vllm.v1.request import Request

        from hycache.vllm.compat import model_runner_output

        s = self.scheduler
        reqs = {}
        traces = {}
        for i, turn in enumerate(turns):
            rid = f"c{i}"
            extra = {"prefix_hints": list(turn.prefix_hints)} if turn.prefix_hints else None
            sp = SamplingParams(
                max_tokens=max(len(turn.answer), 1), ignore_eos=True, extra_args=extra
            )
            reqs[rid] = Request(rid, list(turn.prompt), sp, None, block_hasher=self.hasher)
            traces[rid] = RequestTrace(rid)
            s.add_request(reqs[rid])
        answers = {f"c{i}": list(t.answer) or [1] for i, t in enumerate(turns)}
        result = Concurrent(list(traces.values()))
        for _ in range(max_steps):
            if not s.has_requests():
                break
            out = s.schedule()
            ids = list(out.num_scheduled_tokens)
            if not ids:
                continue
            result.passes += 1
            sampled = []
            for rid in ids:
                req, trace, n = reqs[rid], traces[rid], out.num_scheduled_tokens[rid]
                before = req.num_computed_tokens - n  # schedule() counted this step already
                if trace.hit < 0:
                    trace.hit = before
                t = req.num_prompt_tokens
                if before < t:
                    result.prefill_tokens += min(before + n, t) - before
                    trace.chunk_ends.append(min(req.num_computed_tokens, t))
                done = req.num_computed_tokens >= req.num_tokens
                token = answers[rid][req.num_output_tokens % len(answers[rid])]
                sampled.append([token] if done else [])
                trace.output.extend(sampled[-1])
            s.update_from_output(out, model_runner_output(ids, sampled))
        assert not s.has_requests(), "run_concurrent: requests left after max_steps"
        result.preemptions = sum(r.num_preemptions for r in reqs.values())
        return result


@dataclass
class Concurrent:
    """`ReferenceScheduler.run_concurrent`'s result: per-request traces, forward passes
    (steps that scheduled a token), prompt tokens computed (recomputes included), and
    preemptions."""

    traces: list[RequestTrace]
    passes: int = 0
    prefill_tokens: int = 0
    preemptions: int = 0

    @property
    def hit_tokens(self) -> int:
        return sum(max(t.hit, 0) for t in self.traces)


def run_reference(setup: VllmSetup, turns: Sequence[Turn]) -> list[RequestTrace]:
    """Each turn runs to completion before the next arrives, on one fresh vLLM scheduler."""
    return ReferenceScheduler(setup).run_all(turns)
