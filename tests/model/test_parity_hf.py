"""hycache's Bamba matches transformers' `BambaForCausalLM` (pure-torch path) on random
checkpoints written with `save_pretrained` and read back with `load_model`."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from hycache.model.bamba import BambaForCausalLM, StepBatch
from hycache.model.loader import load_model

transformers = pytest.importorskip("transformers")

PROMPT_LEN = 23
NEW_TOKENS = 8

BASE: dict[str, Any] = {
    "vocab_size": 128,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "attn_layer_indices": [1, 3],
    "mamba_n_heads": 8,
    "mamba_d_head": 16,
    "mamba_n_groups": 2,
    "mamba_d_state": 16,
    "mamba_chunk_size": 8,
    "initializer_range": 0.2,
    "tie_word_embeddings": False,
}

CASES: dict[str, dict[str, Any]] = {
    "gqa2-groups2-untied": {},
    "mha-tied-full-rope": {
        "num_hidden_layers": 3,
        "attn_layer_indices": [0],
        "num_key_value_heads": 4,
        "mamba_n_groups": 1,
        "tie_word_embeddings": True,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 5000.0,
            "partial_rotary_factor": 1.0,
        },
    },
    "gqa4-groups4-quarter-rope-biases": {
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "attn_layer_indices": [2],
        "mamba_n_groups": 4,
        "mamba_proj_bias": True,
        "mamba_conv_bias": False,
        "attention_bias": True,
        "mlp_bias": True,
        "tie_word_embeddings": True,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.25,
        },
    },
    "mqa-first-last-dconv2": {
        "num_hidden_layers": 5,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "attn_layer_indices": [0, 4],
        "mamba_d_conv": 2,
        "mamba_d_state": 8,
    },
    "mamba-only-dt-limit": {
        "num_hidden_layers": 3,
        "attn_layer_indices": None,
        "time_step_limit": (0.01, 0.2),
    },
}


def _hf_model(overrides: dict[str, Any], seed: int) -> Any:
    torch.manual_seed(seed)
    cfg = transformers.BambaConfig(**{**BASE, **overrides})
    cfg._attn_implementation = "eager"
    model = transformers.BambaForCausalLM(cfg).eval()
    # Default init leaves norms, D and biases at constants; perturb them so that every
    # parameter matters for the comparison.
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith((".D", ".dt_bias")):
                p.add_(0.1 * torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
    return model


@pytest.fixture(scope="module", params=sorted(CASES))
def pair(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Any, BambaForCausalLM, str]:
    name: str = request.param
    hf = _hf_model(CASES[name], seed=sorted(CASES).index(name))
    path: Path = tmp_path_factory.mktemp(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf.save_pretrained(path)
    ours, config, tokenizer = load_model(str(path))
    assert tokenizer is None
    assert config.tie_word_embeddings == bool(CASES[name].get("tie_word_embeddings", False))
    return hf, ours, name


def _prompt(seed: int) -> torch.Tensor:
    return torch.randint(3, 128, (PROMPT_LEN,), generator=torch.Generator().manual_seed(seed))


def _hf_greedy(hf: Any, prompt: torch.Tensor) -> list[int]:
    """Greedy continuation by full recomputation (no cache) - the reference."""
    ids = prompt[None]
    out = []
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            nxt = hf(ids, use_cache=False).logits[0, -1].argmax()
            out.append(int(nxt))
            ids = torch.cat([ids, nxt.view(1, 1)], dim=1)
    return out


def _our_greedy(model: BambaForCausalLM, prompt: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
    """Prefill in one step, then decode one token per step through the paged API."""
    kv, states = model.make_kv_cache(8, 8), model.make_state_cache(2)
    table = [5, 1, 7, 3, 0, 2]
    t = prompt.shape[0]
    logits = model.compute_logits(
        model(StepBatch(prompt, torch.arange(t), [t], [0], [table], [-1], [[(t, 1)]]), kv, states)
    )
    out = []
    nxt = int(logits[-1].argmax())
    for pos in range(t, t + NEW_TOKENS):
        out.append(nxt)
        batch = StepBatch(
            torch.tensor([nxt]), torch.tensor([pos]), [1], [pos], [table], [1], [[(1, 1)]]
        )
        nxt = int(model.compute_logits(model(batch, kv, states))[-1].argmax())
    return logits, out


def test_prompt_logits_match(pair: tuple[Any, BambaForCausalLM, str]) -> None:
    hf, ours, _ = pair
    prompt = _prompt(1)
    with torch.no_grad():
        ref = hf(prompt[None], use_cache=False).logits[0]
    got, _ = _our_greedy(ours, prompt)
    assert ref.abs().max() > 1.0  # the comparison is not between near-zero numbers
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-4)


def test_greedy_generation_matches(pair: tuple[Any, BambaForCausalLM, str]) -> None:
    hf, ours, name = pair
    prompt = _prompt(2)
    ref = _hf_greedy(hf, prompt)
    _, got = _our_greedy(ours, prompt)
    assert got == ref
    # transformers' cached decode path ignores time_step_limit (and needs an attention layer).
    if "dt-limit" not in name:
        hf.generation_config.eos_token_id = None  # random models may emit the EOS id
        with torch.no_grad():
            gen = hf.generate(prompt[None], max_new_tokens=NEW_TOKENS, do_sample=False)
        assert gen[0, PROMPT_LEN:].tolist() == ref


def test_parameter_names_match_transformers(pair: tuple[Any, BambaForCausalLM, str]) -> None:
    hf, ours, _ = pair
    hf_keys = set(hf.state_dict())
    our_keys = set(ours.state_dict())
    if ours.config.tie_word_embeddings:
        hf_keys.discard("lm_head.weight")
    assert our_keys == hf_keys
