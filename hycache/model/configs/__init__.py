"""Model configurations, torch-free: the hybrid geometry and each architecture's HF mapping.

Files:
    fields.py          the one validator of config files: JSON field types (HF `config.json`
                       and hycache presets alike) and the readers that name a bad field
    base.py            HybridConfig: the geometry every hybrid shares, its value checks
    bamba.py           BambaConfig          model_type "bamba"
    nemotron_h.py      NemotronHConfig      model_type "nemotron_h"  (M / * / - / E pattern)
    granite_hybrid.py  GraniteHybridConfig  model_type "granitemoehybrid" (MoE, multipliers)
    qwen3_next.py      Qwen3NextConfig      model_type "qwen3_next" (Gated DeltaNet + attention),
                       Qwen35Config / Qwen35MoeConfig  "qwen3_5_text" / "qwen3_5_moe_text" (and
                       the text part of a multimodal "qwen3_5" / "qwen3_5_moe" config)
    presets.py         the built-in presets (`tiny`)

Each architecture maps a Hugging Face `config.json` onto its config (`from_hf_dict`) and back
(`to_hf_dict`); `config_from_hf_dict` dispatches on `model_type` and names the supported ones
otherwise. Both the transformers 5 layouts (RoPE settings inside `rope_parameters`,
`layers_block_type`) and the older ones (`rope_theta` at the top level,
`hybrid_override_pattern`) are accepted. Nothing here imports torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hycache.model.configs.bamba import BambaConfig
from hycache.model.configs.base import HybridConfig
from hycache.model.configs.granite_hybrid import GraniteHybridConfig
from hycache.model.configs.nemotron_h import NemotronHConfig
from hycache.model.configs.qwen3_next import Qwen3NextConfig, Qwen35Config, Qwen35MoeConfig

CONFIG_CLASSES: dict[str, type[HybridConfig]] = {
    c.model_type: c
    for c in (
        BambaConfig,
        NemotronHConfig,
        GraniteHybridConfig,
        Qwen3NextConfig,
        Qwen35Config,
        Qwen35MoeConfig,
    )
}
# multimodal checkpoints whose text part hycache runs
CONFIG_CLASSES.update({c.multimodal_type: c for c in (Qwen35Config, Qwen35MoeConfig)})


def config_from_hf_dict(d: Mapping[str, Any]) -> HybridConfig:
    """The config of whichever supported architecture `d["model_type"]` names."""
    model_type = d.get("model_type")
    cls = CONFIG_CLASSES.get(model_type) if isinstance(model_type, str) else None
    if cls is None:
        raise ValueError(
            f"config field model_type {model_type!r} is not supported; hycache runs the "
            f"Mamba2 / Gated DeltaNet + attention hybrids {', '.join(sorted(CONFIG_CLASSES))}"
        )
    return cls.from_hf_dict(d)
