"""Sampling and speculative verification."""

from __future__ import annotations

import pytest
import torch

from hycache.engine.engine import LLM
from hycache.engine.sampling import probabilities, verify
from hycache.request import SamplingParams


def test_greedy_verify_accepts_the_matching_prefix() -> None:
    logits = torch.tensor([[0.0, 5, 0], [9, 0, 0], [0, 0, 3]])  # argmax 1, 0, 2
    params = SamplingParams(temperature=0)
    gen = torch.Generator().manual_seed(0)
    assert verify(logits, [1, 0], None, params, gen) == [1, 0, 2]  # both accepted + bonus
    assert verify(logits, [1, 2], None, params, gen) == [1, 0]  # second rejected: correction
    assert verify(logits, [2, 0], None, params, gen) == [1]


def test_rejection_sampling_preserves_the_target_distribution() -> None:
    """The first emitted token is distributed as p, whatever the draft distribution q."""
    p_logits = torch.tensor([1.0, 0.2, -0.5, 0.7])
    params = SamplingParams(temperature=1.0)
    p = probabilities(p_logits, params)
    q = torch.tensor([0.1, 0.6, 0.2, 0.1], dtype=torch.float64)
    gen = torch.Generator().manual_seed(1)
    counts = torch.zeros(4)
    n = 20_000
    logits = torch.stack([p_logits, p_logits])
    for _ in range(n):
        draft = int(torch.multinomial(q, 1, generator=gen))
        out = verify(logits, [draft], q[None], params, gen)
        counts[out[0]] += 1
    freq = counts / n
    assert torch.allclose(freq.double(), p, atol=0.015), (freq, p)


def test_top_p_keeps_the_smallest_set_over_p() -> None:
    probs = probabilities(
        torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05])), SamplingParams(temperature=1.0, top_p=0.7)
    )
    assert probs[2] == probs[3] == 0
    assert torch.isclose(probs[:2].sum(), torch.tensor(1.0, dtype=torch.float64))


def test_sampled_generation_is_reproducible_with_a_seed() -> None:
    def run() -> list[int]:
        llm = LLM("tiny", max_model_len=256, num_blocks=64, num_speculative_tokens=2)
        sp = SamplingParams(max_tokens=10, temperature=0.8, top_p=0.9, seed=5)
        return llm.generate([[3, 1, 4, 1, 5]], sp)[0].token_ids

    a, b = run(), run()
    assert a == b and len(a) == 10


@pytest.mark.parametrize(
    "prompt,params,needle",
    [
        ([], SamplingParams(), "empty"),
        ([1, 600], SamplingParams(), "vocabulary"),
        (list(range(200)), SamplingParams(max_tokens=100), "max_model_len"),
        ("text", SamplingParams(), "tokenizer"),
    ],
)
def test_refused_requests_disturb_nothing(
    prompt: object, params: SamplingParams, needle: str
) -> None:
    llm = LLM("tiny", max_model_len=256, num_blocks=64)
    good = llm.add_request([1, 2, 3], SamplingParams(max_tokens=3))
    with pytest.raises(ValueError, match=needle):
        llm.generate([[5, 6], prompt], params)  # type: ignore[list-item]
    assert [r.request_id for r in llm.scheduler.waiting] == [good]  # [5, 6] was not queued
    while llm.scheduler.has_unfinished():
        llm.step()
    assert llm.scheduler.cache.pool.num_free == 63


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -0.5])
def test_non_finite_or_negative_temperature_is_refused_up_front(value: float) -> None:
    """`--temperature nan` used to pass validation and crash mid-generation."""
    with pytest.raises(ValueError, match=r"^temperature:"):
        SamplingParams(temperature=value)


def test_generators_live_on_the_models_device() -> None:
    """torch.multinomial needs a generator of its tensor's device (a CPU generator fails on a
    GPU at temperature > 0)."""
    llm = LLM("tiny", max_model_len=256, num_blocks=64)
    gen = llm.runner._gen("r", SamplingParams(temperature=0.8, seed=3))
    assert gen.device == llm.model.device


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_temperature_sampling_and_verification_run_on_cuda() -> None:
    sp = SamplingParams(max_tokens=8, temperature=0.8, seed=1, ignore_eos=True)
    for k in (0, 2):
        llm = LLM("tiny", device="cuda", max_model_len=256, num_blocks=64, num_speculative_tokens=k)
        (out,) = llm.generate([[1, 2, 3, 4, 5]], sp)
        assert len(out.token_ids) == 8


