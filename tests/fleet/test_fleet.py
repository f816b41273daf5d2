"""hycache engines as Dynamo workers, behind Dynamo's frontend (`kv` router fed the
workers' resumable events) and behind hycache's exact router: siblings follow their prefix,
the hit the router predicted is the engine's `cached_tokens`, streaming and cancellation
reach the engine (and the streamed token ids come back through `nvext`), SIGTERM deregisters,
a killed worker costs no request."""

from __future__ import annotations

import json
import random
import re
import time
import urllib.request
from typing import Any

import pytest

from hycache.fleet.launch import Fleet, request_key

SETTLE_S = 1.0  # for a request's events to reach the router before the next request
WAIT_S = 120.0  # the bound on anything awaited (never asserted)


def complete(fleet: Fleet, prompt: list[int], max_tokens: int = 4) -> dict[str, Any]:
    """One non-streamed completion (token ids in), its JSON answer."""
    body = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "stream": False}
    req = urllib.request.Request(
        fleet.url + "/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=300) as r:
        return dict(json.loads(r.read()))


def families(seed: int, n: int, siblings: int, prefix: int = 100) -> list[list[list[int]]]:
    """`n` families of `siblings` prompts each: a shared `prefix`, then a suffix of its own."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        shared = [rng.randrange(1, 512) for _ in range(prefix)]
        out.append([shared + [rng.randrange(1, 512) for _ in range(rng.randrange(8, 40))]
                    for _ in range(siblings)])  # fmt: skip
    return out


def run_families(fleet: Fleet, seed: int) -> list[tuple[int, str, int]]:
    """Every family's first prompt, then their siblings round by round, one at a time:
    (family, request key, cached_tokens) per request, in order."""
    fams = families(seed, n=3, siblings=3)
    out = []
    for round_ in range(3):
        for f, fam in enumerate(fams):
            answer = complete(fleet, fam[round_])
            cached = answer["usage"]["prompt_tokens_details"]["cached_tokens"]
            out.append((f, request_key(answer["id"]), cached))
            time.sleep(SETTLE_S)
    return out


@pytest.mark.parametrize("arm", ["kv_fleet", "exact_fleet"])
def test_siblings_follow_their_prefix_and_the_predicted_hit_is_the_engines(
    arm: str, request: pytest.FixtureRequest
) -> None:
    fleet: Fleet = request.getfixturevalue(arm)
    done = run_families(fleet, seed=7)
    decisions = fleet.decisions()
    assert {key for _, key, _ in done} <= set(decisions), "a request the router did not log"
    home: dict[int, int] = {}
    for family, key, cached in done:
        d = decisions[key]
        assert d.predicted == cached, (arm, family, d, cached)
        if family in home:  # a sibling: where its prefix is, with the prefix as its hit
            assert d.worker_id == home[family]
            assert cached >= 64
        else:
            home[family] = d.worker_id
            assert cached == 0


def test_streaming_usage_and_finish_reason(kv_fleet: Fleet) -> None:
    body = {
        "model": "tiny",
        "prompt": list(range(1, 80)),
        "max_tokens": 12,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
        "nvext": {"extra_fields": ["completion_token_ids"]},  # token ids out, as they went in
    }
    req = urllib.request.Request(
        kv_fleet.url + "/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    chunks = []
    with urllib.request.urlopen(req, timeout=WAIT_S) as r:
        for raw in r:
            line = raw.decode().strip()
            if line.startswith("data:") and line[5:].strip() != "[DONE]":
                chunks.append(json.loads(line[5:]))
    texts = [c["choices"][0].get("text") for c in chunks if c.get("choices")]
    assert len([t for t in texts if t]) > 1  # streamed, not one blob
    reasons = [c["choices"][0].get("finish_reason") for c in chunks if c.get("choices")]
    assert reasons[-1] == "length"
    usage = chunks[-1]["usage"]
    assert usage["completion_tokens"] == 12
    ids = [t for c in chunks for t in (c.get("nvext") or {}).get("completion_token_ids", [])]
    spelled = [int(t) for t in re.findall(r"<t(\d+)>", "".join(t or "" for t in texts))]
    assert len(ids) == 12 and ids == spelled
    assert usage["prompt_tokens"] == 79


def test_a_client_that_goes_away_is_aborted_in_the_engine(kv_fleet: Fleet) -> None:
    body = {"model": "tiny", "prompt": list(range(2, 60)), "max_tokens": 900, "stream": True,
            "ignore_eos": True}  # fmt: skip
    req = urllib.request.Request(
        kv_fleet.url + "/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=WAIT_S) as r:
        for raw in r:
            if raw.startswith(b"data:"):
                break  # one token came: hang up
    deadline = time.monotonic() + WAIT_S
    while not any(b"client gone" in w.log.read_bytes() for w in kv_fleet.workers):
        assert time.monotonic() < deadline, "no worker aborted the request"
        time.sleep(0.2)


def test_sigterm_deregisters_and_a_killed_worker_costs_no_request(kv_fleet: Fleet) -> None:
    before = kv_fleet.registered_instances()
    assert kv_fleet.stop_worker(2) == 0
    after = kv_fleet.registered_instances()
    gone = [e for e in before if e not in after]
    assert gone and all("instances" in e or "mdc" in e or "event" in e for e in gone)
    assert len([e for e in after if "/instances/" in e]) < len(
        [e for e in before if "/instances/" in e]
    )
    kv_fleet.kill_worker(0)  # SIGKILL: it deregisters nothing
    for fam in families(seed=11, n=4, siblings=2):
        for prompt in fam:
            answer = complete(kv_fleet, prompt)
            assert answer["choices"][0]["finish_reason"] in ("length", "stop")
