"""What a request's release protects (issue 47 item 3): the `protect` depth `BlockPool.free`
and `BlockPool.refresh` take for the pages a request lets go of, from the knobs and the hit
it resumed from; and the copy-on-write sources such a request frees early. The pool keeps the
protected queue itself (`hycache.cache.block_pool`; docs/admission.md, "Hints and floods")."""

from __future__ import annotations

from collections.abc import Sequence

from hycache.cache.block_pool import PROTECT_ALL, PROTECT_PATHS, BlockPool
from hycache.cache.boundaries import Boundaries
from hycache.config import CacheConfig
from hycache.request import Request


def protected_depth(cache: CacheConfig, bounds: Boundaries, req: Request, resume: int) -> int:
    """What a request resuming at `resume` frees into the protected queue: with
    `protect_reused`, a hit's whole path (`PROTECT_ALL`); with `protect_declared`, when the hit
    covers a prefix the request declared, what is keyed up to that prefix's end (its blocks
    and state, not the request's own suffix, `Boundaries.declared_reach`); 0: nothing."""
    if not PROTECT_PATHS or resume <= 0:
        return 0
    if cache.protect_reused:
        return PROTECT_ALL
    if not cache.protect_declared:
        return 0
    return bounds.declared_reach(req.prefix_hints, resume, req.num_prompt_tokens)


class CopySources:
    """The block a protected path copies from (a mid-block resume's copy-on-write source, the
    block its declared prefix ends in) is part of it: released with the path's depth when the
    copies are handed to the runner, before the request lets go."""

    def __init__(self) -> None:
        self._depth: dict[int, int] = {}  # source block -> its path's `protect`

    def note(self, copies: Sequence[tuple[int, int]], protect: int) -> None:
        if protect:
            self._depth.update((src, protect) for src, _ in copies)

    def release(self, pool: BlockPool, copies: Sequence[tuple[int, int]]) -> None:
        """Free the sources of `copies` (pinned until the copies are handed over)."""
        depth, self._depth = self._depth, {}
        for src, _ in copies:
            pool.free([src], protect=depth.get(src, 0))
