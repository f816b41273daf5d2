"""`hycache bench` at toy scale: the shape of its output and the direction of its result."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from hycache.bench.plots import plot_bench
from hycache.bench.results import median_row
from hycache.bench.suite import (
    EngineBench,
    SimBench,
    SimJob,
    _run_all,
    bench,
    engine_orders,
)
from hycache.cli.main import main
from hycache.config import CacheKnobs
from hycache.sim.compare import DEFAULT_ARMS
from hycache.sim.workloads import ChatShape, FamilyShape, SystemPromptShape

KEYS = {
    "output_tokens_per_s",
    "ttft_p50_s",
    "ttft_p95_s",
    "prefill_tokens_computed",
    "hit_tokens",
    "token_hit_rate",
    "lost_reuse_tokens",
    "junctions_observed",
    "extra_prefill_steps_max",
}
SIM_KEYS = KEYS | {"ssm_pages_stored", "ssm_snapshot_pages", "ssm_pages_peak", "num_blocks"}


def toy() -> tuple[EngineBench, SimBench]:
    engine = EngineBench(
        knobs=CacheKnobs(32, 4),
        shared_prefix_tokens=150,
        suffix_tokens=40,
        output_tokens=4,
        num_requests=6,
        concurrency=3,
        repeats=2,
        num_blocks=256,
        threads=1,
    )
    sim = SimBench(
        knobs=CacheKnobs(256, 16),
        concurrency=8,
        system_prompt=SystemPromptShape(24, 3000, 400, 16),
        family=FamilyShape(4, (3, 5), (300, 3000), (20, 200), (4, 16)),
        chat=ChatShape(4, (2, 3), 700, (20, 200), (4, 16)),
        no_sharing=SystemPromptShape(12, 0, 300, 16),
        trace_requests=40,
        curve_output_tokens=(8, 32),
        curve_concurrency=(1, 4),
        curve_requests=16,
    )
    return engine, sim


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    engine, sim = toy()
    messages: list[str] = []
    out = bench(engine, sim, messages.append).to_json()
    json.dumps(out)  # the document `--json` writes
    out["_messages"] = messages
    return out


def test_engine_part_alternates_lookahead_and_limit(doc: dict[str, Any]) -> None:
    eng = doc["engine"]
    arms = ["lookahead", "limit", "limit-split"]
    assert list(eng["policies"]) == arms
    assert eng["inputs"]["orders"] == [arms, arms[::-1]]
    assert all(len(v) == 2 for v in eng["runs"].values())
    look, lim = eng["policies"]["lookahead"], eng["policies"]["limit"]
    assert set(lim) >= KEYS
    # siblings resume at the limit floor((150-1)/4)*4 = 148 under limit, the block (128) under
    # lookahead: more hits, less prefill
    assert 148 in lim["resume_points"] and 128 in look["resume_points"]
    assert lim["hit_tokens"] > look["hit_tokens"]
    assert lim["prefill_tokens_computed"] < look["prefill_tokens_computed"]
    split = eng["policies"]["limit-split"]
    assert lim["extra_prefill_steps_max"] == 0  # its checkpoints are written inside the forward
    # splitting: the junction's stops, and the tail stops lookahead writes inside the forward
    assert 0 < split["extra_prefill_steps_max"] <= 3
    assert 148 in split["resume_points"]  # the same resume points, by splitting
    assert eng["headline"]["name"] == "limit/lookahead"
    assert any("repeat 2/2" in m for m in doc["_messages"])


def test_engine_part_times_the_engine_thread_beside_the_wall(doc: dict[str, Any]) -> None:
    """Every engine figure also on the engine thread's CPU clock, which never runs ahead of
    the wall clock (one thread); per repeat, for the side-by-side ratios."""
    eng = doc["engine"]
    for res in eng["policies"].values():
        assert 0 < res["engine_cpu_s"] <= res["wall_s"]
        assert res["engine_steps"] > 0
        assert res["output_tokens_per_cpu_s"] >= res["output_tokens_per_s"]
        assert 0 < res["ttft_cpu_p50_s"] <= res["ttft_p50_s"]
        assert res["ttft_cpu_p50_s"] <= res["ttft_cpu_p95_s"] <= res["ttft_p95_s"]
    for arm, runs in eng["per_repeat"].items():
        assert set(runs) == {
            "ttft_p50_s",
            "output_tokens_per_cpu_s",
            "ttft_cpu_p50_s",
            "engine_cpu_s",
        }
        assert all(len(v) == 2 for v in runs.values()), arm
        assert eng["policies"][arm]["engine_cpu_s"] == pytest.approx(sum(runs["engine_cpu_s"]) / 2)


def test_engine_part_reports_the_spread_of_its_repeats(doc: dict[str, Any]) -> None:
    """Each arm's repeats as median and min-max; each arm over lookahead per repeat, with
    whether the repeats rank them; the headline carries its arm's."""
    eng = doc["engine"]
    for arm, figures in eng["spread"].items():
        tok_s = eng["runs"][arm]
        assert figures["output_tokens_per_s"]["min"] == min(tok_s)
        assert figures["output_tokens_per_s"]["max"] == max(tok_s)
    assert eng["vs_reference"]["reference"] == "lookahead"
    lim = eng["vs_reference"]["arms"]["limit"]["output_tokens_per_s"]
    per = [a / b for a, b in zip(eng["runs"]["limit"], eng["runs"]["lookahead"], strict=True)]
    assert lim["per_repeat"] == pytest.approx(per)
    assert lim["rankable"] == (min(per) > 1 or max(per) < 1)
    assert eng["headline"]["repeats"] == eng["vs_reference"]["arms"]["limit"]


