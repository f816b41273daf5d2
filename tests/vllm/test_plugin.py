"""`hycache.vllm.Scheduler` inside vLLM's real scheduler and KV cache manager (0.33.0, or 0.34.0
with `.vllm-0.34` first on `PYTHONPATH`: docs/vllm-plugin.md).

Every run builds the scheduler as `vllm serve --scheduler-cls` does (`SchedulerConfig(
scheduler_cls=...)`, then `get_scheduler_cls()`, in `hycache.bench.vllm.reference`); stock is vLLM's
own `Scheduler` on the same deployment. Passes are prefill chunks (one forward each).
"""

from __future__ import annotations

import dataclasses
import logging
import random
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hycache.bench.vllm.reference import ReferenceScheduler, VllmSetup, run_reference
from hycache.bench.vllm.scenario import Turn, run_hycache
from hycache.cache.boundaries import MAX_PREFIX_HINTS, Boundaries
from hycache.config import CacheKnobs, Policy
from hycache.vllm import Scheduler, SyncScheduler
from hycache.vllm.scheduler import Scheduler as VllmLimitScheduler
from hycache.vllm.scheduler import parse_hints
from tests.helpers import WORKED
from tests.vllm.shapes import (
    GEOMETRIES,
    PLUGIN,
    SYNC,
    budget,
    contains_an_answer,
    family,
    hits,
    hycache_config,
    passes,
    scenario,
    with_cls,
)

settings.load_profile("vllm-reference")







def FREE(setup: VllmSetup) -> VllmSetup:
    """The plugin with every stop made (a pass priced at 0): its mechanisms before pricing."""
    return dataclasses.replace(setup, pass_price=(0.0, 1.0))


def test_built_the_way_vllm_serve_builds_it() -> None:
    ref = ReferenceScheduler(VllmSetup(CacheKnobs(64, 16), scheduler_cls=PLUGIN))
    assert ref.vllm_config.scheduler_config.get_scheduler_cls() is Scheduler
    assert type(ref.scheduler) is Scheduler is VllmLimitScheduler
    assert ref.scheduler.hycache_bounds is not None
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler as Stock

    assert issubclass(Scheduler, AsyncScheduler) and issubclass(SyncScheduler, Stock)
    assert not issubclass(SyncScheduler, AsyncScheduler)


# -- the issue's figures ------------------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 3])
def test_seed_shape_at_full_scale(k: int) -> None:
    """B=4416, u=64, 57,600 shared + 6,416 private, MTP k: stock siblings 0 / 57,408 /
    57,408; the plugin's 0 / 57,536 / 57,536 (the limit), and with a hint on the producer
    57,536 from the first sibling on. The junction's stop costs the observing sibling two
    passes (stock + 2), each mid-block resume one (stock + 1: vLLM's own split, a chunk
    starting mid-block cannot export); the tail stop after it, which only an identical resend
    would use, does not pay for its pass and is not made (priced as it was: 17 / 3 / 3)."""
    setup = VllmSetup(CacheKnobs(4416, 64), 8192, num_speculative_tokens=k)
    limit = Boundaries(4416, 64, True, Policy.LIMIT).limit(57_600)
    assert limit == 57_536
    stock = run_reference(setup, family(1, 57_600, 6_416, 4))
    plugin = run_reference(with_cls(setup, PLUGIN), family(1, 57_600, 6_416, 4))
    hinted = run_reference(with_cls(setup, PLUGIN), family(1, 57_600, 6_416, 4, hint=57_600))
    assert hits(stock) == [0, 0, 57_408, 57_408]
    assert hits(plugin) == [0, 0, limit, limit]
    assert hits(hinted) == [0, limit, limit, limit]
    assert passes(stock) == [14, 14, 1, 1]
    assert passes(plugin) == [14, 16, 2, 2]
    assert passes(hinted) == [16, 2, 2, 2]
    assert plugin[1].chunk_ends[-4:] == [57_408, 57_536, 61_824, 64_016]
    free = run_reference(with_cls(FREE(setup), PLUGIN), family(1, 57_600, 6_416, 4))
    assert hits(free) == hits(plugin) and passes(free) == [14, 17, 3, 3]


