"""Repeated timings: the spread of each arm's repeats, and whether the repeats rank two arms.

A benchmark that runs each arm several times reports the median with its min-max; for two arms
it takes the ratio within each repeat (the arms of one repeat ran next to each other, under the
same load) and ranks them only when every repeat agrees on the side of 1. When the ratios' range
crosses 1 the repeats disagree too much to say which arm is faster. Used by `hycache bench`'s
engine part and `benchmarks/bench_vllm_engine.py`. Also the order arms run in when they take
turns (`arm_order`): rotated by one per repeat and per slot, so no arm always goes first.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any, TypeVar

__all__ = ["arm_order", "ratio_spread", "spread", "verdict"]

T = TypeVar("T")


def arm_order(repeat: int, slot: int, arms: Sequence[T]) -> tuple[T, ...]:
    """The arms rotated by one per repeat and per slot (a wave of requests, a workload): along
    a repeat's slots, and along a slot's repeats, each arm goes first in turn."""
    k = (repeat + slot) % len(arms)
    return tuple(arms[k:]) + tuple(arms[:k])


def spread(values: Sequence[float]) -> dict[str, float]:
    """Median, min and max of the repeats."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def ratio_spread(nums: Sequence[float], dens: Sequence[float]) -> dict[str, Any] | None:
    """`nums[i] / dens[i]` per repeat, their spread, and `rankable`: at least two repeats, all
    on the same side of 1 (None when no repeat has a non-zero denominator)."""
    per = [n / d for n, d in zip(nums, dens, strict=True) if d]
    if not per:
        return None
    s = spread(per)
    rankable = len(per) > 1 and (s["max"] < 1 or s["min"] > 1)
    return {**s, "per_repeat": per, "rankable": rankable}


def verdict(r: dict[str, Any]) -> str:
    """`1.16x (1.05-1.30)`, with the warning when the repeats cannot rank the arms."""
    text = f"{r['median']:.3f}x ({r['min']:.3f}-{r['max']:.3f})"
    if not r["rankable"]:
        text += " -- cannot rank: " + (
            "one repeat" if len(r["per_repeat"]) < 2 else "the repeats cross 1"
        )
    return text
