"""The scheduler-only harness (`hycache.bench.vllm.reference.ReferenceScheduler`) shaped like
one real vLLM 0.32 engine, to predict each request's `num_cached_tokens`.

`ReferenceScheduler` builds vLLM 0.33's config and block hasher, which 0.32 does not have (no
lookahead hashes); here the real engine lends its own: the `VllmConfig` it runs, a copy of its
`KVCacheConfig` (same block count, groups and specs), its request block hasher and its
scheduler class. A fresh scheduler of that class then runs the scenario with scripted model
outputs (`ReferenceScheduler.run`: each turn's answer, drafts that verify a known number of
tokens), one request after another, no model. When the engine's hits equal these, the harness
that `tests/vllm` and `hycache explain --backend vllm` use stands for the engine.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from hycache.bench.vllm.reference import ReferenceScheduler, VllmSetup
from hycache.bench.vllm.scenario import Turn
from hycache.config import CacheKnobs


def engine_core(llm: Any) -> Any:
    """The in-process `EngineCore` of an offline `LLM` (VLLM_ENABLE_V1_MULTIPROCESSING=0)."""
    return llm.llm_engine.engine_core.engine_core


class EngineShapedReference(ReferenceScheduler):
    """`ReferenceScheduler` with the scheduler, cache layout and hasher of a running engine."""

    def __init__(self, llm: Any) -> None:
        self._core = engine_core(llm)
        vc = self._core.vllm_config
        spec = vc.speculative_config
        setup = VllmSetup(
            CacheKnobs(
                vc.cache_config.block_size,
                vc.cache_config.prefix_match_unit or vc.cache_config.block_size,
            ),
            budget=vc.scheduler_config.max_num_batched_tokens,
            num_speculative_tokens=spec.num_speculative_tokens if spec else 0,
        )
        super().__init__(setup, vllm_config=vc)

    def _build(self) -> Any:
        from vllm.v1.core.kv_cache_utils import resolve_kv_cache_block_sizes
        from vllm.v1.structured_output import StructuredOutputManager

        kv = copy.deepcopy(self._core.scheduler.kv_cache_config)
        block_size, hash_block_size = resolve_kv_cache_block_sizes(kv, self.vllm_config)
        self.hasher = self._core.request_block_hasher
        return type(self._core.scheduler)(
            vllm_config=self.vllm_config,
            kv_cache_config=kv,
            structured_output_manager=StructuredOutputManager(self.vllm_config),
            block_size=block_size,
            hash_block_size=hash_block_size,
        )


def predicted_hits(llm: Any, turns: Sequence[Turn]) -> list[int]:
    """Each turn's hit on a fresh scheduler shaped like `llm`'s engine, one after another."""
    ref = EngineShapedReference(llm)
    return [ref.run(f"predict{i}", t).hit for i, t in enumerate(turns)]
