"""hycache's Nemotron-H matches transformers' `NemotronHForCausalLM` on random checkpoints
written with `save_pretrained` (float32): prompt logits within 1e-4 and identical greedy tokens
(paged API, `LLM`, and `hycache generate --model DIR`) for several layer patterns, GQA ratios,
`n_groups` and head tying, MoE `E` blocks (grouped top-k routing with a correction bias, latent
experts, normalised or not), prompts longer than the SSD chunk; cached = uncached under every
policy and speculative = plain on the engine."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch

from hycache.model.configs.nemotron_h import NemotronHConfig
from hycache.model.loader import load_config, load_model
from hycache.model.nemotron_h import NemotronHForCausalLM

from .archs import NEMOTRON_BASE, NEMOTRON_CASES, NEMOTRON_H, nemotron_hf_model
from .utils import cli_generate, hf_generate, hf_logits, paged_greedy, random_prompt, save_hf

transformers = pytest.importorskip("transformers")

ARCH = NEMOTRON_H
VOCAB, PROMPT_LEN, NEW_TOKENS = ARCH.vocab, ARCH.prompt_len, ARCH.new_tokens
BASE, CASES, _hf_model = NEMOTRON_BASE, NEMOTRON_CASES, nemotron_hf_model


@pytest.fixture(scope="module", params=sorted(CASES))
def pair(request: pytest.FixtureRequest) -> tuple[Any, NemotronHForCausalLM]:
    """A case's transformers model, and ours from its checkpoint (the parity itself:
    tests/model/test_parity.py)."""
    name: str = request.param
    hf = _hf_model(CASES[name], seed=sorted(CASES).index(name))
    with tempfile.TemporaryDirectory() as d:
        ours, _, _ = load_model(str(save_hf(hf, Path(d))))
    assert isinstance(ours, NemotronHForCausalLM)
    return hf, ours


def test_pattern_and_layer_counts(pair: tuple[Any, NemotronHForCausalLM]) -> None:
    hf, ours = pair
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
    hf, path = saved
    prompt = random_prompt(PROMPT_LEN, 30, VOCAB)
    assert cli_generate(path, prompt, NEW_TOKENS, capsys) == hf_generate(hf, prompt, NEW_TOKENS)


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
