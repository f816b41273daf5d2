"""Random sharing scenarios for the vLLM reference tests: families, resends, nested prefixes,
chains, mid-block resumes, forks (a sibling of a sibling) and chat turns that contain the
previous answer."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Sequence

from hycache.bench.vllm.reference import VllmSetup
from hycache.bench.vllm.scenario import RequestTrace, Turn
from hycache.config import CacheKnobs, HycacheConfig
from tests.helpers import make_config, tokens

GEOMETRIES = [(16, 4), (32, 8), (64, 16), (64, 8), (128, 8), (128, 32), (256, 64), (528, 66)]


def scenario(rng: random.Random, b: int, u: int, k: int = 1, drafts: bool = False) -> list[Turn]:
    """3 to 6 turns of one random shape, all below 6 blocks."""
    shape = rng.choice(["family", "resend", "nested", "chain", "midblock", "chat", "mixed", "fork"])
    n = rng.randint(3, 6)
    span = 6 * b
    accept = (lambda: [rng.randint(0, k) for _ in range(3)]) if drafts else (lambda: [])

    def answer() -> list[int]:
        return tokens(rng, rng.choice([1, 1, 2, rng.randint(1, 2 * b)]))

    prefix = tokens(rng, rng.randint(1, span // 2))
    turns: list[Turn] = []
    if shape == "fork":
        return fork(rng, b, u, accept, answer)
    if shape == "chat":
        p = prefix
        for _ in range(n):
            a = answer()
            turns.append(Turn(p, a, accept()))
            p = p + a + tokens(rng, rng.randint(1, b))
        return turns
    for _ in range(n):
        kind = shape if shape != "mixed" else rng.choice(["family", "resend", "nested", "chain"])
        if kind == "resend" and turns:
            p = list(rng.choice(turns).prompt)
        elif kind == "nested" and turns:
            base = list(rng.choice(turns).prompt)
            p = (
                base[: rng.randint(1, len(base))]
                if rng.random() < 0.5
                else base + tokens(rng, rng.randint(1, b))
            )
        elif kind == "chain" and turns:
            p = list(turns[-1].prompt) + tokens(rng, rng.randint(1, 2 * b))
        elif kind == "midblock":
            cut = rng.randint(1, len(prefix))
            p = prefix[:cut] + tokens(rng, rng.randint(1, 2 * b))
        else:
            p = prefix + tokens(rng, rng.randint(1, 2 * b))
        turns.append(Turn(p, answer(), accept()))
    return turns


def fork(
    rng: random.Random,
    b: int,
    u: int,
    accept: Callable[[], list[int]],
    answer: Callable[[], list[int]],
) -> list[Turn]:
    """owner = S + a, f = S + x, then requests sharing S + x[:m] with f (the drop-setup case:
    B=16, u=4, S8 + a4, S8 + b53, S8 + b8 + c40); S often ends on the unit grid, where the
    EAGLE-drop scheme observes f's junction a unit above the lookahead keys."""
    s = rng.randint(1, 3 * b)
    if rng.random() < 0.5:
        s = max(u, s // u * u)
    prefix = tokens(rng, s)
    x = tokens(rng, rng.randint(2 * u, 3 * b))
    turns = [
        # a short owner tail: the drop scheme keeps the owner's state at S (its tail T - u)
        Turn(
            prefix + tokens(rng, rng.choice([rng.randint(1, u), rng.randint(1, b)])),
            answer(),
            accept(),
        ),
        Turn(prefix + x, answer(), accept()),
    ]
    for _ in range(rng.randint(1, 3)):
        m = rng.choice([u, 2 * u, rng.randint(1, len(x) - 1)])
        turns.append(Turn(prefix + x[:m] + tokens(rng, rng.randint(1, 2 * b)), answer(), accept()))
    return turns


def budget(rng: random.Random, b: int) -> int:
    return rng.choice([max(16, b // 2 + 3), b, b + 39, 2 * b, 8192, 1 << 20])


def hycache_config(
    setup: VllmSetup, policy: str, turns: Sequence[Turn], internal: bool | None = None
) -> HycacheConfig:
    """hycache's config for the same deployment: geometry, budget, drafter and retention
    (the setup's knobs; vLLM's `prefix_cache_retention_interval` is `VllmSetup.retention`);
    `internal`: checkpoints written inside the forward (None: as vLLM's spec, the exporting
    Mamba2 one with them, a Mamba layer that cannot export without)."""
    internal = setup.exporting if internal is None else internal
    retention = setup.knobs.retention
    length = max(len(t.prompt) + len(t.answer) for t in turns)
    return make_config(
        block_size=setup.block_size,
        unit=setup.unit,
        policy=policy,
        eagle=setup.num_speculative_tokens > 0,
        k=setup.num_speculative_tokens,
        budget=setup.budget,
        max_model_len=max(length + 64, 8 * setup.block_size),
        retention=retention,
        internal_checkpoints=internal,
    )


def family(seed: int, shared: int, private: int, n: int, hint: int = 0) -> list[Turn]:
    """A producer and n-1 siblings sharing `shared` tokens; the producer may carry a hint."""
    rng = random.Random(seed)
    prefix = tokens(rng, shared)
    return [
        Turn(prefix + tokens(rng, private), [5], (), (hint,) if hint and i == 0 else ())
        for i in range(n)
    ]


def hits(traces: list[RequestTrace]) -> list[int]:
    return [t.hit for t in traces]


# block sizes where a sub-block stop can pay the plugin's default price (a pass = 96 prefill
# tokens): at B <= 128 none does
PRICED_GEOMETRIES = [(256, 16), (512, 32), (576, 64), (640, 64), (1024, 64), (2048, 64)]


def priced_family(rng: random.Random, b: int) -> tuple[list[Turn], bool]:
    """A producer and three siblings sharing a random prefix (anywhere in a block), the
    producer hinted at it 30% of the time; and whether it is."""
    shared, private = rng.randint(1, 5 * b), rng.randint(1, 2 * b)
    hint = shared if rng.random() < 0.3 else 0
    return family(rng.randrange(1 << 16), shared, private, 4, hint), bool(hint)


def priced_drop_case(seed: int, flag: bool) -> tuple[VllmSetup, list[Turn], bool]:
    """vLLM 0.32's drop setup (MTP k = 1-3, the plugin's default price), the junction flag
    `flag`, and a `priced_family` drawn from `seed`; and whether the producer is hinted."""
    rng = random.Random(seed)
    b, u = rng.choice(PRICED_GEOMETRIES)
    turns, hinted = priced_family(rng, b)
    setup = VllmSetup(
        CacheKnobs(b, u),
        budget(rng, b),
        rng.choice([1, 2, 3]),
        lookahead=False,
        shared_prefix_checkpoint=flag,
    )
    return setup, turns, hinted


def passes_over_stock(stock: list[RequestTrace], plugin: list[RequestTrace]) -> list[int]:
    """Per request, the plugin's prefill passes less stock's."""
    return [len(p.chunk_ends) - len(s.chunk_ends) for s, p in zip(stock, plugin, strict=True)]


def within_the_pass_bound(extra: list[int], hinted: bool, sibling: int = 1) -> bool:
    """Issue 45's bound on a family (producer, observer, siblings): a sibling pays at most
    `sibling` (the bound: one) passes more than stock, the request that observes the junction
    (or the producer, for its hint) at most two; an unhinted producer exactly stock's."""
    producer, observer, *siblings = extra
    return producer <= (2 if hinted else 0) and observer <= 2 and max(siblings) <= sibling
PLUGIN = "hycache.vllm.Scheduler"


SYNC = "hycache.vllm.SyncScheduler"


def passes(traces: list[RequestTrace]) -> list[int]:
    return [len(t.chunk_ends) for t in traces]


def with_cls(setup: VllmSetup, cls: str | None) -> VllmSetup:
    return dataclasses.replace(setup, scheduler_cls=cls)


def contains_an_answer(turns: list[Turn]) -> bool:
    """A prompt that extends an earlier prompt and its answer (a chat turn): decode-side
    snapshots, which the plugin does not bring, decide its hit."""
    return any(
        list(t.prompt[: len(p.prompt) + len(p.answer)]) == [*p.prompt, *p.answer]
        for i, t in enumerate(turns)
        for p in turns[:i]
        if len(t.prompt) > len(p.prompt)
    )
