"""`benchmarks/bench_vllm_engine.py`: the paired plan (each wave in every arm back to back, the
arm going first in turn), one run's figures, the summary's ratios and checks, a worker that
dies; and (slow) a whole paired run, whose prefix cache reset must leave every repeat's hits
and passes the same."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "bench_vllm_engine.py"
_spec = importlib.util.spec_from_file_location("bench_vllm_engine", SCRIPT)
assert _spec is not None and _spec.loader is not None
bench: Any = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def large_block_waves() -> list[list[int]]:
    args = bench.parse_args(["--shape", "large-block", "--json", "x.json"])
    spec = {k: getattr(args, k) for k in bench.SPEC_KEYS}
    _, family = bench.prompts_for(spec)
    return bench.waves_for(family, args.concurrency)


def test_each_arm_runs_each_wave_first_in_turn() -> None:
    """Large-block shape, 5 repeats: 8 waves (each family's first, then 3 siblings one by one);
    within a repeat the arm going first alternates wave by wave, and each wave's first arm
    alternates repeat by repeat; over the run each arm goes first 20 times."""
    waves = large_block_waves()
    assert waves == [[0], [1], [2], [3], [4], [5], [6], [7]]
    plan = bench.wave_orders(("stock", "plugin"), 5, len(waves))
    firsts = [[order[0] for order in row] for row in plan]
    for row in firsts:
        assert all(a != b for a, b in pairwise(row))
    for w in range(len(waves)):
        column = [row[w] for row in firsts]
        assert all(a != b for a, b in pairwise(column))
    flat = [a for row in firsts for a in row]
    assert flat.count("stock") == flat.count("plugin") == 20
    assert all(sorted(o) == ["plugin", "stock"] for row in plan for o in row)


def test_waves_at_concurrency_two() -> None:
    assert bench.waves_for([0, 0, 0, 0, 1, 1, 1], 2) == [[0], [1, 2], [3], [4], [5, 6]]


def wave(requests: dict[int, tuple[float, int, list[int]]], passes: int, wall: float) -> dict:
    return {
        "requests": [
            [
                i,
                {
                    "ttft_s": t,
                    "ttft_cpu_s": t / 2,
                    "hit": h,
                    "token_ids": tok,
                    "passes_to_first_token": 2,
                },
            ]
            for i, (t, h, tok) in requests.items()
        ],
        "passes": passes,
        "wall_s": wall,
    }


PROMPTS = [[5] * 100, [5] * 120, [5] * 130, [6] * 90, [6] * 95]
FAMILY = [0, 0, 0, 1, 1]


def run(ttfts: list[float], hits: list[int], tokens: list[int] | None = None) -> dict:
    tok = tokens or [1, 2]
    waves = [wave({i: (ttfts[i], hits[i], tok)}, passes=3, wall=1.0) for i in range(5)]
    return bench.figures(PROMPTS, FAMILY, waves, drafts=4, accepted=1)


def test_one_runs_figures() -> None:
    r = run([1.0, 2.0, 0.5, 3.0, 0.25], [0, 0, 64, 0, 32])
    assert r["ttft_s"] == [1.0, 2.0, 0.5, 3.0, 0.25]
    assert r["ttft_p50_s"] == 1.0
    assert r["sibling_ttft_p50_s"] == 0.5  # requests 1, 2, 4: each family's first left out
    assert r["ttft_cpu_p50_s"] == 0.5
    assert r["prefill_tokens"] == 100 + 120 + 66 + 90 + 63
    assert r["forward_passes"] == 15
    assert r["passes_to_first_token"] == [2] * 5
    assert r["ttft_cpu_s"] == [0.5, 1.0, 0.25, 1.5, 0.125]
    assert r["output_tok_s"] == pytest.approx(10 / 5.0)
    assert (r["drafts"], r["accepted"]) == (4, 1)


def test_a_wave_missing_a_request_is_refused() -> None:
    waves = [wave({i: (1.0, 0, [1])}, 1, 1.0) for i in range(4)]
    with pytest.raises(AssertionError):
        bench.figures(PROMPTS, FAMILY, waves, 0, 0)


def test_summary_ratios_per_repeat_and_per_request() -> None:
    stock = [run([1.0, 2.0, 2.0, 3.0, 2.0], [0, 0, 64, 0, 32]) for _ in range(2)]
    plugin = [
        run([1.0, 2.0, 1.0, 3.0, 1.0], [0, 0, 96, 0, 64]),
        run([1.0, 4.0, 4.0, 6.0, 4.0], [0, 0, 96, 0, 64]),
    ]
    out = bench.summarize({"stock": stock, "plugin": plugin})
    assert out["identical_tokens"]
    assert out["arms"]["stock"]["same_in_every_repeat"]
    assert out["arms"]["plugin"]["same_in_every_repeat"]
    assert out["ttft_per_request_ratio_per_repeat"] == [
        [1.0, 1.0, 0.5, 1.0, 0.5],
        [1.0, 2.0, 2.0, 2.0, 2.0],
    ]
    p50 = out["ratios"]["ttft_p50_s"]
    assert p50["per_repeat"] == [0.5, 2.0]  # medians 1.0 / 2.0, then 4.0 / 2.0
    assert not p50["rankable"]
    assert out["ratios"]["prefill_tokens"] == pytest.approx(
        (100 + 120 + 34 + 90 + 31) / (100 + 120 + 66 + 90 + 63)
    )
    assert out["arms"]["plugin"]["ttft_s_per_repeat"][1] == [1.0, 4.0, 4.0, 6.0, 4.0]


def test_summary_flags_a_repeat_that_differs() -> None:
    """A hit that moved between repeats (a reset that left a prefix behind) and one token
    that differs in one arm's repeat are both flagged."""
    first = run([1.0] * 5, [0, 0, 64, 0, 32])
    moved = run([1.0] * 5, [0, 64, 64, 0, 32])
    out = bench.summarize({"stock": [first, moved]})
    assert not out["arms"]["stock"]["same_in_every_repeat"]
    assert out["identical_tokens"]
    other = run([1.0] * 5, [0, 0, 64, 0, 32], tokens=[1, 3])
    out = bench.summarize({"stock": [first, first], "plugin": [first, other]})
    assert not out["identical_tokens"]


def test_paired_one_thread_per_arm_is_the_default() -> None:
    base = ["--shared-prefix", "200", "--suffix", "20", "--siblings", "2", "--block-size", "32"]
    base += ["--prefix-match-unit", "16", "--json", "x.json"]
    assert not bench.parse_args(base).sequential
    assert bench.parse_args([*base, "--sequential"]).sequential
    assert bench.parse_args(base).threads == 1
    assert bench.worker_env(1)["OMP_NUM_THREADS"] == "1"
    with pytest.raises(SystemExit):
        bench.parse_args([*base, "--arms", "plugin,stock,plugin"])


def test_a_worker_that_dies_is_reported_with_its_log(tmp_path: Path) -> None:
    """The spec file is missing: the worker exits before it is ready, and the parent says so
    with the end of the worker's log."""
    w = bench.Worker("stock", tmp_path / "missing.json", tmp_path / "stock.log")
    try:
        with pytest.raises(RuntimeError, match="stock worker exited") as err:
            w.receive()
        assert "missing.json" in str(err.value)
    finally:
        w.close(kill=True)
    assert w.proc.returncode not in (None, 0)


@pytest.mark.slow
def test_a_paired_run_repeats_the_same_hits_and_tokens(tmp_path: Path) -> None:
    """Two repeats of a small family, both arms alive: the reset between repeats leaves every
    hit and pass count the same, the plugin's hits above stock's, greedy tokens identical."""
    out = tmp_path / "paired.json"
    cmd = [sys.executable, str(SCRIPT), "--shared-prefix", "2000", "--suffix", "200"]
    cmd += ["--siblings", "3", "--block-size", "64", "--prefix-match-unit", "16", "--mtp", "1"]
    cmd += ["--max-tokens", "6", "--arms", "stock,plugin", "--repeats", "2", "--json", str(out)]
    env = {**os.environ, "PYTHONPATH": str(SCRIPT.parents[1])}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["method"] == "paired" and result["identical_tokens"]
    for arm in ("stock", "plugin"):
        assert result["arms"][arm]["same_in_every_repeat"]
    # the later siblings: stock at the block floor less the drop's block, the plugin at the
    # unit floor less the drop's unit
    assert result["arms"]["stock"]["hits"] == [0, 0, 1920, 1920]
    assert result["arms"]["plugin"]["hits"] == [0, 0, 1984, 1984]
    assert result["orders"] == bench.wave_orders(("stock", "plugin"), 2, 4)
