"""hycache.sim.build: the one workload builder behind `simulate`, `bench` and the load
generator (`bench serve`), and the one config builder of simulated runs."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from hycache.bench.loadgen import build_plan
from hycache.bench.suite import SimBench, bench_workload, sim_config, sim_cost
from hycache.cli.main import make_parser
from hycache.cli.simulate import workload_spec
from hycache.sim.build import (
    PrefixHints,
    SimGeometry,
    WorkloadSizes,
    WorkloadSpec,
    build_config,
    build_workload,
)
from hycache.sim.workloads import DEFAULT_VOCAB, ChatShape, FamilyShape, SystemPromptShape

SIZES = {
    "system-prompt": WorkloadSizes(
        num_requests=5, shared_prefix_tokens=300, suffix_tokens=(10, 40), output_tokens=7
    ),
    "family": WorkloadSizes(
        families=3, requests_per_family=(2, 3), shared_prefix_tokens=(50, 400),
        suffix_tokens=(5, 30), output_tokens=(3, 9),
    ),
    "multi-turn": WorkloadSizes(
        sessions=3, turns=(2, 3), system_prompt_tokens=120, user_tokens=(5, 30),
        output_tokens=(3, 9),
    ),
}  # fmt: skip
FLAGS = {
    "system-prompt": ["--num-requests", "5", "--shared-prefix-tokens", "300",
                      "--suffix-tokens", "10:40", "--output-tokens", "7"],
    "family": ["--families", "3", "--requests-per-family", "2:3", "--shared-prefix-tokens",
               "50:400", "--suffix-tokens", "5:30", "--output-tokens", "3:9"],
    "multi-turn": ["--sessions", "3", "--turns", "2:3", "--system-prompt-tokens", "120",
                   "--user-tokens", "5:30", "--output-tokens", "3:9"],
}  # fmt: skip
BENCH_FIELD = {"system-prompt": "system_prompt", "family": "family", "multi-turn": "chat"}
DEFAULTS = {
    "system-prompt": SystemPromptShape(),
    "family": FamilyShape(),
    "multi-turn": ChatShape(),
}


def prompts(w: object) -> list[tuple[list[int], int, tuple[int, ...]]]:
    """(prompt, max tokens, hints) of each request, or (first turn, its output, hints) of each
    session."""
    reqs = getattr(w, "requests", [])
    out = [(np.asarray(r.prompt_token_ids).tolist(), r.max_tokens, tuple(r.prefix_hints))
           for r in reqs]  # fmt: skip
    for s in getattr(w, "sessions", []):
        first = s.prompt_for_turn(0, []).tolist()
        out.append((first, s.output_tokens[0], tuple(s.prefix_hints)))
    return out


def plan_prompts(plan: object) -> list[tuple[list[int], int, tuple[int, ...]]]:
    if plan.sessions:  # type: ignore[attr-defined]
        return prompts(plan)
    return [(r.prompt, r.max_tokens, tuple(r.prefix_hints)) for r in plan.requests]  # type: ignore[attr-defined]


@pytest.mark.parametrize("kind", ["system-prompt", "family", "multi-turn"])
def test_simulate_bench_and_loadgen_build_equal_workloads(kind: str) -> None:
    """Equal inputs (kind, sizes, seed, vocabulary, hints) give equal requests, whichever
    command asks: simulate's flags, a `SimBench` shape, `bench serve`'s plan."""
    args = make_parser().parse_args(
        ["simulate", "--workload", kind, *FLAGS[kind], "--seed", "4", "--prefix-hint"]
    )
    simulated = build_workload(workload_spec(args))
    shape = SIZES[kind].applied(DEFAULTS[kind])
    bench = SimBench(seed=4, **{BENCH_FIELD[kind]: shape})
    benched = bench_workload(bench, kind)
    hints = PrefixHints(shared=True)
    plan = build_plan(kind, SIZES[kind], seed=4, vocab=DEFAULT_VOCAB, hints=hints)
    assert prompts(simulated) == plan_prompts(plan)
    # the bench names no prefix hints: the same requests without them
    assert [(p, n) for p, n, _ in prompts(benched)] == [(p, n) for p, n, _ in prompts(simulated)]
    assert simulated.concurrency == benched.concurrency == 64


def test_token_hints_reach_every_request_and_session() -> None:
    for kind in ("family", "multi-turn"):
        spec = WorkloadSpec(
            kind, SIZES[kind].applied(DEFAULTS[kind]), hints=PrefixHints(True, (5,))
        )
        for _, _, hints in prompts(build_workload(spec)):
            assert hints[-1] == 5 and len(hints) == 2


def test_a_trace_names_no_prefix_and_a_system_prompt_one_length() -> None:
    with pytest.raises(ValueError, match="a trace names no shared prefix"):
        WorkloadSpec("trace", hints=PrefixHints(shared=True))
    with pytest.raises(ValueError, match="needs one length"):
        WorkloadSizes(shared_prefix_tokens=(1, 2)).applied(SystemPromptShape())


def test_one_config_builder_for_bench_and_explain_geometries() -> None:
    s = SimBench()
    w = bench_workload(replace(s, system_prompt=replace(s.system_prompt, num_requests=2)),
                       "system-prompt")  # fmt: skip
    cfg = sim_config(s, w, sim_cost(s))
    g = SimGeometry(
        s.knobs,
        num_speculative_tokens=s.num_speculative_tokens,
        max_num_seqs=s.concurrency,
    )
    again = build_config(g, max_model_len=cfg.cache.max_model_len, num_blocks=cfg.cache.num_blocks)
    assert again == cfg
