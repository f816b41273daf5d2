"""Simulated serving instances and the router in front of them.

An `Instance` is one engine: its own scheduler, cache manager and device pool, a dry-run
executor, and its own clock (the end of its last step). With a second tier, its cache is
mirrored into a store that every instance may share (`hycache.sim.tier`), and the step that
admits a request whose hit was loaded from the store is longer by the load time.

Routing (`Router`), decided when a request is released to the cluster:

* `round-robin`: instance 0, 1, ..., N-1, 0, ...
* `prefix-aware`: the instance holding the longest prefix of the request: the deeper of its
  device cache's joint hit (`CacheManager.lookup`, which changes nothing) and the longest
  prefix, on the unit grid, of the prompts recently sent to it (prompts in flight are not
  cached yet; without this, siblings released together would scatter). Ties go to the least
  loaded instance (requests waiting, running or routed and not yet admitted), then the lowest
  index. As in SGLang's cache-aware router, a load guard overrides the prefix: when the best
  instance has more than `balance_threshold` requests more than the least loaded one, the
  least loaded one takes the request.
* `attention-only`: what KV-aware routers do today (Dynamo, llm-d): the same, scored by the
  deepest match of the attention blocks alone (`CacheHit.attention_match`), as if every matched
  attention block could be resumed whatever SSM states the instance holds. The router's memory
  of the prompts it sent is the same as `prefix-aware`'s, so the two differ only in what they
  see of the cache.

Each scoring router also predicts the hit of the request on the instance it picks: the cached
part of its score there (the joint hit for `prefix-aware`, the attention match for
`attention-only`; `round-robin` predicts nothing). The request's actual hit is the joint hit at
its admission, so where the cache does not change between routing and admission `prefix-aware`
predicts exactly and `attention-only` overstates by what the SSM states do not cover.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hycache.cache.block_pool import BlockEvent
from hycache.cache.boundaries import StateKind
from hycache.config import GroupKind, HycacheConfig
from hycache.request import Request
from hycache.sched.executor import DryRunExecutor
from hycache.sched.scheduler import Scheduler, SchedulerOutput
from hycache.sim.costmodel import CostModel, SeqWork, StepWork
from hycache.sim.tier import SimBlockIO, SimHostStore, StoreLink, attach_sim_store

__all__ = ["ROUTINGS", "Instance", "Routed", "Router", "SSMPageCounter", "step_work"]

ROUTINGS = ("round-robin", "prefix-aware", "attention-only")
ROUTED_KEYS = 1 << 18  # prefix keys a scoring router remembers per instance (LRU)
BALANCE_THRESHOLD = 32  # SGLang router's default balance_abs_threshold


def step_work(out: SchedulerOutput, block_size: int | None = None) -> StepWork:
    """What the cost model needs to know about one scheduled step. With `block_size`, each
    decoding request's `shared_context_len`: its context tokens in attention blocks an
    earlier decoding request of the step reads too."""
    seen: set[int] = set()
    seqs = []
    for s in out.scheduled:
        prefill = s.num_tokens > 1
        shared = 0
        if block_size and not prefill and s.alloc.block_tables:
            table = s.alloc.block_tables[0]
            for i, block in enumerate(table[: -(-s.start // block_size)]):
                if block in seen:
                    shared += min(block_size, s.start - i * block_size)
                else:
                    seen.add(block)
        seqs.append(
            SeqWork(
                num_new_tokens=s.num_tokens + len(s.draft_token_ids),
                context_len=s.start,
                num_draft_tokens=len(s.draft_token_ids),
                is_prefill=prefill,
                num_state_writes=max((len(st.writes) for st in s.alloc.states), default=0),
                shared_context_len=shared,
            )
        )
    return StepWork(tuple(seqs), num_block_copies=len(out.block_copies))


class Instance:
    """One simulated engine on its own clock."""

    def __init__(
        self,
        index: int,
        config: HycacheConfig,
        *,
        cost: CostModel | None,
        dry_step_s: float,
        seed: int,
        vocab_size: int,
        store: SimHostStore | None = None,
        link: StoreLink | None = None,
        accepted: Mapping[str, Mapping[int, int]] | None = None,
    ) -> None:
        self.index = index
        self.cost = cost
        self.dry_step_s = dry_step_s
        # `update` returns each finish; the cost model packs prefill under decodes
        self.sched = Scheduler(config, keep_finished=0, step_cost=cost)
        # shared context is counted only where the cost model prices it apart (hot path)
        self.block_size = config.cache.block_size if cost and cost.prices_warm_context else None
        spec = config.speculative
        self.executor = DryRunExecutor(
            vocab_size=vocab_size,
            num_speculative_tokens=spec.num_speculative_tokens,
            acceptance_rate=spec.acceptance_rate,
            seed=seed,  # the same for every instance: a request's tokens do not depend on routing
            accepted=accepted,
        )
        self.pages = SSMPageCounter(config, self.sched)
        self.store = store
        self.link = link
        self.io: SimBlockIO | None = None
        if store is not None:
            self.io = attach_sim_store(self.sched.cache, store, config, cost)
        self.clock = 0.0  # end of the last step
        self.steps = 0
        self.peak_blocks = 0
        self.load_s = 0.0  # load time charged to this instance's steps
        self.lookup_trips = 0  # store round trips its admissions made (charged as latency)
        self.inbox: deque[tuple[Any, Request]] = deque()  # routed, not yet added
        # request id -> (item, arrival, the router's predicted hit or None)
        self.in_flight: dict[str, tuple[Any, float, int | None]] = {}
        self.first_token: dict[str, float] = {}
        self.done: list[Request] = []  # finished in the last step, not yet recorded

    @property
    def load(self) -> int:
        s = self.sched
        return len(s.waiting) + len(s.running) + len(self.inbox)

    def busy(self) -> bool:
        return bool(self.done or self.inbox or self.sched.has_unfinished())

    def route(self, item: Any, req: Request, now: float, predicted: int | None = None) -> None:
        """`req` arrives at `now` (the router predicted hit `predicted`); an idle instance that
        fell behind moves up to it."""
        if not self.sched.has_unfinished() and not self.done:
            self.clock = max(self.clock, now)
        self.inbox.append((item, req))
        self.in_flight[req.request_id] = (item, now, predicted)

    def admit(self) -> None:
        while self.inbox:
            self.sched.add_request(self.inbox.popleft()[1])

    def step(self) -> None:
        """One scheduler step: the clock moves by its cost, plus any store load it did."""
        sched = self.sched
        store = self.store
        trips = store.round_trips if store is not None else 0
        loaded = self.io.loaded_bytes if self.io is not None else 0
        out = sched.schedule()
        load = 0.0
        if store is not None and self.io is not None and self.link is not None:
            nbytes = self.io.loaded_bytes - loaded
            calls = store.round_trips - trips
            self.lookup_trips += calls
            if nbytes or calls:
                load = self.link.load_time(nbytes, calls)
        sampling = [s.request.request_id for s in out.scheduled if s.samples]
        done = sched.update(out, self.executor.execute(out))
        preempted = set(out.preempted)
        self.pages.attribute(
            done,
            [s.request for s in out.scheduled]
            + [r for r in sched.waiting if r.request_id in preempted],
        )
        dt = self.cost.step_time(step_work(out, self.block_size)) if self.cost else self.dry_step_s
        if load:
            dt += load
            self.load_s += load
        self.clock += dt
        self.steps += 1
        pool = sched.cache.pool
        self.peak_blocks = max(self.peak_blocks, pool.num_blocks - 1 - pool.num_free)
        for rid in sampling:
            self.first_token.setdefault(rid, self.clock)
        self.done = done


@dataclass(frozen=True)
class Routed:
    """Where a request goes, and the hit the router predicted for it there (None: a router
    that does not score, `round-robin`)."""

    instance: Instance
    predicted_hit: int | None


class Router:
    """Picks the instance a request goes to (see the module docstring)."""

    def __init__(
        self,
        kind: str,
        instances: Sequence[Instance],
        *,
        balance_threshold: int = BALANCE_THRESHOLD,
    ) -> None:
        if kind not in ROUTINGS:
            raise ValueError(f"routing: expected one of {', '.join(ROUTINGS)}, got {kind!r}")
        self.kind = kind
        self.instances = list(instances)
        self.balance_threshold = balance_threshold
        self._next = 0
        self._sent: list[OrderedDict[bytes, None]] = [OrderedDict() for _ in self.instances]

    def pick(self, req: Request) -> Routed:
        insts = self.instances
        if self.kind == "round-robin":
            inst = insts[self._next % len(insts)]
            self._next += 1
            return Routed(inst, None)
        if len(insts) == 1:
            return Routed(insts[0], self.cached(insts[0], req))
        keys = self._keys(req)
        scored = []
        for i in insts:
            cached = self.cached(i, req)
            scored.append((-max(cached, self._sent_match(i, keys)), i.load, i.index, cached))
        _, _, index, predicted = min(scored)
        best = insts[index]
        least = min(insts, key=lambda i: (i.load, i.index))
        if best.load - least.load > self.balance_threshold:
            best, predicted = least, next(s[3] for s in scored if s[2] == least.index)
        self._remember(best, keys)
        return Routed(best, predicted)

    def cached(self, inst: Instance, req: Request) -> int:
        """What this router sees cached of `req` on `inst` (see the module docstring)."""
        hit = inst.sched.cache.lookup(req)
        return hit.attention_match if self.kind == "attention-only" else hit.resume_point

    @staticmethod
    def _keys(req: Request) -> list[bytes]:
        h = req.hashes
        u = h.unit
        limit = min(h.num_hashed_tokens, req.num_prompt_tokens)
        return [h.at(p) for p in range(u, limit + 1, u)]

    def _sent_match(self, inst: Instance, keys: list[bytes]) -> int:
        sent = self._sent[inst.index]
        n = 0
        for k in keys:
            if k not in sent:
                break
            n += 1
        return n * self.instances[0].sched.cache.bounds.unit

    def _remember(self, inst: Instance, keys: list[bytes]) -> None:
        sent = self._sent[inst.index]
        for k in keys:
            sent[k] = None
            sent.move_to_end(k)
        while len(sent) > ROUTED_KEYS:
            sent.popitem(last=False)


PAGE_KINDS: tuple[str, ...] = (*StateKind, "loaded")  # "loaded": from a second tier


class SSMPageCounter:
    """Counts keyed SSM state pages from the block pool's events (as `hycache explain` reads
    checkpoints): one key per SSM page, so keys stored = pages stored. A page keyed in a step
    at the prompt's end or past it, under the key of a request that finished in that step, is
    that request's decode snapshot (`limit` keys it when the request lets go). Pages loaded
    from a second tier count as stored too (they are keyed in the pool).

    For the admission analysis each page has the kind its manager keyed it with
    (`BlockPool.kind`, a `StateKind`: a decode snapshot, a junction or hint stop, the tail
    checkpoint, a replay boundary, the unit below the tail, the drop scheme's replay boundary,
    a block-grid state; "loaded" from a second tier), and `by_kind` counts per kind the pages
    stored, evicted, and evicted without ever having been hit."""

    def __init__(self, config: HycacheConfig, sched: Scheduler) -> None:
        self.groups = {i for i, g in enumerate(config.cache.groups) if g is GroupKind.SSM}
        self.stored = 0
        self.snapshots = 0
        self.live = 0
        self.peak = 0
        self._step: list[BlockEvent] = []  # SSM keys stored since the last `attribute`
        self._pool = sched.cache.state_pool
        self._kind: dict[Any, str] = {}  # live SSM key -> its kind
        self.by_kind: dict[str, dict[str, int]] = {
            k: {"stored": 0, "evicted": 0, "evicted_never_hit": 0} for k in PAGE_KINDS
        }
        sched.cache.subscribe(self.on_event)

    def on_event(self, event: BlockEvent) -> None:
        if event.key.group not in self.groups:
            return
        if event.kind == "stored":
            self.stored += 1
            self.live += 1
            self.peak = max(self.peak, self.live)
            self._step.append(event)
        elif event.kind == "removed":
            self.live -= 1
            kind = self._kind.pop(event.key, None)
            if kind is not None:
                counts = self.by_kind[kind]
                counts["evicted"] += 1
                if not self._pool.hits[event.block_id]:
                    counts["evicted_never_hit"] += 1

    def attribute(self, finished: Sequence[Request], others: Sequence[Request] = ()) -> None:
        """Count the decode snapshots among this step's stored keys (keyed by a request that
        finished in it, `others` being the step's other requests), and record each key's
        kind."""
        events, self._step = self._step, []
        for e in events:
            for req in finished:
                pos = e.position
                if (
                    req.num_prompt_tokens <= pos <= req.hashes.num_hashed_tokens
                    and req.hashes.at(pos) == e.key.hash
                ):
                    self.snapshots += 1
                    break
            block = self._pool.lookup(e.key)
            if block is None:
                continue  # stored and evicted again within the step
            kind = self._pool.kind[block] or "loaded"
            self._kind[e.key] = kind
            self.by_kind[kind]["stored"] += 1
