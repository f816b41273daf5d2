"""Shared builders for the cache, scheduler, engine, store and CLI tests (a test module never
imports another: what two folders share lives here)."""

from __future__ import annotations

import random
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hycache.cache.boundaries import Boundaries
from hycache.config import (
    CacheConfig,
    CacheKnobs,
    HycacheConfig,
    SchedulerConfig,
    SpeculativeConfig,
)
from hycache.request import Request, SamplingParams
from hycache.sched.executor import DryRunExecutor, run_to_completion
from hycache.sched.scheduler import ScheduledRequest, Scheduler, SchedulerOutput, StepResult

if TYPE_CHECKING:
    import torch

    from hycache.engine.engine import LLM
    from hycache.engine.outputs import RequestOutput

# the bound on a hang (a wait that must end, a server that must start): generous, as a loaded
# machine needs it; a latency is never asserted in seconds, only against a control run beside it
HANG_S = 120.0


def make_config(
    *,
    block_size: int = 16,
    unit: int | None = 4,
    policy: str = "junction",
    eagle: bool = True,
    k: int = 3,
    num_blocks: int | None = None,
    max_model_len: int = 4096,
    budget: int = 8192,
    max_num_seqs: int = 64,
    retention: str | int = "semantic",
    prefix_caching: bool = True,
    internal_checkpoints: bool = True,
) -> HycacheConfig:
    cache = CacheConfig(
        CacheKnobs(
            block_size=block_size,
            prefix_match_unit=unit,
            policy=policy,
            retention=retention,
            enable_prefix_caching=prefix_caching,
            internal_checkpoints=internal_checkpoints,
        ),
        num_blocks=num_blocks or (4 * max_model_len // block_size + 64),
        max_model_len=max_model_len,
    )
    spec = SpeculativeConfig(num_speculative_tokens=k if eagle else 0)
    return HycacheConfig(cache, spec, SchedulerConfig(budget, max_num_seqs))


def tiny_family_simulate(families: int) -> list[str]:
    """`hycache simulate`'s arguments for a small family workload on the tiny model (3
    requests a family, B = 16, u = 4, 300 blocks): the CLI tests of the simulator's options."""
    return [
        "simulate", "--workload", "family", "--model", "tiny", "--block-size", "16",
        "--prefix-match-unit", "4", "--families", str(families), "--requests-per-family", "3",
        "--shared-prefix-tokens", "30:60", "--suffix-tokens", "3:10", "--output-tokens", "2:4",
        "--num-blocks", "300",
    ]  # fmt: skip


def tokens(rng: random.Random, n: int, vocab: int = 30000) -> list[int]:
    return [rng.randrange(vocab) for _ in range(n)]


def sharing_requests(cfg: HycacheConfig, rng: random.Random, n: int = 8) -> list[Request]:
    """`n` requests ("r0" ...) whose prompts are a random prefix (1-199 tokens) of one
    200-token root plus 1-89 tokens of their own, each asking for 1-29 tokens."""
    root = tokens(rng, 200)
    return [
        new_request(cfg, f"r{i}", root[: rng.randrange(1, 200)] + tokens(rng, rng.randrange(1, 90)),
                    max_tokens=rng.randrange(1, 30))
        for i in range(n)
    ]  # fmt: skip


def newcomer_prefill(
    sched: Scheduler, ex: DryRunExecutor, prompt_len: int, queued: bool = False
) -> list[ScheduledRequest]:
    """r0 (8 tokens) runs to its first token; then r1 (`prompt_len` tokens) arrives, with r2
    (40 tokens) queued behind it when `queued`: r1's scheduled entries until its first token
    (random tokens from seed 3, in that order)."""
    cfg = sched.config
    rng = random.Random(3)
    r0 = new_request(cfg, "r0", tokens(rng, 8), max_tokens=200)
    sched.add_request(r0)
    while not r0.num_output_tokens:
        out = sched.schedule()
        sched.update(out, ex.execute(out))
    r1 = new_request(cfg, "r1", tokens(rng, prompt_len), max_tokens=2)
    sched.add_request(r1)
    if queued:
        sched.add_request(new_request(cfg, "r2", tokens(rng, 40), max_tokens=2))
    entries: list[ScheduledRequest] = []
    while not r1.num_output_tokens:
        out = sched.schedule()
        entries += [s for s in out.scheduled if s.request is r1]
        sched.update(out, ex.execute(out))
    return entries


def new_request(
    cfg: HycacheConfig,
    rid: str,
    prompt: Sequence[int],
    max_tokens: int = 4,
    prefix_hints: Sequence[int] = (),
) -> Request:
    return Request.new(
        rid,
        prompt,
        SamplingParams(max_tokens=max_tokens, ignore_eos=True),
        unit=cfg.cache.unit,
        hash_seed=cfg.cache.hash_seed,
        lookahead=Boundaries.from_config(cfg.cache, cfg.speculative).lookahead,
        prefix_hints=prefix_hints,
    )


class RecordingExecutor(DryRunExecutor):
    """Dry-run executor that records every scheduled chunk: rid -> [(start, end, checkpoint)],
    and every SSM checkpoint the forward writes: rid -> positions (chunk ends that checkpoint,
    and the internal checkpoints written inside a chunk)."""

    def __init__(self, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.chunks: dict[str, list[tuple[int, int, bool]]] = {}
        self.written: dict[str, list[int]] = {}

    def execute(self, out):  # type: ignore[no-untyped-def]
        for s in out.scheduled:
            rid = s.request.request_id
            self.chunks.setdefault(rid, []).append((s.start, s.end, s.alloc.checkpoint))
            inside = {p for st in s.alloc.states for p, _ in st.writes}
            self.written.setdefault(rid, []).extend(sorted(inside))
            if s.alloc.checkpoint:
                self.written[rid].append(s.end)
        return super().execute(out)


def run_sequential(
    cfg: HycacheConfig, prompts: Sequence[Sequence[int]], max_tokens: int = 4
) -> tuple[Scheduler, list[Request]]:
    """Each request runs to completion before the next arrives."""
    sched = Scheduler(cfg)
    ex = RecordingExecutor(num_speculative_tokens=cfg.speculative.num_speculative_tokens)
    sched.recorder = ex  # type: ignore[attr-defined]
    reqs = []
    for i, p in enumerate(prompts):
        r = new_request(cfg, f"r{i}", p, max_tokens)
        sched.add_request(r)
        run_to_completion(sched, ex, check=True)
        reqs.append(r)
    return sched, reqs


# ---------------------------------------------------------------------------------------------
# Oracle drafts for the real engine
# ---------------------------------------------------------------------------------------------


def oracle_schedule(k: int) -> list[int]:
    """Drafts to accept per verify step, cycled: k, none, and values in between."""
    return list(dict.fromkeys([k, 0, k - 1, 1, k // 2, k]))


@dataclass(frozen=True)
class VerifyStep:
    """One verification of drafts: what the oracle planned and what the runner accepted."""

    request_id: str
    verified: int  # drafts in the step (the scheduler may verify fewer than k)
    planned: int  # correct drafts the oracle proposed
    accepted: int  # StepResult.num_accepted_drafts


class OracleDrafter:
    """Replaces an `LLM`'s EAGLE proposals with the target's own greedy continuation, so that
    greedy verification accepts a known number of drafts per step.

    `answers` maps a prompt (tuple of token ids) to its plain greedy continuation (see
    `learn`). The n-th proposal the runner makes (over all requests, in scheduling order) keeps
    the first `schedule[n % len(schedule)]` drafts and corrupts the others, so a correct engine
    accepts exactly that many (fewer when fewer are verified). The drafter's own KV and hidden
    passes still run: only the proposed ids are replaced (greedy verification reads no draft
    distributions). `steps` records every verification."""

    def __init__(self, llm: LLM, schedule: Sequence[int], vocab: int) -> None:
        runner = llm.runner
        assert runner.drafter is not None and runner.k > 0
        self.k = runner.k
        self.vocab = vocab
        self.schedule = list(schedule)
        self.answers: dict[tuple[int, ...], list[int]] = {}
        self.steps: list[VerifyStep] = []
        self._proposals = 0
        self._planned: dict[str, int] = {}
        draft, execute = runner._draft, runner.execute

        def oracle_draft(
            sched: list[ScheduledRequest],
            hidden: torch.Tensor,
            starts: list[int],
            new_tokens: list[list[int]],
            results: dict[str, StepResult],
        ) -> None:
            draft(sched, hidden, starts, new_tokens, results)
            for s, new in zip(sched, new_tokens, strict=True):
                if s.samples:
                    rid = s.request.request_id
                    at = s.request.num_output_tokens + len(new)  # not yet appended
                    old = results[rid]
                    drafts = self._propose(rid, tuple(s.request.prompt_token_ids), at)
                    results[rid] = StepResult(
                        old.sampled_token_ids, old.num_accepted_drafts, drafts
                    )

        def recording_execute(out: SchedulerOutput) -> dict[str, StepResult]:
            planned = dict(self._planned)  # this step's drafts; execute plans the next ones
            results = execute(out)
            for s in out.scheduled:
                if s.draft_token_ids:
                    rid = s.request.request_id
                    self.steps.append(
                        VerifyStep(
                            rid,
                            len(s.draft_token_ids),
                            planned[rid],
                            results[rid].num_accepted_drafts,
                        )
                    )
            return results

        runner._draft = oracle_draft  # type: ignore[method-assign]
        runner.execute = recording_execute  # type: ignore[method-assign]

    def _propose(self, request_id: str, prompt: tuple[int, ...], at: int) -> list[int]:
        good = self.schedule[self._proposals % len(self.schedule)]
        self._proposals += 1
        self._planned[request_id] = good
        # a finishing request's drafts are never verified: pad past the answer's end
        want = self.answers[prompt][at : at + self.k]
        want += [0] * (self.k - len(want))
        return [t if i < good else (t + 1) % self.vocab for i, t in enumerate(want)]

    def learn(self, plain: LLM, prompts: Sequence[Sequence[int]], max_tokens: int) -> None:
        """Plain greedy continuations of `prompts` from `plain` (no drafter), `max_tokens + k`
        long: the last drafts a request still verifies reach that far."""
        sp = SamplingParams(max_tokens=max_tokens + self.k, ignore_eos=True)
        for p, out in zip(prompts, plain.generate(list(prompts), sp), strict=True):
            self.answers[tuple(p)] = out.token_ids

    def accepted_values(self) -> set[int]:
        return {s.accepted for s in self.steps}


# ---------------------------------------------------------------------------------------------
# KV events replayed the way a router indexes them
# ---------------------------------------------------------------------------------------------


class EventTree:
    """A router's radix tree over one worker's KV events (`hycache.cache.events`): blocks keyed
    by (parent, tokens), as a router that re-hashes token content finds them. Fails on a block
    stored twice without a removal, or removed without being stored."""

    def __init__(self) -> None:
        self.nodes: dict[object, tuple[object, tuple[int, ...]]] = {}  # hash -> parent, tokens
        self.children: dict[tuple[object, tuple[int, ...]], object] = {}
        self.block_size = 0

    def apply(self, batch: object) -> None:
        from hycache.cache.events import AllBlocksCleared, BlockRemoved, BlockStored

        for e in batch.events:  # type: ignore[attr-defined]
            if isinstance(e, AllBlocksCleared):
                self.nodes.clear()
                self.children.clear()
            elif isinstance(e, BlockStored):
                b = self.block_size = e.block_size
                parent = e.parent_block_hash
                for i, h in enumerate(e.block_hashes):
                    toks = tuple(e.token_ids[i * b : (i + 1) * b])
                    assert len(toks) == b and h not in self.nodes, f"stored twice: {h}"
                    assert parent is None or parent in self.nodes, f"orphan: {h}"
                    self.nodes[h] = (parent, toks)
                    self.children[(parent, toks)] = h
                    parent = h
            elif isinstance(e, BlockRemoved):
                for h in e.block_hashes:
                    assert h in self.nodes, f"removed, never stored: {h}"
                    del self.children[self.nodes.pop(h)]

    def depth(self, token_ids: Sequence[int]) -> int:
        """The deepest prefix of `token_ids` the tree holds, in tokens (a depth-scoring
        router's overlap times its block size)."""
        b, parent, n = self.block_size, None, 0
        while b and n + b <= len(token_ids):
            h = self.children.get((parent, tuple(token_ids[n : n + b])))
            if h is None:
                break
            parent, n = h, n + b
        return n

    def prefixes(self) -> set[tuple[int, ...]]:
        """Every stored block as the whole token prefix it ends."""
        out = set()
        for h in self.nodes:
            toks: list[int] = []
            while h is not None:
                parent, t = self.nodes[h]
                toks[:0] = t
                h = parent
            out.add(tuple(toks))
        return out


WORKED = [
    "--block-size",
    "4416",
    "--prefix-match-unit",
    "64",
    "--eagle",
    "--prompt-tokens",
    "64016",
    "--shared-prefix",
    "57600",
]


# a tiny Nemotron-H geometry, as transformers writes its config: the model tests' base
# (tests/model/archs.py) and the simulator tests' MoE variant (`NEMOTRON_MOE`)
NEMOTRON_TINY = {
    "vocab_size": 96,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "mamba_num_heads": 4,
    "mamba_head_dim": 16,
    "n_groups": 2,
    "ssm_state_size": 8,
}

# a Nemotron-3 style config: MoE `E` blocks among Mamba2, attention and MLP layers
NEMOTRON_MOE = {
    "model_type": "nemotron_h",
    **NEMOTRON_TINY,
    "layers_block_type": ["mamba", "moe", "attention", "mlp", "moe", "mamba", "moe"],
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 24,
    "moe_shared_expert_intermediate_size": 40,
    "n_group": 2,
    "topk_group": 1,
}

BAMBA_9B = {  # the geometry of ibm-ai-platform/Bamba-9B's config.json
    "model_type": "bamba",
    "vocab_size": 128256,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "attn_layer_indices": [9, 18, 27],
    "mamba_n_heads": 128,
    "mamba_d_head": 64,
    "mamba_n_groups": 1,
    "mamba_d_state": 128,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "mamba_chunk_size": 256,
    "max_position_embeddings": 262144,
}


SP = SamplingParams(max_tokens=5)


GEOMETRY = {"block_size": 16, "prefix_match_unit": 4, "max_model_len": 256}


def family(seed: int = 0, shared: int = 101, private: int = 23, n: int = 3) -> list[list[int]]:
    rng = random.Random(seed)
    head = [rng.randrange(1, 250) for _ in range(shared)]
    return [head + [rng.randrange(1, 250) for _ in range(private)] for _ in range(n)]


def noise(seed: int = 1, n: int = 5, length: int = 130) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1, 250) for _ in range(length)] for _ in range(n)]


def replay(llm: LLM, evict: bool = True, seed: int = 0) -> RequestOutput:
    """fam[0], fam[1] one after the other, noise that evicts them (small pools), then fam[2]."""
    fam = family(seed)
    llm.generate([fam[0]], SP)
    llm.generate([fam[1]], SP)
    if evict:
        for prompt in noise():
            llm.generate([prompt], SP)
    return llm.generate([fam[2]], SP)[0]


def assert_no_leaks(llm: LLM) -> None:
    cache = llm.scheduler.cache
    cache.check_integrity()
    assert cache.num_live_requests == 0
    assert cache.pool.num_free == cache.pool.num_blocks - 1  # every block back (cached or not)


def raw_exchange(url: str, head: bytes, data: bytes = b"") -> tuple[int, bytes, bool]:
    """Send `head` (and `data`) on a raw socket, send nothing more; the response's status,
    its headers, and whether the server then closed the connection."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=HANG_S) as s:
        s.sendall(head + data)
        got = b""
        while b"\r\n\r\n" not in got:
            part = s.recv(65536)
            assert part, got
            got += part
        headers, _, rest = got.partition(b"\r\n\r\n")
        length = int(headers.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        while len(rest) < length:
            rest += s.recv(65536)
        closed = s.recv(1) == b""  # the server's FIN, not waiting for the body's rest
    return int(headers.split(b" ")[1]), headers.lower(), closed