@pytest.mark.parametrize("cls", [PLUGIN, SYNC])
def test_small_family(cls: str) -> None:
    """B=64, u=16, k=1, three requests of 640 shared + 83 private: stock 0 / 0 / 576, the
    plugin reaches the limit 624 from the second sibling, and from the first with a hint."""
    setup = FREE(VllmSetup(CacheKnobs(64, 16), 8192))
    assert hits(run_reference(setup, family(0, 640, 83, 3))) == [0, 0, 576]
    got = run_reference(with_cls(setup, cls), family(0, 640, 83, 3))
    assert hits(got) == [0, 0, 624]
    # floor(j/B)*B, j; not the block after (640): the chunk from j exports the tail in the
    # forward, so vLLM does not re-align there, and a cut of the plugin's own would be a pass
    assert got[1].chunk_ends == [576, 624, 723]
    assert hits(run_reference(with_cls(setup, cls), family(0, 640, 83, 3, hint=640))) == [
        0,
        624,
        624,
    ]


def test_the_plugin_equals_hycache_limit_on_the_issue_shapes() -> None:
    for setup, turns in [
        (FREE(VllmSetup(CacheKnobs(64, 16), 8192)), family(0, 640, 83, 3)),
        (FREE(VllmSetup(CacheKnobs(64, 16), 8192)), family(0, 640, 83, 3, hint=640)),
        (
            FREE(VllmSetup(CacheKnobs(4416, 64), 8192)),
            family(1, 57_600, 6_416, 4, hint=57_600),
        ),
    ]:
        ours = hits(run_hycache(hycache_config(setup, "limit", turns), turns))
        assert hits(run_reference(with_cls(setup, PLUGIN), turns)) == ours


# -- hints ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "hints",
    [
        [-5],
        [10_000],
        ["640"],
        [True],
        [640.0],
        "640",
        [640, -1],
        {"at": 640},
        [True, 640],
        [640.0, 640, 1.0],
        [0] * MAX_PREFIX_HINTS + [640],
    ],
)
def test_a_bad_hint_is_ignored_with_one_warning(
    hints: object, caplog: pytest.LogCaptureFixture
) -> None:
    """Negative, past the prompt, not an int by type (a bool or a float equal to a good hint
    too), past the first `MAX_PREFIX_HINTS`: ignored, the good ones kept, one warning per
    request, and the request runs as without it."""
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request

    good = isinstance(hints, list) and any(
        type(h) is int and h == 640 for h in hints[:MAX_PREFIX_HINTS]
    )
    ref = ReferenceScheduler(VllmSetup(CacheKnobs(64, 16), scheduler_cls=PLUGIN))
    turns = family(0, 640, 83, 3)
    req = Request(
        "bad",
        list(turns[0].prompt),
        SamplingParams(max_tokens=1, extra_args={"prefix_hints": hints}),
        None,
        block_hasher=ref.hasher,
    )
    with caplog.at_level(logging.WARNING, logger="hycache.vllm"):
        ref.scheduler.add_request(req)
        ref.scheduler.schedule()
    warnings = [r for r in caplog.records if r.name == "hycache.vllm"]
    assert len(warnings) == 1 and "ignoring prefix hints" in warnings[0].getMessage()
    # the hint's limit 624 and the block after; not its block floor 576 (a pass stock never makes)
    assert req.hycache_stops == ((624, 640) if good else ())


def hinted(hints: object, num_prompt_tokens: int = 640, request_id: str = "r") -> Any:
    """What `parse_hints` reads of a vLLM request, and nothing else."""
    from types import SimpleNamespace

    params = SimpleNamespace(extra_args={"prefix_hints": hints})
    return SimpleNamespace(
        sampling_params=params, num_prompt_tokens=num_prompt_tokens, request_id=request_id
    )


