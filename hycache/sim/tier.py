"""The second cache tier in the simulator: the real `StoreMirror` over a real `HostStore`,
with stand-in payloads that carry the size of the block they model.

The mirror decides what is put and what a lookup loads exactly as in the engine; only the
bytes are simulated. `SimBlockIO.read` returns a 9-byte payload naming the group's kind and
the bytes the block would hold on the modelled model (attention: rows x K/V bytes per token of
every cached attention layer, the drafter's included when it runs; SSM: one conv + SSM state
of every Mamba layer, from `CostModel`). The store counts a value as that many bytes
(`HostStore(size_of=...)`), so its capacity and LRU evictions behave as for real blocks, while
a bamba-9b SSM page (117 MiB) costs a few dozen bytes of host memory.

Costs (charged by the simulator, see `Simulator`):

* loads: on the critical path. The step that admits a request whose hit came (partly) from
  the store is longer by `StoreLink.load_time`: the bytes loaded over the link's read
  bandwidth plus one latency per round trip (the mirror's batched `exists`, then its batched
  `get`). The whole batch waits, as with a synchronous load before the forward: an upper
  bound on what an engine that overlaps loads with other requests' compute pays.
* puts: off the critical path (device-to-host copies on a side stream after the step that
  computed them), so not charged to any step; the bytes written and the fraction of the run
  the link would be busy writing are reported (`store_write_busy` > 1 would mean the link
  could not keep up).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from hycache.cache.manager import CacheManager
from hycache.config import GroupKind, HycacheConfig
from hycache.sim.costmodel import CostModel
from hycache.store import GB, check_store_gb
from hycache.store.codec import HEADER_BYTES, fingerprint, layout_parts
from hycache.store.host import HostStore

__all__ = [
    "STORE_LINKS",
    "SimBlockIO",
    "SimHostStore",
    "StoreLink",
    "TierConfig",
    "attach_sim_store",
    "sim_fingerprint",
]

_PAYLOAD = struct.Struct("<BQ")  # group kind (0 attention, 1 SSM), modelled bytes


@dataclass(frozen=True)
class StoreLink:
    """The path between the store and the device: bandwidths in bytes/s, latency per round
    trip in seconds."""

    name: str
    read_bandwidth: float  # store -> device (loads)
    write_bandwidth: float  # device -> store (puts)
    latency_s: float
    source: str = ""

    def __post_init__(self) -> None:
        if self.read_bandwidth <= 0 or self.write_bandwidth <= 0 or self.latency_s < 0:
            raise ValueError(f"store link {self.name!r}: bandwidths > 0 and latency >= 0")

    def load_time(self, nbytes: int, round_trips: int) -> float:
        """Seconds to bring `nbytes` in over `round_trips` requests to the store."""
        return nbytes / self.read_bandwidth + round_trips * self.latency_s


STORE_LINKS: dict[str, StoreLink] = {
    # Host DRAM over PCIe 5.0 x16 (H100/H200 SXM): 64 GB/s per direction raw, ~50 GB/s for a
    # large pinned cudaMemcpy; paged blocks are gathered/scattered through pinned staging
    # buffers, so about half of that is taken as effective (LMCache and vLLM's CPU offloading
    # report 20-30 GB/s per GPU). Latency: a copy launch and a synchronisation.
    "host": StoreLink(
        "host",
        read_bandwidth=25e9,
        write_bandwidth=25e9,
        latency_s=10e-6,
        source="PCIe 5.0 x16 = 64 GB/s raw; ~50 GB/s pinned memcpy; halved for paged gathers",
    ),
    # Mooncake Store across machines: the transfer engine moves data GPU <-> remote DRAM over
    # RDMA (GPUDirect); the Mooncake paper (FAST'25) reports 87 GB/s over 4 x 200 Gbps RoCE
    # NICs, about 22 GB/s per NIC; one NIC per GPU is assumed. Latency: an RPC to the master
    # (exists, placement) plus the RDMA setup, tens of microseconds to ~0.1 ms.
    "rdma": StoreLink(
        "rdma",
        read_bandwidth=22e9,
        write_bandwidth=22e9,
        latency_s=100e-6,
        source="Mooncake (FAST'25): 87 GB/s on 4x200 Gbps RoCE -> ~22 GB/s per NIC; one per GPU",
    ),
}


@dataclass(frozen=True)
class TierConfig:
    """A simulated second tier: its capacity (GiB, as `--kv-store-gb`) and its link."""

    capacity_gb: float
    link: StoreLink = STORE_LINKS["host"]

    def __post_init__(self) -> None:
        check_store_gb(self.capacity_gb)

    @property
    def capacity_bytes(self) -> int:
        return int(self.capacity_gb * GB)


def modelled_size(value: bytes) -> int:
    """What a stored stand-in value counts for: its frame plus the block it models. Other
    objects (a block's unit index: 16-byte keys) count as their own bytes."""
    if len(value) != HEADER_BYTES + _PAYLOAD.size:
        return len(value)
    _, nbytes = _PAYLOAD.unpack_from(value, HEADER_BYTES)
    return len(value) + nbytes


class SimHostStore(HostStore):
    """A `HostStore` whose values count as the blocks they model, and that counts its `get`
    round trips (the mirror makes one per fetch) for the load latency."""

    def __init__(self, capacity_bytes: int) -> None:
        super().__init__(capacity_bytes, size_of=modelled_size)
        self.get_calls = 0

    def get(self, keys: list[str]) -> list[bytes | None]:  # type: ignore[override]
        self.get_calls += 1
        return super().get(keys)

    @property
    def round_trips(self) -> int:
        return self.stats.exists_calls + self.get_calls


class SimBlockIO:
    """A `BlockIO` with no tensors: payloads name the modelled size; loads are counted."""

    def __init__(
        self, groups: tuple[GroupKind, ...], attention_row_bytes: int, ssm_page_bytes: int
    ) -> None:
        self.groups = groups
        self.attention_row_bytes = attention_row_bytes
        self.ssm_page_bytes = ssm_page_bytes
        self.loaded_bytes = 0  # modelled bytes written into device blocks (store -> device)
        self.loaded_objects = 0

    def modelled_bytes(self, group: int, rows: int) -> int:
        if self.groups[group] is GroupKind.SSM:
            return self.ssm_page_bytes
        return rows * self.attention_row_bytes

    def read(self, group: int, block: int, rows: int) -> bytes:
        kind = 1 if self.groups[group] is GroupKind.SSM else 0
        return _PAYLOAD.pack(kind, self.modelled_bytes(group, rows))

    def write(self, group: int, block: int, payload: bytes) -> None:
        _, nbytes = _PAYLOAD.unpack(payload)
        self.loaded_bytes += nbytes
        self.loaded_objects += 1

    def payload_bytes(self, group: int, rows: int) -> int:
        return _PAYLOAD.size


def sim_fingerprint(config: HycacheConfig, cost: CostModel | None) -> str:
    """What makes two simulated instances' objects interchangeable (the engine's fingerprint,
    with the model preset's name standing in for its weights)."""
    model = cost.model.name if cost is not None else None
    return fingerprint({"model": model, **layout_parts(config)})


def attach_sim_store(
    cache: CacheManager, store: SimHostStore, config: HycacheConfig, cost: CostModel | None
) -> SimBlockIO:
    """Mirror `cache` into `store` (which other instances may share), objects sized by `cost`
    (unsized without one: a value then counts as its few bytes)."""
    row = cost.attention_bytes_per_token if cost is not None else 0
    page = cost.model.ssm_state_bytes if cost is not None else 0
    io = SimBlockIO(cache.config.groups, row, page)
    fp = sim_fingerprint(config, cost)
    cache.attach_store(store, fp, io)
    return io
