"""Prefixes in flight: keys that running requests are about to publish.

architecture §4.7: a key created in the current step is not hit in that step; the hitting request
waits one step instead of recomputing what a running request is writing. Two cases make a
waiting request wait (both only while caching is on):

  * attention: the block right after its current match is being computed in this step by a
    scheduled prefill chunk (its match will be a block longer next step);
  * SSM: a running request has promised a checkpoint (a junction or hint stop, the replay
    boundary, the tail checkpoint it has not reached yet) at a position where this request
    would resume: at its junction, on the block grid between its hit and its junction, or at
    one of its own hint stops.

Without this, requests that arrive together all recompute the shared prefix, and each one
observes a "junction" at the producer's current frontier rather than where sharing ends.
"""

from __future__ import annotations

from collections.abc import Iterable

from hycache.cache.boundaries import Boundaries, floor_to
from hycache.cache.coordinator import CacheHit
from hycache.request import Request


def chunk_keys(req: Request, start: int, end: int, block_size: int) -> set[bytes]:
    """Prefix hashes of the full blocks a chunk [start, end) completes."""
    top = min(end, req.hashes.num_hashed_tokens)
    first = floor_to(start, block_size) + block_size
    return {req.hashes.at(p) for p in range(first, top + 1, block_size)}


def promised_checkpoints(running: Iterable[Request], bounds: Boundaries) -> set[bytes]:
    """Prefix hashes of the SSM checkpoints running prefills will still write."""
    out: set[bytes] = set()
    for req in running:
        done, t = req.num_computed_tokens, req.num_prompt_tokens
        if done >= t:
            continue
        stops = {*bounds.prompt_stops(t), *req.junction_stops}
        for p in stops:
            if done < p <= t and bounds.should_checkpoint(p, t, req.junction_stops):
                out.add(req.hashes.at(p))
    return out


def should_wait(
    req: Request, hit: CacheHit, in_step: set[bytes], promised: set[bytes], bounds: Boundaries
) -> bool:
    b = bounds.block_size
    nxt = floor_to(hit.attention_match, b) + b
    if nxt <= req.hashes.num_hashed_tokens and req.hashes.at(nxt) in in_step:
        return True
    if not promised:
        return False
    j = hit.junction
    candidates = [j, *range(floor_to(j, b), hit.resume_point, -b)] if j else []
    # a hinted request also waits for the checkpoints its own hints name
    candidates += bounds.hint_stops(req.prefix_hints, hit.resume_point, req.num_prompt_tokens)
    top = req.hashes.num_hashed_tokens
    return any(hit.resume_point < p <= top and req.hashes.at(p) in promised for p in candidates)
