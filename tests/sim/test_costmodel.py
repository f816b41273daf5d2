"""Cost model: monotonicity, roofline regimes, the drafter's share, cache sizing by hand."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hycache.sched.chunking import StepSeq
from hycache.sim.costmodel import CostModel, SeqWork, StepWork
from hycache.sim.model_spec import ModelSpec
from hycache.sim.presets import (
    GpuSpec,
    load_gpu,
    load_model_spec,
    model_spec_from_dict,
)

BAMBA = load_model_spec("bamba-9b")
NEMO = load_model_spec("nemotron-h-8b")
TINY = load_model_spec("tiny")
H200 = load_gpu("h200")
MiB = 1 << 20


def cm(
    model: ModelSpec = BAMBA, gpu: GpuSpec = H200, *, spec: bool = False, k: int = 3, **kw: Any
) -> CostModel:
    return CostModel(model, gpu, speculative=spec, num_speculative_tokens=k if spec else 0, **kw)


def prefill(n: int, ctx: int = 0) -> StepWork:
    return StepWork((SeqWork(n, ctx, 0, True),))


def decode(reqs: int, ctx: int, k: int = 0) -> StepWork:
    return StepWork(tuple(SeqWork(1 + k, ctx, k, False) for _ in range(reqs)))


@pytest.mark.parametrize("spec", [False, True])
def test_step_time_grows_with_tokens(spec: bool) -> None:
    model = cm(spec=spec)
    times = [model.step_time(prefill(n)) for n in (1, 16, 256, 2048, 8192, 32768)]
    assert all(a < b for a, b in itertools.pairwise(times))


@pytest.mark.parametrize("spec", [False, True])
def test_step_time_grows_with_context(spec: bool) -> None:
    model = cm(spec=spec)
    k = 3 if spec else 0
    times = [model.step_time(decode(32, ctx, k)) for ctx in (0, 1024, 8192, 65536, 131072)]
    assert all(a < b for a, b in itertools.pairwise(times))
    chunks = [model.step_time(prefill(2048, ctx)) for ctx in (0, 4096, 32768, 131072)]
    assert all(a < b for a, b in itertools.pairwise(chunks))


def test_more_requests_cost_more() -> None:
    model = cm()
    times = [model.step_time(decode(n, 4096)) for n in (1, 8, 64, 256)]
    assert all(a < b for a, b in itertools.pairwise(times))


seq_strategy = st.builds(
    lambda n, c, prefill_: SeqWork(n, c, 0, prefill_),
    st.integers(1, 4096),
    st.integers(0, 200_000),
    st.booleans(),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(seq_strategy, min_size=1, max_size=8), st.integers(0, 7), st.integers(1, 512))
def test_adding_work_never_makes_a_step_faster(seqs: list[SeqWork], i: int, extra: int) -> None:
    model = cm(spec=True)
    base = StepWork(tuple(seqs))
    s = seqs[i % len(seqs)]
    more_tokens = list(seqs)
    more_tokens[i % len(seqs)] = SeqWork(s.num_new_tokens + extra, s.context_len, 0, s.is_prefill)
    more_ctx = list(seqs)
    more_ctx[i % len(seqs)] = SeqWork(s.num_new_tokens, s.context_len + extra, 0, s.is_prefill)
    t = model.step_time(base)
    assert model.step_time(StepWork(tuple(more_tokens))) >= t
    assert model.step_time(StepWork(tuple(more_ctx))) >= t
    assert model.step_time(StepWork((*seqs, s))) > t


@pytest.mark.parametrize("model", [BAMBA, NEMO])
def test_big_prefill_is_compute_bound_and_small_decode_memory_bound(model: ModelSpec) -> None:
    c = cm(model)
    big = c.breakdown(prefill(8192))
    assert big["compute_s"] > 10 * big["memory_s"]
    assert big["time_s"] == pytest.approx(big["compute_s"] + big["overhead_s"])
    small = c.breakdown(decode(1, 2048))
    assert small["memory_s"] > 10 * small["compute_s"]
    assert small["time_s"] == pytest.approx(small["memory_s"] + small["overhead_s"])
    # A one-token decode reads every weight once (the embedding is gathered, not read): its
    # time is about weights / bandwidth.
    read = (model.total_params - model.embedding_params) * model.dtype_bytes
    weights_s = read / (H200.hbm_bandwidth * c.bandwidth_efficiency)
    assert small["memory_s"] == pytest.approx(weights_s, rel=0.05)


def test_crossover_is_near_the_ridge_point() -> None:
    """A chunk flips from memory- to compute-bound near the GPU's ridge point (FLOP/byte):
    at 2 FLOPs per weight per token and 2 bytes per weight, near ``ridge`` tokens."""
    c = cm()
    ridge = (H200.peak_flops * c.compute_efficiency) / (H200.hbm_bandwidth * c.bandwidth_efficiency)
    below = c.breakdown(prefill(int(ridge * 0.5), 16))
    above = c.breakdown(prefill(int(ridge * 2.0), 16))
    assert below["memory_s"] > below["compute_s"]
    assert above["compute_s"] > above["memory_s"]


def test_hybrid_decode_batches_stay_memory_bound_on_state_traffic() -> None:
    """Every decoding request reads and writes its SSM state: big batches stay memory-bound."""
    b = cm().breakdown(decode(512, 16))
    assert b["memory_s"] > b["compute_s"]
    assert b["target_bytes"] > 512 * 2 * BAMBA.ssm_state_bytes


def test_drafter_costs_only_when_speculative() -> None:
    off, on = cm(spec=False), cm(spec=True, k=3)
    work = decode(16, 4096, k=0)  # no drafts verified this step: identical target work
    b_off, b_on = off.breakdown(work), on.breakdown(work)
    assert b_off["draft_flops"] == 0 and b_off["draft_bytes"] == 0
    assert b_off["num_draft_passes"] == 0
    assert b_on["num_draft_passes"] == 3  # k sequential drafter passes for decoding requests
    assert b_on["draft_flops"] > 0 and b_on["draft_bytes"] > 0
    assert b_on["target_flops"] == b_off["target_flops"]
    assert on.step_time(work) > off.step_time(work)
    # Each drafter pass re-reads the drafter's weights and the shared LM head.
    per_pass = BAMBA.drafter_weight_bytes + BAMBA.lm_head_params * BAMBA.dtype_bytes
    assert b_on["draft_bytes"] > 3 * per_pass
    # A prefill-only step runs the drafter once, over the prefill tokens.
    assert on.breakdown(prefill(4096))["num_draft_passes"] == 1
    assert on.step_time(prefill(4096)) > off.step_time(prefill(4096))


def test_drafts_need_speculative_decoding() -> None:
    with pytest.raises(ValueError, match="speculative"):
        cm(spec=False).step_time(decode(1, 100, k=2))
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        cm(spec=True, k=2).step_time(decode(1, 100, k=3))
    with pytest.raises(ValueError):
        CostModel(BAMBA, H200, speculative=True, num_speculative_tokens=0)


def test_verify_writes_one_state_per_position_unless_told_otherwise() -> None:
    work = decode(8, 1024, k=3)
    per_pos = cm(spec=True).breakdown(work)["target_bytes"]
    final_only = cm(spec=True, intermediate_state_writes=False).breakdown(work)["target_bytes"]
    assert per_pos - final_only == pytest.approx(8 * 3 * BAMBA.ssm_state_bytes)


def test_an_internal_checkpoint_costs_a_state_write_not_a_step() -> None:
    """A checkpoint written inside the forward adds one state's bytes to the chunk's step;
    splitting there instead costs a second step (its overhead, weights read again)."""
    c = cm(spec=True)
    one = StepWork((SeqWork(4096, 0, 0, True, num_state_writes=2),))
    plain = prefill(4096)
    extra = c.breakdown(one)["target_bytes"] - c.breakdown(plain)["target_bytes"]
    assert extra == pytest.approx(2 * BAMBA.ssm_state_bytes)
    split = c.step_time(prefill(2048)) + c.step_time(prefill(2048, 2048))
    assert c.step_time(plain) <= c.step_time(one) < split
    with pytest.raises(ValueError, match="num_state_writes"):
        SeqWork(8, 0, 0, True, num_state_writes=-1)


def test_decode_bytes_match_hand_arithmetic() -> None:
    """One request, one token, context 1000, tiny model: every byte accounted for."""
    assert (TINY.layers.attention, TINY.layers.mamba) == (2, 4)
    c = cm(TINY)
    m = TINY
    weights = m.total_params * 2 - m.embedding_params * 2  # embedding rows are gathered, not read
    kv = 2 * (2 * 2 * 64 * 2) * (1000 + 1)  # 2 attn layers, K+V, 2 kv heads x 64, bf16
    ssm = 8 * 64 * 64 * 4  # heads x head_dim x d_state, fp32
    conv = 3 * (8 * 64 + 2 * 2 * 64) * 2  # (d_conv - 1) x conv channels (x, B, C), bf16
    state = 4 * (ssm + conv) * 2  # 4 mamba layers, read + write
    assert c.breakdown(decode(1, 1000))["target_bytes"] == weights + kv + state


def test_block_copies_cost_bandwidth() -> None:
    c = cm(block_size=4416)
    base = c.step_time(decode(4, 1000))
    with_copies = c.step_time(StepWork(decode(4, 1000).seqs, num_block_copies=3))
    expected = 2 * 3 * c.block_bytes(4416) / (H200.hbm_bandwidth * c.bandwidth_efficiency)
    assert with_copies - base == pytest.approx(expected)


def test_empty_step_is_free() -> None:
    assert cm().step_time(StepWork(())) == 0.0


def test_block_bytes_is_the_larger_page() -> None:
    c = cm()
    state = 29 * (128 * 64 * 128 * 4 + 3 * (128 * 64 + 2 * 1 * 128) * 2)
    assert BAMBA.ssm_state_bytes == state == 123_104_768
    assert c.block_bytes(16) == state  # SSM state dominates small blocks
    per_token = 3 * 2 * 8 * 128 * 2  # 3 attention layers, K+V, 8 kv heads x 128, bf16
    assert c.block_bytes(16384) == 16384 * per_token  # attention dominates big ones
    # With the drafter on, its attention layer shares the blocks.
    assert cm(spec=True).block_bytes(16384) == 16384 * (per_token + 2 * 8 * 128 * 2)


def test_num_blocks_matches_hand_arithmetic() -> None:
    """bamba-9b on h200 at B = 4416, memory fraction 0.9, no drafter."""
    memory = 143_771 * MiB  # 150,754,820,096 bytes
    weights = 9_780_235_392 * 2  # bf16
    page = max(4416 * 12_288, 123_104_768)  # = the SSM state
    expected = (int(memory * 0.9) - weights) // page
    assert expected == 943
    assert cm().num_blocks(4416) == 943
    assert cm().num_blocks(4416, memory_fraction=0.5) == (int(memory * 0.5) - weights) // page


def test_num_blocks_rejects_a_model_that_does_not_fit() -> None:
    with pytest.raises(ValueError, match="do not fit"):
        cm().num_blocks(16, memory_fraction=0.1)


def test_balanced_block_size() -> None:
    c = cm()
    b = c.balanced_block_size(16)
    assert b % 16 == 0
    assert b * c.attention_bytes_per_token >= BAMBA.ssm_state_bytes
    assert (b - 16) * c.attention_bytes_per_token < BAMBA.ssm_state_bytes


def test_efficiencies_come_from_the_preset_unless_given() -> None:
    assert cm().compute_efficiency == H200.compute_efficiency
    assert cm(compute_efficiency=0.3).compute_efficiency == 0.3
    slow = cm(compute_efficiency=0.3).step_time(prefill(8192))
    assert slow > cm().step_time(prefill(8192))
    with pytest.raises(ValueError):
        cm(bandwidth_efficiency=1.5)


def test_moe_reads_only_touched_experts() -> None:
    data = {
        "name": "moe-toy",
        "hidden_size": 512,
        "vocab_size": 1000,
        "num_layers": 4,
        "layers": {"attention": 1, "mamba": 3},
        "attention": {"num_heads": 8, "num_kv_heads": 2, "head_dim": 64},
        "mamba": {
            "num_heads": 16,
            "head_dim": 64,
            "d_state": 32,
            "n_groups": 1,
            "d_conv": 4,
            "expand": 2,
        },
        "mlp": {"intermediate_size": 1024, "gated": True, "num_blocks": 0},
        "moe": {
            "num_blocks": 4,
            "num_experts": 64,
            "experts_per_token": 2,
            "expert_intermediate_size": 256,
        },
        "dtype_bytes": 2,
        "state_dtype_bytes": 4,
    }
    m = model_spec_from_dict(data)
    assert m.active_params < m.total_params
    c = cm(m)
    one = c.breakdown(decode(1, 0))["target_bytes"]
    many = c.breakdown(decode(512, 0))["target_bytes"]
    assert one < many
    # With every expert touched, the weights read are all of them.
    all_weights = (m.total_params - m.embedding_params) * 2
    assert many - 512 * m.ssm_state_bytes - 512 * m.kv_bytes_per_token == pytest.approx(
        all_weights, rel=1e-3
    )


def test_seqwork_validation() -> None:
    with pytest.raises(ValueError):
        SeqWork(0, 0, 0, True)
    with pytest.raises(ValueError):
        SeqWork(3, -1, 0, False)
    with pytest.raises(ValueError):
        SeqWork(3, 0, 3, False)  # k drafts need 1 + k positions
    with pytest.raises(ValueError):
        SeqWork(3, 0, 1, True)
    with pytest.raises(ValueError):
        StepWork((), num_block_copies=-1)


def test_warm_context_costs_the_warm_factor_and_padding_is_warm() -> None:
    kw = {"phase_overlap": False, "decode_kv_bytes_factor": 6.0, "warm_kv_bytes_factor": 2.0}
    model = cm(TINY, spec=True, k=2, **kw)
    cold = StepWork((SeqWork(3, 4000, 2, False),) * 2)
    warm = StepWork((SeqWork(3, 4000, 2, False), SeqWork(3, 4000, 2, False, 0, 3000)))
    # K/V rows of one decoding request's context: the target's attention layers once, the
    # drafter's layer on each of its 2 passes
    layers = TINY.layers.attention + 2 * TINY.drafter.num_layers
    saved = 3000 * layers * TINY.kv_bytes_per_token_per_layer * (6.0 - 2.0)
    rate = H200.hbm_bandwidth * model.bandwidth_efficiency
    assert model.step_time(cold) - model.step_time(warm) == pytest.approx(saved / rate)
    # padded to the longest decoding context, the padding rows are warm too
    padded = cm(TINY, spec=True, k=2, padded_decode_attention=True, **kw)
    short = StepWork((SeqWork(3, 4000, 2, False), SeqWork(3, 1000, 2, False)))
    even = StepWork((SeqWork(3, 4000, 2, False), SeqWork(3, 4000, 2, False, 0, 3000)))
    assert padded.step_time(short) == pytest.approx(padded.step_time(even))
    # unset, the warm factor is the decode factor, and that the K/V factor
    plain = cm(TINY, spec=True, k=2, kv_bytes_factor=3.0)
    assert plain.warm_kv_bytes_factor == plain.decode_kv_bytes_factor == 3.0
    assert plain.step_time(cold) == plain.step_time(warm)
    with pytest.raises(ValueError, match="shared_context_len"):
        SeqWork(3, 100, 2, False, 0, 101)


def test_step_work_counts_context_shared_with_an_earlier_decoding_request() -> None:
    from hycache.cache.boundaries import Boundaries
    from hycache.request import Request, SamplingParams
    from hycache.sched.executor import DryRunExecutor
    from hycache.sched.scheduler import Scheduler
    from hycache.sim.cluster import step_work
    from tests.helpers import make_config

    cfg = make_config(block_size=16, unit=4, k=2, policy="limit")
    sched = Scheduler(cfg)
    ex = DryRunExecutor(num_speculative_tokens=2)
    lookahead = Boundaries.from_config(cfg.cache, cfg.speculative).lookahead
    prefix = list(range(100, 164))  # 4 whole blocks
    prompts = {"a": [*prefix, 1, 2, 3, 4, 5], "b": [*prefix, 6, 7, 8, 9, 10], "c": [9] * 69}
    reqs = {}
    for rid, prompt in prompts.items():
        sp = SamplingParams(max_tokens=30, ignore_eos=True)
        reqs[rid] = Request.new(rid, prompt, sp, unit=cfg.cache.unit, eos_token_ids=(),
                                lookahead=lookahead)  # fmt: skip
        sched.add_request(reqs[rid])
        out = sched.schedule()  # one at a time: b then hits a's blocks
        sched.update(out, ex.execute(out))
    out = sched.schedule()
    seqs = step_work(out, 16).seqs
    work = {s.request.request_id: w for s, w in zip(out.scheduled, seqs, strict=True)}
    assert [s.request.request_id for s in out.scheduled] == ["a", "b", "c"]  # by arrival
    assert all(not w.is_prefill for w in work.values())
    assert work["a"].shared_context_len == 0
    # b's cache hit gave it a's blocks, which a read already in this step
    hit = reqs["b"].first_hit_tokens or 0
    assert hit >= 16 and work["b"].shared_context_len == hit // 16 * 16
    assert work["c"].shared_context_len == 0
    assert all(w.shared_context_len == 0 for w in step_work(out).seqs)  # no block size given


def _with_chunk(step: StepWork, n: int, ctx: int) -> StepWork:
    return StepWork((*step.seqs, SeqWork(n, ctx, 0, True)))


@pytest.mark.parametrize("reqs", [8, 63])
def test_free_prefill_tokens_are_the_most_that_hide_under_the_decodes_memory_time(
    reqs: int,
) -> None:
    """At the free count every phase stays memory-bound (the step only grows by the chunk's
    own bytes); one token more makes a phase compute-bound."""
    model = cm(spec=True)
    decodes = decode(reqs, 6_000, k=3)
    step = [StepSeq(s.context_len, s.num_new_tokens, 3, False) for s in decodes.seqs]
    n = model.free_prefill_tokens(step, 4_000, 8_192)
    assert 0 < n < 8_192
    hidden = model.phases(_with_chunk(decodes, n, 4_000))
    assert all(p.compute_s <= p.memory_s for p in hidden)
    assert any(p.compute_s > p.memory_s for p in model.phases(_with_chunk(decodes, n + 1, 4_000)))
    base = model.step_time(decodes)
    assert model.step_time(_with_chunk(decodes, n, 4_000)) < 1.01 * base
    assert model.free_prefill_tokens(step, 4_000, n // 2) == n // 2  # at most the limit
    # a bigger decode batch leaves more memory time to hide a chunk under
    if reqs == 8:
        more = [step[0]] * 63
        assert model.free_prefill_tokens(more, 4_000, 8_192) > n


def test_nothing_hides_when_phases_add_up_or_the_step_is_compute_bound() -> None:
    step = [StepSeq(6_000, 4, 3, False)] * 63
    assert cm(spec=True, phase_overlap=False).free_prefill_tokens(step, 0, 8_192) == 0
    busy = [StepSeq(0, 8_000, 0, True), *step]  # already compute-bound: no room
    assert cm(spec=True).free_prefill_tokens(busy, 0, 8_192) == 0
