"""What every supported hybrid architecture must do in the engine, checked once for each:
sharded checkpoints load, `LLM` greedy tokens equal transformers', cached = uncached under every
policy, speculative = plain. Each architecture's own parity tests live in its own file."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from hycache.config import POLICY_NAMES
from hycache.model.loader import load_model

from .archs import GRANITE, NEMOTRON_H, QWEN3_NEXT, Arch
from .utils import (
    engine_outputs,
    hf_generate,
    hf_greedy_recompute,
    hf_logits,
    paged_greedy,
    random_prompt,
    save_hf,
    sharing_prompts,
)

# name -> (its architecture (tests/model/archs.py); the case the engine tests run;
# transformers' greedy reference for it)
ARCHS: dict[str, tuple[Arch, str, Callable[..., Any]]] = {
    "nemotron_h": (NEMOTRON_H, "gqa2-groups2-untied", hf_greedy_recompute),
    "nemotron_h_moe": (NEMOTRON_H, "moe-latent-groups2-topgroup1", hf_greedy_recompute),
    "granitemoehybrid": (GRANITE, "moe-top2-rope-gqa2-untied", hf_generate),
    "qwen3_next": (QWEN3_NEXT, "qwen3_next", hf_generate),
    "qwen3_5": (QWEN3_NEXT, "qwen3_5", hf_generate),
}


@pytest.fixture(scope="module", params=sorted(ARCHS))
def saved(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Arch, Any, Path, Callable[..., Any]]:
    mod, case, reference = ARCHS[request.param]
    hf = mod.hf_model(case, 11)
    return mod, hf, save_hf(hf, tmp_path_factory.mktemp(request.param)), reference


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_sharded_checkpoint_loads(arch: str, tmp_path: Path) -> None:
    mod, case, _ = ARCHS[arch]
    hf = mod.hf_model(case, 4)
    path = save_hf(hf, tmp_path / "sharded", max_shard_size="40KB")
    assert len(list(path.glob("*.safetensors"))) > 1
    assert (path / "model.safetensors.index.json").is_file()
    ours, _, _ = load_model(str(path))
    prompt = random_prompt(mod.prompt_len, 5, mod.vocab)
    got, _ = paged_greedy(ours, prompt, 0)
    torch.testing.assert_close(got, hf_logits(hf, prompt), rtol=0, atol=1e-4)


def test_llm_greedy_matches_transformers(saved: tuple[Arch, Any, Path, Any]) -> None:
    mod, hf, path, reference = saved
    prompts = [random_prompt(mod.prompt_len + i, 20 + i, mod.vocab) for i in range(2)]
    ids = [p.tolist() for p in prompts]
    _, got, _ = engine_outputs(path, ids, mod.new_tokens, dtype="float32")
    assert got == [reference(hf, p, mod.new_tokens) for p in prompts]


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_cached_equals_uncached(saved: tuple[Arch, Any, Path, Any], policy: str) -> None:
    mod, _, path, _ = saved
    prompts = sharing_prompts(mod.vocab, 5)
    on, first, second = engine_outputs(path, prompts, 4, policy=policy)
    off, ref, ref2 = engine_outputs(path, prompts, 4, policy=policy, enable_prefix_caching=False)
    assert first == second == ref == ref2
    assert on.stats.hit_tokens > 0 and off.stats.hit_tokens == 0


def test_speculative_equals_plain(saved: tuple[Arch, Any, Path, Any]) -> None:
    mod, _, path, _ = saved
    prompts = sharing_prompts(mod.vocab, 6)
    _, plain, _ = engine_outputs(path, prompts, 5)
    _, spec, spec2 = engine_outputs(path, prompts, 5, num_speculative_tokens=2)
    assert spec == spec2 == plain
