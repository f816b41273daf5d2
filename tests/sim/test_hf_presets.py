"""Simulator presets read from a checkpoint's `config.json` by the engine's own parser, and the
byte counts the simulator and the engine derive for one config agree."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from hycache.engine.build import attention_block_bytes, state_bytes
from hycache.model.configs import config_from_hf_dict
from hycache.sim.model_spec import model_spec_from_hf
from hycache.sim.presets import load_model_spec
from tests.helpers import BAMBA_9B, NEMOTRON_MOE

PRESETS = Path(__file__).parents[2] / "hycache" / "sim" / "presets" / "models"




def test_the_nemotron_h_8b_preset_is_its_config_json() -> None:
    data = json.loads((PRESETS / "nemotron-h-8b.json").read_text())
    assert data["model_type"] == "nemotron_h"
    spec = load_model_spec("nemotron-h-8b")
    # the hand-written preset it replaced: the same model to the cost model
    assert spec.total_params == 8_100_852_736
    assert (spec.layers.attention, spec.layers.mamba, spec.layers.mlp_only) == (4, 24, 24)
    assert spec.attention_layer_indices == (7, 18, 29, 40)
    assert spec.kv_bytes_per_token == 16_384 and spec.ssm_state_bytes == 102_137_856


@pytest.mark.parametrize(
    ("preset", "block_size"),
    [
        ("nemotron-h-8b", 64),
        ("bamba-9b", 4416),
        ("qwen3-next-80b-a3b", 1056),
        ("qwen3.5-35b-a3b", 1056),
    ],
)
def test_engine_and_simulator_count_the_same_bytes(preset: str, block_size: int) -> None:
    spec = load_model_spec(preset)
    if preset == "bamba-9b":
        data = BAMBA_9B
    else:
        data = json.loads((PRESETS / f"{preset}.json").read_text())
    mc = config_from_hf_dict(data)
    dtype = torch.bfloat16
    assert state_bytes(mc, dtype) == spec.ssm_state_bytes
    assert attention_block_bytes(mc, block_size, dtype, drafter=False) == (
        block_size * spec.kv_bytes_per_token
    )
    # the drafter's one attention layer has the target's geometry
    per_layer = spec.kv_bytes_per_token_per_layer
    assert attention_block_bytes(mc, block_size, dtype, drafter=True) == block_size * (
        spec.kv_bytes_per_token + spec.drafter.num_layers * per_layer
    )


def test_model_config_takes_a_checkpoint_config_json(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**BAMBA_9B, "torch_dtype": "bfloat16"}))
    spec = load_model_spec(path)
    preset = load_model_spec("bamba-9b")
    assert spec.name == "config"
    assert spec.kv_bytes_per_token == preset.kv_bytes_per_token
    assert spec.ssm_state_bytes == preset.ssm_state_bytes
    assert spec.layers == preset.layers and spec.mamba == preset.mamba
    assert abs(spec.total_params / preset.total_params - 1) < 0.01
    bad = tmp_path / "falcon.json"
    bad.write_text(json.dumps({"model_type": "falcon_h1"}))
    with pytest.raises(ValueError, match=r"falcon\.json: config field model_type 'falcon_h1'"):
        load_model_spec(bad)


def test_nemotron_h_moe_blocks_become_the_moe_spec() -> None:
    from hycache.model.nemotron_h import NemotronHForCausalLM

    spec = model_spec_from_hf(NEMOTRON_MOE, "tiny-nemotron-3")
    assert (spec.layers.attention, spec.layers.mamba) == (1, 2)
    assert (spec.layers.mlp_only, spec.layers.moe_only, spec.mlp.num_blocks) == (1, 3, 1)
    assert spec.moe is not None
    assert (spec.moe.num_blocks, spec.moe.num_experts, spec.moe.experts_per_token) == (3, 8, 2)
    assert (spec.moe.expert_intermediate_size, spec.moe.shared_expert_intermediate_size) == (24, 40)
    assert not spec.moe.gated
    # the cost model counts every weight of the engine's model but the routers' correction biases
    model = NemotronHForCausalLM.empty(config_from_hf_dict(NEMOTRON_MOE))
    weights = sum(p.numel() for p in model.parameters())
    assert spec.total_params == weights - 3 * 8


# ------------------------------------------------------------------ Gated DeltaNet hybrids
QWEN3_NEXT_TINY = {
    "model_type": "qwen3_next",
    "vocab_size": 96,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 5,
    "layer_types": ["linear_attention"] * 3 + ["full_attention", "linear_attention"],
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 8,
    "linear_value_head_dim": 6,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 16,
    "shared_expert_intermediate_size": 24,
    "decoder_sparse_step": 2,
}


@pytest.mark.parametrize(
    ("preset", "layers", "experts", "params_b"),
    [
        ("qwen3-next-80b-a3b", (12, 36), (48, 512, 10), 80),
        ("qwen3.5-35b-a3b", (10, 30), (40, 256, 8), 35),
    ],
)
def test_the_gdn_presets(
    preset: str, layers: tuple[int, int], experts: tuple[int, int, int], params_b: int
) -> None:
    """The published geometry: 3 GDN : 1 attention, GDN 16 key / 32 value heads of 128 (a
    2 MiB float32 state + a 48 KiB bfloat16 conv window per layer), every layer a MoE."""
    spec = load_model_spec(preset)
    assert (spec.layers.attention, spec.layers.mamba) == layers
    assert spec.attention_layer_indices == tuple(range(3, sum(layers), 4))
    m = spec.mamba
    assert (m.kind, m.num_heads, m.head_dim, m.d_state, m.n_groups) == ("gdn", 32, 128, 128, 16)
    assert spec.ssm_state_bytes_per_layer == 32 * 128 * 128 * 4 + 3 * (2 * 2048 + 4096) * 2
    assert spec.moe is not None and spec.mlp.num_blocks == 0
    assert (spec.moe.num_blocks, spec.moe.num_experts, spec.moe.experts_per_token) == experts
    assert abs(spec.total_params / (params_b * 1e9) - 1) < 0.02
    assert spec.active_params < 4.5e9
    assert spec.attention.output_gate


def test_gdn_spec_counts_the_engine_models_weights() -> None:
    from hycache.model.qwen3_next import Qwen3NextForCausalLM

    config = config_from_hf_dict(QWEN3_NEXT_TINY)
    spec = model_spec_from_hf(QWEN3_NEXT_TINY, "tiny-qwen3-next")
    assert (spec.layers.attention, spec.layers.mamba, spec.layers.mlp_only) == (1, 4, 0)
    assert spec.moe is not None and (spec.moe.num_blocks, spec.mlp.num_blocks) == (2, 3)
    model = Qwen3NextForCausalLM.empty(config)
    weights = sum(p.numel() for p in model.parameters())
    # every weight but the shared experts' scalar gates (hidden_size each)
    assert spec.total_params == weights - 2 * config.hidden_size


def test_gdn_prefill_flops_grow_with_the_chunk() -> None:
    """A GDN layer's decode FLOPs are the state term; a chunked prefill adds the
    intra-chunk term per token."""
    from hycache.sim.costmodel import GDN_STATE_FLOPS_PER_ELEMENT, CostModel
    from hycache.sim.presets import load_gpu

    spec = load_model_spec("qwen3-next-80b-a3b")
    cost = CostModel(spec, load_gpu("h200"), speculative=False, num_speculative_tokens=0)
    m = spec.mamba
    state = GDN_STATE_FLOPS_PER_ELEMENT * m.num_heads * m.head_dim * m.d_state
    conv = 2 * m.d_conv * m.conv_dim
    assert cost._ssm_flops_per_layer(1) == state + conv
    per_token = cost._ssm_flops_per_layer(64) / 64
    assert per_token == state + conv + 64 * m.num_heads * (5 * m.d_state + 3 * m.head_dim)