def test_simulated_tables_have_every_arm(doc: dict[str, Any]) -> None:
    simd = doc["simulated"]
    assert list(simd) == ["system-prompt", "family", "multi-turn", "trace", "no-sharing"]
    for name, part in simd.items():
        extra = ["no-caching"] if name == "no-sharing" else []
        assert list(part["policies"]) == [*DEFAULT_ARMS, *extra], name
        for metrics in part["policies"].values():
            assert set(metrics) >= SIM_KEYS
        h = part["headline"]
        assert h["output_tokens_per_s"] == pytest.approx(
            part["policies"]["limit"]["output_tokens_per_s"]
            / part["policies"]["lookahead"]["output_tokens_per_s"]
        )
    fam = simd["family"]["policies"]
    assert fam["limit"]["hit_tokens"] > fam["lookahead"]["hit_tokens"]
    assert fam["limit"]["junctions_observed"] > 0  # the family workload exercises junctions
    assert simd["family"]["inputs"]["shape"]["families"] == 4
    chat = simd["multi-turn"]["policies"]
    assert chat["limit"]["ssm_snapshot_pages"] > 0 == chat["lookahead"]["ssm_snapshot_pages"]
    # nothing shared: no arm hits, and the price of caching is reported beside the table
    none = simd["no-sharing"]
    assert all(m["hit_tokens"] == 0 for m in none["policies"].values())
    assert none["policies"]["no-caching"]["ssm_pages_stored"] == 0
    assert none["caching_overhead"]["output_tokens_per_s"] == pytest.approx(
        none["policies"]["limit"]["output_tokens_per_s"]
        / none["policies"]["no-caching"]["output_tokens_per_s"]
    )
    assert none["inputs"]["shape"]["shared_prefix_tokens"] == 0
    assert "caching_overhead" not in simd["family"]
    trace = simd["trace"]["inputs"]
    load = trace["offered_load"]
    assert trace["open_loop"] and load["load"] == 0.75
    assert load["request_rate_per_s"] == pytest.approx(0.75 * load["capacity_requests_per_s"])


def test_curves_over_output_length_and_concurrency(doc: dict[str, Any]) -> None:
    curves = doc["curves"]
    for axis, xs in (("output_tokens", [8, 32]), ("concurrency", [1, 4])):
        assert set(curves[axis]) == {"system-prompt", "family"}
        for points in curves[axis].values():
            assert [p["x"] for p in points] == xs
            for p in points:
                assert p["ratio"] == pytest.approx(
                    p["limit_output_tokens_per_s"] / p["lookahead_output_tokens_per_s"]
                )
    conc = curves["concurrency"]["system-prompt"]
    assert [p["num_requests"] for p in conc] == [16, 16]


