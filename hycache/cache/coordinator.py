"""The hybrid coordinator: one resume point that every layer group accepts.

Attention first (its hits are downward-closed), then the EAGLE drop, applied exactly once and
only here, then the SSM groups until a fixed point:

    attention matches A ──drop d──▶ A - d ──SSM: largest checkpoint <= A - d──▶ resume n

The junction is the attention groups' (post-drop) hit when it is longer than the joint hit:
the point where this request's prefix stops being shared with what is cached.
"""

from __future__ import annotations

from dataclasses import dataclass

from hycache.cache.attention import AttentionManager
from hycache.cache.block_pool import KeyLookup
from hycache.cache.boundaries import Boundaries
from hycache.cache.ssm import SSMManager
from hycache.hashing import PrefixHashes


@dataclass(frozen=True)
class CacheHit:
    resume_point: int
    junction: int
    attention_match: int  # before the drop
    attention_blocks: tuple[list[int], ...]
    ssm_blocks: tuple[int | None, ...]
    store_hit_tokens: int = 0  # how much of resume_point the second tier supplied

    @property
    def lost_reuse(self) -> int:
        """Tokens the attention groups could serve (after the drop) that the joint hit misses."""
        return self.junction - self.resume_point if self.junction else 0


def usable_match(attention_match: int, bounds: Boundaries) -> int:
    """What an attention match `A` can resume at: `A - d` after the EAGLE drop (0 when nothing
    is left). The one place the drop is applied (architecture §4.4); the junction a lookup or the
    store reveals is this value."""
    return max(attention_match - bounds.drop, 0)


def find_joint_hit(
    attention: list[AttentionManager],
    ssm: list[SSMManager],
    hashes: PrefixHashes,
    num_tokens: int,
    bounds: Boundaries,
    lookup: KeyLookup | None = None,
) -> CacheHit:
    """Pure: reads the pool (or `lookup`, which may also see the store), changes nothing."""
    limit = bounds.lookup_limit(num_tokens)
    a = limit
    attn_blocks: list[list[int]] = []
    for group in attention:
        a, blocks = group.find_hit(hashes, a, lookup)
        attn_blocks.append(blocks)
    if not attention:
        a = limit
    after_drop = usable_match(a, bounds)
    n = after_drop
    ssm_blocks: list[int | None] = [None] * len(ssm)
    changed = bool(ssm)
    while changed and n:
        changed = False
        for i, group in enumerate(ssm):
            m, block = group.find_hit(hashes, n, lookup)
            ssm_blocks[i] = block
            if m < n:
                n, changed = m, True
    if not n:
        ssm_blocks = [None] * len(ssm)
    junction = after_drop if after_drop > n else 0
    return CacheHit(n, junction, a, tuple(attn_blocks), tuple(ssm_blocks))


def no_hit(num_attention: int, num_ssm: int) -> CacheHit:
    return CacheHit(0, 0, 0, tuple([] for _ in range(num_attention)), (None,) * num_ssm)
