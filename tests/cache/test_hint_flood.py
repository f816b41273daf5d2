"""Issue 47: one tenant's prefix hints must not evict everyone's prefixes. A victim reuses a
~400-token system prompt while attackers send unique prompts with 16 random hints each
(through the scheduler and the cache, the dry-run executor): client hints are priced by
admission (`StateKind.HINT`, their own chance of a hit) and bounded per request
(`MAX_HINT_STATES`), so the victim keeps its hit as without the hints."""

from __future__ import annotations

import random

from hycache.cache.admission import MAX_HINT_STATES
from hycache.cache.boundaries import MAX_PREFIX_HINTS, StateKind
from hycache.request import Request
from hycache.sched.executor import DryRunExecutor, run_to_completion
from hycache.sched.scheduler import Scheduler
from tests.helpers import make_config, new_request, tokens

SYSTEM, ATTACK = 400, 700  # tokens: the victim's shared prompt, each attacker's prompt


def victim_hits(hinted: bool, rounds: int = 14, attackers: int = 4) -> tuple[int, Scheduler]:
    """Victim hits (resumed past most of its system prompt) on rounds 2..`rounds`, each round
    one victim request beside `attackers` unique prompts (16 random hints each if `hinted`)."""
    rng = random.Random(47)
    cfg = make_config(block_size=16, unit=4, policy="limit", num_blocks=400, max_model_len=1024)
    sched, ex = Scheduler(cfg), DryRunExecutor(num_speculative_tokens=3)
    system = tokens(rng, SYSTEM)
    hits = 0
    for i in range(rounds):
        victim = new_request(cfg, f"v{i}", system + tokens(rng, 30), prefix_hints=[SYSTEM])
        batch: list[Request] = [victim]
        for a in range(attackers):
            hints = sorted(rng.sample(range(1, ATTACK), MAX_PREFIX_HINTS)) if hinted else []
            batch.append(new_request(cfg, f"a{i}.{a}", tokens(rng, ATTACK), prefix_hints=hints))
        for r in batch:
            sched.add_request(r)
        run_to_completion(sched, ex, check=True)
        hits += i > 0 and victim.first_hit_tokens >= SYSTEM - 2 * cfg.cache.unit
    return hits, sched


def test_a_hint_flood_keeps_the_victims_hit() -> None:
    plain, _ = victim_hits(hinted=False)
    flooded, sched = victim_hits(hinted=True)
    assert plain >= 12
    assert flooded >= 12, (plain, flooded)
    admission = sched.cache.admission
    assert admission is not None
    # the hints were priced as their own kind, and never kept unconditionally
    assert admission.refused[StateKind.HINT] > 0


def test_one_request_keeps_at_most_the_bound_of_hint_states() -> None:
    cfg = make_config(block_size=16, unit=4, policy="limit", num_blocks=400, max_model_len=1024)
    sched, ex = Scheduler(cfg), DryRunExecutor(num_speculative_tokens=3)
    rng = random.Random(1)
    r = new_request(cfg, "r", tokens(rng, ATTACK), prefix_hints=range(32, ATTACK, 40))
    sched.add_request(r)
    kept = []
    while sched.has_unfinished():
        out = sched.schedule()
        for s in out.scheduled:
            kept += [p for st in s.alloc.states for p, _ in st.writes if p in r.hint_stops]
            if s.alloc.checkpoint and s.end in r.hint_stops:
                kept.append(s.end)
        sched.update(out, ex.execute(out))
    assert r.hint_stops and 0 < len(set(kept)) <= MAX_HINT_STATES
