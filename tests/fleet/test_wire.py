"""hycache's KV event bytes through Dynamo 1.6.1's own decoder (its `KvEventPublisher` relaying
a ZMQ PUB, `zmq_wire.rs`) into its KV router: the "dynamo" wire of `encode_batch` is read in
both modes, the depth the router matches is the engine's resume point in `resumable` mode, and
the "vllm" wire's `full`-mode tail is what Dynamo refuses (why the two wires exist).

Each case runs in a subprocess (Dynamo's runtime is process-wide) against a NATS server on
127.0.0.1 that the test starts and stops; one endpoint served, registered with the `tiny`
card, no frontend."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hycache.fleet.launch import LOOPBACK, dynamo_env, dynamo_missing, free_port

SCRIPT = r"""
import asyncio, json, random, sys, time
from pathlib import Path
from dynamo.llm import (KvEventPublisher, KvRouter, KvRouterConfig, ModelInput, ModelType,
                        WorkerType, register_model)
from dynamo.runtime import DistributedRuntime
from hycache.config import CacheKnobs
from hycache.engine.engine import LLM
from hycache.engine.kv_events import publish_kv_events, stop_publishing
from hycache.fleet.card import write_card
from hycache.request import SamplingParams

mode, wire, workdir = sys.argv[1], sys.argv[2], Path(sys.argv[3])
B, U = 16, 4
block = U if mode == "resumable" else B
llm = LLM("tiny", knobs=CacheKnobs(B, U, policy="limit"), max_model_len=256, num_blocks=96,
          num_speculative_tokens=2)
rng = random.Random(5)
root = [rng.randrange(1, 200) for _ in range(60)]
prompts = [root[:rng.randrange(20, 60)] + [rng.randrange(1, 200) for _ in range(15)]
           for _ in range(4)]

async def main():
    loop = asyncio.get_running_loop()
    rt = DistributedRuntime(loop, "file", "tcp", event_plane="nats")
    ep = rt.endpoint("wire.worker.generate")
    async def generate(request, context):
        yield {"token_ids": [1], "finish_reason": "stop"}
    serving = asyncio.ensure_future(ep.serve_endpoint(generate, graceful_shutdown=False))
    card = write_card("tiny", workdir / "card")
    await register_model(ModelInput.Tokens, ModelType.Completions, ep, str(card), "tiny",
                         worker_type=WorkerType.Aggregated, kv_cache_block_size=block)
    client = await ep.client()
    await client.wait_for_instances()
    pub = publish_kv_events(llm, f"tcp://127.0.0.1:*", mode, wire=wire)
    relay = KvEventPublisher(ep, kv_block_size=block, zmq_endpoint=pub.bound_endpoint,
                             zmq_topic="")
    router = KvRouter(ep, block, KvRouterConfig())
    await asyncio.sleep(1.0)  # the relay and the router subscribe
    outs = llm.generate(prompts, SamplingParams(max_tokens=4, ignore_eos=True))
    turn = prompts[-1] + list(outs[-1].token_ids) + [5, 6]
    asks = [*prompts, turn]
    expected = [llm.resume_point(p) for p in asks]
    got = []
    deadline = time.monotonic() + (20.0 if wire == "dynamo" or mode == "resumable" else 5.0)
    while time.monotonic() < deadline:
        got = [(await router.best_worker(p))[2] * block for p in asks]
        if got[-1] == expected[-1] if mode == "resumable" else got[0]:
            break
        await asyncio.sleep(0.5)
    print(json.dumps({"expected": expected, "got": got, "published": pub.num_published}))
    sys.stdout.flush()
    relay.shutdown()
    stop_publishing(llm, pub)
    rt.shutdown()
    serving.cancel()

asyncio.run(main())
"""


@pytest.fixture(scope="module")
def nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    why = dynamo_missing()
    if why is not None:
        pytest.skip(why)
    workdir = tmp_path_factory.mktemp("wire")
    port = free_port()
    server = subprocess.Popen(
        ["nats-server", "-a", LOOPBACK, "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        env = dict(os.environ) | dynamo_env(workdir / "discovery", port)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH")) if p
        )
        env["WORKDIR"] = str(workdir)
        yield env
    finally:
        server.terminate()
        server.wait(timeout=30)


def relay(env: dict[str, str], mode: str, wire: str) -> tuple[dict[str, list[int]], str]:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, mode, wire, env["WORKDIR"]],
        capture_output=True,
        env=env,
        timeout=300,
    )
    err = out.stderr.decode(errors="replace")
    assert out.returncode == 0, err[-3000:]
    lines = [ln for ln in out.stdout.decode().splitlines() if ln.startswith("{")]
    assert lines, err[-3000:]
    return json.loads(lines[-1]), err


@pytest.mark.parametrize("wire", ["vllm", "dynamo"])
def test_resumable_events_reach_dynamos_router_on_either_wire(
    nats: dict[str, str], wire: str
) -> None:
    """Dynamo decodes every batch; its matched depth is the engine's resume point for the
    continuing turn, and never below the engine's hit for any request."""
    res, err = relay(nats, "resumable", wire)
    assert "Failed to decode" not in err
    assert res["published"] > 0
    assert res["got"][-1] == res["expected"][-1] > 0
    assert all(g >= e for g, e in zip(res["got"], res["expected"], strict=True))


def test_full_events_need_the_dynamo_wire(nats: dict[str, str]) -> None:
    """`full` mode on the "dynamo" wire: every batch decodes and the attention group's blocks
    are indexed; on the "vllm" wire (the `resumable_events` tail) Dynamo refuses every
    batch."""
    res, err = relay(nats, "full", "dynamo")
    assert "Failed to decode" not in err
    assert res["got"][0] == res["expected"][0] // 16 * 16 > 0
    res, err = relay(nats, "full", "vllm")
    assert "Failed to decode ZMQ KV batch" in err
    assert res["got"] == [0] * len(res["got"])
