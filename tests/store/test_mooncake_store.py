"""The `mooncake` backend against a real `mooncake_master` on loopback ports (started here,
stopped here): the interface, an engine resuming from it, two processes sharing one master,
and the faults (master absent at start, killed mid-run, back again)."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from hycache.engine.engine import LLM
from hycache.request import SamplingParams
from tests.helpers import GEOMETRY, HANG_S, SP, assert_no_leaks, family, noise, replay

mooncake = pytest.importorskip("mooncake.store", reason="mooncake-transfer-engine not installed")

from hycache.store.master import MooncakeMaster, free_port  # noqa: E402
from hycache.store.mooncake import RETRY_SECONDS, MooncakeStore  # noqa: E402

SEGMENT = 64 << 20
KW = {**GEOMETRY, "num_speculative_tokens": 2}


@pytest.fixture(scope="module")
def master() -> Iterator[MooncakeMaster]:
    try:
        m = MooncakeMaster().start()
    except RuntimeError as e:  # e.g. libibverbs missing: `make setup` installs it
        pytest.skip(f"mooncake_master cannot start here: {e}")
    yield m
    m.stop()


def test_mooncake_store_batched_interface(master: MooncakeMaster) -> None:
    store = MooncakeStore(master.url, SEGMENT)
    try:
        assert store.put([("t/a", b"1" * 100), ("t/b", b"2" * 50)]) == [True, True]
        assert store.put([("t/a", b"other")]) == [True]  # immutable: the first value stays
        assert store.exists(["t/a", "t/b", "t/c"]) == [True, True, False]
        assert store.get(["t/a", "t/c"]) == [b"1" * 100, None]
        assert store.remove(["t/a", "t/c"]) == 1
        assert store.exists(["t/a"]) == [False]
        too_big = b"x" * ((128 << 20) + 1)
        assert store.put([("t/big", too_big)]) == [False]
        assert store.stats.put_refused == 1
    finally:
        store.close()


def test_mooncake_engine_resumes_a_sibling_from_the_store(master: MooncakeMaster) -> None:
    fam = family(seed=11)
    want = LLM("tiny", enable_prefix_caching=False, **KW).generate([fam[2]], SP)[0].token_ids
    device = replay(LLM("tiny", **KW), evict=False, seed=11)
    llm = LLM("tiny", num_blocks=40, kv_store=master.url, kv_store_gb=0.0625, **KW)
    out = replay(llm, seed=11)
    assert out.hit_tokens == device.hit_tokens > 0 and out.store_hit_tokens > 0
    assert out.token_ids == want
    assert_no_leaks(llm)
    assert llm.store is not None
    llm.store.close()


PRODUCER = textwrap.dedent(
    """
    import sys
    from hycache.engine.engine import LLM
    from tests.helpers import GEOMETRY, SP, family
    llm = LLM("tiny", kv_store=sys.argv[1], kv_store_gb=0.0625, num_speculative_tokens=2,
              **GEOMETRY)
    fam = family(seed=12)
    llm.generate([fam[0]], SP)
    llm.generate([fam[1]], SP)
    print("ready", flush=True)
    sys.stdin.read()  # keep this client's segment mounted until the test is done
    """
)


def test_mooncake_two_processes_share_one_master(master: MooncakeMaster) -> None:
    fam = family(seed=12)
    want = LLM("tiny", enable_prefix_caching=False, **KW).generate([fam[2]], SP)[0].token_ids
    expected = LLM("tiny", **KW)
    expected.generate([fam[0]], SP)
    expected.generate([fam[1]], SP)
    limit_hit = expected.generate([fam[2]], SP)[0].hit_tokens
    producer = subprocess.Popen(
        [sys.executable, "-c", PRODUCER, master.url],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert producer.stdout is not None and producer.stdout.readline().strip() == "ready"
        consumer = LLM("tiny", kv_store=master.url, kv_store_gb=0.0625, **KW)
        out = consumer.generate([fam[2]], SP)[0]
        assert out.hit_tokens == out.store_hit_tokens == limit_hit > 0
        assert out.token_ids == want
        assert consumer.store is not None
        consumer.store.close()
    finally:
        producer.communicate(input="", timeout=60)
    assert producer.returncode == 0


def assert_store_hits_resume(llm: LLM, seed: int) -> None:
    """Once the master answers again (after the client's back-off, and, when the client never
    joined, a probe in the background), a new family's evicted prefix is served from the
    store."""
    time.sleep(RETRY_SECONDS + 0.2)
    store = llm.store
    assert store is not None
    deadline = time.monotonic() + HANG_S
    while store._client is None:  # type: ignore[attr-defined]
        store.exists(["probe"])  # (re)joins once the background probe found the master
        assert time.monotonic() < deadline, "the client never rejoined"
        time.sleep(0.2)
    fam = family(seed=seed)
    llm.generate([fam[0]], SP)
    llm.generate([fam[1]], SP)
    for prompt in noise(seed=seed + 1):
        llm.generate([prompt], SP)
    assert llm.generate([fam[2]], SP)[0].store_hit_tokens > 0


def test_mooncake_master_absent_then_back(caplog: pytest.LogCaptureFixture) -> None:
    port = free_port()
    fam = family(seed=13)
    want = LLM("tiny", enable_prefix_caching=False, **KW).generate([fam[2]], SP)[0].token_ids
    with caplog.at_level(logging.WARNING, logger="hycache.store"):
        llm = LLM("tiny", num_blocks=40, kv_store=f"mooncake://127.0.0.1:{port}", **KW)
        out = replay(llm, seed=13)
    assert out.token_ids == want and out.store_hit_tokens == 0
    store = llm.store
    assert store is not None and store.stats.errors >= 1
    warnings = [r for r in caplog.records if "unreachable" in r.getMessage()]
    assert len(warnings) == 1  # warned once, counted every time
    with MooncakeMaster(port=port):
        assert_store_hits_resume(llm, seed=14)
        store.close()
    assert_no_leaks(llm)


def test_mooncake_master_killed_mid_run_then_restarted() -> None:
    port = free_port()
    master = MooncakeMaster(port=port).start()
    llm = LLM("tiny", num_blocks=40, kv_store=f"mooncake://127.0.0.1:{port}", **KW)
    reference = LLM("tiny", enable_prefix_caching=False, **KW)
    try:
        fam = family(seed=16)
        llm.generate(fam[:2], SP)
        master.kill()
        prompts = [*noise(seed=17), fam[2]]
        outs = llm.generate(prompts, SP)  # serving goes on: misses, refused puts
        assert [o.token_ids for o in outs] == [o.token_ids for o in reference.generate(prompts, SP)]
        assert llm.store is not None and llm.store.stats.errors >= 1
        master = MooncakeMaster(port=port).start()  # empty: Mooncake keeps objects in memory
        assert_store_hits_resume(llm, seed=18)  # a family the device never held
        assert_no_leaks(llm)
    finally:
        if llm.store is not None:
            llm.store.close()
        master.stop()


def test_a_server_that_is_no_master_costs_only_hits(caplog: pytest.LogCaptureFixture) -> None:
    """Something else listening at the master's address (an HTTP server) passes the port
    probe, but the client's setup there never ends: the store opens within its setup deadline,
    warned once, and the engine generates without it."""
    port = free_port()
    http = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + HANG_S
        while not MooncakeStore._reachable(type("P", (), {"host": "127.0.0.1", "port": port})()):  # type: ignore[arg-type]
            assert time.monotonic() < deadline
            time.sleep(0.05)
        fam = family(seed=21)
        want = LLM("tiny", enable_prefix_caching=False, **KW).generate([fam[2]], SP)[0].token_ids
        # the open must end (a hang's bound); its setup deadline counts one error
        stores: list[MooncakeStore] = []
        opened = threading.Thread(target=lambda: stores.append(open_store(port, caplog)))
        opened.start()
        opened.join(HANG_S)
        assert stores, "opening the store hung"
        store = stores[0]
        assert store.stats.errors == 1
        assert [r.getMessage() for r in caplog.records if "setup" in r.getMessage()]
        llm = LLM("tiny", num_blocks=40, kv_store=store, **KW)
        out = replay(llm, seed=21)
        assert out.token_ids == want and out.store_hit_tokens == 0
        # no store call could wait out a deadline: the client never joined, so every call was
        # a miss without a native call (the setup probes retry in the background)
        assert store._client is None  # type: ignore[attr-defined]
        store.close()
        assert_no_leaks(llm)
    finally:
        http.terminate()
        http.wait(10)


def open_store(port: int, caplog: pytest.LogCaptureFixture) -> MooncakeStore:
    with caplog.at_level(logging.WARNING, logger="hycache.store"):
        return MooncakeStore(f"mooncake://127.0.0.1:{port}", SEGMENT, setup_timeout=3)


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t = time.monotonic()
    out = fn()
    return time.monotonic() - t, out


@pytest.mark.slow
def test_a_hung_master_costs_one_deadline_then_only_hits() -> None:
    """A master that stops answering (SIGSTOP: its port still accepts connections) while a
    200-token request runs: the first store call waits out its deadline, every later one is a
    miss at once; the tokens equal an engine without caching; once the master goes on, store
    hits resume."""
    import os
    import signal

    port = free_port()
    master = MooncakeMaster(port=port).start()
    kw = {**KW, "max_model_len": 512}
    llm = LLM("tiny", num_blocks=80, kv_store=f"mooncake://127.0.0.1:{port}", **kw)
    reference = LLM("tiny", enable_prefix_caching=False, **kw)
    long = SamplingParams(max_tokens=200, ignore_eos=True)
    try:
        fam = family(seed=22)
        llm.generate(fam[:2], SP)
        assert master.proc is not None and llm.store is not None
        other = noise(seed=23, n=1)[0]
        timeout = llm.store.call_timeout  # type: ignore[attr-defined]
        os.kill(master.proc.pid, signal.SIGSTOP)
        errors = llm.store.stats.errors
        out = llm.generate([fam[2]], long)[0]
        assert out.token_ids == reference.generate([fam[2]], long)[0].token_ids
        assert llm.store._hung  # type: ignore[attr-defined]
        # one call waited out its deadline (each that does counts an error), no other did
        assert llm.store.stats.errors == errors + 1
        # once hung, no call reaches the client: a request costs what the control (the same
        # work with no store at all) does, timed just before and after it under the same load
        control_before, _ = timed(lambda: reference.generate([other], long))
        after, again = timed(lambda: llm.generate([other], long)[0])
        control_after, _ = timed(lambda: reference.generate([other], long))
        control = max(control_before, control_after)
        print(f"200 tokens once the master hung: {after:.2f}s (control without a store: "
              f"{control_before:.2f}s, {control_after:.2f}s)")  # fmt: skip
        assert again.store_hit_tokens == 0
        assert llm.store.stats.errors == errors + 1
        assert after < 2 * control + timeout / 2
        os.kill(master.proc.pid, signal.SIGCONT)
        deadline = time.monotonic() + HANG_S
        while llm.store is not None and llm.store._hung:  # type: ignore[attr-defined]
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert_store_hits_resume(llm, seed=24)
        assert_no_leaks(llm)
    finally:
        if master.proc is not None:
            os.kill(master.proc.pid, signal.SIGCONT)
        if llm.store is not None:
            llm.store.close()
        master.stop()
