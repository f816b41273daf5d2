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
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from hycache.store.base import KVStore

LOCAL_BUFFER_BYTES = 128 << 20  # the client's staging buffer: the largest object it moves
RETRY_SECONDS = 2.0


def parse_url(url: str) -> tuple[str, int]:
    """`mooncake://HOST:PORT` -> (host, port), with a clear error for anything else."""
    parts = urlsplit(url)
    if parts.scheme != "mooncake" or not parts.hostname or parts.path not in ("", "/"):
        raise ValueError(f"kv-store: expected mooncake://HOST:PORT, got {url!r}")
    try:
        port = parts.port
    except ValueError:
        port = None
    if port is None or not 0 < port < 65536:
        raise ValueError(f"kv-store: {url!r} needs a port in 1..65535 (the master's -rpc_port)")
    return parts.hostname, port


def _quiet_native_logs() -> None:
    # the native client logs every failed RPC; hycache counts and warns once instead
    os.environ.setdefault("GLOG_minloglevel", "3")
    os.environ.setdefault("MC_LOG_LEVEL", "ERROR")


class MooncakeStore(KVStore):
    name = "mooncake"

    def __init__(self, url: str, segment_bytes: int, *, local_hostname: str | None = None) -> None:
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
        self._connect()

    # -- connection ---------------------------------------------------------------------------

    def _reachable(self) -> bool:
        try:
            with socket.create_connection((self.host, self.port), timeout=0.5):
                return True
        except OSError:
            return False

    def _connect(self) -> bool:
        """Join the store if the master answers; else back off (a miss until then)."""
        if not self._reachable():
            self._down(f"mooncake master {self.host}:{self.port} is unreachable")
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

    def _down(self, message: str) -> None:
        self.stats.errors += 1
        self.stats.warn_once("unreachable", f"{message}; serving continues without the store")
        self._retry_at = time.monotonic() + RETRY_SECONDS

    def _ready(self) -> bool:
        """Whether to call the store now: not while backing off, and after a failure only
        once the master's port answers again (a call against a dead master blocks for
        seconds in the client's RPC timeout)."""
        if time.monotonic() < self._retry_at:
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
        codes = self._client.batch_is_exist(list(keys))
        if any(c < 0 for c in codes):
            self._failed(min(codes))
            return [False] * len(keys)
        return [c == 1 for c in codes]

    def get(self, keys: Sequence[str]) -> list[bytes | None]:
        self.stats.get_keys += len(keys)
        if not keys or not self._ready():
            self.stats.get_misses += len(keys)
            return [None] * len(keys)
        values = self._client.get_batch(list(keys))
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
        for key, value in items:
            if len(value) > LOCAL_BUFFER_BYTES:
                self.stats.put_refused += 1
                self.stats.warn_once(
                    "too-large", f"mooncake store: an object of {len(value)} bytes is refused"
                )
                out.append(False)
                continue
            rc = self._client.put(key, value)
            if rc == 0:
                self.stats.puts += 1
                self.stats.put_bytes += len(value)
                self._put_bytes += len(value)
                out.append(True)
                continue
            self.stats.put_refused += 1
            if rc == -900:  # RPC_FAIL: the master is gone
                self._failed(rc)
                rest = len(items) - len(out)  # this item and every one after it
                self.stats.put_refused += rest - 1
                out.extend([False] * rest)
                break
            self.stats.warn_once("refused", f"mooncake store refused a put ({rc}): store full?")
            out.append(False)
        return out

    def remove(self, keys: Sequence[str]) -> int:
        if not keys or not self._ready():
            return 0
        # force: a removal is for bad objects, which a reader's lease must not keep alive
        n = sum(1 for rc in self._client.batch_remove(list(keys), True) if rc == 0)
        self.stats.removed += n
        return n

    @property
    def capacity_bytes(self) -> int:
        return self.segment_bytes

    @property
    def used_bytes(self) -> int:
        return self._put_bytes  # what this process put; the master evicts on its own

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
