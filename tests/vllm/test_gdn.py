"""`hycache.vllm.Scheduler` on a Gated DeltaNet hybrid: Qwen3-Next-80B-A3B's KV cache config
(36 GDN layers in three groups, 12 + 1 MTP gated-attention layers in one) through vLLM's real
scheduler, 0.33.0 or 0.34.0 (`hycache.bench.vllm.reference`, `VllmSetup(model=QWEN3_NEXT)`).

The GDN spec is the layer's own (`QwenGatedDeltaNetAttention.get_kv_cache_spec`): with
FlashInfer's prefill (Hopper) it exports one checkpoint per forward on the grid lcm(u, 64);
with the Triton/FLA prefill it cannot, and vLLM splits the prefill at its checkpoints.
"""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hycache.bench.vllm.reference import (
    NEMOTRON_H,
    QWEN3_NEXT,
    ReferenceScheduler,
    VllmSetup,
    run_reference,
    vllm_block_size,
)
from hycache.bench.vllm.scenario import Turn, run_hycache
from hycache.cache.boundaries import Boundaries
from hycache.config import CacheKnobs, Policy
from tests.helpers import tokens
from tests.vllm.shapes import (
    PLUGIN,
    budget,
    contains_an_answer,
    family,
    hits,
    hycache_config,
    passes,
    scenario,
    with_cls,
)

settings.load_profile("vllm-reference")

# (B, u): block sizes vLLM accepts for Qwen3-Next (multiples of 64, at least the GDN page)
GDN_GEOMETRIES = [(576, 64), (576, 32), (576, 16), (640, 64), (1152, 128), (1152, 64)]


def gdn(
    b: int,
    u: int,
    k: int = 1,
    exporting: bool = True,
    budget: int = 8192,
    pass_price: tuple[float, float] | None = None,
) -> VllmSetup:
    """`pass_price`: the plugin's (None: its default; (0, 1) makes every stop, as hycache's
    own `limit` does)."""
    knobs = CacheKnobs(b, u, internal_checkpoints=exporting)
    return VllmSetup(knobs, budget, k, model=QWEN3_NEXT, pass_price=pass_price)


def test_the_kv_cache_config_vllm_builds_for_qwen3_next() -> None:
    """Block size 576 on Hopper (FlashInfer exports; 544 / 560 where it cannot), three GDN
    groups of 12 layers and one attention group of 12 + the MTP layer; each GDN page holds
    the conv window (3 + k rows of 2 x 16 x 128 + 32 x 128 channels) and the 32 x 128 x 128
    state in bfloat16, padded to the attention page."""
    from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec

    assert [vllm_block_size(QWEN3_NEXT, k, True) for k in (0, 1, 2, 3)] == [576] * 4
    assert [vllm_block_size(QWEN3_NEXT, k, False) for k in (0, 1, 2, 3)] == [544, 544, 560, 560]
    ref = ReferenceScheduler(gdn(576, 64, k=1))
    groups = ref.scheduler.kv_cache_config.kv_cache_groups
    assert ref.mamba_group_ids == [0, 1, 2]
    attention = groups[3].kv_cache_spec
    assert isinstance(attention, FullAttentionSpec) and len(groups[3].layer_names) == 13
    assert "mtp.layers.0.self_attn.attn" in groups[3].layer_names
    assert attention.page_size_bytes == 2 * 576 * 2 * 256 * 2
    for i in ref.mamba_group_ids:
        spec = groups[i].kv_cache_spec
        assert isinstance(spec, MambaSpec) and len(groups[i].layer_names) == 12
        assert all(name.endswith(".linear_attn") for name in groups[i].layer_names)
        assert spec.mamba_type == MambaAttentionBackendEnum.GDN_ATTN
        assert spec.shapes == ((4, 8192), (32, 128, 128))
        assert spec.dtypes == (torch.bfloat16, torch.bfloat16)
        assert spec.page_size_bytes == attention.page_size_bytes > spec.real_page_size_bytes
        assert (spec.num_prefill_checkpoint_blocks, spec.prefill_checkpoint_alignment) == (1, 64)
        assert spec.num_speculative_blocks == 1
    ref = ReferenceScheduler(gdn(576, 32, exporting=False))
    for i in ref.mamba_group_ids:
        spec = ref.scheduler.kv_cache_config.kv_cache_groups[i].kv_cache_spec
        assert (spec.num_prefill_checkpoint_blocks, spec.prefill_checkpoint_alignment) == (0, None)


