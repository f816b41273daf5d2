"""The model runner: turns a `SchedulerOutput` into tensors, runs the target and the drafter,
samples, verifies drafts, and answers one `StepResult` per request (the executor interface).

Per step:
  1. block copies (copy-on-write) in every paged KV cache;
  2. one target forward over all scheduled tokens (known tokens, then drafts); each request
     reads its SSM state from `src` and writes it to `dst` (or, when verifying drafts, writes
     the state after every verified position into scratch slots, and the accepted one is copied
     to `dst` afterwards);
  3. sampling / verification on the rows that predict new tokens (and, when the request asks,
     their logprobs), and which of them the request keeps (`Request.accept_tokens`: a stop
     token or max_tokens may cut drafts), all in its `StepResult`; a decode step that reaches
     a unit boundary copies the exact state there into its snapshot block (`limit`);
  4. with a drafter: one drafter pass over every newly verified position (row p pairs the
     target's hidden state at p with token p + 1), then k - 1 chained single-token passes.
"""

from __future__ import annotations

import dataclasses

import torch
import xxhash

from hycache.cache.boundaries import Boundaries
from hycache.config import GroupKind, HycacheConfig
from hycache.engine.sampling import (
    SamplingError,
    adjust_logits,
    check_finite,
    pick,
    position_generator,
    token_logprobs,
    verify,
    verify_seeded,
)
from hycache.model.eagle import EagleHead
from hycache.model.hybrid import HybridForCausalLM
from hycache.model.mtp import MtpHead
from hycache.model.paged import StepBatch
from hycache.request import SamplingParams
from hycache.sched.scheduler import ScheduledRequest, SchedulerOutput, StepResult


