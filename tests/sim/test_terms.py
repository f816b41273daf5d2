"""The cost-model terms are declared once (`hycache.sim.terms`): every consumer (GpuSpec, the
preset loader, the profile writer, CostModel, Fit, the fit's free parameters, the docs' table)
follows the declaration, and one rule resolves an unset term."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hycache.sim.costmodel import CostModel
from hycache.sim.fit import FREE_PARAMETERS, Conditions, Fit, profile_dict
from hycache.sim.presets import (
    PRESET_FIELDS,
    GpuSpec,
    gpu_from_dict,
    list_presets,
    load_gpu,
    load_model_spec,
)
from hycache.sim.terms import BY_NAME, TERM_NAMES, TERMS, CostTerms, Term, resolve

MODEL = load_model_spec("tiny")
BASE = {"name": "g", "peak_flops": 1e12, "hbm_bandwidth": 1e11, "memory_bytes": 1 << 34}
DOCS = Path(__file__).resolve().parents[2] / "docs" / "cost-model.md"


def _value(t: Term, i: int) -> float | bool:
    """A valid value of `t` other than its constant fallback (distinct per term)."""
    if t.kind is bool:
        return not t.fallback if isinstance(t.fallback, bool) else True
    if t.bound == "fraction":
        return 0.05 + 0.01 * i
    return 3.0 + i


EVERY = {t.name: _value(t, i) for i, t in enumerate(TERMS)}
BASE_GPU = gpu_from_dict(BASE)


def _cost(gpu: GpuSpec, **terms: Any) -> CostModel:
    return CostModel(MODEL, gpu, speculative=True, num_speculative_tokens=2, block_size=64,
                     **terms)  # fmt: skip


def test_every_consumer_lists_the_declared_terms() -> None:
    names = tuple(f.name for f in dataclasses.fields(CostTerms))
    assert names == TERM_NAMES
    gpu_fields = [f.name for f in dataclasses.fields(GpuSpec)]
    assert [n for n in gpu_fields if n in BY_NAME] == list(TERM_NAMES)
    assert tuple(f.name for f in dataclasses.fields(Fit)) == TERM_NAMES
    assert PRESET_FIELDS[-len(TERMS) :] == TERM_NAMES
    assert not set(PRESET_FIELDS[: -len(TERMS)]) & set(TERM_NAMES)
    assert tuple(t.name for t in TERMS if t.free) == FREE_PARAMETERS
    cost = _cost(BASE_GPU)
    assert {n: getattr(cost, n) for n in TERM_NAMES} == cost.terms.terms()


def test_a_term_set_in_a_preset_file_reaches_the_spec_the_cost_model_and_the_profile(
    tmp_path: Path,
) -> None:
    """Every declared term, set in a file, is read by the loader, used by CostModel, kept by
    a Fit, and written back by the profile writer (a new term needs no other list)."""
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps(BASE | EVERY))
    gpu = load_gpu(path)
    assert gpu.terms() == EVERY
    cost = _cost(gpu)
    assert cost.terms.terms() == EVERY
    assert cost.without_drafter().terms == cost.terms
    values = Fit(**EVERY)
    assert values.as_arguments() == EVERY
    assert values.cost_model(MODEL, BASE_GPU, 2).terms.terms() == EVERY
    cond = Conditions("cpu", 1, "float32", "x", 0.0, 0.0, 1.0, 1.0)
    doc = profile_dict(BASE_GPU, values, model="tiny", fitted=[], held_out=[],
                       conditions=cond, command="t")  # fmt: skip
    assert {k: doc[k] for k in TERM_NAMES} == EVERY
    assert gpu_from_dict(doc).terms() == EVERY


@pytest.mark.parametrize("t", TERMS, ids=lambda t: t.name)
def test_each_term_is_checked_by_the_loader_and_the_cost_model(t: Term) -> None:
    bad: Any = "yes" if t.kind is bool else (1.5 if t.bound == "fraction" else -1.0)
    with pytest.raises(ValueError, match=t.name):
        gpu_from_dict(BASE | {t.name: bad})
    if t.kind is not bool:
        with pytest.raises(ValueError, match=t.name):
            _cost(BASE_GPU, **{t.name: bad})
    with pytest.raises(TypeError, match="no_such_term"):
        _cost(BASE_GPU, no_such_term=1.0)


@settings(max_examples=60, deadline=None)
@given(
    explicit=st.sets(st.sampled_from(TERM_NAMES)),
    preset=st.sets(st.sampled_from(TERM_NAMES)),
)
def test_an_unset_term_takes_the_preset_then_its_fallback(
    explicit: set[str], preset: set[str]
) -> None:
    """The caller's value, else the preset's, else the fallback: a constant, or the resolved
    value of the term it names (so a chain, e.g. warm -> decode -> kv, follows the first
    term set along it)."""
    caller = {n: EVERY[n] for n in explicit}
    spec = dataclasses.replace(BASE_GPU, **{n: _value(BY_NAME[n], 50) for n in preset})
    got = _cost(spec, **caller).terms.terms()
    assert resolve(caller, spec).terms() == got
    for t in TERMS:
        if t.name in explicit:
            want = EVERY[t.name]
        elif t.name in preset:
            want = _value(t, 50)
        elif isinstance(t.fallback, str):
            want = got[t.fallback]
        else:
            want = t.fallback
        assert got[t.name] == want, t.name


def test_fit_fills_unfitted_terms_and_needs_the_efficiencies() -> None:
    f = Fit(0.5, 0.25)
    for t in TERMS[2:]:
        assert getattr(f, t.name) == t.unfitted, t.name
    with pytest.raises(TypeError, match="bandwidth_efficiency"):
        Fit(0.5)


def test_packaged_gpu_presets_load_with_terms_unset_as_before() -> None:
    """The packaged presets set only the GPU terms; every other resolves to its fallback."""
    for name in list_presets()["gpus"]:
        gpu = load_gpu(name)
        assert gpu.terms().keys() == set(TERM_NAMES)
        set_terms = {n for n, v in gpu.terms().items() if v is not None}
        assert set_terms <= {"compute_efficiency", "bandwidth_efficiency", "step_overhead_s"}
        cost = _cost(gpu)
        assert cost.copy_efficiency == cost.state_copy_efficiency == cost.bandwidth_efficiency
        assert cost.warm_kv_bytes_factor == cost.decode_kv_bytes_factor == 1.0
        assert cost.phase_overlap is True and cost.padded_decode_attention is False


def test_the_docs_table_lists_every_term_with_its_fallback() -> None:
    """docs/cost-model.md's table of terms: one row per term, in order, with its unit,
    fallback and whether calibrate fits it."""
    text = DOCS.read_text(encoding="utf-8")
    rows = re.findall(r"^\| `(\w+)` \| ([^|]+) \| ([^|]+) \| (yes|no) \|$", text, re.M)

    def shown(fb: float | bool | str) -> str:
        if isinstance(fb, str):
            return f"`{fb}`"
        return str(fb).lower() if isinstance(fb, bool) else f"{fb:g}"

    want = [(t.name, t.unit, shown(t.fallback), "yes" if t.free else "no") for t in TERMS]
    assert [tuple(c.strip() for c in row) for row in rows] == want
