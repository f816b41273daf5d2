"""The store's building blocks: value framing (a bad object is a miss) and the host LRU."""

from __future__ import annotations

import pytest

from hycache.store import HostStore, codec, open_store


def test_a_framed_value_round_trips_under_its_own_name_only() -> None:
    name = codec.object_name("fp", 0, 16, b"\x01" * 16)
    value = codec.encode(name, b"payload")
    assert codec.decode(name, value) == b"payload"
    other = codec.object_name("fp", 0, 32, b"\x01" * 16)
    assert codec.decode(other, value) is None  # another key's value is never a hit


@pytest.mark.parametrize(
    "damage",
    [
        lambda v: v[:-1],  # truncated
        lambda v: v[: codec.HEADER_BYTES - 1],  # half a header
        lambda v: v[:-1] + bytes([v[-1] ^ 1]),  # one bit flipped in the payload
        lambda v: b"XXXX" + v[4:],  # not ours
        lambda v: b"",
    ],
)
def test_a_damaged_value_decodes_to_a_miss(damage) -> None:
    name = codec.object_name("fp", 1, 8, b"\x02" * 16)
    assert codec.decode(name, damage(codec.encode(name, b"x" * 100))) is None


def test_the_fingerprint_changes_with_anything_that_changes_the_bytes() -> None:
    base = {"model": {"hidden": 64}, "dtype": "float32", "block_size": 16}
    assert codec.fingerprint(base) == codec.fingerprint(dict(base))
    for key, value in [("dtype", "bfloat16"), ("block_size", 32), ("model", {"hidden": 65})]:
        assert codec.fingerprint({**base, key: value}) != codec.fingerprint(base)


def test_host_store_evicts_least_recently_used_to_fit() -> None:
    s = HostStore(capacity_bytes=30)
    assert s.put([("a", b"1" * 10), ("b", b"2" * 10), ("c", b"3" * 10)]) == [True] * 3
    assert s.get(["a"]) == [b"1" * 10]  # a is now the most recent
    assert s.put([("d", b"4" * 10)]) == [True]
    assert s.exists(["a", "b", "c", "d"]) == [True, False, True, True]
    assert s.used_bytes == 30 and s.evictions == 1


def test_host_store_refuses_what_can_never_fit_and_keeps_first_values() -> None:
    s = HostStore(capacity_bytes=16)
    assert s.put([("big", b"x" * 17), ("k", b"first")]) == [False, True]
    assert s.put([("k", b"second")]) == [True]
    assert s.get(["k", "big"]) == [b"first", None]
    assert s.stats.put_refused == 1 and s.stats.get_misses == 1
    assert s.remove(["k", "nope"]) == 1 and s.used_bytes == 0


@pytest.mark.parametrize(
    ("spec", "gb", "message"),
    [
        ("disk", 1.0, "expected 'host' or 'mooncake://HOST:PORT'"),
        ("host", 0.0, "must be a number > 0 and at most 1048576"),
        ("host", float("nan"), "must be a number > 0 and at most 1048576"),
        ("host", float("inf"), "must be a number > 0 and at most 1048576"),
        ("host", 1e300, "must be a number > 0 and at most 1048576"),
        ("mooncake://evil host:5", 1.0, "is not a host name or address"),
        ("mooncake://127.0.0.1", 1.0, "needs a port"),
        ("mooncake://127.0.0.1:99999", 1.0, "needs a port"),
        ("mooncake://:5000", 1.0, "expected mooncake://HOST:PORT"),
    ],
)
def test_bad_store_specs_are_refused_clearly(spec: str, gb: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        open_store(spec, gb)
