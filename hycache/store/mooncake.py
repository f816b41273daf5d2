"""`mooncake`: the real Mooncake Store, shared by every process on one `mooncake_master`.

    mooncake_master -rpc_address 127.0.0.1 -rpc_port 50051       # one command, one master
    hycache serve --kv-store mooncake://127.0.0.1:50051 --kv-store-gb 4

Each hycache process joins as a Mooncake client: it mounts `kv_store_gb` of its own memory into
the store (objects any client puts may land in any client's segment) and reads and writes over
the transfer engine's TCP transport. Clients use peer-to-peer handshakes (no metadata server)
and advertise 127.0.0.1 unless told otherwise (`MOONCAKE_LOCAL_HOSTNAME`): left to itself the
transfer engine advertises the machine's external address.

Faults never reach the caller: when the master is absent or stops answering, every call is a
miss (or a refused put), warned once and counted, and the client backs off; it probes the
master's port before trying again, so a dead master costs no RPC timeouts, and store hits
resume once the master is back (its objects are gone: Mooncake keeps them in memory).

Every native call runs on one thread of the store's own (`_CallThread`) and the caller waits
for it at most `call_timeout` seconds (`setup_timeout` for joining the store). A master that
is alive but stops answering (SIGSTOP, a hung host: its port still accepts connections, so a
port probe cannot tell) thus costs one call's deadline; from then on every call is a miss at
once, without touching the client, until the stuck call has returned and a probe call on that
thread gets an answer again. A setup that never ends (something else listens on the port)
leaves the store a miss for good, warned once; `serve` and `generate` carry on without it.

A batch of puts (the mirror's flush at the end of an engine step) has its own deadline,
`flush_timeout`, over all its calls: what is left when it passes is refused (a later flush
writes what the store still lacks). A put whose transfer fails (a peer whose segment the
master chose has died: each such put costs about a second of retries inside the client)
skips the rest of its batch, so one dead peer costs one failed transfer per flush, never one
per object.
"""

from __future__ import annotations

import ipaddress
import os
import queue
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any
from urllib.parse import urlsplit

from hycache.store.base import KVStore

LOCAL_BUFFER_BYTES = 128 << 20  # the client's staging buffer: the largest object it moves
RETRY_SECONDS = 2.0
CALL_TIMEOUT_S = 2.0  # the longest a store call may hold the engine's step
FLUSH_TIMEOUT_S = 2.0  # the longest one batch of puts (a flush) may hold it, all calls together
# Mooncake's ErrorCode values that `put` returns
NO_AVAILABLE_HANDLE = -200  # no segment has room: the store is full
TRANSFER_FAIL = -800  # the transfer into the chosen segment failed: its owner may be gone
RPC_FAIL = -900  # the master did not answer
SETUP_TIMEOUT_S = 10.0  # joining the store (a live master answers in well under a second)
PROBE_KEY = "hycache-probe"  # what a hung store asks until the master answers again
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*\.?")


def valid_host(host: str) -> bool:
    """An IP address or a DNS name (letters, digits, hyphens, dots; no spaces)."""
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return len(host) <= 253 and _HOSTNAME.fullmatch(host) is not None


def parse_url(url: str) -> tuple[str, int]:
    """`mooncake://HOST:PORT` -> (host, port), with a clear error for anything else."""
    parts = urlsplit(url)
    if parts.scheme != "mooncake" or not parts.hostname or parts.path not in ("", "/"):
        raise ValueError(f"kv-store: expected mooncake://HOST:PORT, got {url!r}")
    if (
        parts.username is not None
        or parts.query
        or parts.fragment
        or not valid_host(parts.hostname)
    ):
        raise ValueError(f"kv-store: {url!r}: {parts.hostname!r} is not a host name or address")
    try:
        port = parts.port
    except ValueError:
        port = None
    if port is None or not 0 < port < 65536:
        raise ValueError(f"kv-store: {url!r} needs a port in 1..65535 (the master's -rpc_port)")
    return parts.hostname, port


