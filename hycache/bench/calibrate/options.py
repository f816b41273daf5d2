"""What `hycache calibrate` measures: the probes (`PrefillProbe`, `DecodeProbe`), the grids of
them (the fitted one, the held-out one, and their smoke-test sizes) and `CalibrateOptions`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hycache.config import CacheKnobs

Progress = Callable[[str], None]

VOCAB = 512  # the tiny preset's vocabulary: every probe prompt is drawn below it


@dataclass(frozen=True)
class DecodeProbe:
    """Batches of each size in `batches`, one after another, decoding at `context` with `k`
    drafts; `mixed`: for each batch size, the chunk length of a fresh request joining each
    step; `turns`: for each batch size, `chunks` requests joining one step, each the next
    turn of a decoding request (its prompt and `tokens` new ones: a short chunk at about
    `context`, the rest a cache hit; multi-turn chat's steps). `shared`: the requests are
    siblings of one prefix (all but their last 8 tokens), else each has a context of its
    own."""

    context: int
    k: int
    batches: tuple[int, ...]
    mixed: tuple[tuple[int, int], ...] = ()  # (batch size, chunk tokens)
    shared: bool = False
    turns: tuple[tuple[int, int, int], ...] = ()  # (batch size, chunks, tokens per chunk)


@dataclass(frozen=True)
class PrefillProbe:
    """Chunks of `chunk` tokens at each of `contexts` (one request, chunk by chunk)."""

    chunk: int
    contexts: tuple[int, ...]
    k: int = 2


@dataclass(frozen=True)
class Grid:
    prefill: tuple[PrefillProbe, ...]
    decode: tuple[DecodeProbe, ...]
    copies: tuple[int, ...]  # block copies per timed batch
    state_writes: tuple[int, ...]


FIT_GRID = Grid(
    prefill=(
        PrefillProbe(552, (0,)),
        PrefillProbe(1104, (0, 2208, 4416, 6624)),
        PrefillProbe(2208, (0, 4416)),
        PrefillProbe(4416, (0,)),
        PrefillProbe(8192, (0,)),  # the validation workloads' largest chunk (8,002 tokens)
        PrefillProbe(1104, (0, 3312), k=0),
    ),
    decode=(
        DecodeProbe(512, 2, (1, 4, 8), mixed=((2, 552),)),
        DecodeProbe(4000, 2, (1, 8)),
        DecodeProbe(8000, 2, (2, 8), mixed=((4, 1104),)),
        DecodeProbe(4000, 2, (4, 8), shared=True),
        DecodeProbe(8000, 2, (8,), shared=True),
        # multi-turn chat's steps: next turns (short chunks over a cached history) join decodes
        DecodeProbe(2048, 2, (6,), turns=((6, 1, 128), (4, 1, 48), (3, 3, 320))),
        DecodeProbe(2048, 0, (1, 8)),
        DecodeProbe(2048, 1, (4,)),
        DecodeProbe(2048, 3, (4,)),
    ),
    copies=(4, 32),
    state_writes=(4, 32),
)

HELD_OUT_GRID = Grid(
    prefill=(PrefillProbe(1656, (0, 3312)), PrefillProbe(3312, (3312,))),
    decode=(
        DecodeProbe(1500, 2, (3, 6), mixed=((6, 2208),), turns=((3, 2, 200),)),
        DecodeProbe(6000, 2, (5,)),
        DecodeProbe(6000, 2, (6,), shared=True),
        DecodeProbe(3000, 1, (2,)),
    ),
    copies=(12,),
    state_writes=(12,),
)

QUICK_FIT = Grid(
    prefill=(PrefillProbe(128, (0, 256)), PrefillProbe(256, (0,))),
    decode=(
        DecodeProbe(256, 2, (1, 3), mixed=((2, 128),), turns=((2, 2, 32),)),
        DecodeProbe(256, 0, (2,)),
    ),
    copies=(4,),
    state_writes=(4,),
)
QUICK_HELD_OUT = Grid(
    prefill=(PrefillProbe(192, (0,)),),
    decode=(DecodeProbe(384, 2, (2,)),),
    copies=(),
    state_writes=(),
)


@dataclass(frozen=True)
class CalibrateOptions:
    """What `hycache calibrate` runs: the engine model, torch threads, repeats per shape, the
    cache geometry of the probes, and the grids (`quick`: a smoke-test size)."""

    model: str = "tiny"
    threads: int = 1
    repeats: int = 5
    knobs: CacheKnobs = field(default_factory=lambda: CacheKnobs(552, 8))  # the probes' cache
    dtype: str = "float32"
    seed: int = 0
    quick: bool = False
    clock: str = "wall"  # what the fit matches: "wall", or "cpu" (process CPU time)
    grid: Grid = FIT_GRID
    held_out: Grid = HELD_OUT_GRID
    device: str = "cpu"
    cache_memory_gb: float = 0.5
    # decode (verify) steps take `decode_repeats` x `repeats`: they last 10-60 ms on a CPU
    # and spread 30-60% from one step to the next, while each costs little beside the
    # prefill that sets it up
    decode_repeats: int = 4
    vocab: int = VOCAB
    # a (model, config) made by the caller and reused by every probe (the GPU script's
    # random-weight Bamba-9B); None: `model` is loaded by name for each probe
    build: Callable[[], tuple[Any, Any]] | None = field(default=None, compare=False)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def run_knobs(self) -> CacheKnobs:
        """The knobs the probes run with (`quick`: 64-token blocks; policy `limit`)."""
        knobs = self.knobs.replace(block_size=64) if self.quick else self.knobs
        return knobs.replace(policy="limit")

    def grids(self) -> tuple[Grid, Grid]:
        return (QUICK_FIT, QUICK_HELD_OUT) if self.quick else (self.grid, self.held_out)