@pytest.mark.parametrize("k", [1, 3])
def test_seed_shape_on_qwen3_next(k: int) -> None:
    """64,016-token prompts sharing 57,600, u = 64, B = 576 (vLLM's pick on Hopper), MTP k:
    stock siblings 0 / 57,024 / 57,024 (a block below P: the last shared block's lookahead
    key covers the token after P); the plugin's reach the limit floor((P-1)/u)*u = 57,536,
    from the first sibling with a hint on the producer, as hycache's own `limit` does. The
    observing sibling stops at 57,024 and 57,536 (one pass more: the block boundary 64
    tokens above, where a sibling sharing more would resume, does not pay its pass at the
    default price, and the chunk from 57,536 exports the tail inside its forward); the others
    prefill 6,480 tokens in one pass. The hinted producer stops at 57,536 only (one pass
    more than stock's 8)."""
    setup = gdn(vllm_block_size(QWEN3_NEXT, k, True), 64, k)
    assert setup.block_size == 576
    limit = Boundaries(576, 64, True, Policy.LIMIT).limit(57_600)
    assert limit == 57_536
    turns = family(1, 57_600, 6_416, 4)
    stock = run_reference(setup, turns)
    plugin = run_reference(with_cls(setup, PLUGIN), turns)
    hinted_turns = family(1, 57_600, 6_416, 4, hint=57_600)
    hinted = run_reference(with_cls(setup, PLUGIN), hinted_turns)
    assert hits(stock) == [0, 0, 57_024, 57_024]
    assert hits(plugin) == [0, 0, limit, limit]
    assert hits(hinted) == [0, limit, limit, limit]
    assert passes(stock) == [8, 9, 1, 1]
    assert passes(plugin) == [8, 10, 1, 1]
    assert passes(hinted) == [9, 1, 1, 1]
    assert plugin[1].chunk_ends[-4:] == [56_448, 57_024, 57_536, 64_016]
    assert hinted[0].chunk_ends[-3:] == [56_448, 57_536, 64_016]
    for ts, got in ((turns, plugin), (hinted_turns, hinted)):
        assert hits(run_hycache(hycache_config(setup, "limit", ts), ts)) == hits(got)


def test_seed_shape_where_the_gdn_prefill_cannot_export() -> None:
    """The Triton/FLA prefill (no in-forward checkpoint): vLLM picks B = 544, which u = 64
    does not divide, so the deployment is refused (hycache's knobs refuse it first, as vLLM
    would); at u = 32 stock siblings resume at
    57,120 and the plugin's at the limit 57,568; at `--block-size 576` (u = 64) 57,024
    against 57,536. vLLM splits the final chunk at the tail checkpoint (3 passes), the plugin
    one more at the block boundary after its mid-block resume (vLLM's own split). Its tail
    stop, which stock makes too, is priced as stock's (`stops.tail_pays`, a pass at the
    default 96 tokens): at B = 576 the tail 64,000 lies 64 tokens above its block floor and
    is never made (no pass more than stock's); at B = 544 it saves 352 tokens, and the third
    sibling keeps it (no tail used yet, two left: one use in three expected) while the
    fourth, with none of three used, does not."""
    with pytest.raises(ValueError, match="does not divide block_size 544"):
        ReferenceScheduler(gdn(544, 64, exporting=False))
    turns = family(1, 57_600, 6_416, 4)
    for b, u, want_stock, want_plugin, plugin_passes in (
        (544, 32, 57_120, 57_568, [4, 3]),
        (576, 64, 57_024, 57_536, [3, 3]),
    ):
        setup = gdn(b, u, exporting=False)
        assert want_plugin == Boundaries(b, u, True, Policy.LIMIT).limit(57_600)
        stock = run_reference(setup, turns)
        plugin = run_reference(with_cls(setup, PLUGIN), turns)
        assert hits(stock) == [0, 0, want_stock, want_stock]
        assert hits(plugin) == [0, 0, want_plugin, want_plugin]
        assert passes(stock)[2:] == [3, 3] and passes(plugin)[2:] == plugin_passes


@st.composite
def gdn_shapes(draw: st.DrawFn) -> tuple[VllmSetup, list[Turn]]:
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    b, u = rng.choice(GDN_GEOMETRIES)
    k = rng.choice([1, 1, 2, 3])
    turns = scenario(rng, b, u, k, drafts=True)
    while contains_an_answer(turns):
        turns = scenario(rng, b, u, k, drafts=True)
    # every stop made: the property compares the mechanisms with hycache's own `limit`
    setup = gdn(b, u, k, draw(st.booleans()), budget(rng, b), pass_price=(0.0, 1.0))
    return setup, turns


