"""The LLM API: streaming, cache salts, stop tokens, outputs."""

from __future__ import annotations

from hycache.engine.engine import LLM
from hycache.request import SamplingParams


def small(**kw: object) -> LLM:
    return LLM("tiny", max_model_len=256, num_blocks=96, block_size=16, prefix_match_unit=4, **kw)  # type: ignore[arg-type]


PROMPT = list(range(3, 60))


def test_stream_yields_the_generated_tokens_in_order() -> None:
    sp = SamplingParams(max_tokens=7)
    (ref,) = small().generate([PROMPT], sp)
    got: list[int] = []
    finished = []
    for event in small().stream([PROMPT], sp):
        got.extend(event.new_token_ids)
        if event.finished:
            finished.append(event.output)
    assert got == ref.token_ids and len(got) == 7
    assert finished[0].token_ids == got and finished[0].finish_reason == "length"


def test_cache_salt_isolates_tenants() -> None:
    llm = small()
    sp = SamplingParams(max_tokens=2)
    llm.add_request(PROMPT, sp, cache_salt="a")
    while llm.scheduler.has_unfinished():
        llm.step()

    def hit(salt: str | None) -> int:
        llm.add_request(PROMPT, sp, request_id=f"probe-{salt}", cache_salt=salt)
        while True:
            for e in llm.step():
                if e.output is not None:
                    return e.output.hit_tokens

    assert hit("b") == 0 and hit(None) == 0
    assert hit("a") > 0


def test_stop_token_ends_generation() -> None:
    sp = SamplingParams(max_tokens=12)
    (ref,) = small().generate([PROMPT], sp)
    stop = ref.token_ids[3]
    (out,) = small().generate([PROMPT], SamplingParams(max_tokens=12, stop_token_ids=(stop,)))
    assert out.token_ids == ref.token_ids[: ref.token_ids.index(stop) + 1]
    assert out.finish_reason == "stop"


def test_each_token_is_streamed_once_across_preemptions() -> None:
    """A request re-admitted after a preemption replays its outputs as prefill; the stream must
    not deliver them again (issue #10's repro: 8 prompts of 40 tokens, a 40-block pool)."""
    llm = LLM("tiny", block_size=16, prefix_match_unit=16, max_model_len=256, num_blocks=40)
    prompts = [[(7 * i + j) % 500 + 1 for j in range(40)] for i in range(8)]
    streamed: dict[str, list[int]] = {}
    final: dict[str, list[int]] = {}
    for event in llm.stream(prompts, SamplingParams(max_tokens=120, ignore_eos=True)):
        streamed.setdefault(event.request_id, []).extend(event.new_token_ids)
        if event.output is not None:
            final[event.request_id] = event.output.token_ids
    assert llm.scheduler.num_preemptions > 0, "the pool should force preemptions"
    assert len(final) == 8
    for rid, tokens in final.items():
        assert len(tokens) == 120 and streamed[rid] == tokens


def test_every_eos_id_of_the_checkpoint_stops_a_request(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """`eos_token_id: [2, 131]` used to stop on 2 only; generation_config.json counts too."""
    import json

    from hycache.engine.build import eos_token_ids
    from hycache.request import Request, RequestStatus

    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": [2, 131]}))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 5}))
    assert eos_token_ids(str(tmp_path)) == (2, 5, 131)
    assert eos_token_ids("tiny") == ()
    req = Request.new("r", [1, 2, 3], SamplingParams(max_tokens=8), unit=4, eos_token_ids=(2, 131))
    assert req.accept_tokens([9, 131, 4]) == ([9, 131], RequestStatus.FINISHED_STOPPED)
    ignore = Request.new(
        "i", [1], SamplingParams(max_tokens=8, ignore_eos=True), unit=4, eos_token_ids=(2,)
    )
    assert ignore.accept_tokens([2, 2]) == ([2, 2], None)


def test_speculative_scratch_comes_out_of_the_cache_budget() -> None:
    """`--num-speculative-tokens 500` used to allocate ~17 GB of scratch states outside any
    budget (killed by the OOM killer); it is refused now, and smaller k shrink the pool."""
    import pytest

    from hycache.cache.layout import split_budget
    from hycache.engine.build import attention_block_bytes, scratch_bytes, state_bytes

    with pytest.raises(ValueError, match=r"^cache_memory_gb:.*scratch"):
        LLM("tiny", num_speculative_tokens=500, max_model_len=256)
    spec = LLM("tiny", max_model_len=256, cache_memory_gb=0.25, num_speculative_tokens=3)
    mc, dtype = spec.model_config, spec.model.dtype
    scratch = scratch_bytes(mc, dtype, 64, 3)
    assert scratch == 64 * 4 * state_bytes(mc, dtype)
    sizes = split_budget(
        2**28 - scratch,
        attention_block_bytes=attention_block_bytes(mc, 64, dtype, drafter=True),
        state_page_bytes=state_bytes(mc, dtype),
        max_model_len=256,
        block_size=64,
        attention_groups=2,
    )
    c = spec.config.cache
    assert (c.num_blocks, c.num_state_pages) == (sizes.num_blocks, sizes.num_state_pages)
