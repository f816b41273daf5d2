"""A request: its tokens, their prefix hashes, and how far it has computed.

One counter drives everything: `num_computed_tokens` catches up with `num_tokens`. Prefill
chunks, cache hits and verified drafts all just advance it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np

from hycache.hashing import PrefixHashes

MAX_LOGPROBS = 20  # the most alternatives per token a request may ask for (OpenAI's cap)
MAX_PENALTY = 2.0  # presence and frequency penalties lie in [-2, 2] (OpenAI's, vLLM's range)
# repetition_penalty r divides or multiplies logits: within [1/100, 100] a float32 logit (|x| <
# ~1e3) stays finite; vLLM asks only r > 0, and r = 1e-39 turned logits into inf and NaN
MIN_REPETITION_PENALTY = 0.01
MAX_REPETITION_PENALTY = 100.0
MAX_STOP_TOKEN_IDS = 256  # per request; checked against each output token through a set


class RequestStatus(StrEnum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "finished_stopped"
    FINISHED_LENGTH = "finished_length"
    FINISHED_ABORTED = "finished_aborted"

    @property
    def finished(self) -> bool:
        return self.value.startswith("finished")


@dataclass
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    # report each output token's logprob and this many most likely alternatives (None: none)
    logprobs: int | None = None
    # vLLM's semantics (`hycache.engine.sampling.adjust_logits`): presence and frequency
    # penalise output tokens, repetition prompt and output tokens; logit_bias adds to logits
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    # `stop_token_ids` as a set: each output token is checked in O(1)
    stop_token_set: frozenset[int] = field(init=False, repr=False, compare=False)

    @property
    def adjusts_logits(self) -> bool:
        """Whether a penalty or a logit bias changes the logits before sampling."""
        return bool(
            self.presence_penalty
            or self.frequency_penalty
            or self.repetition_penalty != 1.0
            or self.logit_bias
        )

    def _check_penalties(self) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not -MAX_PENALTY <= value <= MAX_PENALTY:
                raise ValueError(f"{name}: must lie in [-2, 2], got {value}")
        r = self.repetition_penalty
        if not MIN_REPETITION_PENALTY <= r <= MAX_REPETITION_PENALTY:
            raise ValueError(
                f"repetition_penalty: must lie in [{MIN_REPETITION_PENALTY:g}, "
                f"{MAX_REPETITION_PENALTY:g}], got {r}"
            )
        self.logit_bias = tuple((int(t), float(b)) for t, b in self.logit_bias)
        for token, bias in self.logit_bias:
            if token < 0 or not -float("inf") < bias < float("inf"):
                raise ValueError(f"logit_bias: bad entry {token}: {bias}")

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens: must be >= 1, got {self.max_tokens}")
        if not self.temperature >= 0 or self.temperature == float("inf"):
            raise ValueError(f"temperature: must be a finite number >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p: must lie in (0, 1], got {self.top_p}")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise ValueError(f"logprobs: must lie in [0, {MAX_LOGPROBS}], got {self.logprobs}")
        self.stop_token_ids = tuple(int(t) for t in self.stop_token_ids)
        if len(self.stop_token_ids) > MAX_STOP_TOKEN_IDS:
            raise ValueError(
                f"stop_token_ids: at most {MAX_STOP_TOKEN_IDS}, got {len(self.stop_token_ids)}"
            )
        if any(t < 0 for t in self.stop_token_ids):
            raise ValueError("stop_token_ids: token ids must be >= 0")
        self.stop_token_set = frozenset(self.stop_token_ids)
        self._check_penalties()


@dataclass(frozen=True)
class TokenLogprob:
    """An output token's log-probability under the model (log_softmax of the raw logits, before
    temperature and top-p, as vLLM reports by default) and the most likely tokens at its
    position, `(token id, logprob)` from the most likely down."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass
class CacheOutcome:
    """What the cache lookup decided the last time this request was admitted."""

    resume_point: int = 0
    junction: int = 0
    attention_match: int = 0
    lost_reuse: int = 0
    store_hit_tokens: int = 0  # of resume_point, loaded from the second tier