def test_bench_plot(doc: dict[str, Any], tmp_path: Path) -> None:
    png = tmp_path / "b.png"
    plot_bench(png, doc)
    assert png.stat().st_size > 20_000


def test_worker_processes_give_the_same_numbers() -> None:
    _, sim = toy()
    jobs = [
        SimJob(sim, "family", ("lookahead", "limit"), "a"),
        SimJob(sim, "system-prompt", ("limit",), "b"),
    ]
    here = _run_all(jobs, 1, lambda _m: None)
    there = _run_all(jobs, 2, lambda _m: None)
    assert here == there


@dataclass(frozen=True)
class _Row:
    x: float
    n: int
    r: tuple[int, ...]


def test_engine_orders_and_medians() -> None:
    assert engine_orders(["a", "b"], 3) == [["a", "b"], ["b", "a"], ["a", "b"]]
    runs = [_Row(1.0, 3, (1,)), _Row(5.0, 1, (2,)), _Row(2.0, 2, (3,))]
    assert median_row(runs) == _Row(2.0, 2, (1,))  # ints stay ints; the rest: the first's
    assert median_row([_Row(1.0, 1, ()), _Row(2.0, 4, ())]) == _Row(1.5, 1, ())


@pytest.mark.slow
def test_bench_command_writes_json_and_png(tmp_path: Path) -> None:
    out, png = tmp_path / "b.json", tmp_path / "b.png"
    assert main(["bench", "--quick", "--jobs", "1", "--json", str(out), "--plot", str(png)]) == 0
    doc = json.loads(out.read_text())
    assert {"engine", "simulated", "curves", "wall_s"} <= set(doc)
    assert png.stat().st_size > 10_000


def test_no_internal_checkpoints_reaches_every_arm_but_the_split_ones() -> None:
    """`hycache bench --no-internal-checkpoints`: the simulated arms' config turns them off;
    the engine's prompts do not depend on it; `-split` arms are off either way."""
    from dataclasses import replace

    from hycache.bench.suite import bench_workload, sim_config, sim_cost
    from hycache.cli.main import make_parser

    args = make_parser().parse_args(["bench", "--no-internal-checkpoints"])
    assert args.internal_checkpoints is False
    engine, sim = toy()
    off = replace(sim, knobs=sim.knobs.replace(internal_checkpoints=False))
    w = bench_workload(off, "system-prompt")
    assert not sim_config(off, w, sim_cost(off)).cache.internal_checkpoints
    assert sim_config(sim, w, sim_cost(sim)).cache.internal_checkpoints
    engine_off = replace(engine, knobs=engine.knobs.replace(internal_checkpoints=False))
    assert engine_off.prompts() == engine.prompts()


def test_no_prefix_caching_turns_caching_off_in_every_arm() -> None:
    """`hycache bench --no-prefix-caching`: every simulated arm runs with caching off (the
    engine arms too: `EngineBench.knobs.enable_prefix_caching`)."""
    from dataclasses import replace

    from hycache.bench.suite import bench_workload, sim_config, sim_cost
    from hycache.cli.bench import BenchArgs
    from hycache.cli.main import make_parser

    args = make_parser().parse_args(["bench", "--no-prefix-caching", "--quick"])
    a = BenchArgs.from_cli_args(args)
    assert a.engine.knobs.enable_prefix_caching is False
    assert a.sim.knobs.enable_prefix_caching is False
    _, sim = toy()
    off = replace(sim, knobs=sim.knobs.replace(enable_prefix_caching=False))
    w = bench_workload(off, "family")
    assert not sim_config(off, w, sim_cost(off)).cache.enable_prefix_caching
    assert sim_config(sim, w, sim_cost(sim)).cache.enable_prefix_caching
