"""EAGLE draft head: deterministic init, save/load, shapes, paged KV consistency."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from hycache.model.bamba import BambaForCausalLM, StepBatch
from hycache.model.eagle import EagleHead
from hycache.model.paged import PagedKVCache

from .utils import full_hidden, random_chunks, shuffled_blocks, small_config

F64 = torch.float64


@pytest.fixture(scope="module")
def target() -> BambaForCausalLM:
    return BambaForCausalLM.random(small_config(), seed=11, dtype=F64)


def _batch(tokens: list[int], start: int, table: list[int]) -> StepBatch:
    q = len(tokens)
    return StepBatch(torch.tensor(tokens), torch.arange(start, start + q), [q], [start], [table])


def _draft(
    head: EagleHead,
    target: BambaForCausalLM,
    tokens: list[int],
    hidden: torch.Tensor,
    chunks: list[int],
    table: list[int],
    kv: PagedKVCache,
) -> tuple[torch.Tensor, torch.Tensor]:
    hs, ls = [], []
    pos = 0
    for c in chunks:
        h, logits = head(
            _batch(tokens[pos : pos + c], pos, table), hidden[pos : pos + c], kv, target
        )
        assert logits is not None
        hs.append(h)
        ls.append(logits)
        pos += c
    return torch.cat(hs), torch.cat(ls)


def test_random_is_deterministic_per_seed() -> None:
    cfg = small_config()
    a, b, c = (EagleHead.random(cfg, s) for s in (3, 3, 4))
    for k, v in a.state_dict().items():
        assert torch.equal(v, b.state_dict()[k]), k
    assert not torch.equal(a.fc.weight, c.fc.weight)


def test_shapes_and_names(target: BambaForCausalLM) -> None:
    head = EagleHead.random(target.config, 1, dtype=F64)
    cfg = target.config
    names = set(head.state_dict())
    assert {
        "fc.weight",
        "fc.bias",
        "layers.0.self_attn.q_proj.weight",
        "layers.0.mlp.down_proj.weight",
        "layers.0.input_layernorm.weight",
        "layers.0.post_attention_layernorm.weight",
    } <= names
    assert not any("embed" in n or "lm_head" in n for n in names)
    assert head.fc.weight.shape == (cfg.hidden_size, 2 * cfg.hidden_size)
    tokens = [1, 2, 3, 4, 5]
    hidden = full_hidden(target, tokens)
    kv = head.make_kv_cache(4, 4)
    assert kv.num_layers == 1
    h, logits = head(_batch(tokens, 0, [2, 0]), hidden, kv, target)
    assert h.shape == (5, cfg.hidden_size)
    assert logits is not None and logits.shape == (5, cfg.vocab_size)
    h2, none = head(_batch(tokens, 0, [3, 1]), hidden, kv, target, compute_logits=False)
    assert none is None
    torch.testing.assert_close(h2, h, rtol=0, atol=1e-12)
    # The logits are the target's head applied to the draft hidden.
    torch.testing.assert_close(
        logits, target.compute_logits(target.final_layernorm(h)), rtol=0, atol=0
    )


def test_save_load_round_trip(target: BambaForCausalLM, tmp_path: Path) -> None:
    head = EagleHead.random(target.config, 2, dtype=F64)
    head.save(tmp_path / "eagle.safetensors")
    loaded = EagleHead.load(tmp_path / "eagle.safetensors", target.config, dtype=F64)
    for k, v in head.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k
    tokens = [7, 8, 9]
    hidden = full_hidden(target, tokens)
    out_a = head(_batch(tokens, 0, [0]), hidden, head.make_kv_cache(2, 4), target)
    out_b = loaded(_batch(tokens, 0, [0]), hidden, loaded.make_kv_cache(2, 4), target)
    assert torch.equal(out_a[0], out_b[0])
    # Without a bias in the file the head is built without one.
    no_bias = EagleHead.random(target.config, 2, fc_bias=False)
    no_bias.save(tmp_path / "nb.safetensors")
    assert EagleHead.load(tmp_path / "nb.safetensors", target.config).fc.bias is None


def test_load_errors(target: BambaForCausalLM, tmp_path: Path) -> None:
    path = tmp_path / "e.safetensors"
    EagleHead.random(target.config, 2).save(path)
    good = load_file(str(path))

    def write(tensors: dict[str, torch.Tensor]) -> Path:
        out = tmp_path / f"bad{len(list(tmp_path.iterdir()))}.safetensors"
        save_file(tensors, str(out))
        return out

    missing = dict(good)
    del missing["layers.0.mlp.up_proj.weight"]
    with pytest.raises(ValueError, match=r"missing tensors.*mlp\.up_proj"):
        EagleHead.load(write(missing), target.config)
    with pytest.raises(ValueError, match=r"unexpected tensors.*embed_tokens"):
        EagleHead.load(write({**good, "embed_tokens.weight": torch.zeros(97, 32)}), target.config)
    with pytest.raises(ValueError, match=r"shape mismatch.*fc\.weight"):
        EagleHead.load(write({**good, "fc.weight": torch.zeros(32, 32)}), target.config)
    with pytest.raises(FileNotFoundError):
        EagleHead.load(tmp_path / "nope.safetensors", target.config)


@pytest.mark.parametrize("seed", [0, 1])
def test_chunked_equals_whole(target: BambaForCausalLM, seed: int) -> None:
    rng = random.Random(seed)
    tokens = [rng.randrange(97) for _ in range(60)]
    hidden = full_hidden(target, tokens)
    head = EagleHead.random(target.config, 5, dtype=F64)
    # Token t+1 paired with target hidden at t.
    draft_in, hid_in = tokens[1:], hidden[:-1]
    whole = _draft(head, target, draft_in, hid_in, [59], list(range(8)), head.make_kv_cache(8, 8))
    chunks = random_chunks(59, rng, 20)
    chunked = _draft(
        head, target, draft_in, hid_in, chunks, shuffled_blocks(16, seed), head.make_kv_cache(16, 4)
    )
    torch.testing.assert_close(chunked[0], whole[0], rtol=0, atol=1e-9)
    torch.testing.assert_close(chunked[1], whole[1], rtol=0, atol=1e-9)


def test_chained_draft_steps(target: BambaForCausalLM) -> None:
    """Feeding each draft's hidden back in, one token per step, gives the same outputs as one
    forward over the recorded (token, hidden) inputs on a fresh cache."""
    head = EagleHead.random(target.config, 6, dtype=F64)
    tokens = [3, 14, 15, 92, 65]
    hidden = full_hidden(target, tokens)
    kv = head.make_kv_cache(4, 4)
    table = [1, 3, 0, 2]
    h, _ = head(_batch(tokens[1:], 0, table), hidden[:-1], kv, target)
    in_tokens, in_hidden, outs = list(tokens[1:]), [hidden[:-1]], [h]
    prev_h = h[-1:]
    for pos in range(4, 7):
        nxt = int(target.compute_logits(target.final_layernorm(prev_h)).argmax())
        in_tokens.append(nxt)
        in_hidden.append(prev_h)
        prev_h, logits = head(_batch([nxt], pos, table), prev_h, kv, target)
        assert logits is not None and logits.shape == (1, 97)
        outs.append(prev_h)
    once, _ = head(
        _batch(in_tokens, 0, [2, 0]), torch.cat(in_hidden), head.make_kv_cache(4, 4), target
    )
    torch.testing.assert_close(torch.cat(outs), once, rtol=0, atol=1e-9)
