"""What a cached entry is worth: the value `flop-aware` eviction adds to recency.

The block pool evicts, among free cached entries, the one with the lowest score

    score = freed_at / (num_blocks - 1)  +  value(entry)

where `freed_at` counts the keyed blocks freed into the pool so far (so recency is measured in
pool turnovers) and `value` is what this module computes (Marconi, MLSys'25):

    value = alpha * (FLOPs a hit on the entry saves / bytes it holds)
                  / (FLOPs of prefilling one block at context 0 / bytes of one page)

Every page of a pool has the same size (in the shared pool an attention block and a state page
are the same page; with separate pools the two kinds never compete), so the bytes cancel and
`value = alpha * saved / F(0, B)`: alpha = 1 lets an entry that saves one block's prefill outlive
an equally recent worthless one by one pool turnover.

What a hit on an entry saves. A hit at `n` needs both the attention blocks covering `[0, n)`
and the SSM state at exactly `n`; it saves the prefill of `[0, n)` in every layer. That saving
is split by the layers each entry restores, so that the entries of one hit add up to it:

* an attention block whose deepest key is `p` holds the rows `[s, p)`, `s = floor((p-1)/B)*B`;
  it saves the attention layers' share of those tokens, with attention over their context:
  `(1 - ssm_fraction) * token_flops * (p - s) + pair_flops * sum_{i in [s, p)} (i + 1)`;
* an SSM state page at `n` saves the SSM layers' share of the whole prefix `[0, n)`:
  `ssm_fraction * token_flops * n` (the state is the product of every token before it: without
  it, the hit falls back to an earlier state or to 0, whatever attention still holds).

So a deep state is worth far more than any one block (Bamba-9B: a state at 20k tokens saves as
much as ~30 blocks), which is the point: a state that its running request passed is freed long
before the blocks under it, and LRU evicts it first although the whole hit depends on it.

Every entry's value is also weighed by the observed chance that an entry of its kind (an
attention block, a decode snapshot, a tail checkpoint, ...: `BlockPool.reuse`) is hit before it
is evicted, the same chance admission keeps states by (`hycache.cache.retention`): kinds that
are never reused on a workload (decode snapshots on a conversation trace whose prompts omit the
answer) sink to the front of the heap.

alpha defaults to 0.05 (`DEFAULT_EVICTION_ALPHA`), chosen on the eviction curves (README;
the measured figures are in docs/concepts.md): 0.03-0.1 all beat LRU under pressure; 0.3 and 1
keep deep states so long that they crowd out the blocks of more recent prefixes. The cache
core prices nothing itself: the per-token numbers come in through `RecomputeCost` (the
simulator derives them from its cost model, the engine from its layers).
"""

from __future__ import annotations

from collections.abc import Sequence

from hycache.cache.block_pool import CacheKey
from hycache.config import GroupKind, RecomputeCost


def prefill_flops(cost: RecomputeCost, start: int, end: int) -> float:
    """FLOPs of prefilling tokens `[start, end)` in every layer."""
    n = max(end - start, 0)
    pairs = (end * (end + 1) - start * (start + 1)) / 2 if n else 0.0
    return cost.token_flops * n + cost.pair_flops * pairs


class FlopValue:
    """`value(key, position)` for a `BlockPool` (see the module docstring for the formula)."""

    def __init__(
        self,
        cost: RecomputeCost,
        groups: Sequence[GroupKind],
        block_size: int,
        alpha: float,
    ) -> None:
        self.cost = cost
        self.groups = tuple(groups)
        self.block_size = block_size
        self.alpha = alpha
        self._scale = alpha / prefill_flops(cost, 0, block_size)

    def saved_flops(self, group: int, position: int) -> float:
        """FLOPs a hit on the entry keyed at `position` of `group` saves."""
        c = self.cost
        if self.groups[group] is GroupKind.SSM:
            return c.ssm_fraction * c.token_flops * position
        b = self.block_size
        start = (position - 1) // b * b if position > 0 else 0
        pairs = (position * (position + 1) - start * (start + 1)) / 2
        return (1.0 - c.ssm_fraction) * c.token_flops * (position - start) + c.pair_flops * pairs

    def __call__(self, key: CacheKey, position: int) -> float:
        return self._scale * self.saved_flops(key.group, position)
