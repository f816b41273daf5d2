"""Property-based tests: random lookup / allocate / commit / free / evict sequences against the
pool and the managers, with the integrity check after every operation."""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from hycache.cache.block_pool import BlockEvent, CacheKey
from hycache.cache.manager import CacheManager
from hycache.config import CacheConfig, CacheKnobs, GroupKind, SpeculativeConfig
from hycache.request import Request, SamplingParams

B, U = 4, 2
# prompts drawn from a few families sharing prefixes, so hits are common
FAMILIES = [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], [1, 2, 3, 4, 9, 9, 9, 9, 8, 8, 8, 8]]


class CacheMachine(RuleBasedStateMachine):
    policy = "junction"
    eviction = "lru"
    hints: tuple[int, ...] = ()  # the prefix hints every request names

    def __init__(self) -> None:
        super().__init__()
        self.cfg = CacheConfig(
            CacheKnobs(
                block_size=B, prefix_match_unit=U, policy=self.policy, eviction=self.eviction
            ),
            num_blocks=24,
            max_model_len=20,
            groups=(GroupKind.ATTENTION, GroupKind.SSM, GroupKind.ATTENTION),
        )
        self.cache = CacheManager(self.cfg, SpeculativeConfig(num_speculative_tokens=2))
        self.live: dict[str, Request] = {}
        self.n = 0
        self.declared_hits = 0  # requests admitted with a hit covering a prefix they declared
        self.generation = [0] * self.cfg.num_blocks
        self.stored: dict[CacheKey, tuple[int, int]] = {}
        self.cache.pool.subscribe(self._on_event)
        alloc = self.cache.pool.allocate

        def counting_allocate(n: int) -> list[int]:
            out = alloc(n)
            for b in out:
                self.generation[b] += 1
            return out

        self.cache.pool.allocate = counting_allocate  # type: ignore[method-assign]

    def _on_event(self, e: BlockEvent) -> None:
        if e.kind == "stored":
            self.stored[e.key] = (e.block_id, self.generation[e.block_id])
        else:
            self.stored.pop(e.key, None)

    @rule(
        family=st.sampled_from(range(len(FAMILIES))),
        length=st.integers(3, 16),
        tail=st.lists(st.integers(20, 23), max_size=4),
        chunk=st.integers(1, 8),
    )
    def admit(self, family: int, length: int, tail: list[int], chunk: int) -> None:
        prompt = (FAMILIES[family] + tail)[:length] or [1]
        rid = f"r{self.n}"
        self.n += 1
        req = Request.new(
            rid,
            prompt,
            SamplingParams(max_tokens=4),
            unit=U,
            lookahead=self.cache.bounds.lookahead,
            prefix_hints=self.hints,
        )
        hit = self.cache.lookup(req)
        assert hit.resume_point <= req.num_tokens - 1
        assert hit.resume_point % U == 0
        end = min(req.num_tokens, hit.resume_point + chunk)
        alloc = self.cache.allocate(req, hit.resume_point, end, 0, hit)
        if alloc is None:
            return
        self.cache.take_copies()
        req.num_computed_tokens = end
        self.cache.commit(req)
        self.live[rid] = req
        bounds, t = self.cache.bounds, req.num_prompt_tokens
        self.declared_hits += bounds.declared_reach(self.hints, hit.resume_point, t) > 0

    @precondition(lambda self: self.live)
    @rule(data=st.data(), chunk=st.integers(1, 8), drafts=st.integers(0, 2))
    def step(self, data: st.DataObject, chunk: int, drafts: int) -> None:
        rid = data.draw(st.sampled_from(sorted(self.live)))
        req = self.live[rid]
        start = req.num_computed_tokens
        if start >= req.num_tokens:
            if req.num_tokens >= self.cfg.max_model_len - 2:
                return
            req.append_output([30 + req.num_tokens % 3])
        end = min(req.num_tokens, start + chunk)
        alloc = self.cache.allocate(req, start, end, drafts, num_drafts=drafts)
        if alloc is None:
            return
        self.cache.take_copies()
        req.num_computed_tokens = end
        self.cache.commit(req)
        if any(st.snapshot is not None for st in alloc.states):
            assert self.cache.bounds.keys_every_unit and end == req.num_tokens

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.live)))
        self.cache.free(self.live.pop(rid))

    @invariant()
    def integrity(self) -> None:
        pool = self.cache.pool
        pool.check_integrity()
        assert min(pool.ref_cnt) >= 0
        # every live key is on the block it was stored on, and that block was not reused since
        for key, block in pool._key_to_block.items():
            assert self.stored[key] == (block, self.generation[block])
        # by default (`protect_declared`) only a hit on a declared prefix protects anything
        if not self.declared_hits:
            assert pool.num_protected == 0

    def teardown(self) -> None:
        for req in list(self.live.values()):
            self.cache.free(req)
        self.cache.check_integrity()
        assert self.cache.pool.num_free == self.cfg.num_blocks - 1  # nothing leaked


class LimitCacheMachine(CacheMachine):
    """`limit`: lookahead keys, keys on every unit, decode snapshots published on free."""

    policy = "limit"


class HintedLimitCacheMachine(LimitCacheMachine):
    """`limit` with every request naming prefix hints (the families' shared 4 tokens, and 8):
    declared hits fill the protected queue (`protect_declared`), within its cap and leaking
    nothing."""

    hints = (4, 8)


class FlopAwareLimitCacheMachine(LimitCacheMachine):
    """`limit` under `flop-aware` eviction: the scored heap instead of the LRU queue."""

    eviction = "flop-aware"


MACHINE_SETTINGS = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestCacheMachine = CacheMachine.TestCase
TestCacheMachine.settings = MACHINE_SETTINGS
TestLimitCacheMachine = LimitCacheMachine.TestCase
TestLimitCacheMachine.settings = MACHINE_SETTINGS
TestHintedLimitCacheMachine = HintedLimitCacheMachine.TestCase
TestHintedLimitCacheMachine.settings = MACHINE_SETTINGS
TestFlopAwareLimitCacheMachine = FlopAwareLimitCacheMachine.TestCase
TestFlopAwareLimitCacheMachine.settings = MACHINE_SETTINGS
