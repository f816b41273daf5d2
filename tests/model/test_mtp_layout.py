"""The MTP layer's checkpoint layout, held to vLLM's reader of it (`qwen3_next_mtp.py` and
`qwen3_5_mtp.py`, `load_weights`): vLLM renames `mtp.` to `model.` and loads the result into
its multi-token predictor, whose weight-holding children are `fc` (2H -> H, no bias),
`pre_fc_norm_embedding`, `pre_fc_norm_hidden`, `layers.0` (a decoder layer built with
`layer_type="full_attention"`, so named and shaped as the target's full-attention layers on
disk) and `norm`; the embedding and LM head are the target's. A checkpoint laid out that way
(the decoder layer copied from the target's own saved full-attention layer, so every name and
shape is transformers' on-disk one, per-expert MoE tensors included) loads in hycache with
every tensor where vLLM puts it, and the engine drafts with it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from hycache.engine.engine import LLM
from hycache.model.configs.qwen3_next import Qwen3NextConfig
from hycache.model.loader import load_model
from hycache.model.mtp import MtpHead, checkpoint_mtp_tensors

from .archs import QWEN3_NEXT as parity
from .utils import save_hf

# the children of vLLM's `Qwen3NextMultiTokenPredictor` / `Qwen3_5MultiTokenPredictor` that
# take checkpoint tensors (after `mtp.` -> `model.`)
VLLM_MTP_MODULES = ("fc.", "pre_fc_norm_embedding.", "pre_fc_norm_hidden.", "layers.0.", "norm.")


def vllm_layout_mtp(path: Path, hidden: int, layer_types: list[str]) -> dict[str, torch.Tensor]:
    """`mtp.*` tensors as vLLM reads them (perturbed copies of the saved target's): attention
    and norms from its first full-attention layer, the MLP from layer 0 (vLLM builds the MTP
    layer under `mtp.layers.0`, so its MLP kind is layer 0's), fc and the norms random."""
    disk: dict[str, torch.Tensor] = {}
    for f in sorted(path.glob("*.safetensors")):
        disk.update(load_file(str(f)))
    attention = f"model.layers.{layer_types.index('full_attention')}."
    g = torch.Generator().manual_seed(0)

    def noise(t: torch.Tensor) -> torch.Tensor:
        return t + 0.01 * torch.randn(t.shape, generator=g, dtype=t.dtype)

    mtp = {}
    for key, t in disk.items():
        for prefix, part in ((attention, ("self_attn.", "input_layernorm.", "post_att")),
                             ("model.layers.0.", ("mlp.",))):  # fmt: skip
            name = key.removeprefix(prefix)
            if key.startswith(prefix) and name.startswith(part):
                mtp["mtp.layers.0." + name] = noise(t)
    mtp["mtp.fc.weight"] = 0.05 * torch.randn(hidden, 2 * hidden, generator=g)
    for name in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        mtp[f"mtp.{name}.weight"] = 0.1 * torch.randn(hidden, generator=g)
    return mtp


@pytest.mark.parametrize("arch,seed", [("qwen3_next", 7), ("qwen3_next", 8), ("qwen3_5", 7),
                                       ("qwen3_5_moe", 7)])  # fmt: skip
def test_an_mtp_layer_laid_out_as_vllm_reads_it_loads(arch: str, seed: int, tmp_path: Path) -> None:
    hf = parity.hf_model(arch, seed)
    path = save_hf(hf, tmp_path / arch)
    cfg = hf.config
    mtp = vllm_layout_mtp(path, cfg.hidden_size, list(cfg.layer_types))
    moe = any(".mlp.experts.0." in k for k in mtp)  # per-expert tensors, as transformers saves
    step, dense = getattr(cfg, "decoder_sparse_step", 1), getattr(cfg, "mlp_only_layers", [])
    assert moe == (arch != "qwen3_5" and step == 1 and 0 not in dense)
    assert all(k.removeprefix("mtp.").startswith(VLLM_MTP_MODULES) for k in mtp)
    save_file({k: v.contiguous() for k, v in mtp.items()}, str(path / "mtp.safetensors"))

    _, config, _ = load_model(str(path))
    assert isinstance(config, Qwen3NextConfig)
    head = MtpHead.from_tensors(checkpoint_mtp_tensors(path), config)
    state = head.state_dict()
    assert set(state) == {k.removeprefix("mtp.") for k in mtp}
    for key, t in state.items():
        torch.testing.assert_close(t, mtp["mtp." + key], rtol=0, atol=0)

    llm = LLM(str(path), dtype="float32", num_speculative_tokens=1, block_size=16,
              prefix_match_unit=4, max_model_len=128, num_blocks=24)  # fmt: skip
    drafter = llm.runner.drafter
    assert isinstance(drafter, MtpHead)
    for key, t in drafter.state_dict().items():
        torch.testing.assert_close(t, mtp["mtp." + key], rtol=0, atol=0)