class ModelRunner:
    def __init__(
        self,
        model: HybridForCausalLM,
        config: HycacheConfig,
        *,
        drafter: EagleHead | MtpHead | None = None,
        seed: int = 0,
    ) -> None:
        cache = config.cache
        mc = model.config
        self.model = model
        self.drafter = drafter
        self.seed = seed
        self.k = config.speculative.num_speculative_tokens if drafter is not None else 0
        self.bounds = Boundaries.from_config(cache, config.speculative)
        attn_groups = [i for i, g in enumerate(cache.groups) if g is GroupKind.ATTENTION]
        self.target_table = 0 if mc.num_attention_layers else None
        self.draft_table = len(attn_groups) - 1 if drafter is not None else None
        n = cache.num_blocks
        self.kv = model.make_kv_cache(n, cache.block_size) if mc.num_attention_layers else None
        pages = cache.num_state_pages if cache.num_state_pages is not None else n
        self.scratch_base = pages
        scratch = config.scheduler.max_num_seqs * (self.k + 1) if self.k else 0
        self.states = model.make_state_cache(pages + scratch) if mc.num_mamba_layers else None
        self.draft_kv = drafter.make_kv_cache(n, cache.block_size) if drafter else None
        self._draft_probs: dict[str, torch.Tensor | None] = {}
        self._gens: dict[str, torch.Generator] = {}
        # requests whose sampling failed in the last step (request id -> why); the engine
        # ends each of them alone (`take_failed`)
        self.failed: dict[str, str] = {}

    # -- per-request state ---------------------------------------------------------------------

    def _gen(self, rid: str, params: SamplingParams) -> torch.Generator:
        gen = self._gens.get(rid)
        if gen is None:
            seed = params.seed
            if seed is None:
                seed = xxhash.xxh64_intdigest(rid.encode(), self.seed) % 2**62
            # on the model's device: torch.multinomial takes a generator of its tensor's device
            gen = self._gens[rid] = torch.Generator(self.model.device).manual_seed(seed)
        return gen

    def _seeded_gen(self, params: SamplingParams, position: int) -> torch.Generator:
        assert params.seed is not None
        return position_generator(params.seed, position, self.model.device)

    def take_failed(self) -> dict[str, str]:
        """The requests whose sampling failed since the last call, and why."""
        failed, self.failed = self.failed, {}
        return failed

    def release(self, request_id: str) -> None:
        """Forget a finished request's generator and draft distributions."""
        self._gens.pop(request_id, None)
        self._draft_probs.pop(request_id, None)

    @torch.inference_mode()
    def warmup(self, num_tokens: int) -> int:
        """One forward as the largest prefill chunk the scheduler may send: the target over
        `num_tokens` positions at context 0, one logit row, and the drafter's pass over them.
        A serving engine runs it before its first request (vLLM's dummy run), so the step's
        temporaries are allocated, and on a CPU faulted in, once: a cold 8,192-token chunk
        ran 45% slower than the next one. The forward writes only free blocks and state
        slots (nothing is allocated yet, and each is written before it is read), so no
        request sees it. Returns the tokens it ran (fewer when the pool is smaller)."""
        paged = self.kv if self.kv is not None else self.draft_kv
        bs = paged.block_size if paged is not None else 0
        if paged is not None:  # block 0 is the null block
            num_tokens = min(num_tokens, (paged.num_blocks - 1) * bs)
        if num_tokens < 1:
            return 0
        table = list(range(1, -(-num_tokens // bs) + 1)) if bs else []
        srcs, writes = [], []
        if self.states is not None:
            srcs, writes = [-1], [[(num_tokens, self.states.num_slots - 1)]]
        ids = [0] * num_tokens
        positions = list(range(num_tokens))
        batch = _batch(ids, positions, [num_tokens], [0], [table], srcs, writes, self.model.device)
        hidden = self.model.forward(batch, self.kv, self.states)
        self.model.compute_logits(hidden[-1:])
        if self.drafter is not None and self.draft_kv is not None:
            draft = _batch(ids, positions, [num_tokens], [0], [table], [], [], self.model.device)
            self.drafter(draft, hidden, self.draft_kv, self.model, compute_logits=False)
        if str(self.model.device).startswith("cuda"):
            torch.cuda.synchronize()
        return num_tokens

    # -- one step --------------------------------------------------------------------------------

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> dict[str, StepResult]:
        for src, dst in out.block_copies:
            for kv in (self.kv, self.draft_kv):
                if kv is not None:
                    kv.copy_block(src, dst)
        sched = out.scheduled
        if not sched:
            return {}
        hidden = self.model.forward(self._target_batch(sched), self.kv, self.states)
        starts = _starts([s.num_tokens + len(s.draft_token_ids) for s in sched])
        rows: list[int] = []
        for i, s in enumerate(sched):
            if s.samples:
                first = starts[i] + s.num_tokens - 1
                rows.extend(range(first, first + len(s.draft_token_ids) + 1))
        logits = None
        if rows:
            logits = self.model.compute_logits(_rows(hidden, rows))
        results: dict[str, StepResult] = {}
        new_tokens: list[list[int]] = []
        at = 0
        for r, s in enumerate(sched):
            rid = s.request.request_id
            if not s.samples:
                new_tokens.append([])
                results[rid] = StepResult([])
                continue
            n = len(s.draft_token_ids) + 1
            assert logits is not None
            params = s.request.sampling
            probs = self._draft_probs.pop(rid, None) if s.draft_token_ids else None
            req = s.request
            try:
                rows = adjust_logits(
                    logits[at : at + n], params, req.prompt_token_ids, req.output_token_ids,
                    s.draft_token_ids,
                )  # fmt: skip
                check_finite(rows)
                if params.seed is not None:
                    pos = req.num_output_tokens
                    toks = verify_seeded(
                        rows,
                        s.draft_token_ids,
                        params,
                        lambda i, pos=pos, sp=params: self._seeded_gen(sp, pos + i),
                    )
                else:
                    toks = verify(rows, s.draft_token_ids, probs, params, self._gen(rid, params))
            except (SamplingError, RuntimeError) as e:
                # this request alone fails: a stand-in token keeps the step consistent, and
                # the engine ends the request after the step without showing it
                self.failed[rid] = str(e)
                toks = [int(logits[at].nan_to_num().argmax())]
            lps = None
            if params.logprobs is not None:  # row i predicted toks[i]
                lps = token_logprobs(logits[at : at + n], toks, params.logprobs)
            at += n
            accepted = len(toks) - 1
            verdict = req.accept_tokens(toks)
            if self.states is not None:
                self._keep_states(r, s, accepted, s.end + len(verdict[0]) - 1)
            new_tokens.append(toks)
            results[rid] = StepResult(toks, accepted, logprobs=lps, verdict=verdict)
        if self.drafter is not None:
            self._draft(sched, hidden, starts, new_tokens, results)
        return results

    def _keep_states(self, r: int, s: ScheduledRequest, accepted: int, last: int) -> None:
        """After verification: the accepted position's state goes to `dst`; a decode snapshot
        takes the state at the last unit boundary among the verified positions the request
        keeps (`last`): from the per-position scratch states when drafts were verified, else
        the step's own final state."""
        assert self.states is not None
        io = s.alloc.states[0]
        base = self.scratch_base + r * (self.k + 1)
        if s.draft_token_ids:
            self.states.copy_slot(base + accepted, io.dst)
        if io.snapshot is None:
            return
        pos = self.bounds.decode_snapshot(s.end, last)
        if pos:
            src = base + (pos - s.end) if s.draft_token_ids else io.dst
            self.states.copy_slot(src, io.snapshot)

    def _target_batch(self, sched: list[ScheduledRequest]) -> StepBatch:
        ids: list[int] = []
        positions: list[int] = []
        qlens, ctx, tables, srcs, writes = [], [], [], [], []
        for r, s in enumerate(sched):
            toks = s.token_ids
            ids.extend(toks)
            positions.extend(range(s.start, s.start + len(toks)))
            qlens.append(len(toks))
            ctx.append(s.start)
            tables.append(
                s.alloc.block_tables[self.target_table] if self.target_table is not None else []
            )
            if self.states is not None:
                st = s.alloc.states[0]
                srcs.append(-1 if st.src is None else st.src)
                if s.draft_token_ids:
                    base = self.scratch_base + r * (self.k + 1)
                    nd = len(s.draft_token_ids)
                    writes.append([(s.num_tokens + i, base + i) for i in range(nd + 1)])
                else:
                    writes.append(
                        [*((p - s.start, b) for p, b in st.writes), (s.num_tokens, st.dst)]
                    )
        return _batch(ids, positions, qlens, ctx, tables, srcs, writes, self.model.device)

    def _draft(
        self,
        sched: list[ScheduledRequest],
        hidden: torch.Tensor,
        starts: list[int],
        new_tokens: list[list[int]],
        results: dict[str, StepResult],
    ) -> None:
        """Drafter rows for every verified position, then k drafts per sampling request."""
        assert self.drafter is not None and self.draft_kv is not None
        assert self.draft_table is not None
        ids: list[int] = []
        positions: list[int] = []
        qlens, ctx, tables, sel = [], [], [], []
        for i, s in enumerate(sched):
            if s.samples:  # row p pairs hidden p with token p + 1: the new tokens end it
                verified = s.num_tokens + len(new_tokens[i]) - 1
                nxt = s.request.tokens(s.start + 1, s.end) + new_tokens[i]
            else:
                verified = s.num_tokens
                nxt = s.request.tokens(s.start + 1, s.end + 1)
            ids.extend(nxt[:verified])
            positions.extend(range(s.start, s.start + verified))
            qlens.append(verified)
            ctx.append(s.start)
            tables.append(s.alloc.block_tables[self.draft_table])
            sel.extend(range(starts[i], starts[i] + verified))
        batch = _batch(ids, positions, qlens, ctx, tables, [], [], self.model.device)
        x, _ = self.drafter(
            batch, _rows(hidden, sel), self.draft_kv, self.model, compute_logits=False
        )
        live = [i for i, s in enumerate(sched) if s.samples]
        if not live:
            return
        ends = _starts(qlens)
        last_rows = [ends[i + 1] - 1 for i in live]
        prev_hidden = _rows(x, last_rows)  # (R_live, hidden)
        prev_pos = [positions[j] for j in last_rows]
        drafts: list[list[int]] = [[] for _ in live]
        probs: list[list[torch.Tensor]] = [[] for _ in live]
        for step in range(self.k):
            logits = self.drafter.draft_logits(prev_hidden, self.model)
            for n, i in enumerate(live):
                req = sched[i].request
                sp = req.sampling
                if sp.seed is not None:  # the drafts' own stream: never the tokens'
                    gen = self._seeded_gen(sp, -1 - req.num_output_tokens - step)
                else:
                    gen = self._gen(req.request_id, sp)
                try:
                    tok, p = pick(logits[n], sp, gen)
                except (SamplingError, RuntimeError) as e:
                    self.failed.setdefault(req.request_id, str(e))
                    tok, p = int(logits[n].nan_to_num().argmax()), None
                drafts[n].append(tok)
                if p is not None:
                    probs[n].append(p)
            if step == self.k - 1:
                break
            prev_pos = [p + 1 for p in prev_pos]
            batch = _batch(
                [d[-1] for d in drafts],
                prev_pos,
                [1] * len(live),
                prev_pos,
                [sched[i].alloc.block_tables[self.draft_table] for i in live],
                [],
                [],
                self.model.device,
            )
            prev_hidden, _ = self.drafter(
                batch, prev_hidden, self.draft_kv, self.model, compute_logits=False
            )
        for n, i in enumerate(live):
            rid = sched[i].request.request_id
            results[rid] = dataclasses.replace(results[rid], next_draft_token_ids=drafts[n])
            self._draft_probs[rid] = torch.stack(probs[n]) if probs[n] else None


def _rows(t: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """t[rows], the index built on the host and copied without waiting for the device."""
    idx = torch.tensor(rows, dtype=torch.long).to(t.device, non_blocking=True)
    return t.index_select(0, idx)


def _starts(lengths: list[int]) -> list[int]:
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return out


def _batch(
    ids: list[int],
    positions: list[int],
    qlens: list[int],
    ctx: list[int],
    tables: list[list[int]],
    srcs: list[int],
    writes: list[list[tuple[int, int]]],
    device: torch.device,
) -> StepBatch:
    return StepBatch(
        # built on the host and copied without waiting for the device
        input_ids=torch.tensor(ids, dtype=torch.long).to(device, non_blocking=True),
        positions=torch.tensor(positions, dtype=torch.long).to(device, non_blocking=True),
        query_lens=qlens,
        context_lens=ctx,
        block_tables=tables,
        state_src=srcs,
        state_writes=writes,
    )