# ------------------------------------------------------------------------------ logprobs
def uncached_logprobs(llm: LLM, ids: list[int]) -> torch.Tensor:
    """log_softmax of the model's raw logits at every position of `ids`, from one forward pass
    over fresh caches (no prefix cache, no chunking, no drafts)."""
    from hycache.model.paged import StepBatch

    model = llm.model
    block = 16
    blocks = -(-len(ids) // block)
    kv = model.make_kv_cache(blocks, block) if model.config.num_attention_layers else None
    states = model.make_state_cache(1) if model.config.num_mamba_layers else None
    batch = StepBatch(
        input_ids=torch.tensor(ids, dtype=torch.long),
        positions=torch.arange(len(ids), dtype=torch.long),
        query_lens=[len(ids)],
        context_lens=[0],
        block_tables=[list(range(blocks))],
        state_src=[-1] if states is not None else [],
        state_writes=[[(len(ids), 0)]] if states is not None else [],
    )
    logits = model.compute_logits(model.forward(batch, kv, states))
    return torch.log_softmax(logits.double(), dim=-1)


LP_KW: dict[str, object] = {"max_model_len": 256, "block_size": 16, "prefix_match_unit": 4}
LP_PROMPTS = [[(11 * i + 3) % 500 + 1 for i in range(37)], [7, 7, 7, 1, 2]]


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_logprobs_are_the_raw_models_log_softmax(temperature: float) -> None:
    """Each output token's logprob, and its top-5, equal log_softmax of the logits an uncached
    forward pass over prompt + output computes at the position that predicted it (before
    temperature: the values are the model's, whatever the sampling); greedy's top-1 is the
    token itself."""
    llm = LLM("tiny", dtype="float64", num_blocks=64, **LP_KW)  # type: ignore[arg-type]
    sp = SamplingParams(max_tokens=9, temperature=temperature, seed=4, ignore_eos=True, logprobs=5)
    for p, out in zip(LP_PROMPTS, llm.generate(LP_PROMPTS, sp), strict=True):
        assert out.logprobs is not None and len(out.logprobs) == len(out.token_ids) == 9
        ref = uncached_logprobs(llm, p + out.token_ids)
        for j, (t, lp) in enumerate(zip(out.token_ids, out.logprobs, strict=True)):
            row = ref[len(p) - 1 + j]
            assert lp.token_id == t
            assert lp.logprob == pytest.approx(float(row[t]), abs=1e-9)
            want = row.topk(5)
            assert [i for i, _ in lp.top] == want.indices.tolist()
            assert [v for _, v in lp.top] == pytest.approx(want.values.tolist(), abs=1e-9)
            if temperature == 0:
                assert lp.top[0][0] == t


def test_speculative_logprobs_equal_plain_across_preemption_and_truncation() -> None:
    """With EAGLE drafts (k = 3) each token's logprobs come from the row that predicted it: the
    same values as plain decoding within 1e-5, one per kept token even when a stop token or
    max_tokens cuts accepted drafts, and none repeated when a small pool preempts (preempted
    requests replay their outputs as prefill)."""
    prompts = [[(7 * i + j) % 500 + 1 for j in range(40)] for i in range(6)]
    plain = LLM("tiny", num_blocks=400, **LP_KW)  # type: ignore[arg-type]
    sp = SamplingParams(max_tokens=30, ignore_eos=True, logprobs=2)
    base = plain.generate(prompts, sp)
    stop = base[0].token_ids[12]
    sps = [sp, SamplingParams(max_tokens=30, ignore_eos=True, logprobs=2, stop_token_ids=(stop,))]
    kw = {**LP_KW, "max_model_len": 128}
    spec = LLM("tiny", num_blocks=40, num_speculative_tokens=3, **kw)  # type: ignore[arg-type]
    streamed: dict[str, list[object]] = {}
    outs = {}
    for event in spec.stream(prompts + prompts[:1], [*[sp] * len(prompts), sps[1]]):
        assert event.new_logprobs is not None
        assert len(event.new_logprobs) == len(event.new_token_ids)
        streamed.setdefault(event.request_id, []).extend(event.new_logprobs)
        if event.output is not None:
            outs[event.request_id] = event.output
    assert spec.scheduler.num_preemptions > 0, "the pool should force preemptions"
    got = [outs[rid] for rid in sorted(outs, key=lambda r: int(r.split("-")[1]))]
    for want, out in zip([*base, base[0]], got, strict=True):
        assert out.logprobs is not None and streamed[out.request_id] == out.logprobs
        n = len(out.token_ids)
        assert out.token_ids == want.token_ids[:n] and len(out.logprobs) == n
        assert want.logprobs is not None
        for a, b in zip(want.logprobs, out.logprobs, strict=False):
            assert a.token_id == b.token_id
            assert abs(a.logprob - b.logprob) < 1e-5
            assert [t for t, _ in a.top] == [t for t, _ in b.top]
    assert got[-1].finish_reason == "stop" and got[-1].token_ids[-1] == stop
    assert len(got[-1].token_ids) == base[0].token_ids.index(stop) + 1


def test_logprobs_are_off_by_default_and_capped() -> None:
    llm = LLM("tiny", num_blocks=64, **LP_KW)  # type: ignore[arg-type]
    (out,) = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=3))
    assert out.logprobs is None
    (out,) = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=3, logprobs=0))
    assert out.logprobs is not None and [lp.top for lp in out.logprobs] == [()] * 3
    with pytest.raises(ValueError, match=r"^logprobs:"):
        SamplingParams(logprobs=21)
