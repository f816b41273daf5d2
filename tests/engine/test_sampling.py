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
