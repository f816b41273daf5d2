"""`hycache.vllm.Scheduler` on a hybrid served without a drafter (issue 46), on vLLM 0.33 / 0.34's
real scheduler: keys on every unit, junction stops and prefix hints, with the resume point
`floor(P/u)*u` (hycache's own `limit --no-eagle`) where stock resumes at `floor(P/B)*B`;
inert only where vLLM itself cannot hit below a block. Passes priced (`hycache.cache.stops`):
no later sibling pays more than stock + 1, the observer no more than stock + 2.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hycache.bench.vllm.reference import ReferenceScheduler, VllmSetup, run_reference
from hycache.bench.vllm.scenario import RequestTrace
from hycache.cache.boundaries import Boundaries
from hycache.config import CacheKnobs, Policy
from tests.vllm.shapes import GEOMETRIES, budget, family, hits

settings.load_profile("vllm-reference")

PLUGIN = "hycache.vllm.SyncScheduler"
FREE = (0.0, 1.0)  # every stop made (a free pass)


def passes(traces: list[RequestTrace]) -> list[int]:
    return [len(t.chunk_ends) for t in traces]


def no_drafter(b: int, u: int, cls: str | None = None, **kw: object) -> VllmSetup:
    return VllmSetup(CacheKnobs(b, u), num_speculative_tokens=0, scheduler_cls=cls, **kw)  # type: ignore[arg-type]


def limit(b: int, u: int, p: int) -> int:
    return Boundaries(b, u, False, Policy.LIMIT).limit(p)


def test_the_plugin_is_on_without_a_drafter() -> None:
    sched = ReferenceScheduler(no_drafter(64, 16, PLUGIN)).scheduler
    assert sched.hycache_inert_reason is None
    bounds = sched.hycache_bounds
    assert not bounds.drafter and bounds.drop == 0 and bounds.effective_policy is Policy.LIMIT
    assert limit(4416, 64, 19_750) == 19_712 == 19_750 // 64 * 64


@pytest.mark.parametrize("shared,private", [(19_750, 3_250), (57_600, 6_416)])
def test_issue_shapes(shared: int, private: int) -> None:
    """B=4416, u=64, budget 8,192: stock siblings resume at floor(P/B)*B, the plugin at
    floor(P/u)*u from the second sibling on (from the first with a hint), each later sibling
    in stock + 1 passes, the observer in stock + 2."""
    b, u = 4416, 64
    stock = run_reference(no_drafter(b, u), family(1, shared, private, 4))
    plugin = run_reference(no_drafter(b, u, PLUGIN), family(1, shared, private, 4))
    hinted = run_reference(no_drafter(b, u, PLUGIN), family(1, shared, private, 4, shared))
    floor, lim = shared // b * b, limit(b, u, shared)
    assert hits(stock) == [0, 0, floor, floor]
    assert hits(plugin) == [0, 0, lim, lim]
    assert hits(hinted) == [0, lim, lim, lim]
    s, p, h = passes(stock), passes(plugin), passes(hinted)
    assert p[0] == s[0] and p[1] <= s[1] + 2
    assert all(x <= y + 1 for x, y in zip(p[2:], s[2:], strict=True))
    assert h[0] <= s[0] + 2
    assert all(x <= y + 1 for x, y in zip(h[1:], s[1:], strict=True))


def test_explain_no_eagle(capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's command: stock 0 / 17,664 / 17,664, the plugin 0 / 19,712 / 19,712, as
    hycache's own `limit --no-eagle`."""
    from hycache.cli.main import main

    shape = [
        "--no-eagle", "--block-size", "4416", "--prefix-match-unit", "64",
        "--prompt-tokens", "23000", "--shared-prefix", "19750",
    ]  # fmt: skip
    assert main(["explain", *shape, "--backend", "vllm", "--json"]) == 0
    cols = json.loads(capsys.readouterr().out)["policies"]
    assert cols["vllm"]["siblings"] == [0, 17_664, 17_664]
    ours = cols["hycache.vllm.Scheduler"]
    assert ours["siblings"] == [0, 19_712, 19_712] and ours["scheduler"].endswith("limit on")
    assert main(["explain", *shape, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["policies"]["limit"]["siblings"] == ours["siblings"]


@pytest.mark.parametrize(
    "setup,reason",
    [
        (no_drafter(64, 64), "prefix_match_unit equals block_size"),
        (no_drafter(4416, 4416), "prefix_match_unit equals block_size"),
    ],
)
def test_inert_only_where_vllm_cannot_hit_below_a_block(
    setup: VllmSetup, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    turns = family(0, 640, 83, 3, hint=640)
    with caplog.at_level(logging.INFO, logger="hycache.vllm"):
        plugin = run_reference(dataclasses.replace(setup, scheduler_cls=PLUGIN), turns)
    lines = [r.getMessage() for r in caplog.records if r.name == "hycache.vllm"]
    assert len(lines) == 1 and "inert" in lines[0] and reason in lines[0], lines
    stock = run_reference(setup, turns)
    assert [(t.hit, t.chunk_ends) for t in plugin] == [(t.hit, t.chunk_ends) for t in stock]


@st.composite
def families(draw: st.DrawFn) -> tuple[VllmSetup, int, int, int]:
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    b, u = rng.choice(GEOMETRIES)
    shared = rng.randint(1, 5 * b)
    private = rng.randint(1, 2 * b)
    knobs = CacheKnobs(b, u, internal_checkpoints=draw(st.booleans()))
    setup = VllmSetup(knobs, budget(rng, b), num_speculative_tokens=0, pass_price=FREE)
    return setup, shared, private, rng.randrange(1 << 16)


@given(case=families())
def test_random_families(case: tuple[VllmSetup, int, int, int]) -> None:
    """Every stop made: siblings from the second on resume at floor(P/u)*u where stock resumes
    at floor(P/B)*B, or at an earlier sibling's tail checkpoint where a private part shorter
    than a unit puts it inside the shared prefix; a hinted family from the first sibling on;
    never below stock."""
    setup, shared, private, seed = case
    b, u = setup.block_size, setup.unit
    plugin_setup = dataclasses.replace(setup, scheduler_cls=PLUGIN)
    stock = hits(run_reference(setup, family(seed, shared, private, 4)))
    plugin = hits(run_reference(plugin_setup, family(seed, shared, private, 4)))
    hinted = hits(run_reference(plugin_setup, family(seed, shared, private, 4, shared)))
    lim = limit(b, u, shared)
    tail = Boundaries(b, u, False, Policy.LIMIT).tail_checkpoint(shared + private)
    assert stock[2:] == [max(shared // b * b, tail if tail <= shared else 0)] * 2
    assert plugin[2:] == [lim] * 2 and hinted[1:] == [lim] * 3
    assert all(s <= p for s, p in zip(stock, plugin, strict=True))
    assert all(s <= h for s, h in zip(stock, hinted, strict=True))
