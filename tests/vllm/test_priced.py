"""`hycache bench vllm` (hycache.bench.vllm.priced): vLLM's real scheduler, each step priced by
the simulator's cost model, on tiny workloads: the table's invariants, not its figures."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from pathlib import Path

import pytest

from hycache.bench.vllm.priced import (
    ARMS,
    PricedBench,
    _ClosedLoop,
    accepted,
    jobs_of,
    quick,
    run,
    run_arm,
    run_draws,
)
from hycache.cli.bench_vllm import bench_from_cli_args
from hycache.cli.main import command_of, main, make_parser
from hycache.sim.workloads import ChatShape

BENCH = quick(PricedBench())


@pytest.fixture(scope="module")
def family_doc() -> dict:
    return run(replace(BENCH, workloads=("family",), concurrency=(1, 4)))


def test_alone_a_requests_ttft_is_the_sum_of_its_priced_prefill_passes() -> None:
    cost = BENCH.cost()
    for arm in BENCH.arms:
        r = run_arm(BENCH, arm, BENCH.shape("multi-turn"), 1, cost, BENCH.num_blocks(cost))
        assert len(r.ttft) == len(r.pass_seconds) == 6  # 3 sessions x 2 turns
        assert r.ttft == pytest.approx(r.pass_seconds, rel=1e-9)
        assert all(p >= 1 for p in r.passes)


def test_the_plugin_hits_at_least_stock_and_pays_at_most_two_passes_more(family_doc: dict) -> None:
    rows = {(r["concurrency"], r["arm"]): r for r in family_doc["rows"]}
    assert {arm for _, arm in rows} == {"stock", "stock+flag", "plugin"}
    for c in (1, 4):
        stock, plugin = rows[(c, "stock")], rows[(c, "plugin")]
        assert plugin["requests"] == stock["requests"] == 6
        assert plugin["hit_tokens"] >= stock["hit_tokens"]
        # what a hit saves is prefill: computed + hit tokens cover the same prompts
        total = stock["prefill_tokens"] + stock["hit_tokens"]
        assert plugin["prefill_tokens"] + plugin["hit_tokens"] == total
        assert plugin["passes_per_request"] <= stock["passes_per_request"] + 2
    # at concurrency 1 the family's shared prefixes end off the block grid: the plugin
    # resumes deeper and its output tok/s is above stock's
    cell = next(r for r in family_doc["ratios"] if r["concurrency"] == 1)
    assert cell["hit_tokens"] > 0 and cell["output_tok_s"] > 1.0


def test_drafts_verify_at_the_acceptance_rate() -> None:
    assert [accepted(1, 0.7, n) for n in range(10)] == [0, 1, 1, 0, 1, 1, 0, 1, 1, 1]
    assert sum(accepted(3, 0.5, n) for n in range(100)) == 150
    assert all(accepted(2, 1.0, n) == 2 for n in range(5))


def test_the_command_prints_the_table_and_writes_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "priced.json"
    argv = ["bench", "vllm", "--quick", "--workload", "system-prompt", "--concurrency", "1"]
    flags = ["--num-speculative-tokens", "0", "--price", "default", "--json", str(path)]
    assert main([*argv, *flags]) == 0
    doc = json.loads(path.read_text())
    assert doc["inputs"]["block_size"] == 4416 and doc["inputs"]["num_speculative_tokens"] == 0
    assert doc["inputs"]["price"] == "default"
    # without a drafter vLLM's junction flag does not apply: two arms
    assert [r["arm"] for r in doc["rows"]] == ["stock", "plugin"]
    out = capsys.readouterr().out
    assert "priced" in out and "plugin" in out
    assert main(["bench", "vllm", "--prefix-match-unit", "100", "--quick"]) == 2


def test_the_filters_pick_workloads_concurrencies_arms_and_the_seed(tmp_path: Path) -> None:
    argv = ["bench", "vllm", "--workload", "multi-turn", "--concurrency", "16", "64"]
    argv += ["--seed", "3", "--arm", "plugin", "--arm", "stock"]
    bench = bench_from_cli_args(make_parser(command_of(argv)).parse_args(argv))
    assert isinstance(bench, PricedBench)
    assert (bench.workloads, bench.concurrency, bench.seed) == (("multi-turn",), (16, 64), 3)
    assert bench.arms == ("stock", "plugin")  # ARMS' order, whatever the flags' order
    assert bench_from_cli_args(make_parser("bench").parse_args(["bench", "vllm"])).arms == ARMS
    # a filtered run: its rows are the arms asked for, the ratio where stock and plugin ran
    path = tmp_path / "filtered.json"
    quick_run = ["bench", "vllm", "--quick", "--workload", "multi-turn", "--concurrency", "1"]
    both = ["--arm", "plugin", "--arm", "stock"]
    assert main([*quick_run, "--seed", "3", *both, "--json", str(path)]) == 0
    doc = json.loads(path.read_text())
    assert [r["arm"] for r in doc["rows"]] == ["stock", "plugin"] and len(doc["ratios"]) == 1
    assert main([*quick_run, "--arm", "plugin", "--json", str(path)]) == 0
    assert json.loads(path.read_text())["ratios"] == []  # no stock to compare with
    # the seed draws another workload
    other = jobs_of(BENCH.shape("multi-turn"), 4)[0]
    assert [j.prompt for j in jobs_of(BENCH.shape("multi-turn"), 3)[0]] != [j.prompt for j in other]
    # vLLM's junction flag needs a drafter
    assert main([*quick_run, "--arm", "stock+flag", "--num-speculative-tokens", "0"]) == 2


def test_a_request_rate_spreads_the_first_requests_and_leaves_the_burst_as_it_was() -> None:
    """`--request-rate`: the first requests (a chat's sessions) arrive as a seeded Poisson
    process, the same for every arm; the default (all at once) is the run without it."""
    shape = BENCH.shape("multi-turn")
    cost = BENCH.cost()
    burst = run_arm(BENCH, "plugin", shape, 4, cost, BENCH.num_blocks(cost))
    assert BENCH.arrivals(3) == [0.0, 0.0, 0.0]
    slow = replace(BENCH, request_rate=0.5)  # a session every 2 s: each runs alone
    times = slow.arrivals(3)
    assert times[0] == 0.0 and times == sorted(times) and times[-1] > 0
    assert times == slow.arrivals(3) and times != replace(slow, seed=1).arrivals(3)
    spread = run_arm(slow, "plugin", shape, 4, cost, BENCH.num_blocks(cost))
    # the same requests and tokens; the clock waits for the last session to arrive
    assert spread.output_tokens == burst.output_tokens
    assert sorted(spread.hits) == sorted(burst.hits)
    assert spread.seconds > times[-1]
    # no session arrives while another is in flight (the gaps exceed a session's run):
    # each request alone, so its TTFT is its own prefill passes, as at concurrency 1
    alone = run_arm(BENCH, "plugin", shape, 1, cost, BENCH.num_blocks(cost))
    assert min(b - a for a, b in itertools.pairwise(times)) > alone.seconds / 3
    assert sorted(spread.ttft) == pytest.approx(sorted(alone.ttft), rel=1e-9)
    with pytest.raises(ValueError, match="request rate"):
        replace(BENCH, request_rate=0.0)
    argv = ["bench", "vllm", "--request-rate", "8"]
    bench = bench_from_cli_args(make_parser("bench").parse_args(argv))
    assert isinstance(bench, PricedBench) and bench.request_rate == 8.0
    with pytest.raises(SystemExit) as exc:
        main(["bench", "vllm", "--quick", "--request-rate", "0"])
    assert exc.value.code == 2


def test_a_chats_later_turns_take_no_more_passes_than_on_stock() -> None:
    """Nemotron-H's chat (docs/vllm-plugin.md, the multi-turn cell): the first turns resume
    at the system prompt's junction; a later turn resumes where stock resumes it (the
    previous prompt's tail), or, where that tail's stop was priced out (its chunk started at
    the tail's block floor, and the next turn's saving did not pay for the pass), at that
    block start, on the grid. No later turn takes a pass more than on stock, and some take
    one fewer."""
    bench = replace(PricedBench(), workloads=("multi-turn",), concurrency=(8,))
    shape = ChatShape(sessions=8, turns=(2, 4))
    cost = bench.cost()
    seen: dict[str, dict[tuple[int, int], tuple[int, int]]] = {}
    for arm in ("stock", "plugin"):
        loop = _ClosedLoop(bench, arm, shape, 8, cost, bench.num_blocks(cost))
        session = {id(job.session): i for i, (_, job) in enumerate(loop.arrivals)}
        keys: dict[str, tuple[int, int]] = {}
        while loop.arrivals or loop.ready or loop.live:
            before = set(loop.live)
            loop.admit()
            for rid in set(loop.live) - before:
                job = loop.live[rid][1]
                keys[rid] = (session[id(job.session)], job.turn)
            loop.step()
        seen[arm] = {k: (loop.hit[rid], len(loop.passes[rid])) for rid, k in keys.items()}
    stock, plugin = seen["stock"], seen["plugin"]
    assert stock.keys() == plugin.keys()
    later = [k for k in stock if k[1] > 0]
    assert len(later) > 8
    b = bench.b
    for k in later:
        (s_hit, s_passes), (p_hit, p_passes) = stock[k], plugin[k]
        assert p_passes <= s_passes, (k, stock[k], plugin[k])
        assert p_hit in (s_hit, s_hit // b * b), (k, stock[k], plugin[k])
    assert sum(plugin[k][1] for k in later) < sum(stock[k][1] for k in later)
    firsts = sorted(plugin[k][0] for k in plugin if k[1] == 0)
    assert all(stock[k][0] == 0 for k in stock if k[1] == 0)
    assert firsts.count(2_944) >= 6  # the 3,000-token system prompt's junction, floor(2999/64)*64


def test_draws_give_each_cells_spread_over_the_workload_draws(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--draws N`: the run on seeds --seed .. --seed + N - 1, each draw's document whole, and
    per cell plugin / stock as median (min-max) over the draws, with how many meet the bar."""
    path = tmp_path / "draws.json"
    argv = ["bench", "vllm", "--quick", "--workload", "family", "--concurrency", "1", "4"]
    assert main([*argv, "--arm", "stock", "--arm", "plugin", "--seed", "5", "--draws", "3",
                 "--json", str(path)]) == 0  # fmt: skip
    doc = json.loads(path.read_text())
    assert doc["inputs"]["seeds"] == [5, 6, 7]
    assert len(doc["draws"]) == 3
    single = run(replace(BENCH, workloads=("family",), concurrency=(1, 4), seed=6,
                         only_arms=("stock", "plugin")))  # fmt: skip
    assert doc["draws"][1]["rows"] == single["rows"]  # a draw is the single run of its seed
    cells = {(c["workload"], c["concurrency"]): c for c in doc["across_draws"]}
    assert set(cells) == {("family", 1), ("family", 4)}
    for (_, c), cell in cells.items():
        per = [next(r for r in d["ratios"] if r["concurrency"] == c) for d in doc["draws"]]
        tok = sorted(r["output_tok_s"] for r in per)
        assert cell["output_tok_s"] == {"median": tok[1], "min": tok[0], "max": tok[2]}
        assert cell["draws"] == 3 and cell["ok"] == sum(r["ok"] for r in per)
    out = capsys.readouterr().out
    assert "seeds 5-7" in out and "of 3" in out
    with pytest.raises(ValueError, match="draws"):
        run_draws(BENCH, 0)