PROBE_RETRY_SECONDS = 30.0  # after a failed probe (no master there), before the next
_PROBE = """
import sys
from mooncake.store import MooncakeDistributedStore
client = MooncakeDistributedStore()
rc = client.setup(sys.argv[1], "P2PHANDSHAKE", 0, 1 << 20, "tcp", "", sys.argv[2])
client.close()
sys.exit(0 if rc == 0 else 3)
"""


def probe_master(host: str, port: int, local_hostname: str, timeout: float) -> bool:
    """Whether a Mooncake master at host:port takes a client within `timeout` seconds, tried
    by a client in a child process (mounting no memory) that is killed at the deadline."""
    env = {**os.environ, "GLOG_minloglevel": "3", "MC_LOG_LEVEL": "ERROR"}
    argv = [sys.executable, "-c", _PROBE, local_hostname, f"{host}:{port}"]
    try:
        done = subprocess.run(
            argv, env=env, timeout=timeout, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
    except (subprocess.TimeoutExpired, OSError):
        return False
    return done.returncode == 0


def _quiet_native_logs() -> None:
    # the native client logs every failed RPC; hycache counts and warns once instead
    os.environ.setdefault("GLOG_minloglevel", "3")
    os.environ.setdefault("MC_LOG_LEVEL", "ERROR")


class _CallThread:
    """One daemon thread running the native client's calls in order; `run` waits for one at
    most `timeout` seconds. (A daemon: a call stuck for good never holds the process's exit.)"""

    def __init__(self) -> None:
        self._inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name="hycache-mooncake", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            item = self._inbox.get()
            if item is None:
                return
            fn, future = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as e:
                future.set_exception(e)

    def submit(self, fn: Callable[[], Any]) -> Future[Any]:
        future: Future[Any] = Future()
        self._inbox.put((fn, future))
        return future

    def stop(self) -> None:
        self._inbox.put(None)


class MooncakeStore(KVStore):
    name = "mooncake"

    def __init__(
        self,
        url: str,
        segment_bytes: int,
        *,
        local_hostname: str | None = None,
        call_timeout: float = CALL_TIMEOUT_S,
        setup_timeout: float = SETUP_TIMEOUT_S,
        flush_timeout: float = FLUSH_TIMEOUT_S,
    ) -> None:
        super().__init__()
        self.host, self.port = parse_url(url)
        if segment_bytes <= 0:
            raise ValueError(f"kv_store_gb: must be > 0, got {segment_bytes} bytes")
        self.url = url
        self.segment_bytes = int(segment_bytes)
        self.local_hostname = local_hostname or os.environ.get(
            "MOONCAKE_LOCAL_HOSTNAME", "127.0.0.1"
        )
        _quiet_native_logs()
        try:
            from mooncake.store import MooncakeDistributedStore
        except ImportError as e:  # pragma: no cover - depends on the install
            raise ValueError(
                "kv-store mooncake: the Mooncake client is not installed; "
                "pip install mooncake-transfer-engine-non-cuda (and, for its libibverbs, "
                "apt-get install libibverbs1)"
            ) from e
        self._factory = MooncakeDistributedStore
        self._client: Any = None
        self._retry_at = 0.0
        self._suspect = False  # a call failed: probe the master's port before the next
        self._put_bytes = 0
        self.call_timeout = call_timeout
        self.setup_timeout = setup_timeout
        self.flush_timeout = flush_timeout
        self._calls = _CallThread()
        self._hung = False  # a call overran its deadline: miss at once until one answers
        self._closed = False
        self._verified = False  # a probe found a master at the address (see `_connect`)
        self._verifying: threading.Thread | None = None
        self._connect(wait=True)

    # -- calls with a deadline ------------------------------------------------------------------

    def _call(self, fn: Callable[[], Any]) -> tuple[bool, Any]:
        """(True, fn()) run on the call thread, or (False, None) when the store is hung or
        closed, or `fn` overran its deadline (which makes the store hung: warned once)."""
        if self._hung or self._closed:
            return False, None
        timeout = self.call_timeout
        future = self._calls.submit(fn)
        try:
            return True, future.result(timeout)
        except FutureTimeout:
            self._hung = True
            self.stats.errors += 1
            self.stats.warn_once(
                "hung",
                f"mooncake store at {self.host}:{self.port} did not answer within "
                f"{timeout:g} s; its calls are misses until it answers again",
            )
            future.add_done_callback(lambda _: self._calls.submit(self._recover))
            return False, None

    def _recover(self) -> None:
        """On the call thread, once the stuck call has returned: probe until the master answers
        (each probe waits out the client's own RPC timeout while it does not)."""
        while self._hung and not self._closed and self._client is not None:
            codes = self._client.batch_is_exist([PROBE_KEY])
            if codes and min(codes) >= 0:
                break
            time.sleep(RETRY_SECONDS)
        self._hung = False

    # -- connection ---------------------------------------------------------------------------

    def _reachable(self) -> bool:
        try:
            with socket.create_connection((self.host, self.port), timeout=0.5):
                return True
        except OSError:
            return False

    def _connect(self, wait: bool = False) -> bool:
        """Join the store if the master answers; else back off (a miss until then). The native
        setup holds the GIL and, against a server that is no master, retries for ever, so a
        master is first proven by `probe_master` in a child process: waited for (up to
        `setup_timeout`) when the store opens (`wait`), in the background on a reconnect."""
        if not self._reachable():
            self._down(f"mooncake master {self.host}:{self.port} is unreachable")
            return False
        if not self._verify(wait):
            return False
        client = self._factory()
        rc = client.setup(
            self.local_hostname,
            "P2PHANDSHAKE",
            self.segment_bytes,
            LOCAL_BUFFER_BYTES,
            "tcp",
            "",
            f"{self.host}:{self.port}",
        )
        if rc != 0:
            self._down(f"mooncake client setup against {self.host}:{self.port} failed ({rc})")
            return False
        self._client = client
        return True

    def _verify(self, wait: bool) -> bool:
        """Whether a probe has shown a master at the address (starting one if none runs)."""
        if self._verified:
            return True
        if self._verifying is None or not self._verifying.is_alive():
            self._verifying = threading.Thread(
                target=self._run_probe, name="hycache-mooncake-probe", daemon=True
            )
            self._verifying.start()
        if wait:
            self._verifying.join()
        return self._verified

    def _run_probe(self) -> None:
        if probe_master(self.host, self.port, self.local_hostname, self.setup_timeout):
            self._verified = True
            return
        self.stats.errors += 1
        self.stats.warn_once(
            "setup",
            f"mooncake client setup against {self.host}:{self.port} did not finish within "
            f"{self.setup_timeout:g} s (is a mooncake_master listening there?); serving "
            "continues without the store",
        )
        self._retry_at = time.monotonic() + PROBE_RETRY_SECONDS

    def _down(self, message: str) -> None:
        self.stats.errors += 1
        self.stats.warn_once("unreachable", f"{message}; serving continues without the store")
        self._retry_at = time.monotonic() + RETRY_SECONDS

    def _ready(self) -> bool:
        """Whether to call the store now: not while backing off, and after a failure only
        once the master's port answers again (a call against a dead master blocks for
        seconds in the client's RPC timeout)."""
        if self._hung or self._closed or time.monotonic() < self._retry_at:
            return False
        if self._client is None:
            return self._connect()
        if self._suspect:
            if not self._reachable():
                self._down(f"mooncake master {self.host}:{self.port} is unreachable")
                return False
            self._suspect = False
        return True

    def _failed(self, rc: int) -> None:
        """A call failed. A master that is gone: back off, and probe its port before the next
        call. One that answers (a restarted master takes the client back on its next call):
        go on at once."""
        self.stats.errors += 1
        self.stats.warn_once("call", f"mooncake store call failed ({rc}); counted as a miss")
        if not self._reachable():
            self._down(f"mooncake master {self.host}:{self.port} is unreachable")
            self._suspect = True

    # -- the interface --------------------------------------------------------------------------

    def exists(self, keys: Sequence[str]) -> list[bool]:
        self.stats.exists_calls += 1
        self.stats.exists_keys += len(keys)
        if not keys or not self._ready():
            return [False] * len(keys)
        client = self._client
        answered, codes = self._call(lambda: client.batch_is_exist(list(keys)))
        if not answered:
            return [False] * len(keys)
        if any(c < 0 for c in codes):
            self._failed(min(codes))
            return [False] * len(keys)
        return [c == 1 for c in codes]

    def get(self, keys: Sequence[str]) -> list[bytes | None]:
        self.stats.get_keys += len(keys)
        if not keys or not self._ready():
            self.stats.get_misses += len(keys)
            return [None] * len(keys)
        client = self._client
        answered, values = self._call(lambda: client.get_batch(list(keys)))
        if not answered:
            self.stats.get_misses += len(keys)
            return [None] * len(keys)
        out: list[bytes | None] = []
        for v in values:
            if v:
                self.stats.get_hits += 1
                out.append(bytes(v))
            else:
                self.stats.get_misses += 1
                out.append(None)
        return out

    def put(self, items: Sequence[tuple[str, bytes]]) -> list[bool]:
        if not items or not self._ready():
            self.stats.put_refused += len(items)
            return [False] * len(items)
        out: list[bool] = []
        deadline = time.monotonic() + self.flush_timeout

        def skip_rest(kind: str, message: str) -> None:
            rest = len(items) - len(out)
            self.stats.put_refused += rest
            out.extend([False] * rest)
            if message:
                self.stats.warn_once(kind, message)

        for key, value in items:
            if time.monotonic() > deadline:
                skip_rest(
                    "flush-deadline",
                    f"mooncake store: a batch of puts overran its {self.flush_timeout:g} s "
                    "deadline; the rest of it is skipped",
                )
                break
            if len(value) > LOCAL_BUFFER_BYTES:
                self.stats.put_refused += 1
                self.stats.warn_once(
                    "too-large", f"mooncake store: an object of {len(value)} bytes is refused"
                )
                out.append(False)
                continue
            client = self._client
            answered, rc = self._call(lambda c=client, k=key, v=value: c.put(k, v))
            if not answered:  # hung: this put and every one after it are refused
                skip_rest("", "")
                break
            if rc == 0:
                self.stats.puts += 1
                self.stats.put_bytes += len(value)
                self._put_bytes += len(value)
                out.append(True)
                continue
            if rc == RPC_FAIL:  # the master is gone
                self._failed(rc)
                skip_rest("", "")
                break
            if rc == TRANSFER_FAIL:
                self.stats.errors += 1
                skip_rest(
                    "transfer",
                    f"mooncake store: a put's transfer failed ({rc}): the peer holding the "
                    "segment it was given may be gone; the rest of that batch is skipped",
                )
                break
            self.stats.put_refused += 1
            if rc == NO_AVAILABLE_HANDLE:
                self.stats.warn_once("full", f"mooncake store is full ({rc}); a put is refused")
            else:
                self.stats.warn_once("refused", f"mooncake store refused a put ({rc})")
            out.append(False)
        return out

    def remove(self, keys: Sequence[str]) -> int:
        if not keys or not self._ready():
            return 0
        # force: a removal is for bad objects, which a reader's lease must not keep alive
        client = self._client
        answered, codes = self._call(lambda: client.batch_remove(list(keys), True))
        if not answered:
            return 0
        n = sum(1 for rc in codes if rc == 0)
        self.stats.removed += n
        return n

    @property
    def capacity_bytes(self) -> int:
        return self.segment_bytes

    @property
    def used_bytes(self) -> int:
        return self._put_bytes  # what this process put; the master evicts on its own

    def close(self) -> None:
        """Close the client (unless a call is stuck: then it is left to the process's exit)."""
        client, self._client = self._client, None
        if client is not None:
            self._call(client.close)
        self._closed = True  # nothing more goes to the call thread
        self._calls.stop()
