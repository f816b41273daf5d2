"""Token sampling and speculative verification.

Greedy (temperature 0) picks the argmax and accepts a draft exactly when it equals the target's
argmax, so speculative greedy decoding reproduces plain greedy decoding token for token.
With temperature > 0, drafts are verified by standard speculative rejection sampling: accept
draft d with probability min(1, p(d) / q(d)); on the first rejection, sample from the residual
max(p - q, 0), renormalised; if all are accepted, sample a bonus token from p.

`adjust_logits` applies a request's logit bias and penalties before any of that, as vLLM does
(in this order): `logit_bias` is added; `repetition_penalty` r divides the positive logits and
multiplies the negative ones of every token in the prompt or the output so far; then
`frequency_penalty` times a token's count in the output, and `presence_penalty` once for a token
in the output, are subtracted. Each verified row is adjusted with the output it follows (the
accepted tokens and the drafts before it), so speculative decoding still equals plain decoding.

A request with a `seed` draws the token at output position j from a generator of its own,
seeded by (seed, j) (`position_generator`), and verifies drafts by equality with that token
(`verify_seeded`): its tokens are those of plain decoding with the same seed whatever drafts
the step carried, so a preemption (which drops the drafts) or a different drafter changes
nothing (at the price of accepting a draft only when it equals the sampled token).

A row whose logits are NaN or +inf (a numerical failure in one request) raises
`SamplingError`, which the runner turns into that request's failure alone.

`token_logprobs` reports what a request asked for with `SamplingParams.logprobs`: the
log_softmax of the raw logits (before penalties, temperature and top-p, vLLM's default), so the
values do not depend on how the token was chosen.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import xxhash

from hycache.request import SamplingParams, TokenLogprob


class SamplingError(RuntimeError):
    """One request's logits or distribution are not numbers: that request fails, no other."""


def check_finite(logits: torch.Tensor) -> None:
    """Raise SamplingError when any row of `logits` holds NaN or +inf (-inf is a banned
    token, which sampling handles)."""
    if bool(torch.isnan(logits).any()) or bool(torch.isposinf(logits).any()):
        raise SamplingError("the logits of this request became NaN or infinite")


def position_generator(seed: int, position: int, device: torch.device | str) -> torch.Generator:
    """The generator of a seeded request's output position `position` (its drafts' too)."""
    key = xxhash.xxh64_intdigest(position.to_bytes(8, "little", signed=True), seed % 2**64) % 2**62
    return torch.Generator(device).manual_seed(key)


def adjust_logits(
    logits: torch.Tensor,
    params: SamplingParams,
    prompt: Sequence[int],
    output: Sequence[int],
    drafts: Sequence[int] = (),
) -> torch.Tensor:
    """(n, V) raw logits -> the logits to sample from: row i follows `output` + `drafts[:i]`
    (see the module docstring). Returns `logits` itself when the request sets nothing."""
    if not params.adjusts_logits:
        return logits
    n, vocab = logits.shape
    out = logits.clone()
    if params.logit_bias:
        ids = torch.tensor([t for t, _ in params.logit_bias], device=out.device)
        bias = torch.tensor([b for _, b in params.logit_bias], dtype=out.dtype, device=out.device)
        out.index_add_(1, ids, bias.expand(n, -1))
    history = torch.tensor([*output, *drafts[: n - 1]], dtype=torch.long, device=out.device)
    counts = torch.zeros((n, vocab), dtype=out.dtype, device=out.device)
    for i in range(n):  # row i has seen len(output) + i tokens
        seen = history[: len(output) + i]
        counts[i].index_add_(0, seen, torch.ones_like(seen, dtype=out.dtype))
    if params.repetition_penalty != 1.0:
        in_prompt = torch.zeros(vocab, dtype=torch.bool, device=out.device)
        in_prompt[torch.tensor(list(prompt), dtype=torch.long, device=out.device)] = True
        seen_any = in_prompt | (counts > 0)
        r = params.repetition_penalty
        out = torch.where(seen_any, torch.where(out > 0, out / r, out * r), out)
    if params.frequency_penalty:
        out = out - params.frequency_penalty * counts
    if params.presence_penalty:
        out = out - params.presence_penalty * (counts > 0).to(out.dtype)
    return out


def probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """(..., V) logits -> (..., V) sampling distribution (temperature, then top-p)."""
    probs = torch.softmax(logits.double() / params.temperature, dim=-1)
    if params.top_p < 1.0:
        sorted_p, idx = probs.sort(dim=-1, descending=True)
        keep = sorted_p.cumsum(-1) - sorted_p < params.top_p  # always keeps the top token
        sorted_p = sorted_p * keep
        probs = torch.zeros_like(probs).scatter(-1, idx, sorted_p)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample(probs: torch.Tensor, gen: torch.Generator) -> int:
    if not bool(torch.isfinite(probs).all()) or not float(probs.sum()) > 0:
        raise SamplingError("the sampling distribution of this request is not a distribution")
    return int(torch.multinomial(probs, 1, generator=gen).item())


def pick(
    logits: torch.Tensor, params: SamplingParams, gen: torch.Generator
) -> tuple[int, torch.Tensor | None]:
    """One token from (V,) logits, and its distribution when sampling (None when greedy)."""
    if params.temperature == 0:
        return int(logits.argmax().item()), None
    probs = probabilities(logits, params)
    return sample(probs, gen), probs


def verify(
    logits: torch.Tensor,
    drafts: Sequence[int],
    draft_probs: torch.Tensor | None,
    params: SamplingParams,
    gen: torch.Generator,
) -> list[int]:
    """Verify drafts against the target's (len(drafts) + 1, V) logits.

    Row i predicts the token after the i-th verified position. Returns the accepted drafts
    followed by one new token (the correction, or the bonus when every draft is accepted)."""
    out: list[int] = []
    if params.temperature == 0:
        target = logits.argmax(-1).tolist()
        for i, d in enumerate(drafts):
            if target[i] != d:
                return [*out, target[i]]
            out.append(d)
        return [*out, target[len(drafts)]]
    p = probabilities(logits, params)
    for i, d in enumerate(drafts):
        q = draft_probs[i] if draft_probs is not None else None
        qd = float(q[d]) if q is not None else 1.0
        u = float(torch.rand((), generator=gen, dtype=torch.float64, device=gen.device))
        if qd > 0 and u < min(1.0, float(p[i, d]) / qd):
            out.append(d)
            continue
        residual = (p[i] - q).clamp_min(0) if q is not None else p[i].clone()
        if q is None:
            residual[d] = 0
        total = residual.sum()
        return [*out, sample(residual / total if total > 0 else p[i], gen)]
    return [*out, sample(p[len(drafts)], gen)]


def verify_seeded(
    logits: torch.Tensor,
    drafts: Sequence[int],
    params: SamplingParams,
    gen_at: Callable[[int], torch.Generator],
) -> list[int]:
    """A seeded request's drafts against (len(drafts) + 1, V) logits: row i's token is drawn
    with `gen_at(i)` (the generator of its output position) exactly as plain decoding draws
    it, and draft i is accepted when it equals that token."""
    if params.temperature == 0:
        return verify(logits, drafts, None, params, gen_at(0))
    p = probabilities(logits, params)
    out: list[int] = []
    for i in range(len(drafts) + 1):
        tok = sample(p[i], gen_at(i))
        out.append(tok)
        if i == len(drafts) or drafts[i] != tok:
            break
    return out


def token_logprobs(logits: torch.Tensor, token_ids: Sequence[int], k: int) -> list[TokenLogprob]:
    """Row i of the (>= len(token_ids), V) raw logits predicted `token_ids[i]`: its logprob and
    the `k` most likely tokens of that row."""
    n = len(token_ids)
    lp = torch.log_softmax(logits[:n].double(), dim=-1)
    ids = torch.tensor(list(token_ids), dtype=torch.long, device=lp.device)
    chosen = lp.gather(-1, ids[:, None])[:, 0].tolist()
    k = min(k, lp.shape[-1])
    if k == 0:
        return [TokenLogprob(t, c) for t, c in zip(token_ids, chosen, strict=True)]
    top_lp, top_ids = lp.topk(k, dim=-1)
    return [
        TokenLogprob(t, c, tuple(zip(i, v, strict=True)))
        for t, c, i, v in zip(token_ids, chosen, top_ids.tolist(), top_lp.tolist(), strict=True)
    ]
