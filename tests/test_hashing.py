from __future__ import annotations

import random

from hycache.hashing import PrefixHashes, extra_key_bytes


def hashes(tokens: list[int], unit: int = 4, seed: int = 0, extra: bytes = b"") -> PrefixHashes:
    h = PrefixHashes(unit, seed, extra)
    h.extend(tokens)
    return h


def test_incremental_equals_one_shot() -> None:
    rng = random.Random(1)
    toks = [rng.randrange(1 << 20) for _ in range(103)]
    inc = PrefixHashes(4)
    for i in range(0, 103, 7):
        inc.extend(toks[i : i + 7])
    one = hashes(toks)
    assert len(inc) == len(one) == 25
    assert all(inc.at(n) == one.at(n) for n in range(4, 101, 4))


def test_chained_prefix_semantics() -> None:
    a = hashes([1, 2, 3, 4, 5, 6, 7, 8])
    b = hashes([1, 2, 3, 4, 9, 9, 9, 9])
    c = hashes([0, 2, 3, 4, 5, 6, 7, 8])
    assert a.at(4) == b.at(4) and a.at(8) != b.at(8)
    assert a.at(8) != c.at(8)  # a difference in unit 1 changes every later hash


def test_seed_and_salt_change_every_key() -> None:
    toks = list(range(16))
    base = hashes(toks)
    assert hashes(toks).at(16) == base.at(16)  # deterministic
    assert hashes(toks, seed=7).at(4) != base.at(4)
    assert hashes(toks, extra=extra_key_bytes("tenant-a")).at(4) != base.at(4)
    assert extra_key_bytes() == b""