@given(
    st.lists(
        st.one_of(
            st.integers(-3, 700),
            st.booleans(),
            st.floats(allow_nan=False),
            st.text(max_size=3),
            st.none(),
        ),
        max_size=3 * MAX_PREFIX_HINTS,
    )
)
def test_the_hints_kept_are_the_good_ints_among_the_first_cap(hints: list[object]) -> None:
    """Kept: exactly the ints (by type) in [1, the prompt] among the first `MAX_PREFIX_HINTS`,
    whatever else the list holds (a bad value equal to a good one never hides it)."""
    head = hints[:MAX_PREFIX_HINTS]
    want = tuple(sorted({h for h in head if type(h) is int and 0 < h <= 640}))
    assert parse_hints(hinted(hints)) == want


def parse_seconds(hints: list[object], repeat: int = 50) -> float:
    start = time.perf_counter()
    for _ in range(repeat):
        parse_hints(hinted(hints))
    return time.perf_counter() - start


def test_parsing_does_not_grow_with_the_list() -> None:
    """A list of 10^5 hostile hints costs what one of 10^3 costs: no work past the cap (the
    issue's parser took 0.005 s on 10^3 bad hints and 3.5 s on 3x10^4). Timed against the
    10^3 control in the same test, interleaved, best of 7: a linear parser would be ~100x."""
    small: list[object] = [1.5, True, -1, "x"] * 250
    large: list[object] = [1.5, True, -1, "x"] * 25_000
    logging.getLogger("hycache.vllm").disabled = True
    try:
        control, treated = [], []
        for _ in range(7):
            control.append(parse_seconds(small))
            treated.append(parse_seconds(large))
    finally:
        logging.getLogger("hycache.vllm").disabled = False
    assert min(treated) < 5 * min(control)


