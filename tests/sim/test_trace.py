"""Mooncake traces: reader round trip, every error with its line, generator statistics, and
lazy prompts (expanded when the simulator admits a request)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import hycache.sim.trace as trace_module
from hycache.sim.load import closed_loop
from hycache.sim.simulator import Simulator
from hycache.sim.trace import (
    TraceFormatError,
    TraceRequest,
    hash_block_tokens,
    iter_mooncake_trace,
    lazy_mooncake_trace,
    read_mooncake_records,
    read_mooncake_trace,
)
from hycache.sim.trace_gen import (
    generate_mooncake_like,
    token_hit_ceiling,
    trace_gen,
    trace_stats,
    write_trace,
)
from tests.helpers import make_config

B = 8  # small blocks keep hand-made traces short


def rec(ts: Any, inp: Any, out: Any, ids: list[Any]) -> dict[str, Any]:
    return {"timestamp": ts, "input_length": inp, "output_length": out, "hash_ids": ids}


def test_round_trip(tmp_path: Path) -> None:
    records = [rec(0, 20, 5, [1, 2, 3]), rec(1500, 12, 3, [1, 2]), rec(2000, 9, 1, [7, 8])]
    path = tmp_path / "t.jsonl"
    write_trace(records, path)
    reqs = read_mooncake_trace(path, block_tokens=B, vocab=100)
    assert [r.request_id for r in reqs] == [0, 1, 2]
    assert [r.arrival_s for r in reqs] == [0.0, 1.5, 2.0]
    assert [r.prompt_len for r in reqs] == [20, 12, 9]
    assert [r.max_tokens for r in reqs] == [5, 3, 1]
    a, b, c = (r.prompt_token_ids for r in reqs)
    assert np.array_equal(a[:12], b)  # shared hash ids -> shared tokens
    assert not np.array_equal(a[:8], c[:8])
    assert all(x.min() >= 0 and x.max() < 100 for x in (a, b, c))
    again = read_mooncake_trace(path, block_tokens=B, vocab=100)
    assert all(
        np.array_equal(x.prompt_token_ids, y.prompt_token_ids)
        for x, y in zip(reqs, again, strict=True)
    )
    lazy = list(iter_mooncake_trace(path, block_tokens=B, vocab=100))
    assert np.array_equal(lazy[0].prompt_token_ids, a)


def test_hash_tokens_depend_only_on_seed_id_and_position() -> None:
    one = hash_block_tokens([5, 9], 16, 1000, seed=3)
    alone = hash_block_tokens([9], 16, 1000, seed=3)
    assert np.array_equal(one[16:], alone)
    assert not np.array_equal(one[:16], alone)
    assert not np.array_equal(hash_block_tokens([9], 16, 1000, seed=4), alone)
    # Pinned: changing these changes every trace's tokens.
    assert hash_block_tokens([0, 1], 4, 32000, seed=0).tolist() == PINNED


PINNED = [12433, 21551, 27197, 26280, 432, 6637, 1117, 11023]


def test_hash_tokens_are_the_same_in_another_process() -> None:
    code = (
        "from hycache.sim.trace import hash_block_tokens;"
        "print(hash_block_tokens([123, 4567], 8, 32000, seed=0).tolist())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == hash_block_tokens([123, 4567], 8, 32000).tolist()


def test_blank_lines_and_backward_timestamps(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    lines = [
        json.dumps(rec(500, 8, 1, [1])),
        "",
        "   ",
        json.dumps(rec(100, 8, 1, [2])),
        json.dumps(rec(500, 8, 1, [3])),
    ]
    path.write_text("\n".join(lines) + "\n\n")
    recs = read_mooncake_records(path, B)
    assert [r.request_id for r in recs] == [1, 0, 2]  # sorted by time, stably; ids skip blanks
    assert [r.line for r in recs] == [4, 1, 5]
    assert [r.request_id for r in read_mooncake_trace(path, B, limit=2)] == [1, 0]


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("{not json", "invalid JSON"),
        ("[1, 2]", "expected a JSON object"),
        (
            json.dumps({"timestamp": 0, "input_length": 8, "hash_ids": [1]}),
            "missing field 'output_length'",
        ),
        (json.dumps(rec(0, "8", 1, [1])), "'input_length' must be an integer"),
        (json.dumps(rec(0, 8.5, 1, [1])), "'input_length' must be an integer"),
        (json.dumps(rec(0, -8, 1, [1])), "'input_length' must not be negative"),
        (json.dumps(rec(0, 8, -1, [1])), "'output_length' must not be negative"),
        (json.dumps(rec(0, 0, 1, [])), "'input_length' must be >= 1"),
        (json.dumps(rec(0, 8, 0, [1])), "'output_length' must be >= 1"),
        (json.dumps(rec(-1, 8, 1, [1])), "'timestamp' must not be negative"),
        (json.dumps(rec("soon", 8, 1, [1])), "'timestamp' must be a number"),
        (json.dumps({**rec(0, 8, 1, [1]), "hash_ids": 3}), "'hash_ids' must be a list"),
        (json.dumps(rec(0, 8, 1, [1, "x"])), "'hash_ids'[1] must be an integer in [0, 2**63)"),
        (json.dumps(rec(0, 17, 1, [1, 2])), "needs 3 hash_ids at 8 tokens per block, got 2"),
    ],
)
@pytest.mark.parametrize("read", [read_mooncake_trace, lazy_mooncake_trace])
def test_errors_name_the_line(
    tmp_path: Path, line: str, reason: str, read: Callable[..., object]
) -> None:
    """Eager or lazy, the whole file is validated before a request is returned."""
    path = tmp_path / "t.jsonl"
    good = json.dumps(rec(0, 8, 1, [1]))
    path.write_text(f"{good}\n\n{good}\n{line}\n{good}\n")
    with pytest.raises(TraceFormatError) as e:
        read(path, block_tokens=B)
    assert e.value.line == 4
    assert f"{path}, line 4: " in str(e.value)
    assert reason in str(e.value)
    assert isinstance(e.value, ValueError)


def test_extra_hash_ids_are_ignored(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    write_trace([rec(0, 9, 1, [4, 5, 6, 7])], path)
    (r,) = read_mooncake_records(path, B)
    assert r.hash_ids == (4, 5)


def test_token_hit_ceiling_by_hand() -> None:
    records = [
        rec(0, 8, 1, [1, 2]),  # nothing seen: 0
        rec(1, 10, 1, [1, 2, 3]),  # leads with 1, 2 seen: 8 (of 10)
        rec(2, 6, 1, [1, 9]),  # 1 seen, 9 not: 4 (of 6)
        rec(3, 3, 1, [1]),  # 1 seen, capped at the input length: 3
        rec(4, 8, 1, [5, 1]),  # 5 unseen first: 0
    ]
    assert token_hit_ceiling(records, block_tokens=4) == pytest.approx((8 + 4 + 3) / 35)


def test_generated_trace_is_deterministic_and_valid(tmp_path: Path) -> None:
    a = generate_mooncake_like(300, seed=5)
    assert a == generate_mooncake_like(300, seed=5)
    assert a != generate_mooncake_like(300, seed=6)
    for r in a:
        assert len(r["hash_ids"]) == -(-r["input_length"] // 512)
    path = tmp_path / "g.jsonl"
    stats = trace_gen(path, num_requests=300, seed=5)
    assert stats["num_requests"] == 300 and stats["path"] == str(path)
    assert len(read_mooncake_records(path)) == 300
    assert trace_stats(a)["token_hit_ceiling"] == pytest.approx(stats["token_hit_ceiling"])


def test_default_trace_matches_mooncake_statistics() -> None:
    records = generate_mooncake_like()
    s = trace_stats(records)
    assert s["num_requests"] == 12000
    assert 0.37 <= s["token_hit_ceiling"] <= 0.43
    assert s["input_median"] == pytest.approx(6900, rel=0.10)
    assert s["output_median"] == pytest.approx(350, rel=0.10)
    assert s["arrival_rate_per_s"] == pytest.approx(3.4, rel=0.10)
    assert s["input_max"] <= 131072
    assert s["input_mean"] > s["input_median"]  # heavy right tail


@pytest.mark.parametrize("target", [0.2, 0.6])
def test_hit_ceiling_is_a_knob(target: float) -> None:
    records = generate_mooncake_like(2000, seed=1, target_hit_ceiling=target)
    assert token_hit_ceiling(records) == pytest.approx(target, abs=0.03)


def _continuation_gaps_s(records: list[dict]) -> list[float]:
    """Seconds between a request and the last one holding the deepest block it reuses, for
    requests that reuse at least 4 blocks (conversation turns, not system prompts)."""
    last: dict[int, int] = {}
    gaps = []
    for r in records:
        ids, lead = r["hash_ids"], 0
        while lead < len(ids) and ids[lead] in last:
            lead += 1
        if lead >= 4:
            gaps.append((r["timestamp"] - last[ids[lead - 1]]) / 1000)
        last.update((h, r["timestamp"]) for h in ids)
    return gaps


def test_turn_gap_and_system_prompts_are_knobs(tmp_path: Path) -> None:
    plain = generate_mooncake_like(1500, seed=2)
    gapped = generate_mooncake_like(1500, seed=2, turn_gap_s=120.0)
    assert [r["timestamp"] for r in plain] == [r["timestamp"] for r in gapped]
    assert np.median(_continuation_gaps_s(plain)) < 60
    gaps = _continuation_gaps_s(
        generate_mooncake_like(1500, seed=2, turn_gap_s=120.0, num_system_prompts=0)
    )
    assert 80 <= np.median(gaps) <= 180 and min(gaps) > 20
    assert np.median(_continuation_gaps_s(gapped)) > np.median(_continuation_gaps_s(plain))
    stats = trace_gen(tmp_path / "g.jsonl", 300, 1, turn_gap_s=120.0, num_system_prompts=0)
    assert stats["turn_gap_s"] == 120.0 and stats["num_system_prompts"] == 0
    with pytest.raises(ValueError, match="turn_gap_s"):
        generate_mooncake_like(10, turn_gap_s=0.0)


# ---------------------------------------------------------------------------------------------
# Lazy prompts
# ---------------------------------------------------------------------------------------------


def test_lazy_trace_keeps_hash_ids_and_expands_on_read(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    write_trace([rec(500, 20, 5, [1, 2, 3, 9]), rec(100, 12, 3, [1, 2])], path)
    eager = read_mooncake_trace(path, block_tokens=B, vocab=100, seed=2)
    lazy = lazy_mooncake_trace(path, block_tokens=B, vocab=100, seed=2)
    assert all(isinstance(r, TraceRequest) for r in lazy)
    assert [r.hash_ids for r in lazy] == [(1, 2), (1, 2, 3)]  # only the ids the prompt uses
    for e, z in zip(eager, lazy, strict=True):
        fields = ("request_id", "max_tokens", "arrival_s", "prompt_len", "prefix_hints")
        assert [getattr(z, f) for f in fields] == [getattr(e, f) for f in fields]
        assert np.array_equal(z.prompt_token_ids, e.prompt_token_ids)
        assert not z.prompt_token_ids.flags.writeable
        assert np.array_equal(z.expand().prompt_token_ids, e.prompt_token_ids)
    # new arrival times (closed loop, a request rate) keep a request lazy
    (moved,) = closed_loop(lazy[:1])
    assert isinstance(moved, TraceRequest) and moved.arrival_s is None
    assert dataclasses.replace(moved, arrival_s=None) == moved
    assert len(lazy_mooncake_trace(path, block_tokens=B, limit=1)) == 1
    with pytest.raises(ValueError, match="vocab"):
        lazy_mooncake_trace(path, block_tokens=B, vocab=0)


def spaced_trace(path: Path, n: int, gap_ms: int) -> None:
    write_trace([rec(i * gap_ms, 17 + i % 7, 3, [i % 4, 100 + i, 200 + i]) for i in range(n)], path)


@pytest.mark.parametrize("closed", [False, True], ids=["open-loop", "closed-loop"])
def test_simulator_expands_each_prompt_when_it_admits_the_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, closed: bool
) -> None:
    """A lazy trace's prompts are expanded one at a time, as requests are admitted: open loop
    with arrivals 10 s apart, request i is expanded after requests 0..i-1 have finished; closed
    loop at concurrency 4, with at most 4 requests unfinished. The results are those of the
    same trace read eagerly."""
    n, concurrency = 30, 4
    path = tmp_path / "t.jsonl"
    spaced_trace(path, n, gap_ms=10_000)
    lazy: list[TraceRequest] = lazy_mooncake_trace(path, block_tokens=B, vocab=100)
    eager = read_mooncake_trace(path, block_tokens=B, vocab=100)
    if closed:
        lazy, eager = closed_loop(lazy), closed_loop(eager)  # type: ignore[assignment]
    finished: list[int | str] = []
    finished_at_expansion: list[int] = []
    real = trace_module.hash_block_tokens

    def counting(*args: Any, **kw: Any) -> np.ndarray:
        finished_at_expansion.append(len(finished))
        return real(*args, **kw)

    cfg = make_config(block_size=B, unit=4, policy="limit")
    sim = Simulator(cfg, dry_step_s=0.01, vocab_size=100)
    want = sim.run(eager, concurrency=concurrency if closed else None)
    monkeypatch.setattr(trace_module, "hash_block_tokens", counting)
    got = sim.run(
        lazy,  # type: ignore[arg-type]
        concurrency=concurrency if closed else None,
        on_finish=lambda r: finished.append(r.id),
    )
    assert len(finished_at_expansion) == n  # each prompt expanded once
    if closed:
        assert all(i - f <= concurrency for i, f in enumerate(finished_at_expansion))
        assert max(i - f for i, f in enumerate(finished_at_expansion)) == concurrency - 1
    else:
        assert finished_at_expansion == list(range(n))
    assert [r.line() for r in got.records] == [r.line() for r in want.records]
    assert got.summary == want.summary
    assert got.summary["hit_tokens"] > 0