@given(case=gdn_shapes())
def test_random_shapes_on_qwen3_next(case: tuple[VllmSetup, list[Turn]]) -> None:
    """Per request, on the GDN config: plugin >= stock; where the GDN prefill cannot export,
    plugin = hycache's `limit` (`hycache simulate --policy limit --sequential`), as on the
    Mamba2 spec. Where it exports, neither bounds the other: FlashInfer exports only on the
    grid lcm(u, 64), where hycache's in-forward checkpoint lands on any unit (u = 32 loses
    the tail below it), and vLLM's final chunk keeps no replay-boundary stop."""
    setup, turns = case
    stock = run_reference(setup, turns)
    plugin = run_reference(with_cls(setup, PLUGIN), turns)
    limit = hits(run_hycache(hycache_config(setup, "limit", turns), turns))
    for i, (s, p, m) in enumerate(zip(hits(stock), hits(plugin), limit, strict=True)):
        assert s <= p, (i, s, p)
        assert setup.exporting or p == m, (i, p, m)


@pytest.mark.xfail(
    strict=True,
    reason="the plugin's stops move the chunk grid off a block "
    "boundary stock kept by chance (docs/vllm-plugin.md, known gaps)",
)
@pytest.mark.parametrize("model", [QWEN3_NEXT, NEMOTRON_H])
def test_a_stop_can_cost_a_checkpoint_stock_kept_by_chance(model: str) -> None:
    """B = 640, u = 64, a 1,280-token budget: r1 (2,218 tokens) shares 986 with r0, so the
    plugin stops it at 640, 960, 1,280 and its last chunk runs 1,280 -> 2,218 in one forward
    (exporting only the tail, 2,176); stock's budget grid ends a chunk at 1,920, the replay
    boundary, and keeps that state. r2, sharing 1,989 tokens with r1, resumes at 1,920 on
    stock and 1,280 under the plugin: plugin < stock, on the Mamba2 spec as on GDN."""
    rng = random.Random(0)
    shared = tokens(rng, 986)
    r1 = shared + tokens(rng, 1_232)
    turns = [
        Turn(shared + tokens(rng, 163), [5]),
        Turn(r1, [5]),
        Turn(r1[:1_989] + tokens(rng, 266), [5]),
    ]
    setup = VllmSetup(CacheKnobs(640, 64), 1_280, 1, model=model)
    assert hits(run_reference(setup, turns)) == [0, 0, 1_920]
    assert hits(run_reference(with_cls(setup, PLUGIN), turns))[2] >= 1_920


SEED_GDN = [
    "explain",
    "--backend",
    "vllm",
    "--model",
    QWEN3_NEXT,
    "--block-size",
    "576",
    "--prefix-match-unit",
    "64",
    "--prompt-tokens",
    "64016",
    "--shared-prefix",
    "57600",
    "--num-speculative-tokens",
    "1",
]


def test_explain_backend_vllm_on_qwen3_next(capsys: pytest.CaptureFixture[str]) -> None:
    """`hycache explain --backend vllm --model qwen3-next-80b-a3b`: the seed shape's columns
    on the GDN config; a block size vLLM refuses for it, or `--model` without `--backend
    vllm`, is a plain error."""
    import json

    from hycache.cli.main import main

    assert main([*SEED_GDN, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["inputs"]["model"] == QWEN3_NEXT
    stock, ours = result["policies"]["vllm"], result["policies"]["hycache.vllm.Scheduler"]
    assert stock["siblings"] == [0, 57_024, 57_024]
    assert ours["siblings"] == [0, 57_536, 57_536] == [0, ours["limit"], ours["limit"]]
    assert stock["producer_checkpoints"] == ours["producer_checkpoints"] == [64_000]
    assert stock["resend"] == ours["resend"] == 64_000
    assert main(SEED_GDN) == 0
    assert "model=qwen3-next-80b-a3b" in capsys.readouterr().out
    assert main([*SEED_GDN[:5], "--block-size", "512", *SEED_GDN[7:]]) == 2
    assert "multiple of 64 of at least 576" in capsys.readouterr().err
    flags = ["--prompt-tokens", "100", "--shared-prefix", "50"]
    assert main(["explain", "--model", QWEN3_NEXT, *flags]) == 2
    assert "--model applies to --backend vllm only" in capsys.readouterr().err