@dataclass(eq=False)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams
    hashes: PrefixHashes
    arrival: int = 0
    eos_token_ids: tuple[int, ...] = ()
    status: RequestStatus = RequestStatus.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    spec_token_ids: list[int] = field(default_factory=list)
    outcome: CacheOutcome = field(default_factory=CacheOutcome)
    junction_stops: tuple[int, ...] = ()  # for the observed junction and the prefix hints
    drop_stops: tuple[int, ...] = ()  # of junction_stops, the drop scheme's junction alone
    hint_stops: tuple[int, ...] = ()  # of junction_stops, those only the prefix hints make
    prefix_hints: tuple[int, ...] = ()  # where this request's shared prefixes end (tokens)
    num_prefill_steps: int = 0
    num_checkpoint_splits: int = 0  # prefill steps ended at a checkpoint stop (passes it cost)
    num_preemptions: int = 0
    prefill_tokens_computed: int = 0
    first_outcome: CacheOutcome | None = None  # the lookup at first admission
    # with `sampling.logprobs`: one entry per output token
    output_logprobs: list[TokenLogprob] = field(default_factory=list)

    @property
    def first_hit_tokens(self) -> int | None:
        return self.first_outcome.resume_point if self.first_outcome else None

    @classmethod
    def new(
        cls,
        request_id: str,
        prompt_token_ids: Sequence[int],
        sampling: SamplingParams,
        *,
        unit: int,
        hash_seed: int = 0,
        extra_keys: bytes = b"",
        arrival: int = 0,
        eos_token_ids: Sequence[int] = (),
        lookahead: bool = False,
        prefix_hints: Sequence[int] = (),
    ) -> Request:
        """`lookahead` selects the key scheme (`Boundaries.lookahead` of the cache it joins).
        `prefix_hints`: token counts where shared prefixes end (used by `limit`)."""
        arr = np.asarray(prompt_token_ids, dtype=np.int64)
        if arr.ndim != 1:
            raise ValueError(f"prompt_token_ids: expected a flat list of ints, got {arr.shape}")
        hints = tuple(sorted({int(h) for h in prefix_hints}))
        if any(h < 0 for h in hints):
            raise ValueError(f"prefix_hints: token counts must be >= 0, got {list(hints)}")
        hashes = PrefixHashes(unit, hash_seed, extra_keys, lookahead)
        hashes.extend(arr)
        tokens = arr.tolist()
        req = cls(request_id, tokens, sampling, hashes, arrival, tuple(eos_token_ids))
        req.prefix_hints = hints
        return req

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    def tokens(self, start: int, end: int) -> list[int]:
        p = len(self.prompt_token_ids)
        if end <= p:
            return self.prompt_token_ids[start:end]
        if start >= p:
            return self.output_token_ids[start - p : end - p]
        return self.prompt_token_ids[start:] + self.output_token_ids[: end - p]

    def accept_tokens(self, token_ids: Sequence[int]) -> tuple[list[int], RequestStatus | None]:
        """Of newly verified tokens, those the request keeps (up to `max_tokens`, through the
        first stop token or EOS), and the status it finishes with (None: it goes on). Pure: the
        scheduler appends them; the runner asks which positions will really exist."""
        sp = self.sampling
        room = sp.max_tokens - self.num_output_tokens
        new: list[int] = []
        for t in token_ids[:room]:
            new.append(t)
            if t in sp.stop_token_set or (not sp.ignore_eos and t in self.eos_token_ids):
                return new, RequestStatus.FINISHED_STOPPED
        if self.num_output_tokens + len(new) >= sp.max_tokens:
            return new, RequestStatus.FINISHED_LENGTH
        return new, None

    def append_output(
        self, token_ids: Sequence[int], logprobs: Sequence[TokenLogprob] | None = None
    ) -> None:
        """Append tokens `accept_tokens` kept, with the step's logprobs when the request wants
        them (the first `len(token_ids)` of them, so a truncation cuts both alike)."""
        if logprobs is not None:
            self.output_logprobs.extend(logprobs[: len(token_ids)])
        self.output_token_ids.extend(token_ids)
        self.hashes.extend(token_ids)
