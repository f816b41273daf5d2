"""Driving a vLLM engine step by step in the real-engine tests."""

from __future__ import annotations

from typing import Any


def run_with_abort(
    llm: Any, prompts: list[list[int]], params: Any, max_tokens: int, tag: str
) -> list[list[int]]:
    """prompts[0] is aborted after the first step (mid-prefill); the others run beside it to
    the end. Returns the others' token ids, in order."""
    engine = llm.llm_engine
    for i, p in enumerate(prompts):
        engine.add_request(f"{tag}{i}", {"prompt_token_ids": p}, params)
    engine.step()
    engine.abort_request([f"{tag}0"])
    done: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            if o.finished:
                done[o.request_id] = list(o.outputs[0].token_ids)
    assert f"{tag}0" not in done or len(done[f"{tag}0"]) < max_tokens
    return [done[f"{tag}{i}"] for i in range(1, len(prompts))]
