"""The cost model's tunable terms, declared once, and the rule for a term left unset.

This module owns :data:`TERMS` (one :class:`Term` per efficiency, overhead, factor or switch
of `CostModel.step_time`: its unit, what it means, its range, what it falls back to, whether
`hycache calibrate` fits it) and :class:`CostTerms`, the frozen record of one value per term
that the others reuse: :class:`~hycache.sim.presets.GpuSpec` extends it (a preset's optional
values), :class:`~hycache.sim.fit.Fit` extends it (a fit's values), the preset loader reads
its fields from :data:`TERMS`, and `CostModel` takes them as keyword arguments and resolves
them with :func:`resolve` (the one home of the fallback rule: an explicit value, else the
preset's, else the term's fallback, a constant or another term's resolved value).

A new term is one :class:`CostTerms` field with its :func:`term` metadata; every list above
follows from it (tests/sim/test_terms.py checks that they do).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal

__all__ = [
    "BY_NAME",
    "FREE_PARAMETERS",
    "TERMS",
    "TERM_NAMES",
    "CostTerms",
    "Term",
    "check_term",
    "resolve",
]

# the range a term's value must lie in
Bound = Literal["fraction", "positive", "nonnegative", "flag"]
Value = float | bool


@dataclass(frozen=True)
class Term:
    """One term of the cost model.

    `fallback`: the value an unset term takes, a constant or the name of an earlier term
    (its resolved value). `free`: `hycache calibrate` fits it (`FREE_PARAMETERS`).
    `unfitted`: its value in a :class:`~hycache.sim.fit.Fit` that did not fit it (the value
    at which it adds nothing: no overhead, one pass over each byte); None: a fit must give
    it (the two efficiencies) or it stays unset (and falls back)."""

    name: str
    kind: type
    unit: str
    doc: str
    fallback: Value | str
    bound: Bound
    free: bool = True
    unfitted: Value | None = None


def term(
    unit: str,
    doc: str,
    fallback: Value | str,
    bound: Bound,
    *,
    free: bool = True,
    unfitted: Value | None = None,
) -> Any:
    """A :class:`CostTerms` field (unset by default) carrying its term's declaration."""
    meta = {"unit": unit, "doc": doc, "fallback": fallback, "bound": bound, "free": free,
            "unfitted": unfitted}  # fmt: skip
    return field(default=None, metadata=meta)


@dataclass(frozen=True)
class CostTerms:
    """One value per cost-model term; None: unset (see :func:`resolve`). The declaration
    order is the order of a preset file's keys, and a fallback names an earlier term."""

    compute_efficiency: float | None = term(
        "fraction of peak_flops", "achieved / peak FLOP rate of a forward", 0.6, "fraction"
    )
    bandwidth_efficiency: float | None = term(
        "fraction of hbm_bandwidth", "achieved / peak memory bandwidth of a forward", 0.8,
        "fraction",
    )  # fmt: skip
    step_overhead_s: float | None = term(
        "s per step", "once per step with work (scheduling, input tensors, sampling, launches)",
        1.5e-3, "nonnegative", unfitted=0.0,
    )  # fmt: skip
    draft_pass_overhead_s: float | None = term(
        "s per drafter pass", "once per drafter pass", 2.0e-4, "nonnegative", unfitted=0.0
    )
    seq_overhead_s: float | None = term(
        "s per request in a step",
        "once per request scheduled in a step (the CPU engine's runner and sampler loop over "
        "requests in Python)",
        0.0, "nonnegative", unfitted=0.0,
    )  # fmt: skip
    kv_bytes_factor: float | None = term(
        "x attended K/V bytes",
        "times each attended K/V byte of a prefill chunk is moved (1: a paged kernel reads it "
        "once; the CPU engine gathers the blocks into a contiguous copy first)",
        1.0, "positive", unfitted=1.0,
    )  # fmt: skip
    decode_kv_bytes_factor: float | None = term(
        "x attended K/V bytes",
        "the same for a decoding (verifying) request's own context (a few queries over a long "
        "context run far below a chunk's rate on the CPU engine)",
        "kv_bytes_factor", "positive",
    )  # fmt: skip
    warm_kv_bytes_factor: float | None = term(
        "x attended K/V bytes",
        "the same for the context a decoding request shares with one read before it in the "
        "step, and the padding of a padded layout (on a CPU it comes from the caches)",
        "decode_kv_bytes_factor", "positive",
    )  # fmt: skip
    decode_state_rewrites: float | None = term(
        "SSM states per decoded token",
        "whole SSM states read and written per decoded (verified) token beyond the step's own "
        "state traffic (the CPU engine's recurrent update rewrites the state every position), "
        "priced at state_copy_efficiency",
        0.0, "nonnegative",
    )  # fmt: skip
    phase_overlap: bool | None = term(
        "switch",
        "a phase costs the larger of compute and memory (a roofline); False: their sum (one "
        "CPU thread runs the matrix products, then the gathers)",
        True, "flag", free=False, unfitted=True,
    )  # fmt: skip
    padded_decode_attention: bool | None = term(
        "switch",
        "decoding requests attend over the longest decoding context of the step (the CPU "
        "engine's batched layout; a fact about the engine, not fitted)",
        False, "flag", free=False, unfitted=False,
    )  # fmt: skip
    copy_efficiency: float | None = term(
        "fraction of hbm_bandwidth", "achieved / peak bandwidth of a block copy",
        "bandwidth_efficiency", "fraction",
    )  # fmt: skip
    state_copy_efficiency: float | None = term(
        "fraction of hbm_bandwidth",
        "achieved / peak bandwidth of an SSM state copy (a request's state read and written "
        "each step, internal checkpoints, intermediate verify states)",
        "bandwidth_efficiency", "fraction",
    )  # fmt: skip

    def terms(self) -> dict[str, Value | None]:
        """Every term's value by name (None: unset), in declaration order."""
        return {name: getattr(self, name) for name in TERM_NAMES}


