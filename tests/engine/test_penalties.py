"""Penalties and logit bias with vLLM's semantics (issue 19): the formulas, their effect on
greedy output, speculative = plain with them on, and the server's fields."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import torch

from hycache.engine.sampling import adjust_logits
from hycache.request import SamplingParams
from tests.engine.conftest import drive, make_llm


def reference(logits: list[float], prompt: list[int], output: list[int], **kw: Any) -> list[float]:
    """vLLM's order, one row, written out: bias; repetition on prompt and output tokens;
    frequency and presence on output tokens."""
    row = list(logits)
    for t, b in kw.get("logit_bias", ()):
        row[t] += b
    r = kw.get("repetition_penalty", 1.0)
    for t in set(prompt) | set(output):
        row[t] = row[t] / r if row[t] > 0 else row[t] * r
    for t in set(output):
        row[t] -= kw.get("frequency_penalty", 0.0) * output.count(t)
        row[t] -= kw.get("presence_penalty", 0.0)
    return row


def test_adjusted_logits_follow_vllm_row_by_row() -> None:
    """Row i of a verification follows the output and the first i drafts."""
    torch.manual_seed(0)
    logits = torch.randn(3, 12, dtype=torch.float64)
    kw: dict[str, Any] = {"presence_penalty": 0.5, "frequency_penalty": 0.25,
                          "repetition_penalty": 1.3,
                          "logit_bias": ((2, 4.0), (7, -1.5))}  # fmt: skip
    params = SamplingParams(**kw)
    prompt, output, drafts = [1, 2, 3], [3, 4, 4], [5, 4]
    got = adjust_logits(logits, params, prompt, output, drafts)
    for i in range(3):
        want = reference(logits[i].tolist(), prompt, output + drafts[:i], **kw)
        assert got[i].tolist() == pytest.approx(want, abs=1e-12)
    plain = SamplingParams()
    assert adjust_logits(logits, plain, prompt, output) is logits


def test_penalties_change_greedy_output_and_are_validated() -> None:
    llm = make_llm()
    prompt = [11, 12, 13, 14] * 4

    def sevens(**kw: Any) -> int:
        sp = SamplingParams(max_tokens=12, ignore_eos=True, logit_bias=((7, 3.0),), **kw)
        return llm.generate([prompt], sp)[0].token_ids.count(7)

    biased = SamplingParams(max_tokens=5, ignore_eos=True, logit_bias=((7, 100.0),))
    assert llm.generate([prompt], biased)[0].token_ids == [7] * 5
    assert sevens() == 12  # a bias of 3 makes 7 the greedy choice throughout
    for penalty in ({"frequency_penalty": 1.0}, {"presence_penalty": 2.0},
                    {"repetition_penalty": 3.0}):  # fmt: skip
        assert 0 < sevens(**penalty) < 12, penalty  # repeating 7 is penalised
    for bad in ({"presence_penalty": 2.5}, {"frequency_penalty": -3.0},
                {"repetition_penalty": 0.0}, {"repetition_penalty": float("inf")}):  # fmt: skip
        with pytest.raises(ValueError):
            SamplingParams(**bad)
    with pytest.raises(ValueError, match="logit_bias"):
        llm.add_request([1, 2], SamplingParams(logit_bias=((512, 1.0),)))


@pytest.mark.parametrize("k", [1, 3])
def test_speculative_equals_plain_with_penalties_and_bias(k: int) -> None:
    """Greedy, float64, a pool small enough to preempt, an abort: the drafts are verified
    against rows penalised with the output before them, so the tokens are plain decoding's."""
    sp = SamplingParams(max_tokens=10, ignore_eos=True, presence_penalty=0.8,
                        frequency_penalty=0.6, repetition_penalty=1.4,
                        logit_bias=((3, 2.5), (9, -4.0)))  # fmt: skip
    plain = drive(make_llm(num_speculative_tokens=0), 11, sp)
    spec_llm = make_llm(num_speculative_tokens=k, num_blocks=22, max_model_len=96)
    spec = drive(spec_llm, 11, sp)
    assert spec == plain
    assert plain != drive(make_llm(num_speculative_tokens=0), 11)  # the penalties did something
    assert spec_llm.scheduler.num_preemptions > 0


def test_the_server_takes_vllms_penalty_fields() -> None:
    from hycache.server.app import create_app
    from tests.server.conftest import make_llm as serve_llm
    from tests.server.conftest import serving

    app = create_app(serve_llm(), model_name="tiny")
    ids = [21, 22, 23, 24] * 3
    with serving(app) as (url, _, _), httpx.Client(base_url=url, timeout=30) as c:
        body = {"prompt": ids, "max_tokens": 4, "ignore_eos": True, "logit_bias": {"7": 100}}
        r = c.post("/v1/completions", json=body)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["token_ids"] == [7] * 4
        fields = {"presence_penalty": 1.0, "frequency_penalty": -0.5, "repetition_penalty": 1.2}
        assert c.post("/v1/completions", json={"prompt": ids, **fields}).status_code == 200
        for bad in ({"presence_penalty": 2.5}, {"repetition_penalty": 0}, {"logit_bias": {"x": 1}},
                    {"logit_bias": {"512": 1}}, {"logit_bias": {"1": "a"}},
                    {"frequency_penalty": True}):  # fmt: skip
            r = c.post("/v1/completions", json={"prompt": ids, **bad})
            assert r.status_code == 400, (bad, r.text)