def test_the_warning_is_bounded_whatever_the_request_holds(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One line of bounded length for 10^5 hostile hints of any size: the counts, the first
    few values (each repr bounded, a 4,300+ digit int too), the request id cut."""
    hostile: list[object] = ["a" * 10**6, int("9" * 4000) ** 2, [list(range(10**5))], {"k": 1}]
    hostile += [-1] * 10**5
    with caplog.at_level(logging.WARNING, logger="hycache.vllm"):
        assert parse_hints(hinted([*hostile, 5], request_id="i" * 10**5)) == ()
        assert parse_hints(hinted([640, *hostile])) == (640,)
    lines = [r.getMessage() for r in caplog.records if r.name == "hycache.vllm"]
    assert len(lines) == 2 and all(len(line) < 600 for line in lines)
    assert f"{MAX_PREFIX_HINTS} bad" in lines[0]
    assert f"{len(hostile) + 1 - MAX_PREFIX_HINTS} past the first {MAX_PREFIX_HINTS}" in lines[0]
    assert f"{MAX_PREFIX_HINTS - 1} bad" in lines[1]


# -- random sharing shapes --------------------------------------------------------------------


STOPS_SEEN: dict[str, tuple[int, ...]] = {}  # request id -> stops, by RecordingScheduler


class RecordingScheduler(SyncScheduler):
    """The plugin, recording each request's stops (a junction or hint it acted on)."""

    def hycache_stops(self, request, hit, junction):  # type: ignore[no-untyped-def]
        stops = super().hycache_stops(request, hit, junction)
        STOPS_SEEN[request.request_id] = stops
        return stops




@st.composite
def shapes(draw: st.DrawFn) -> tuple[VllmSetup, list[Turn]]:
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    b, u = rng.choice(GEOMETRIES)
    k = rng.choice([1, 1, 2, 3])
    turns = scenario(rng, b, u, k, drafts=True)
    while contains_an_answer(turns):
        turns = scenario(rng, b, u, k, drafts=True)
    return VllmSetup(
        CacheKnobs(b, u, internal_checkpoints=draw(st.booleans())),
        budget(rng, b),
        k,
        pass_price=(0.0, 1.0),
    ), turns


@given(case=shapes())
def test_random_shapes(case: tuple[VllmSetup, list[Turn]]) -> None:
    """With every stop made (`FREE`), per request: plugin >= stock; plugin = `limit`
    (`hycache simulate --policy limit --sequential`) with a Mamba layer that splits at its
    checkpoints, and at most `limit`
    with the Mamba2 spec (vLLM exports one checkpoint per forward and skips the replay
    boundary's stop, which hycache's split keeps: a request that is a prefix of an earlier
    one can resume lower). Until a request acts on a junction, every request chunks
    exactly as on stock vLLM."""
    setup, turns = case
    stock = run_reference(setup, turns)
    STOPS_SEEN.clear()
    plugin = run_reference(with_cls(setup, f"{__name__}.RecordingScheduler"), turns)
    limit = hits(run_hycache(hycache_config(setup, "limit", turns), turns))
    for i, (s, p, m) in enumerate(zip(hits(stock), hits(plugin), limit, strict=True)):
        assert s <= p, i
        assert p == m if not setup.exporting else p <= m, i
    for s, p in zip(stock, plugin, strict=True):
        assert p.hit == s.hit  # the caches are the same so far
        if STOPS_SEEN.get(p.request_id):
            break  # this request acts on a junction (its stops), so the caches part here
        assert p.chunk_ends == s.chunk_ends


# -- inert where limit does not apply -------------------------------------------------------


@pytest.mark.parametrize(
    "setup,reason",
    [
        (VllmSetup(CacheKnobs(64, 64)), "prefix_match_unit equals block_size"),
        (VllmSetup(CacheKnobs(64, 16), lookahead=False), "num_hash_lookahead_tokens=0"),
    ],
)
def test_inert_is_stock_and_says_why_once(
    setup: VllmSetup, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    turns = family(0, 640, 83, 3) + family(2, 200, 300, 2)
    with caplog.at_level(logging.INFO, logger="hycache.vllm"):
        plugin = run_reference(with_cls(setup, PLUGIN), turns)
    lines = [r.getMessage() for r in caplog.records if r.name == "hycache.vllm"]
    assert len(lines) == 1 and "inert" in lines[0] and reason in lines[0], lines
    stock = run_reference(setup, turns)
    assert [(t.hit, t.chunk_ends) for t in plugin] == [(t.hit, t.chunk_ends) for t in stock]


# -- blocks go back to vLLM's pool --------------------------------------------------------------


def drive_concurrently(
    ref: ReferenceScheduler, turns: list[Turn], abort: str, max_tokens: int = 8
) -> list[Any]:
    """All turns at once in a pool too small for them (vLLM preempts), `abort` aborted
    mid-prefill; each step samples one token per request that finished its prompt."""
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request, RequestStatus

    from hycache.vllm.compat import model_runner_output

    s = ref.scheduler
    reqs = [
        Request(
            f"c{i}",
            list(t.prompt),
            SamplingParams(
                max_tokens=max_tokens,
                ignore_eos=True,
                extra_args={"prefix_hints": list(t.prefix_hints)} if t.prefix_hints else None,
            ),
            None,
            block_hasher=ref.hasher,
        )
        for i, t in enumerate(turns)
    ]
    by_id = {r.request_id: r for r in reqs}
    for r in reqs:
        s.add_request(r)
    for step in range(10_000):
        if not s.has_requests():
            break
        out = s.schedule()
        ids = list(out.num_scheduled_tokens)
        sampled = [[] if by_id[i].num_computed_tokens < by_id[i].num_tokens else [7] for i in ids]
        s.update_from_output(out, model_runner_output(ids, sampled))
        if step == 3:
            s.finish_requests(abort, RequestStatus.FINISHED_ABORTED)
    assert not s.has_requests()
    return reqs


@pytest.mark.parametrize("cls", [PLUGIN, SYNC])
def test_preemption_abort_and_finish_return_every_block(cls: str) -> None:
    from vllm.v1.request import RequestStatus

    from hycache.vllm.managers import manager_classes

    unit_keyed, _ = manager_classes()

    ref = ReferenceScheduler(VllmSetup(CacheKnobs(64, 16), 256, num_blocks=24, scheduler_cls=cls))
    start = ref.num_free_blocks()
    reqs = drive_concurrently(ref, family(0, 640, 83, 4, hint=640), "c1", max_tokens=300)
    assert any(r.num_preemptions for r in reqs)  # the pool was too small: vLLM preempted
    assert reqs[1].status is RequestStatus.FINISHED_ABORTED
    assert all(r.status is RequestStatus.FINISHED_LENGTH_CAPPED for r in reqs if r is not reqs[1])
    assert ref.num_free_blocks() == start
    for m in ref.scheduler.kv_cache_manager.coordinator.single_type_managers:
        assert not m.req_to_blocks
        if isinstance(m, unit_keyed):
            assert not m._num_keyed_units


# -- hycache explain --backend vllm ---------------------------------------------------------------

SEED_SHAPE = WORKED  # the README's worked example, as `hycache explain` flags


def test_explain_backend_vllm_on_the_seed_shape(capsys: pytest.CaptureFixture[str]) -> None:
    """Stock vLLM beside `hycache.vllm.Scheduler`, measured on vLLM's scheduler (k=3)."""
    import json

    from hycache.cli.main import main

    assert main(["explain", *SEED_SHAPE, "--backend", "vllm", "--json"]) == 0
    cols = json.loads(capsys.readouterr().out)["policies"]
    stock, ours = cols["vllm"], cols["hycache.vllm.Scheduler"]
    assert stock["siblings"] == [0, 57_408, 57_408]
    assert ours["siblings"] == [0, 57_536, 57_536] == [0, ours["limit"], ours["limit"]]
    assert stock["resend"] == ours["resend"] == 64_000
    assert stock["producer_checkpoints"] == ours["producer_checkpoints"] == [64_000]
    assert stock["sibling_prefill_steps"] == [14, 1, 1]
    assert ours["sibling_prefill_steps"] == [16, 2, 2]
    assert main(["explain", *SEED_SHAPE, "--backend", "vllm", "--prefix-hint", "57600"]) == 0
    table = capsys.readouterr().out
    assert "57,536 / 57,536 / 57,536" in table and "0 / 57,408 / 57,408" in table


# -- the docs command ------------------------------------------------------------------------


def test_the_docs_command_builds_the_plugin_and_its_figures() -> None:
    """docs/vllm-plugin.md's `vllm serve` flags, flag for flag, through vLLM's parser and config
    (`tests/vllm/serve_command.py`, in a process with vLLM's CPU platform)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from tests.vllm.serve_command import docs_command

    root = Path(__file__).resolve().parents[2]
    # the caller's PYTHONPATH after the root: `.vllm-0.34` when testing vLLM 0.34
    path = os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "PYTHONPATH": path}
    proc = subprocess.run(
        [sys.executable, "-m", "tests.vllm.serve_command"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    got = json.loads(lines[-1].removeprefix("RESULT "))
    assert got["flags"] == docs_command()[3:]
    assert got["scheduler_cls"] == PLUGIN
    assert got["scheduler"] == "hycache.vllm.scheduler.Scheduler"  # what PLUGIN names
    assert got["mamba_cache_mode"] == "align" and got["enable_prefix_caching"]
    assert got["prefix_match_unit"] == 64 and got["max_num_batched_tokens"] == 8192
    assert (got["speculative_method"], got["num_speculative_tokens"]) == ("mtp", 3)
    assert got["num_hash_lookahead_tokens"] == 1  # vLLM's lookahead keys: the plugin is on
    assert got["hits_hint_0"] == [0, 0, 57_536, 57_536]
    assert got["hits_hint_57600"] == [0, 57_536, 57_536, 57_536]
    import vllm

    assert got["vllm"] == vllm.__version__  # the same vLLM as this process