def _declare() -> tuple[Term, ...]:
    out: list[Term] = []
    for f in fields(CostTerms):
        m = f.metadata
        kind = bool if m["bound"] == "flag" else float
        out.append(Term(f.name, kind, m["unit"], m["doc"], m["fallback"], m["bound"],
                        m["free"], m["unfitted"]))  # fmt: skip
        if isinstance(m["fallback"], str) and m["fallback"] not in {t.name for t in out[:-1]}:
            raise TypeError(f"term {f.name}: falls back to {m['fallback']!r}, not an earlier term")
    return tuple(out)


TERMS: tuple[Term, ...] = _declare()
TERM_NAMES: tuple[str, ...] = tuple(t.name for t in TERMS)
BY_NAME: dict[str, Term] = {t.name: t for t in TERMS}
FREE_PARAMETERS: tuple[str, ...] = tuple(t.name for t in TERMS if t.free)


def check_term(name: str, value: Value) -> str | None:
    """What is wrong with `value` for term `name` (None: nothing), as `must be ...`."""
    bound = BY_NAME[name].bound
    if bound == "flag":
        return None if isinstance(value, bool) else f"must be true or false, got {value!r}"
    if bound == "fraction" and not 0.0 < value <= 1.0:
        return f"must be in (0, 1], got {value}"
    if bound == "positive" and not value > 0:
        return f"must be > 0, got {value}"
    if bound == "nonnegative" and not value >= 0:
        return f"must be >= 0, got {value}"
    return None


def resolve(*layers: Mapping[str, Value | None] | CostTerms) -> CostTerms:
    """Every term set: the first layer that sets it (the caller's values, then a preset's),
    else its fallback (a constant, or the resolved value of the term it names); each value
    checked against its term's range (ValueError naming the term)."""
    maps = [x.terms() if isinstance(x, CostTerms) else x for x in layers]
    for m in maps:
        unknown = sorted(set(m) - set(TERM_NAMES))
        if unknown:
            raise TypeError(f"unknown cost-model term(s): {', '.join(unknown)}")
    out: dict[str, Value] = {}
    for t in TERMS:
        value = next((m[t.name] for m in maps if m.get(t.name) is not None), None)
        if value is None:
            value = out[t.fallback] if isinstance(t.fallback, str) else t.fallback
        value = bool(value) if t.kind is bool else float(value)
        problem = check_term(t.name, value)
        if problem:
            raise ValueError(f"{t.name} {problem}")
        out[t.name] = value
    return CostTerms(**out)
