"""hycache's own scheduler prices the prefill stops it splits at (`limit-split`: no internal
checkpoints), by the one rule (`hycache.cache.stops.stop_pays`, issue 45 item 3): a junction
stop that does not pay for its pass is not made (and no state is kept or promised there); one
that pays is."""

from __future__ import annotations

import random

from hycache.bench.vllm.scenario import ScriptedExecutor, Turn
from hycache.cache.stops import FREE_PASSES, FlatPrice, PassPricer
from hycache.request import SamplingParams
from hycache.sched.executor import run_to_completion
from hycache.sched.scheduler import Scheduler
from hycache.sim.build import build_cost
from tests.helpers import make_config, tokens

# B = 64, u = 16, no drafter: siblings sharing 230 tokens meet at j = 224 (floor(P/u)*u),
# mid-block above vLLM's block floor 192
CONFIG = make_config(
    block_size=64, unit=16, policy="limit", eagle=False, internal_checkpoints=False
)


def family() -> list[Turn]:
    rng = random.Random(3)
    shared = tokens(rng, 230)
    return [Turn(shared + tokens(rng, 150), [5]) for _ in range(3)]


def run(price: PassPricer) -> list[tuple[int, list[int]]]:
    """(hit, prompt chunk ends) per request, one request after another."""
    sched = Scheduler(CONFIG, pass_price=price)
    ex = ScriptedExecutor(0)
    out = []
    for i, turn in enumerate(family()):
        rid = f"r{i}"
        sched.add_request(sched.new_request(rid, list(turn.prompt), SamplingParams(max_tokens=1)))
        trace = ex.add(rid, turn)
        run_to_completion(sched, ex, check=True)
        out.append((trace.hit, trace.chunk_ends))
    return out


def test_a_stop_that_does_not_pay_is_not_made_and_one_that_pays_is() -> None:
    """The producer keeps no state below its 320 block: the observer computes from 0 and may
    stop at 192 (the junction's block floor), 224 (the junction) and 256 (the block after).
    At the state pool's prior chance 0.5 a stop from `prev` pays when 0.5 * (stop - prev)
    tokens cover the pass."""
    free = run(FREE_PASSES)
    assert [hit for hit, _ in free] == [0, 0, 224]
    assert free[1][1] == [192, 224, 256, 320, 368, 380]
    assert run(FlatPrice(pass_cost=10.0, token_cost=1.0)) == free  # 0.5 * 32 >= 10
    # 0.5 * 192 >= 50 pays at 192; from there 0.5 * 32 (224) and 0.5 * 64 (256) do not
    mid = run(FlatPrice(pass_cost=50.0, token_cost=1.0))
    assert mid[1] == (0, [192, 320, 368, 380]) and mid[2][0] == 192
    # nothing pays: the observer chunks as the producer, the next sibling resumes at 0
    dear = run(FlatPrice(pass_cost=1_000.0, token_cost=1.0))
    assert dear[1] == (0, [320, 368, 380]) and dear[2][0] == 0


def test_the_simulator_prices_stops_with_its_cost_model_the_engine_makes_every_stop() -> None:
    cost = build_cost("bamba-9b", "h200", num_speculative_tokens=0, block_size=64)
    assert Scheduler(CONFIG, step_cost=cost).pass_price is cost
    assert Scheduler(CONFIG).pass_price is FREE_PASSES
