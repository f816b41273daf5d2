"""hycache's Granite 4.0 hybrid matches transformers' `GraniteMoeHybridForCausalLM` on random
checkpoints written with `save_pretrained` (float32): prompt logits within 1e-4 and identical
greedy tokens (paged API and `LLM`) for MoE top-k and dense MLPs, RoPE and no positional
encoding, several GQA ratios, `n_groups`, tied and untied heads and non-trivial multipliers,
prompts longer than the SSD chunk; cached = uncached under every policy and speculative = plain
on the engine."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from hycache.model.configs.granite_hybrid import GraniteHybridConfig
from hycache.model.loader import load_model
from hycache.model.paged import StepBatch

from .archs import GRANITE, GRANITE_BASE, GRANITE_CASES, granite_hf_model
from .utils import hf_logits, paged_greedy, random_prompt, save_hf

transformers = pytest.importorskip("transformers")

ARCH = GRANITE
VOCAB, PROMPT_LEN, NEW_TOKENS = ARCH.vocab, ARCH.prompt_len, ARCH.new_tokens
BASE, CASES, _hf_model = GRANITE_BASE, GRANITE_CASES, granite_hf_model


def test_transformers_in_memory_expert_names_load(tmp_path: Path) -> None:
    """A checkpoint written from transformers' state_dict (experts.gate_up_proj, ...) loads."""
    from safetensors.torch import save_file

    hf = _hf_model({}, seed=3)
    path = save_hf(hf, tmp_path / "a")
    state = {k: v.contiguous() for k, v in hf.state_dict().items()}
    assert any(k.endswith("experts.gate_up_proj") for k in state)
    (path / "model.safetensors").unlink()
    save_file(state, str(path / "model.safetensors"))
    ours, _, _ = load_model(str(path))
    prompt = random_prompt(PROMPT_LEN, 4, VOCAB)
    torch.testing.assert_close(
        paged_greedy(ours, prompt, 0)[0], hf_logits(hf, prompt), rtol=0, atol=1e-4
    )


# ------------------------------------------------------------------------------ engine
@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    hf = _hf_model(CASES["moe-top2-rope-gqa2-untied"], seed=11)
    return hf, save_hf(hf, tmp_path_factory.mktemp("engine"))


# ------------------------------------------------------------------------------ config
def test_config_round_trips(saved: tuple[Any, Path]) -> None:
    d = json.loads((saved[1] / "config.json").read_text())
    cfg = GraniteHybridConfig.from_hf_dict(d)
    assert cfg.attn_layer_indices == (1,) and cfg.mamba_layer_indices == (0, 2, 3)
    assert (cfg.num_local_experts, cfg.num_experts_per_tok) == (4, 2)
    assert cfg.attention_scale == 0.25 and cfg.use_rope and cfg.rotary_dim == cfg.head_dim
    assert GraniteHybridConfig.from_hf_dict(cfg.to_hf_dict()) == cfg
    legacy = {**d, "layer_types": ["mamba", "attention", "mamba", "mamba"]}
    assert GraniteHybridConfig.from_hf_dict(legacy) == cfg
    with pytest.raises(ValueError, match="num_experts_per_tok"):
        GraniteHybridConfig.from_hf_dict({**d, "num_experts_per_tok": 5})


def test_step_batch_of_mixed_requests(saved: tuple[Any, Path]) -> None:
    """A prefill and a decode in one step give what they give alone (MoE routing per token)."""
    ours, _, _ = load_model(str(saved[1]), dtype=torch.float64)
    a = random_prompt(PROMPT_LEN, 7, VOCAB)
    alone, _ = paged_greedy(ours, a, 0)
    kv, states = ours.make_kv_cache(16, 8), ours.make_state_cache(3)
    batch = StepBatch(
        torch.cat([a, torch.tensor([5, 6])]),
        torch.cat([torch.arange(PROMPT_LEN), torch.arange(2)]),
        [PROMPT_LEN, 2],
        [0, 0],
        [list(range(4)), [8]],
        [-1, -1],
        [[(PROMPT_LEN, 0)], [(2, 1)]],
    )
    both = ours.compute_logits(ours(batch, kv, states))
    torch.testing.assert_close(both[:PROMPT_LEN], alone, rtol=0, atol=1e-9)
