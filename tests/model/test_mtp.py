"""The MTP layer a Qwen3-Next / Qwen3.5 checkpoint carries (`mtp.*`) is the engine's drafter:
it loads from the checkpoint beside the target (which ignores it, as transformers does), a
bad MTP tensor is named, and speculative greedy decoding with it (k = 2) gives transformers'
greedy tokens."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from hycache.engine.engine import LLM
from hycache.model.configs.qwen3_next import Qwen3NextConfig
from hycache.model.eagle import EagleHead
from hycache.model.loader import load_model
from hycache.model.mtp import MtpHead, checkpoint_mtp_tensors
from hycache.request import SamplingParams

from .archs import QWEN3_NEXT as parity
from .utils import hf_generate, random_prompt, save_hf


@pytest.fixture(scope="module", params=["qwen3_next", "qwen3_5"])
def checkpoint(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Any, Path]:
    """A transformers checkpoint plus a random MTP layer in a shard of its own."""
    hf = parity.hf_model(request.param, 5)
    path = save_hf(hf, tmp_path_factory.mktemp(request.param))
    _, config, _ = load_model(str(path))
    assert isinstance(config, Qwen3NextConfig)
    save_file(MtpHead.random(config, seed=3).mtp_tensors(), str(path / "mtp.safetensors"))
    return hf, path


def test_mtp_loads_and_drafts_transformers_greedy_tokens(checkpoint: tuple[Any, Path]) -> None:
    hf, path = checkpoint
    prompts = [random_prompt(parity.prompt_len + i, 40 + i, parity.vocab) for i in range(2)]
    llm = LLM(str(path), dtype="float32", num_speculative_tokens=2, block_size=16,
              prefix_match_unit=4, max_model_len=160, num_blocks=40)  # fmt: skip
    assert isinstance(llm.runner.drafter, MtpHead)
    sp = SamplingParams(max_tokens=parity.new_tokens, ignore_eos=True)
    got = [o.token_ids for o in llm.generate([p.tolist() for p in prompts], sp)]
    assert got == [hf_generate(hf, p, parity.new_tokens) for p in prompts]


def test_mtp_tensors_round_trip_and_bad_ones_are_named(checkpoint: tuple[Any, Path]) -> None:
    _, path = checkpoint
    _, config, _ = load_model(str(path))
    assert isinstance(config, Qwen3NextConfig)
    tensors = checkpoint_mtp_tensors(path)
    head = MtpHead.from_tensors(tensors, config)
    for key, t in head.state_dict().items():
        torch.testing.assert_close(t, tensors[key], rtol=0, atol=0)
    del tensors["fc.weight"]
    with pytest.raises(ValueError, match=r"missing tensors \['fc.weight'\]"):
        MtpHead.from_tensors(tensors, config)


def test_without_mtp_tensors_the_drafter_is_eagle(tmp_path: Path) -> None:
    hf = parity.hf_model("qwen3_5", 6)
    path = save_hf(hf, tmp_path / "no-mtp")
    assert not checkpoint_mtp_tensors(path)
    llm = LLM(str(path), dtype="float32", num_speculative_tokens=1, block_size=16,
              prefix_match_unit=4, max_model_len=128, num_blocks=24)  # fmt: skip
    assert isinstance(llm.runner.drafter, EagleHead)
