"""hycache's Nemotron-H matches transformers' `NemotronHForCausalLM` on random checkpoints
written with `save_pretrained` (float32): prompt logits within 1e-4 and identical greedy tokens
(paged API, `LLM`, and `hycache generate --model DIR`) for several layer patterns, GQA ratios,
`n_groups` and head tying, MoE `E` blocks (grouped top-k routing with a correction bias, latent
experts, normalised or not), prompts longer than the SSD chunk; cached = uncached under every
policy and speculative = plain on the engine."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from hycache.model.configs.nemotron_h import NemotronHConfig
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
    # Nemotron-3 MoE blocks: 8 experts in 2 groups, only the best group's experts selectable,
    # experts in a 16-wide latent space, MLP biases (shared expert, latent projections)
    "moe-latent-groups2-topgroup1": {
        "layers_block_type": ["mamba", "moe", "attention", "mlp", "moe", "mamba"],
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 24,
        "moe_shared_expert_intermediate_size": 40,
        "moe_latent_size": 16,
        "n_group": 2,
        "topk_group": 1,
        "routed_scaling_factor": 2.5,
        "mlp_bias": True,
    },
    # 3 of 8 experts among the best 2 of 4 groups, unnormalised weights, no latent space
    "moe-groups4-topgroup2-unnormalised": {
        "layers_block_type": ["moe", "mamba", "attention", "moe", "mamba", "moe"],
        "n_routed_experts": 8,
        "num_experts_per_tok": 3,
        "moe_intermediate_size": 20,
        "moe_shared_expert_intermediate_size": 24,
        "n_group": 4,
        "topk_group": 2,
        "norm_topk_prob": False,
        "routed_scaling_factor": 1.5,
    },
}


def _hf_model(overrides: dict[str, Any], seed: int) -> Any:
    torch.manual_seed(seed)
    kw = {k: v for k, v in {**BASE, **overrides}.items() if v is not None}
    cfg = transformers.NemotronHConfig(**kw)
    cfg._attn_implementation = "eager"
    model = transformers.NemotronHForCausalLM(cfg).eval()
    perturb_hf(model, seed + 1)
    gen = torch.Generator().manual_seed(seed + 2)
    with torch.no_grad():  # a buffer, left at zero by transformers' init
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.2 * torch.randn(b.shape, generator=gen))
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
    assert ours.config.num_moe_layers == ours.config.pattern.count("E")
    assert ours.config.num_mlp_layers == ours.config.pattern.count("-")


# ------------------------------------------------------------------------------ engine
@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    hf = _hf_model(CASES["gqa2-groups2-untied"], seed=11)
    return hf, save_hf(hf, tmp_path_factory.mktemp("engine"))


def test_cli_generate_matches_transformers(
    saved: tuple[Any, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    from hycache.cli.main import main

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
@pytest.fixture(scope="module")
def moe_config(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """config.json of a MoE case, as `save_pretrained` writes it."""
    kw = {**BASE, **CASES["moe-latent-groups2-topgroup1"]}
    path = tmp_path_factory.mktemp("moe-config")
    transformers.NemotronHConfig(**kw).save_pretrained(path)
    d: dict[str, Any] = json.loads((path / "config.json").read_text())
    return d


def test_moe_config_reads_transformers_fields(moe_config: dict[str, Any]) -> None:
    cfg = NemotronHConfig.from_hf_dict(moe_config)
    assert cfg.pattern == "ME*-EM" and cfg.moe_layers == (1, 4)
    assert (cfg.num_moe_layers, cfg.num_mlp_layers) == (2, 1)
    assert (cfg.n_routed_experts, cfg.num_experts_per_tok, cfg.n_group, cfg.topk_group) == (
        8,
        2,
        2,
        1,
    )
    assert (cfg.moe_intermediate_size, cfg.moe_shared_expert_intermediate_size) == (24, 40)
    assert (cfg.moe_latent_size, cfg.routed_scaling_factor, cfg.norm_topk_prob) == (16, 2.5, True)
    assert NemotronHConfig.from_hf_dict(cfg.to_hf_dict()) == cfg
    # transformers' defaults for absent fields; its `num_local_experts` alias
    moe_keys = ("n_routed_experts", "n_group", "topk_group")
    bare = {k: v for k, v in moe_config.items() if not k.startswith("moe_") and k not in moe_keys}
    bare |= {"num_local_experts": 16}
    cfg = NemotronHConfig.from_hf_dict(bare)
    assert (cfg.n_routed_experts, cfg.n_group, cfg.topk_group, cfg.moe_latent_size) == (
        16,
        1,
        1,
        None,
    )
    assert cfg.moe_intermediate_size == cfg.moe_shared_expert_intermediate_size == 7688


@pytest.mark.parametrize(
    ("change", "match"),
    [
        # transformers' router would fail on these (a group scores its two best experts)
        ({"n_group": 8}, r"n_group: 8 groups .* at least two experts"),
        ({"n_group": 3}, r"n_group: 3 groups of n_routed_experts=8 must be equal"),
        ({"topk_group": 3}, r"topk_group: must be in \[1, n_group=2\]"),
        # more experts than the selected groups hold: the choice would be arbitrary
        ({"num_experts_per_tok": 5}, r"num_experts_per_tok: 5 exceeds the 4 experts"),
        ({"moe_latent_size": 0}, r"moe_latent_size: must be a positive int or null"),
    ],
)
def test_unrunnable_moe_routing_is_refused_clearly(
    moe_config: dict[str, Any], change: dict[str, Any], match: str, tmp_path: Path
) -> None:
    (tmp_path / "config.json").write_text(json.dumps(moe_config | change))
    with pytest.raises(ValueError, match=r"NemotronHConfig\." + match):
        load_config(tmp_path)


def test_moe_fields_are_not_checked_without_moe_blocks(saved: tuple[Any, Path]) -> None:
    d = json.loads((saved[1] / "config.json").read_text())
    assert NemotronHConfig.from_hf_dict(d | {"n_group": 3}).pattern == "M-*-M"


def test_router_stays_in_float32_in_a_bfloat16_model(tmp_path: Path) -> None:
    hf = _hf_model(CASES["moe-groups4-topgroup2-unnormalised"], seed=5)
    ours, _, _ = load_model(str(save_hf(hf, tmp_path)), dtype=torch.bfloat16)
    gate = ours.backbone.layers[0].mixer.gate
    assert gate.weight.dtype == gate.e_score_correction_bias.dtype == torch.float32
    assert ours.backbone.layers[0].mixer.experts[0].up_proj.weight.dtype == torch.bfloat16
    ref_bias = hf.model.layers[0].mixer.gate.e_score_correction_bias
    assert torch.equal(gate.e_score_correction_bias, ref_bias)
    prompt = random_prompt(PROMPT_LEN, 6, VOCAB)
    got, _ = paged_greedy(ours, prompt, 0)
    assert got.isfinite().all()
    assert (got.float() - hf_logits(hf, prompt)).abs().max() < 0.25  # bfloat16 agreement


def test_config_round_trips_and_reads_legacy_names(saved: tuple[Any, Path]) -> None:
    d = json.loads((saved[1] / "config.json").read_text())
    cfg = NemotronHConfig.from_hf_dict(d)
    assert cfg.pattern == "M-*-M" and not cfg.use_rope and cfg.mamba_expand is None
    assert cfg.time_step_limit == (d["time_step_min"], float("inf"))
    assert NemotronHConfig.from_hf_dict(cfg.to_hf_dict()) == cfg
    legacy = {k: v for k, v in d.items() if k not in ("layers_block_type", "n_groups")}
    legacy |= {"hybrid_override_pattern": "M-*-M", "mamba_n_groups": d["n_groups"]}
    assert NemotronHConfig.from_hf_dict(legacy) == cfg
